"""The Outputs, Induction heads and Circuits pages in a real headless Chromium: load each page,
change a control, follow a deep link, and read the updated figures."""

import pytest
from browser_common import choose, figure, open_tab, screenshot, wait
from dashboard_common import ALPHABET

from attnlens.dashboards.app import make_link
from attnlens.dashboards.store import ModelStore

from helpers import tiny_model

pytestmark = pytest.mark.browser

DEFAULT = "the cat. the cat."


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48), DEFAULT)
    store.add("tiny-dcmha", tiny_model("dcmha", tokenizer_alphabet=ALPHABET, n_ctx=48,
                                       attn_cfg={"static_proj": True}), DEFAULT)
    return store


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Screenshots of the pages, kept as test artifacts under pytest's tmp dir."""
    return tmp_path_factory.mktemp("dashboard-analysis-screenshots")


def _click_label(browser, container_id, text):
    """Click the radio item labelled `text` inside `container_id`."""
    label = wait(browser, f"return [...document.querySelectorAll('#{container_id} label')]"
                          f".find(l => l.innerText.trim() === {text!r}) || null")
    label.click()


def test_outputs_page(server, browser, shots):
    open_tab(browser, server, "Outputs")
    names = wait(browser, figure("outputs-loss", "g.data.map(t => t.name)"))
    assert names == ["tiny-mha", "tiny-dcmha"]
    assert wait(browser, figure("outputs-loss", "g.data[0].x.length")) == len(DEFAULT)
    assert wait(browser, figure("outputs-topk-0", "g.data[0].x.length")) == 5
    assert wait(browser, figure("outputs-topk-0", "g.data[0].colorbar.title.text")) == \
        "probability"
    choose(browser, "outputs-k", "2")
    assert wait(browser, figure("outputs-topk-0", "g.data[0].x.length === 2 ? 2 : null")) == 2
    assert wait(browser, figure("outputs-repeat", "g.data.length")) == 4
    screenshot(browser, shots, "outputs")


def test_induction_page(server, browser, store, shots):
    open_tab(browser, server, "Induction heads")
    panels = wait(browser, figure("heads-scores-0", "g.data.length"))
    assert panels == 4                                  # three detectors + the stripe
    cfg = store.get("tiny-mha").cfg
    shape = wait(browser, figure("heads-scores-0", "[g.data[0].y.length, g.data[0].x.length]"))
    assert shape == [cfg.n_layers, cfg.n_heads]
    assert wait(browser, figure("heads-scores-1", "g.data.length")) == 4     # second model
    bars = wait(browser, figure("heads-ablation", "g.data.map(t => t.name)"))
    assert bars == ["before", "after"]
    _click_label(browser, "heads-probe", "the prompt")
    assert wait(browser, figure("heads-scores-0", "g.data.length === 3 ? 3 : null")) == 3
    assert wait(browser, figure("heads-composition", "g.layout.coloraxis.cmid === 0"))
    note = wait(browser, "const e = document.getElementById('heads-training-note');"
                         "return e && e.innerText.length ? e.innerText : null")
    assert "no checkpoint directory" in note
    screenshot(browser, shots, "induction")


def test_circuits_page_and_its_deep_link(server, browser, shots):
    open_tab(browser, server, "Circuits")
    labels = wait(browser, figure("circuits-qk", "g.data[0].x"))
    assert labels == [c.replace(" ", "␣") for c in dict.fromkeys(DEFAULT)]   # first seen
    assert wait(browser, figure("circuits-qk", "g.data[0].zmid === 0"))
    choose(browser, "ctl-head", "2")
    title = wait(browser, figure("circuits-ov", "g.layout.title.text.includes('H2')"
                                                " ? g.layout.title.text : null"))
    assert title == "tiny-mha L0H2: full OV circuit"
    assert wait(browser, figure("circuits-composition", "g.data.length")) == 3    # Q, K, V
    screenshot(browser, shots, "circuits")
    link = server + "/" + make_link("circuits", ["tiny-dcmha"], 1, 3, "pattern", "abc")
    for _ in range(2):   # follow the link, then reload: the same view both times
        browser.get(link)
        title = wait(browser, figure("circuits-qk", "g.layout.title.text.includes('L1H3')"
                                                    " ? g.layout.title.text : null"))
        assert title == "tiny-dcmha L1H3: full QK circuit"
        assert wait(browser, figure("circuits-qk", "g.data[0].x")) == ["a", "b", "c"]
