"""Deep links hold the pages' own controls too (Outputs top-k and start, Induction probe and
knock-out, Circuits kind and query / key positions): callback tests through HTTP, and one
headless-Chromium test that follows such a link and reads the restored figure."""

from urllib.parse import parse_qs

import pytest
from browser_common import choose, figure, wait
from dash import no_update
from dashboard_common import ALPHABET, call, layout_props, shared, view_link

from attnlens.dashboards.app import PAGE_LINKS, _parse_link, create_app, make_link
from attnlens.dashboards.pages import PAGES
from attnlens.dashboards.store import ModelStore

from helpers import tiny_model

SHARED = {"tabs.value": "explorer", "ctl-models.value": ["tiny-mha"],
          "ctl-applied-prompt.data": "", "ctl-layer.value": 0, "ctl-head.value": 0,
          "ctl-stage.value": "pattern"}


@pytest.fixture(scope="module")
def store():
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48), "the cat. the cat.")
    store.add("tiny-mta", tiny_model("mta", tokenizer_alphabet=ALPHABET, n_ctx=48),
              "abc abc abc")
    return store


@pytest.fixture(scope="module")
def app(store):
    return create_app(store)


def _controls_now(**changed) -> dict:
    """Every linked control's component value: the layout defaults, `changed` by URL key."""
    values = {f"{cid}.value": default for cid, default in PAGE_LINKS.values()}
    for key, value in changed.items():
        values[f"{PAGE_LINKS[key][0]}.value"] = value
    return values


def test_every_page_control_is_linked_with_its_layout_default():
    assert set(PAGE_LINKS) == {"k", "start", "probe", "half", "ablate_at", "ablate_how",
                               "ablate_score", "ablate_head", "circuit", "query", "key",
                               "scale", "mode", "direction", "rank_by"}
    layout = {}
    store = ModelStore()
    store.add("tiny-mha", tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=48), "ab")
    for page in PAGES:
        layout_props(page.layout(store), layout)
    for cid, default in PAGE_LINKS.values():
        assert layout[f"{cid}.value"] == default, cid


def test_link_round_trip_leaves_defaults_out():
    link = make_link("circuits", ["tiny-mta"], 1, 2, "pattern", "abc",
                     controls={"circuit": "pair", "query": 3, "key": 1, "k": 5, "half": None})
    query = parse_qs(link.lstrip("?"))
    assert "k" not in query and "half" not in query          # default / emptied: left out
    assert _parse_link(link) == {"page": "circuits", "models": ["tiny-mta"], "layer": 1,
                                 "head": 2, "stage": "pattern", "prompt": "abc",
                                 "circuit": "pair", "query": 3, "key": 1}
    assert _parse_link("?query=-1&probe=text")["query"] == "-1"   # left for the page to refuse
    with pytest.raises(ValueError, match="'colour' is not a linked control"):
        make_link("outputs", [], 0, 0, "pattern", "", controls={"colour": "red"})


def _sync(app, search, changed="url.search", **controls):
    values = {"url.search": search, **SHARED, **_controls_now(**controls)}
    _, resp = (call(app, "url.search", values, changed=changed) if changed == "url.search"
               else view_link(app, values, changed))
    return resp.get("response", {})


def test_link_restores_page_controls_and_controls_update_the_link(app):
    out = _sync(app, "?page=heads&models=tiny-mta&probe=text&half=6&ablate_at=pattern"
                     "&ablate_how=mean&ablate_score=previous_token&k=3&start=2"
                     "&circuit=pair&query=3&key=1&scale=per+model&ablate_head=L1H2"
                     "&mode=mean&direction=to&rank_by=previous_token")
    assert out["tabs"]["value"] == "heads"
    restored = {key: out[cid]["value"] for key, (cid, _) in PAGE_LINKS.items()}
    assert restored == {"probe": "text", "half": 6, "ablate_at": "pattern", "ablate_how": "mean",
                        "ablate_score": "previous_token", "k": 3, "start": 2,
                        "circuit": "pair", "query": 3, "key": 1, "scale": "per model",
                        "ablate_head": "L1H2", "mode": "mean", "direction": "to",
                        "rank_by": "previous_token"}
    # a control changes: the link follows (and keeps the shared controls)
    out = _sync(app, "?page=explorer", changed="circuits-query.value", circuit="pair", query=4)
    link = _parse_link(out["url"]["search"])
    assert link["circuit"] == "pair" and link["query"] == 4 and "key" not in link
    assert link["models"] == ["tiny-mha"] and link["page"] == "explorer"


def test_old_links_leave_page_controls_alone(app):
    out = _sync(app, "?page=circuits&models=tiny-mha&layer=1", circuit="composed")
    assert out["tabs"]["value"] == "circuits" and out["ctl-layer"]["value"] == 1
    for cid, _ in PAGE_LINKS.values():
        assert out.get(cid, {}).get("value", no_update) is no_update


def test_restored_values_drive_the_pages(app):
    """The values a link restores are what the pages compute with (and bad ones are named)."""
    values = {**shared(["tiny-mta"], layer=1, head=2, prompt="abcab"), "tabs.value": "circuits",
              **_controls_now(circuit="pair", query=3, key=1)}
    _, resp = call(app, "circuits-qk", values)
    out = resp["response"]
    assert out["circuits-error"]["children"] == ""
    assert out["circuits-qk"]["figure"]["layout"]["title"]["text"].endswith(
        "at query 3, key 1")
    values = {**values, "tabs.value": "outputs", **_controls_now(k=3)}
    _, resp = call(app, "outputs-loss", values)
    titles = str(resp["response"]["outputs-topk"]["children"])
    assert "top 3 predictions" in titles
    values = {**values, "tabs.value": "circuits", **_controls_now(circuit="pair", query="-1")}
    _, resp = call(app, "circuits-qk", values)
    assert "query position" in resp["response"]["circuits-error"]["children"]


def test_knock_out_point_falls_back_to_the_link(app, store):
    """A linked knock-out point the dropdown dropped (not among its options yet) comes back
    from the link once the linked model's points are known; one the model lacks gives "z"."""
    values = {"ctl-models.value": ["tiny-mta"], "heads-ablate-at.value": None,
              "url.search": "?page=heads&ablate_at=softmax"}
    _, resp = call(app, "heads-ablate-at", values)
    assert resp["response"]["heads-ablate-at"]["value"] == "softmax"
    _, resp = call(app, "heads-ablate-at", {**values, "ctl-models.value": ["tiny-mha"]})
    assert resp["response"]["heads-ablate-at"]["value"] == "z"
    from attnlens.dashboards.pages.heads import _all_points
    assert {"z", "v", "softmax", "pattern"} <= set(_all_points(store))



def test_link_round_trip_keeps_the_one_model_pages_model():
    """Issue 56 item 2: the one-model pages' model travels in the link (`model=`), unless it is
    the first chosen model, which it follows."""
    link = make_link("variants", ["tiny-mha"], 0, 0, "pattern", "", model="tiny-mta")
    assert _parse_link(link)["model"] == "tiny-mta"
    assert "model=" not in make_link("variants", ["tiny-mta"], 0, 0, "pattern", "",
                                     model="tiny-mta")


def test_one_model_pages_model_is_linked_and_restored(app):
    # controls -> URL: another model picked for the one-model pages joins the link
    values = {"url.search": "?page=variants&models=tiny-mha", **SHARED, **_controls_now(),
              "tabs.value": "variants", "ctl-model.value": "tiny-mta"}
    _, resp = view_link(app, values, changed="ctl-model.value")
    link = _parse_link(resp["response"]["url"]["search"])
    assert link["model"] == "tiny-mta" and link["models"] == ["tiny-mha"]
    # URL -> controls: the link restores it beside the models
    out = _sync(app, "?page=variants&models=tiny-mha&model=tiny-mta")
    assert out["ctl-model"]["value"] == "tiny-mta" and out["tabs"]["value"] == "variants"
    # a link without `model=` (older links): the model follows the link's first model
    values = {**values, "url.search": "?page=variants&models=tiny-mta",
              "ctl-model.value": "tiny-mha"}
    _, resp = call(app, "url.search", values, changed="url.search")
    assert resp["response"]["ctl-model"]["value"] == "tiny-mta"
    # the models change: the one-model pages follow the first, and the link drops `model=`
    values = {**values, "ctl-models.value": ["tiny-mta"], "ctl-model.value": "tiny-mha"}
    _, resp = view_link(app, values, changed="ctl-models.value")
    out = resp["response"]
    assert out["ctl-model"]["value"] == "tiny-mta"
    assert "model" not in _parse_link(out["url"]["search"])

@pytest.mark.browser
def test_browser_follows_a_link_with_page_controls(server, browser):
    browser.get(f"{server}/?page=circuits&models=tiny-mta&layer=1&head=2&prompt=abcab"
                "&circuit=pair&query=3&key=1")
    title = wait(browser, figure("circuits-qk", "g.layout.title.text"))
    assert title == "tiny-mta L1H2: composed full QK circuit at query 3, key 1"
    assert browser.find_element(
        "css selector", "#circuits-kind input[value='pair']").is_selected()
    assert browser.find_element("id", "circuits-query").get_attribute("value") == "3"
    assert "circuit=pair" in browser.current_url and "query=3" in browser.current_url
    browser.get(f"{server}/?page=outputs&models=tiny-mha&k=2")
    title = wait(browser, figure("outputs-topk-0", "g.layout.title.text"))
    assert title.startswith("tiny-mha: top 2 predictions")
    # the knock-out point is a stage of the linked model (its options follow the model)
    browser.get(f"{server}/?page=heads&models=tiny-mta&ablate_head=L1H3&ablate_at=softmax"
                "&ablate_how=mean&ablate_score=previous_token&half=6")
    title = wait(browser, figure("heads-ablation", "g.layout.title.text"))
    assert title.startswith("tiny-mta: L1H3 set to its mean at hook_softmax; previous_token"), \
        browser.current_url



@pytest.mark.browser
def test_browser_reopens_a_link_on_its_one_model_pages_model(server, browser):
    """Issue 56 item 2: Variants on the second model, reopened from its link, is Variants on that
    model again (it reopened on the first model: "nothing for the cope view")."""
    browser.get(f"{server}/?page=variants&models=tiny-mha")
    wait(browser, "return document.querySelector('#ctl-model') && document.querySelector("
                  "'#ctl-model').innerText.includes('tiny-mha')")
    choose(browser, "ctl-model", "tiny-mta")
    link = wait(browser, "return location.search.includes('model=tiny-mta') && location.href")
    browser.get(link)
    wait(browser, "const m = document.querySelector('#ctl-model');"
                  "return m && m.innerText.includes('tiny-mta')"
                  " && document.querySelector('#variants-body .js-plotly-plot') !== null")
    assert browser.find_element("id", "variants-error").text == ""
    assert "models=tiny-mha" in browser.current_url
