"""The explorer's head change in the browser (issue 56 item 3; timed by
`attnlens.benchmarks.browser`, not here): what a change waits for and what it sends."""

from __future__ import annotations

import pytest
from dashboard_common import ALPHABET

from attnlens.dashboards.app import create_app
from attnlens.dashboards.store import ModelStore

from helpers import tiny_model

CONTROLS = ("ctl-models.value", "ctl-applied-prompt.data", "ctl-layer.value", "ctl-head.value",
            "ctl-stage.value", "tabs.value")


@pytest.fixture(scope="module")
def app():
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48), "the cat.")
    return create_app(store)


def _ids(deps) -> set[str]:
    return {f"{d['id']}.{d['property']}" for d in deps}


def _outputs(key: str) -> set[str]:
    return {o.split("@")[0] for o in key.strip(".").split("...")}


def test_no_callback_fired_by_a_control_holds_back_the_explorer(app):
    """dash-renderer holds a callback back while another pending one outputs one of its
    inputs: a head change waited for the URL callback (it output every control) before the
    explorer's request left. No callback fired by a shared control outputs a control the
    explorer's zoom reads, except the explorer's own."""
    zoom = next(cb for k, cb in app.callback_map.items()
                if "explorer-zoom.figure" in _outputs(k) and "ctl-head.value" in _ids(cb["inputs"]))
    reads = _ids(zoom["inputs"])
    for key, cb in app.callback_map.items():
        if cb is zoom or not _ids(cb["inputs"]) & set(CONTROLS):
            continue
        blocks = _outputs(key) & reads
        assert not blocks, f"{key} (fired by a control) outputs {blocks}, read by the zoom"


def test_the_stage_views_are_requested_once_the_zoomed_map_has_arrived(app):
    """The explorer's stage views and its zoomed map were requested together; the stage views'
    smaller response came first and the browser drew them before the map. Their callback now
    reads no control as an input (only as state): the browser's note of the zoom's arrival,
    written by a clientside callback of the zoom's figure, fires it."""
    stages = next(cb for k, cb in app.callback_map.items()
                  if "explorer-stages.children" in _outputs(k))
    assert not _ids(stages["inputs"]) & (set(CONTROLS) - {"tabs.value"})
    assert "explorer-zoom-arrived.data" in _ids(stages["inputs"])
    assert set(CONTROLS[:4]) <= _ids(stages["state"])
    cue = next(cb for cb in app._callback_list if cb["output"] == "explorer-zoom-arrived.data")
    assert _ids(cue["inputs"]) == {"explorer-zoom.figure"} and "clientside_function" in cue


def test_the_dashboard_benchmarks_share_one_command_line():
    """`explorer`, `pages` and `browser` take one command line (`dashboard_parser`, each with
    its own defaults) and print one header (`dashboard_header`): shape, machine, load."""
    from attnlens.benchmarks.explorer import dashboard_header, dashboard_parser

    args = dashboard_parser("x\nmore", variants="mha", layers=2).parse_args(["--tokens", "40"])
    assert (args.variants, args.tokens, args.layers, args.heads, args.repeats) == \
        ("mha", 40, 2, 8, 15)
    head = dashboard_header("the explorer", args, 1.5)
    assert head.startswith("# the explorer (40 tokens, 2 layers x 8 heads, d_model 256)\n\n")
    assert "load average 1.5 before" in head and "a shared machine" in head
