"""attnlens.lab.run_progress: a run's step, CPU time and the time left at its recent pace."""

from __future__ import annotations

import json

import pytest

from attnlens.lab.run_progress import describe, progress, recent_pace
from attnlens.training.train_state import STATE_FILE
from tests.test_trainer import run


def write_log(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_recent_pace_is_the_median_of_plain_steps_up_to_the_checkpoint(tmp_path):
    log = tmp_path / "metrics.jsonl"
    records = [{"step": 1, "tokens_per_s": 5.0}]                       # compile: left out
    records += [{"step": s, "tokens_per_s": 100.0 + s} for s in range(2, 10)]
    records += [{"step": 10, "tokens_per_s": 1.0, "val_loss": 3.0},   # an evaluation ...
                {"step": 11, "tokens_per_s": 2.0},                     # ... charged to step 11
                {"step": 12, "tokens_per_s": 300.0}, {"step": 13, "tokens_per_s": 9999.0}]
    write_log(log, records)
    # steps 2..9 and 12 (13 is after the checkpoint at 12): median of 102..109, 300
    assert recent_pace(log, up_to_step=12) == 106.0
    assert recent_pace(log, up_to_step=12, window=3) == 109.0   # 108, 109, 300
    assert recent_pace(tmp_path / "none.jsonl", 12) is None
    assert recent_pace(log, 12, clock="cpu") is None   # a log without CPU times
    with pytest.raises(ValueError, match="clock must be one of"):
        recent_pace(log, 12, clock="gpu")


def test_the_projection_is_in_cpu_hours_where_the_log_has_cpu_times(tmp_path):
    """On a shared machine the wall pace halves when another job runs; the CPU pace does not,
    so the projection is read from it where the trainer recorded it."""
    run(tmp_path, steps=6, checkpoint_every=3)
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tokens_per_cpu_s"] > 0 for r in records)   # the trainer records it
    ckpt = tmp_path / (tmp_path / "latest").read_text()
    state = json.loads((ckpt / STATE_FILE).read_text())
    state["train_config"]["steps"] = 12
    (ckpt / STATE_FILE).write_text(json.dumps(state))
    write_log(tmp_path / "metrics.jsonl",   # busy machine: half the wall pace
              [{"step": s, "tokens": 48 * s, "tokens_per_s": 24.0, "tokens_per_cpu_s": 48.0}
               for s in range(1, 7)])
    p = progress(tmp_path)
    assert (p["clock"], p["tokens_per_s"]) == ("cpu", 48.0)
    assert p["left_h"] == pytest.approx(round(6 * 48 / 48.0 / 3600, 2))
    assert "; about 0.00 CPU-h left at 48 tokens per CPU-second)" in describe(p)


def test_progress_of_a_real_run_and_its_projection(tmp_path):
    run(tmp_path, steps=6, checkpoint_every=3)
    p = progress(tmp_path)
    assert (p["step"], p["of"], p["tokens"]) == (6, 6, 6 * 48)
    assert p["cpu_h"] is not None and p["cpu_h"] >= 0 and p["left_h"] == 0.0
    assert p["longer_context_ahead"] is False
    # half-way, with a curriculum ahead: a lower bound, and the text says so
    ckpt = tmp_path / (tmp_path / "latest").read_text()
    state = json.loads((ckpt / STATE_FILE).read_text())
    state["train_config"]["steps"] = 12
    (ckpt / STATE_FILE).write_text(json.dumps(state))
    card = json.loads((ckpt / "card.json").read_text())
    (ckpt / "card.json").write_text(json.dumps({**card, "ctx_schedule": [[8, 6]]}))
    write_log(tmp_path / "metrics.jsonl",
              [{"step": s, "tokens": 48 * s, "tokens_per_s": 48.0} for s in range(1, 7)])
    p = progress(tmp_path)
    assert (p["clock"], p["tokens_per_s"]) == ("wall", 48.0)   # an older log: wall pace
    assert p["left_h"] == pytest.approx(round(6 * 48 / 48.0 / 3600, 2))
    assert p["longer_context_ahead"] is True
    assert "at least" in describe(p) and "longer contexts ahead" in describe(p)
    assert describe(p).startswith("step 6 of 12 (0.0M tokens, ")
    p["longer_context_ahead"] = False   # an early-stopping run: the steps are a ceiling
    assert describe(p, ceiling=True).startswith("step 6 of at most 12 (")
    assert ("; at most 0.00 h left at 48 tokens per wall-second, early stopping)"
            in describe(p, ceiling=True))


def test_a_run_without_a_checkpoint_is_at_step_zero(tmp_path):
    assert progress(tmp_path) == {"step": 0, "of": None, "tokens": 0, "cpu_h": None,
                                  "tokens_per_s": None, "clock": None, "left_h": None,
                                  "longer_context_ahead": False, "left_range": None}
