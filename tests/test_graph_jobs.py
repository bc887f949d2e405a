"""The dashboard's background job queue (dashboards/jobs.py) and the attribution-graph page's
budget (issue 55, item 2): long graphs run in the background with progress and a cancel, a
request over the server's budget gets a message, and the empty prompt (the model's long
default text) is graphed within the budget."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from dashboard_common import ALPHABET, call

from attnlens.dashboards import jobs as jobs_module
from attnlens.dashboards.jobs import Busy, JobRunner
from attnlens.dashboards.pages import graph as page
from attnlens.dashboards.store import ModelStore
from attnlens.interp.attribution import budget as budget_module
from attnlens.interp.attribution.budget import AttributionBudget
from attnlens.interp.sae.transcoder import Transcoder, TranscoderConfig
from attnlens.interp.sae.transcoder_train import save_transcoders

from helpers import tiny_model


def _until(job, states, timeout=10):
    end = time.monotonic() + timeout
    while job.state not in states:
        assert time.monotonic() < end, job.state
        time.sleep(0.01)


def test_a_job_runs_reports_progress_and_is_found_by_key():
    jobs = JobRunner()

    def work(progress):
        for i in range(5):
            progress(i + 1, 5)
        return "graph"
    job = jobs.submit("k", work)
    assert jobs.wait("k", timeout=10).result == "graph" and job.state == "done"
    assert (job.done, job.total) == (5, 5) and job.describe() == "done"
    assert jobs.submit("k", work) is job                    # the same key is the same job


def test_a_running_job_is_cancelled_at_its_next_step_and_the_queue_moves_on():
    jobs = JobRunner()
    started = threading.Event()

    def endless(progress):
        started.set()
        while True:
            progress(1, 10)
            time.sleep(0.01)
    running = jobs.submit("long", endless)
    jobs.submit("next", lambda progress: "ran")
    assert started.wait(10) and running.state == "running"
    assert "computing 1 / 10 rows (10%)" in running.describe()
    assert jobs.cancel("long")
    assert jobs.wait("long", timeout=10).state == "cancelled"
    assert jobs.wait("next", timeout=10).result == "ran"
    assert not jobs.cancel("long") and not jobs.cancel("nothing")
    # a cancelled job is computed afresh when asked again
    again = jobs.submit("long", lambda progress: "second try")
    assert again is not running and jobs.wait("long", timeout=10).result == "second try"


def test_a_queued_job_cancelled_never_runs_and_a_full_queue_says_busy():
    jobs = JobRunner(max_queued=1)
    gate, ran = threading.Event(), []
    blocker = jobs.submit("block", lambda progress: gate.wait(10))
    _until(blocker, ("running",))
    jobs.submit("waiting", lambda progress: ran.append(1))
    with pytest.raises(Busy, match="the server is busy: 1 graphs are waiting"):
        jobs.submit("third", lambda progress: None)
    assert jobs.cancel("waiting") and jobs.get("waiting").state == "cancelled"
    gate.set()
    assert jobs.wait("block", timeout=10).state == "done"
    jobs.submit("after", lambda progress: "ok")
    assert jobs.wait("after", timeout=10).result == "ok" and ran == []


@pytest.mark.parametrize("error, message", [
    (ValueError("the graph does not fit"), "failed: the graph does not fit"),
    (MemoryError(), "failed: out of memory (lower the budget or shorten the prompt)"),
    (RuntimeError("boom"), "failed: RuntimeError: boom"),
])
def test_errors_become_the_jobs_message_and_the_worker_lives_on(error, message):
    jobs = JobRunner()

    def fail(progress):
        raise error
    jobs.submit("bad", fail)
    assert jobs.wait("bad", timeout=10).describe() == message
    jobs.submit("good", lambda progress: 1)
    assert jobs.wait("good", timeout=10).result == 1


def test_only_the_last_finished_jobs_are_kept():
    jobs = JobRunner(keep=2)
    for key in "abcd":
        jobs.submit(key, lambda progress, key=key: key)
        jobs.wait(key, timeout=10)
    jobs.submit("e", lambda progress: "e")
    jobs.wait("e", timeout=10)
    kept = [k for k in "abcde" if jobs.get(k) is not None]
    assert kept == ["d", "e"]


# the page ----------------------------------------------------------------------------------

LONG = ("the cat sat on the mat. " * 20)[:480]          # the default text: 481 tokens with BOS


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = ModelStore()
    model = tiny_model("mha", tokenizer_alphabet=ALPHABET, n_ctx=512, d_mlp=64)
    directory = tmp_path_factory.mktemp("tiny-long")
    d = model.cfg.d_model
    save_transcoders({layer: Transcoder(TranscoderConfig(d_in=d, d_sae=64, d_out=d,
                                                         activation="topk", k=4, layer=layer),
                                        seed=layer) for layer in range(model.cfg.n_layers)},
                     directory / "transcoders")
    store.add("tiny-long", model, LONG, directory)
    return store


@pytest.fixture(scope="module")
def app(store):
    from attnlens.dashboards.app import create_app

    return create_app(store)


GRAPH = {"tabs.value": "graph", "ctl-model.value": "tiny-long", "ctl-applied-prompt.data": "",
         "graph-target.value": "", "graph-node-threshold.value": 0.8,
         "graph-edge-threshold.value": 0.98, "graph-max-edges.value": 400}


@pytest.fixture
def small_budget(monkeypatch):
    """A server budget of 40 features (the tiny model has 8 per token) and a fresh queue."""
    monkeypatch.setattr(page, "SERVER_BUDGET", AttributionBudget(max_feature_nodes=40))
    monkeypatch.setattr(page, "JOBS", JobRunner(max_queued=2, keep=2))


def _respond(app, values, changed=None):
    status, resp = call(app, "graph-figure", {**GRAPH, **values}, changed=changed)
    assert status == 200
    return resp["response"]


def test_the_empty_prompt_is_graphed_in_the_background_within_budget(app, store,
                                                                      small_budget):
    first = _respond(app, {})
    assert first["graph-poll"]["disabled"] is False
    assert first["graph-progress"]["children"].startswith("481-token prompt: ")
    assert first["graph-job"]["style"]["display"] == "block"
    job = page.JOBS.wait(next(iter(page.JOBS._jobs)), timeout=170)
    assert job.state == "done", job.describe()
    done = _respond(app, {"graph-poll.n_intervals": 1}, changed="graph-poll.n_intervals")
    assert done["graph-poll"]["disabled"] is True and done["graph-error"]["children"] == ""
    note = done["graph-note"]["children"]
    assert "40 in the graph" in note and "left out" in note, note
    g = job.result
    assert g.n_features == 40 and g.budget.n_active > 40 and g.adjacency.dtype == torch.float32
    assert g.n_pos == 481


def test_a_request_over_the_servers_budget_gets_a_message(app, small_budget, monkeypatch):
    """A graph the server's memory budget cannot hold is refused before any row, and the
    page shows why (the server stays up); so is a request when the queue is full."""
    monkeypatch.setattr(budget_module, "copy_bytes", lambda *a: 3 * 10**9)
    _respond(app, {})
    job = page.JOBS.wait(next(iter(page.JOBS._jobs)), timeout=60)
    assert job.state == "failed"
    failed = _respond(app, {"graph-poll.n_intervals": 1}, changed="graph-poll.n_intervals")
    assert "does not fit the memory budget of 2.00 GB" in failed["graph-error"]["children"]
    assert failed["graph-poll"]["disabled"] is True
    monkeypatch.setattr(page, "JOBS", JobRunner(max_queued=0))
    busy = _respond(app, {"graph-target.value": "a"})
    assert busy["graph-error"]["children"].startswith("the server is busy")


def test_a_long_graph_can_be_cancelled(app, small_budget, monkeypatch):
    gate = threading.Event()
    real = page.GraphRequest.make

    def slow(self, name, callback=None):
        def wait_then(done, total):
            gate.wait(10)
            callback(done, total)
        return real(self, name, callback=wait_then)
    monkeypatch.setattr(page.GraphRequest, "make", slow)
    _respond(app, {"graph-target.value": "t"})
    job = next(iter(page.JOBS._jobs.values()))
    _until(job, ("running",))
    cancelled = _respond(app, {"graph-target.value": "t", "graph-cancel.n_clicks": 1},
                         changed="graph-cancel.n_clicks")
    assert cancelled["graph-note"]["children"].startswith("graph cancelled")
    assert cancelled["graph-poll"]["disabled"] is True
    gate.set()
    assert page.JOBS.wait(job.key, timeout=30).state == "cancelled"
    # a click on a node of a graph still computing names the wait, not a 500
    status, resp = call(app, "graph-node", {**GRAPH, "graph-target.value": "t",
                                            "graph-figure.clickData": {
                                                "points": [{"customdata": 0}]}},
                        changed="graph-figure.clickData")
    assert status == 200 and "computed in the background" in str(resp["response"])
    assert jobs_module.CANCELLED == "cancelled"
