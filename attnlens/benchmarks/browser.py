"""Benchmark: what the user waits for in the browser (issue 56 item 3), in headless Chromium.

    python -m attnlens.benchmarks.browser [--variants mha,dcmha] [--tokens 512] [--repeats 5]

`attnlens.benchmarks.pages` and `attnlens.benchmarks.explorer` time the server's callbacks; this
times the whole round: from the user's change (a head picked in the bar, a new prompt run) until
the explorer's zoomed map shows it, drawn by plotly.js (the zoom's title names the new head, its
map has the new prompt's length), timed in the page (`_arm`: from the press on the option or the
Run button to the first animation frame showing the map; WebDriver's round trips are outside).
In between: the callbacks the change fires (every page's, on
the server's threads), the responses' transfer and plotly's re-render. Targets: a head change
< 300 ms, a new prompt < 1 s at 512 tokens. Models: random weights of the bundled toy shape
(weights do not change the cost), two in the bar (Compare's two columns would be computed too if
hidden pages computed). Needs chromium and chromedriver. Not a timed test: run it by hand and
copy the table into docs/benchmarks.md; the machine is shared, so the numbers carry its load.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import statistics
import threading
import time

import torch

from attnlens.benchmarks.explorer import ALPHABET, dashboard_header, dashboard_parser
from attnlens.benchmarks.pages import build_model
from attnlens.dashboards.app import create_app
from attnlens.dashboards.store import ModelStore

HEAD_TARGET_MS, PROMPT_TARGET_MS = 300.0, 1000.0
ZOOM = "document.querySelector('#explorer-zoom .js-plotly-plot')"


def _serve(app) -> tuple[str, object]:
    from werkzeug.serving import make_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}", server


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def _until(driver, script: str, timeout: float = 60.0, poll: float = 0.005) -> float:
    """Seconds until `script` returns true in the page (polled every `poll` s)."""
    start = time.perf_counter()
    while not driver.execute_script(script):
        if time.perf_counter() - start > timeout:
            raise TimeoutError(script)
        time.sleep(poll)
    return time.perf_counter() - start


def _shows(title: str, n: int) -> str:
    """JS: the zoomed map is drawn with `title` at the start of its title and `n` positions."""
    return (f"const g = {ZOOM}; return !!(g && g._fullLayout && g.data && g.data.length && "
            f"((g.layout.title || {{}}).text || '').startsWith({title!r}) && "
            f"g.data[0].x.length === {n} && "
            "!document.querySelector('#explorer-zoom[data-dash-is-loading=true]'));")


def _arm(driver, shows: str) -> None:
    """Times the next change in the page itself: from the user's next press (a capturing
    `pointerdown`: the option picked, the Run button) until the first animation frame in which
    `shows` (a JS function body) is true, in `window.__attnlens_ms`. WebDriver's own round trips
    (finding the dropdown's options, polling from Python: ~200-300 ms on a loaded 2-core
    machine) are outside it."""
    driver.execute_script(
        "window.__attnlens_ms = null; const shows = new Function(arguments[0]);"
        "document.addEventListener('pointerdown', () => {"
        "  const t0 = performance.now();"
        "  const frame = () => { if (shows()) { window.__attnlens_ms = performance.now() - t0; }"
        "                        else { requestAnimationFrame(frame); } };"
        "  requestAnimationFrame(frame);"
        "}, {capture: true, once: true});", shows)


def _timed(driver, timeout: float = 60.0) -> float:
    """The armed change's milliseconds (`_arm`), once the page has them."""
    _until(driver, "return window.__attnlens_ms !== null", timeout)
    return driver.execute_script("return window.__attnlens_ms")


def _set_head(driver, head: int, shows: str) -> None:
    driver.find_element("id", "ctl-head").click()
    option = [o for o in driver.find_elements("css selector", "[role=option]")
              if o.text.strip() == str(head)][0]
    _arm(driver, shows)
    option.click()


def _set_prompt(driver, text: str, shows: str) -> None:
    box = driver.find_element("id", "ctl-prompt")
    driver.execute_script(
        "const box = arguments[0]; const set = Object.getOwnPropertyDescriptor("
        "HTMLTextAreaElement.prototype, 'value').set; set.call(box, arguments[1]);"
        "box.dispatchEvent(new Event('input', {bubbles: true}));", box, text)
    run = driver.find_element("id", "ctl-run")
    _arm(driver, shows)
    run.click()


def measure(variant: str, args, rng: random.Random) -> list[dict]:
    model = build_model(variant, args)
    store = ModelStore()
    store.add("m", model, "".join(rng.choice(ALPHABET) for _ in range(args.tokens - 1)))
    store.add("other", build_model("mha", args), "abc")
    url, server = _serve(create_app(store))
    driver = _browser()
    try:
        driver.get(f"{url}/?page=explorer&models=m,other&layer={args.layers - 1}&head=0")
        layer = args.layers - 1
        _until(driver, _shows(f"m L{layer}H0", args.tokens), timeout=120)
        runs = {"head": [], "new prompt": []}
        head = 0
        for _ in range(args.repeats):
            head = (head + 1) % args.heads
            _set_head(driver, head, _shows(f"m L{layer}H{head}", args.tokens))
            runs["head"].append(_timed(driver))
            text = "".join(rng.choice(ALPHABET) for _ in range(args.tokens - 1))
            driver.execute_script(f"window.__attnlens_z = {ZOOM}.data[0].z;")
            # the new prompt's map has the old one's length: wait for another map drawn
            _set_prompt(driver, text, f"if ({ZOOM}.data[0].z === window.__attnlens_z) "
                                      "return false; " + _shows(f"m L{layer}H{head}",
                                                                args.tokens))
            runs["new prompt"].append(_timed(driver))
    finally:
        driver.quit()
        server.shutdown()
    return [{"variant": variant, "update": k, "ms": statistics.median(v), "max": max(v)}
            for k, v in runs.items()]


def main(argv=None) -> None:
    args = dashboard_parser(__doc__, variants="mha,dcmha", layers=2, heads=4, d_model=64,
                            repeats=5).parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    load = os.getloadavg()[0]
    rows = [r for v in args.variants.split(",") for r in measure(v, args, rng)]
    print(dashboard_header("explorer in headless Chromium", args, load))
    print(f"- from the change to the zoomed map drawn; median (max) of {args.repeats}; targets: "
          f"head change < {HEAD_TARGET_MS:.0f} ms, new prompt < {PROMPT_TARGET_MS:.0f} ms\n")
    print("| variant | update | ms (median) | ms (max) |")
    print("|---|---|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['update']} | {r['ms']:.0f} | {r['max']:.0f} |")


if __name__ == "__main__":
    main()
