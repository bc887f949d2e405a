"""A deep link to a variant's own stage restores it (issue 49): one link per variant and per
kind of stage (pre-softmax logits, row-stochastic softmax, post-softmax mixed map, side
quantities such as CoPE's gates), opened in headless Chromium on a store whose first model
(the page's default) lacks that stage; and a stage, layer or head a model lacks falls back to
the closest one with a note, never an empty figure."""

from __future__ import annotations

import pytest
from browser_common import figure, screenshot, wait
from dashboard_common import ALPHABET, call, shared
from tiers import EXTENDED

from attnlens.dashboards.app import make_link
from attnlens.dashboards.store import ModelStore
from attnlens.interp.tools.explore import map_stages

from helpers import tiny_model

VARIANTS = ("mha", "mta", "cope", "dcmha", "infini")
N_CTX = 48


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    for variant in VARIANTS:   # tiny-mha first: the default model has none of the others' stages
        extra = {"attn_cfg": {"segment_len": 8}} if variant == "infini" else {}
        if variant == "dcmha":   # a third layer: a link's layer 2 is a layer of the store
            extra = {"n_layers": 3}
        store.add(f"tiny-{variant}", tiny_model(variant, tokenizer_alphabet=ALPHABET,
                                                n_ctx=N_CTX, **extra), "the cat. the cat sat.")
    return store


@pytest.fixture(scope="module")
def app(store):
    from attnlens.dashboards.app import create_app

    return create_app(store)


def stage_kind(stage) -> str:
    if stage.softmax == "pre":
        return "pre"
    if stage.softmax == "neither":
        return "side"
    return "stochastic" if stage.row_stochastic else "mixed"


def links() -> list[tuple[str, str, str]]:
    """(model, stage, kind): one stage of each kind each variant has, the last layer."""
    out = []
    for variant in VARIANTS:
        model = tiny_model(variant, n_ctx=N_CTX, **({"n_layers": 3} if variant == "dcmha" else {}))
        seen = set()
        for stage in map_stages(model, model.cfg.n_layers - 1):
            kind = stage_kind(stage)
            if kind not in seen:
                seen.add(kind)
                out.append((f"tiny-{variant}", stage.name, kind))
    return out


LINKS = links()


def test_every_variant_and_stage_kind_is_walked():
    kinds = {(m, k) for m, _, k in LINKS}
    assert {k for _, k in kinds} == {"pre", "stochastic", "mixed", "side"}
    assert {m for m, _ in kinds} == {f"tiny-{v}" for v in VARIANTS}
    names = {s for _, s, _ in LINKS}
    assert {"probs", "gates", "softmax"} <= names


def link_cases() -> list:
    """LINKS as cases: each variant's first stage in make test, the rest in make
    test-extended (tests/tiers.py)."""
    first = {}
    for name, stage, _ in LINKS:
        first.setdefault(name, stage)
    return [pytest.param(name, stage, kind, id=f"{name}-{stage}",
                         marks=() if first[name] == stage else EXTENDED)
            for name, stage, kind in LINKS]


@pytest.mark.browser
@pytest.mark.parametrize("name, stage, kind", link_cases())
def test_deep_link_to_a_stage_restores_it(browser, server, shots, store, name, stage, kind):
    model = store.get(name)
    layer, head = model.cfg.n_layers - 1, model.cfg.n_heads - 1
    browser.get(server + "/" + make_link("explorer", [name], layer, head, stage, ""))
    wait(browser, figure("explorer-zoom", "g.data[0].x.length"))
    state = browser.execute_script(
        "const v = id => { const e = document.getElementById(id);"
        "  return e ? e.innerText.trim() : null; };"
        "return {stage: v('ctl-stage'), layer: v('ctl-layer'), head: v('ctl-head'),"
        "        error: v('explorer-error'), note: v('explorer-note')};")
    assert state["stage"] == stage and state["layer"] == str(layer) \
        and state["head"] == str(head), state
    assert state["error"] == "" and "closest" not in (state["note"] or ""), state
    title = browser.execute_script(
        "return document.querySelector('#explorer-zoom .js-plotly-plot').layout.title.text")
    assert title == f"{name} L{layer}H{head} hook_{stage}"
    n = store.prompt(name, "").tokens.shape[1]
    # z arrives as a typed-array spec ({dtype, bdata, shape}); plotly's full data holds the rows
    size = browser.execute_script(figure(
        "explorer-zoom", "[g.data[0].type, g.data[0].y.length, g.data[0].x.length,"
                         " g._fullData[0].z.length, g._fullData[0].z[0].length]"))
    assert size == ["heatmap", n, n, n, n], size
    screenshot(browser, shots, f"stage-link-{name}-{stage}")


@pytest.mark.browser
def test_a_link_to_a_stage_the_model_lacks_falls_back_and_says_so(browser, server, shots):
    browser.get(server + "/" + make_link("explorer", ["tiny-mha"], 2, 1, "probs", ""))
    wait(browser, figure("explorer-zoom", "g.data[0].x.length"))
    note = wait(browser, "const e = document.getElementById('explorer-note');"
                         "return e && e.innerText.includes('closest') ? e.innerText : null;")
    assert "tiny-mha has no hook_probs" in note and "no layer 2" in note, note
    assert browser.execute_script("return document.getElementById('explorer-error').innerText"
                                  ) == ""
    title = browser.execute_script(
        "return document.querySelector('#explorer-zoom .js-plotly-plot').layout.title.text")
    assert title == "tiny-mha L1H1 hook_pattern"
    screenshot(browser, shots, "stage-link-fallback")


PAGES = {"explorer": "explorer-grid", "compare": "compare-columns", "tokens": "tokens-text",
         "heads": "heads-scores"}
CASES = [(0, 0, "probs", "has no hook_probs"), (0, 0, None, "stage None"),
         (9, 0, "pattern", "no layer 9"), (0, 7, "pattern", "no head 7"),
         ("1; drop", 0, "pattern", "layer '1; drop'")]
# the Induction page takes the stage only (it scores every layer and head)
FALLBACKS = [(page, *case) for page in PAGES for case in CASES
             if page != "heads" or case[:2] == (0, 0)]


@pytest.mark.parametrize("page, layer, head, stage, said", FALLBACKS)
def test_a_page_that_takes_a_stage_falls_back_with_a_note(app, page, layer, head, stage, said):
    output = PAGES[page]
    models = ["tiny-mha", "tiny-cope"] if page == "compare" else ["tiny-mha"]
    values = {"tabs.value": page, **shared(models, layer, head, stage),
              "ctl-model.value": "tiny-mha", "heads-half.value": 6, "heads-probe.value": "random",
              "heads-rank-by.value": "induction",
              "tokens-token.value": None, "tokens-mode.value": "head",
              "tokens-direction.value": "from", "compare-scale.value": "shared"}
    status, resp = call(app, output, values)
    assert status == 200, resp
    out = resp["response"]
    texts = " ".join(str(v.get("children", "")) for v in out.values() if isinstance(v, dict))
    assert said in texts, texts[:2000]
    drawn = out[output].get("children", out[output].get("figure"))
    assert drawn, f"{page}: nothing drawn for layer={layer!r} head={head!r} stage={stage!r}"
