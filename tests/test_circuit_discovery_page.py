"""dashboards/pages/circuits_auto.py (issue 25): the circuit discovery page's computation and
callbacks, without a browser (tests/test_dashboard_browser_zoo.py and _text.py open it in
Chromium on every model they test)."""

from __future__ import annotations

import pytest
from dash import Dash

from attnlens.dashboards.pages import circuits_auto
from attnlens.dashboards.store import ModelStore


@pytest.fixture(scope="module")
def store():
    from attnlens.hooked_models import zoo

    store = ModelStore()
    store.add("induction-mha", zoo.load("induction-mha"), "abcabc")
    return store


def test_circuit_view(store):
    fig, note, links, stem = circuits_auto.circuit_view(store, ["induction-mha"], "eap-ig",
                                                        top_k=20, prompts=6)
    assert len(fig.data) > 10 and "faithfulness" in note and stem.startswith("induction-mha")
    assert fig.layout.width is None and fig.layout.autosize   # fits the page, however deep
    assert "[L0H1](?page=explorer&models=induction-mha&layer=0&head=1)" in links


def test_circuit_view_refuses_bad_values(store):
    with pytest.raises(ValueError, match="prompts"):
        circuits_auto.circuit_view(store, ["induction-mha"], prompts=0)
    with pytest.raises(ValueError, match="method"):
        circuits_auto.circuit_view(store, ["induction-mha"], method="acdc")


def test_layout_and_callbacks_register(store):
    app = Dash(__name__)
    app.layout = circuits_auto.layout(store)
    circuits_auto.register(app, store)
    assert any("circuitsauto-graph" in key for key in app.callback_map)
