"""20 concurrent mixed requests (pages, models, heads, stages, prompts) are each answered exactly
as when sent alone: per-model locks, the shared map cache and memoised figures do not leak one
request's maps into another's answer."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from dashboard_common import ALPHABET, call

from attnlens.dashboards.app import create_app
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.store import ModelStore

from helpers import tiny_model


@pytest.fixture(scope="module")
def app():
    store = ModelStore()
    for v in ("mha", "mta", "cope"):
        store.add(f"tiny-{v}", tiny_model(v, tokenizer_alphabet=ALPHABET, n_ctx=48),
                  "the cat. the cat.")
    return create_app(store)


def explorer(model, layer, head, stage, prompt):
    return ("explorer-grid", {"ctl-models.value": [model], "ctl-applied-prompt.data": prompt,
                              "ctl-layer.value": layer, "ctl-head.value": head,
                              "ctl-stage.value": stage, "explorer-format.value": "png"})


def compare(models, layer, head, stage, prompt):
    return ("compare-columns", {"ctl-models.value": models, "ctl-applied-prompt.data": prompt,
                                "ctl-layer.value": layer, "ctl-head.value": head,
                                "ctl-stage.value": stage})


def variant(model, view, layer, head, prompt):
    return ("variants-body", {"ctl-model.value": model, "variants-view.value": view,
                              "ctl-applied-prompt.data": prompt, "ctl-layer.value": layer,
                              "ctl-head.value": head})


REQUESTS = [
    explorer("tiny-mha", 0, 0, "pattern", "abcab"),
    explorer("tiny-mha", 1, 3, "pattern", "abcab"),
    explorer("tiny-mha", 1, 2, "attn_scores", "the dog"),
    explorer("tiny-mta", 0, 1, "softmax", "abcab"),
    explorer("tiny-mta", 1, 3, "pattern", "abcabc"),
    explorer("tiny-mta", 1, 0, "post_sm_conv", ""),
    explorer("tiny-cope", 0, 2, "gates", "a.b.c.d"),
    explorer("tiny-cope", 1, 1, "pattern", "abcab"),
    explorer("tiny-cope", 1, 9, "pattern", "abcab"),                # bad head: a message
    compare(["tiny-mha", "tiny-mta"], 1, 1, "softmax", "abcab"),
    compare(["tiny-mta", "tiny-cope"], 0, 3, "pattern", "the cat"),
    compare(["tiny-mha", "tiny-cope", "tiny-mta"], 1, 2, "pattern", ""),
    variant("tiny-cope", "cope", 1, 2, "a.b. c.d."),
    variant("tiny-cope", "cope", 0, 0, ""),
    variant("tiny-mta", "mta", 1, 1, "abcab"),
    variant("tiny-mta", "dcmha", 0, 2, "abcab"),
    variant("tiny-mha", "cope", 0, 0, ""),                          # another variant: message
    ("gating-gates", {"ctl-model.value": "tiny-mta", "gating-text.value": "abcab"}),
    ("diversity-graph", {"ctl-model.value": "tiny-cope", "diversity-composed.value": []}),
    explorer("tiny-mha", 0, 2, "pattern", "xyz xyz"),
]


def test_twenty_concurrent_mixed_requests_answer_as_alone(app):
    assert len(REQUESTS) == 20
    MAP_CACHE.clear()
    alone = [call(app, prefix, values) for prefix, values in REQUESTS]
    assert all(status == 200 for status, _ in alone)
    for rounds in range(2):          # with the cache full (round 0) and empty (round 1)
        if rounds:
            MAP_CACHE.clear()
        with ThreadPoolExecutor(max_workers=20) as pool:
            together = list(pool.map(lambda r: call(app, *r), REQUESTS))
        for (prefix, values), a, b in zip(REQUESTS, alone, together, strict=True):
            assert a == b, f"{prefix} {values} answered differently under concurrency"
