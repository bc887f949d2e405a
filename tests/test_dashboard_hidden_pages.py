"""Only the page on show computes (issue 56 item 3, dashboards/visible.py): a shared control
change fires every page's callbacks in the browser; a hidden Compare, Explorer, Variants, Gating
or Diversity answers 204 (nothing computed, nothing sent), and a page whose tab comes back
computes only when its inputs changed while it was hidden."""

from __future__ import annotations

import pytest
from dashboard_common import ALPHABET, call, shared

from attnlens.dashboards.app import create_app
from attnlens.dashboards.store import ModelStore

from helpers import tiny_model

# the computing callbacks of the pages that used to compute while hidden: (output, page)
COMPUTING = [("compare-columns", "compare"), ("explorer-grid", "explorer"),
             ("explorer-stages", "explorer"),
             ("variants-body", "variants"), ("variants-change", "variants"),
             ("gating-gates", "gating"), ("diversity-graph", "diversity")]


@pytest.fixture(scope="module")
def app():
    store = ModelStore()
    for variant in ("mha", "infini"):
        store.add(f"tiny-{variant}", tiny_model(variant, tokenizer_alphabet=ALPHABET, n_ctx=48),
                  "the cat. the cat.")
    return create_app(store)


def _values(page, head=0, **more):
    return {**shared(["tiny-mha", "tiny-infini"], head=head, prompt="the cat sat."),
            "ctl-model.value": "tiny-infini", "compare-scale.value": "shared",
            "variants-view.value": "infini", "diversity-composed.value": [],
            "gating-text.value": "", "tabs.value": page, **more}


def _drawn(resp, page, output):
    key = next(k for k in resp["response"] if k.startswith(f"{page}-drawn"))
    assert output.split("-")[0] == page
    return resp["response"][key]["data"]


@pytest.mark.parametrize("output,page", COMPUTING)
def test_a_hidden_page_computes_nothing_on_a_control_change(app, output, page):
    status, _ = call(app, output, _values("tokens", head=1))
    assert status == 204, f"{output} computed while the tokens tab was shown"


@pytest.mark.parametrize("output,page", COMPUTING)
def test_a_page_shown_again_computes_only_if_its_inputs_changed(app, output, page):
    status, resp = call(app, output, _values(page))
    assert status == 200 and not any(v.get("children") for k, v in resp["response"].items()
                                     if k.endswith("-error"))
    drawn = _drawn(resp, page, output)
    state = {f"{k}.data": drawn for k in resp["response"] if k.startswith(f"{page}-drawn")}
    # back to the tab with the inputs it drew: nothing to do
    status, _ = call(app, output, _values(page, **state), changed="tabs.value")
    assert status == 204
    # back to the tab after the inputs changed while hidden (other models, prompt and head:
    # whichever of them the callback reads): it draws them
    changed = {**_values(page, head=1, **state), "ctl-models.value": ["tiny-infini", "tiny-mha"],
               "ctl-model.value": "tiny-mha", "ctl-applied-prompt.data": "a cat sat."}
    status, resp = call(app, output, changed, changed="tabs.value")
    assert status == 200 and _drawn(resp, page, output) != drawn
