"""Helpers of the headless-Chromium dashboard tests (the `server` and `browser` fixtures live in
conftest.py): wait for a script, read a drawn plotly figure, open a tab, pick a dropdown option,
save a screenshot."""

from __future__ import annotations

POLL_S = 0.05   # WebDriverWait's default 0.5 s left a worker idle ~0.25 s per wait


def wait(driver, script, timeout=60):
    """Run `script` in the page every POLL_S until it returns something truthy; returns that."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=POLL_S).until(
        lambda d: d.execute_script(script))


def figure(graph_id, expr):
    """JS returning `expr` over the plotly graph `g` inside `graph_id`, or null until drawn."""
    return (f"const g = document.querySelector('#{graph_id} .js-plotly-plot');"
            f"return g && g.data && g.data.length && g.layout ? ({expr}) : null;")


def screenshot(browser, shots, page):
    """Save the page as `shots/<page>.png` and check it is not blank."""
    path = shots / f"{page}.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000


def open_tab(browser, server, title):
    """Load the app and click the tab titled `title`."""
    browser.get(server)
    wait(browser, "return document.title === 'attnlens'")
    # the layout renders after the title: wait for the tab itself, not only for the page
    script = ("return Array.from(document.querySelectorAll('.tab'))"
              f".some(t => t.innerText.trim() === {title!r});")
    wait(browser, script)
    tabs = browser.find_elements("css selector", ".tab")
    next(t for t in tabs if t.text.strip() == title).click()


def choose(browser, dropdown_id, option_text):
    """Pick `option_text` in a dcc.Dropdown (Dash 4: a button opening a listbox)."""
    browser.find_element("id", dropdown_id).click()
    option = wait(browser, "return [...document.querySelectorAll('[role=option]')]"
                           f".find(o => o.innerText.trim() === '{option_text}') || null")
    option.click()
