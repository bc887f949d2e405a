"""The Outputs, Induction heads and Circuits pages in a real headless Chromium: load each page,
change a control, follow a deep link, and read the updated figures."""

import shutil
import socket
import threading

import pytest

from dashboards.app import create_app, make_link
from dashboards.store import ModelStore

from helpers import tiny_model

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
ALPHABET = "abcdefghijklmnopqrstuvwxyz ."
DEFAULT = "the cat. the cat."


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48), DEFAULT)
    store.add("tiny-dcmha", tiny_model("dcmha", tokenizer_alphabet=ALPHABET, n_ctx=48,
                                       attn_cfg={"static_proj": True}), DEFAULT)
    return store


@pytest.fixture(scope="module")
def server(store):
    from werkzeug.serving import make_server

    app = create_app(store)
    port = _free_port()
    srv = make_server("127.0.0.1", port, app.server, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    srv.shutdown()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail("chromium and chromedriver are required (apt-get install chromium "
                    "chromium-driver); .ci/run installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1400,1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Screenshots of the pages, kept as test artifacts under pytest's tmp dir."""
    return tmp_path_factory.mktemp("dashboard-analysis-screenshots")


def _wait(driver, script, timeout=60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script))


def _figure(graph_id, expr):
    """JS returning `expr` over the plotly graph `g` inside `graph_id`, or null until drawn."""
    return (f"const g = document.querySelector('#{graph_id} .js-plotly-plot');"
            f"return g && g.data && g.data.length && g.layout ? ({expr}) : null;")


def _screenshot(browser, shots, page):
    path = shots / f"{page}.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000


def _open_tab(browser, server, title):
    browser.get(server)
    _wait(browser, "return document.title === 'attnlens'")
    script = ("return Array.from(document.querySelectorAll('.tab'))"
              f".some(t => t.innerText.trim() === {title!r});")
    _wait(browser, script)
    tabs = browser.find_elements("css selector", ".tab")
    next(t for t in tabs if t.text.strip() == title).click()


def _choose(browser, dropdown_id, option_text):
    """Pick `option_text` in a dcc.Dropdown (Dash 4: a button opening a listbox)."""
    browser.find_element("id", dropdown_id).click()
    option = _wait(browser, "return [...document.querySelectorAll('[role=option]')]"
                            f".find(o => o.innerText.trim() === '{option_text}') || null")
    option.click()


def _click_label(browser, container_id, text):
    """Click the radio item labelled `text` inside `container_id`."""
    label = _wait(browser, f"return [...document.querySelectorAll('#{container_id} label')]"
                           f".find(l => l.innerText.trim() === {text!r}) || null")
    label.click()


def test_outputs_page(server, browser, shots):
    _open_tab(browser, server, "Outputs")
    names = _wait(browser, _figure("outputs-loss", "g.data.map(t => t.name)"))
    assert names == ["tiny-mha", "tiny-dcmha"]
    assert _wait(browser, _figure("outputs-loss", "g.data[0].x.length")) == len(DEFAULT)
    assert _wait(browser, _figure("outputs-topk-0", "g.data[0].x.length")) == 5
    assert _wait(browser, _figure("outputs-topk-0", "g.data[0].colorbar.title.text")) == \
        "probability"
    _choose(browser, "outputs-k", "2")
    assert _wait(browser, _figure("outputs-topk-0", "g.data[0].x.length === 2 ? 2 : null")) == 2
    assert _wait(browser, _figure("outputs-repeat", "g.data.length")) == 4
    _screenshot(browser, shots, "outputs")


def test_induction_page(server, browser, store, shots):
    _open_tab(browser, server, "Induction heads")
    panels = _wait(browser, _figure("heads-scores-0", "g.data.length"))
    assert panels == 4                                  # three detectors + the stripe
    cfg = store.get("tiny-mha").cfg
    shape = _wait(browser, _figure("heads-scores-0", "[g.data[0].y.length, g.data[0].x.length]"))
    assert shape == [cfg.n_layers, cfg.n_heads]
    assert _wait(browser, _figure("heads-scores-1", "g.data.length")) == 4     # second model
    bars = _wait(browser, _figure("heads-ablation", "g.data.map(t => t.name)"))
    assert bars == ["before", "after"]
    _click_label(browser, "heads-probe", "the prompt")
    assert _wait(browser, _figure("heads-scores-0", "g.data.length === 3 ? 3 : null")) == 3
    assert _wait(browser, _figure("heads-composition", "g.layout.coloraxis.cmid === 0"))
    note = _wait(browser, "const e = document.getElementById('heads-training-note');"
                          "return e && e.innerText.length ? e.innerText : null")
    assert "no checkpoint directory" in note
    _screenshot(browser, shots, "induction")


def test_circuits_page_and_its_deep_link(server, browser, shots):
    _open_tab(browser, server, "Circuits")
    labels = _wait(browser, _figure("circuits-qk", "g.data[0].x"))
    assert labels == [c.replace(" ", "␣") for c in dict.fromkeys(DEFAULT)]   # first seen
    assert _wait(browser, _figure("circuits-qk", "g.data[0].zmid === 0"))
    _choose(browser, "ctl-head", "2")
    title = _wait(browser, _figure("circuits-ov", "g.layout.title.text.includes('H2')"
                                                  " ? g.layout.title.text : null"))
    assert title == "tiny-mha L0H2: full OV circuit"
    assert _wait(browser, _figure("circuits-composition", "g.data.length")) == 3    # Q, K, V
    _screenshot(browser, shots, "circuits")
    link = server + "/" + make_link("circuits", ["tiny-dcmha"], 1, 3, "pattern", "abc")
    for _ in range(2):   # follow the link, then reload: the same view both times
        browser.get(link)
        title = _wait(browser, _figure("circuits-qk", "g.layout.title.text.includes('L1H3')"
                                                      " ? g.layout.title.text : null"))
        assert title == "tiny-dcmha L1H3: full QK circuit"
        assert _wait(browser, _figure("circuits-qk", "g.data[0].x")) == ["a", "b", "c"]
