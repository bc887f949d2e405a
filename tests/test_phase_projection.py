"""attnlens.lab.phase_projection: the time a run's longer-context phases should take, bounded by
the slowdown that finished runs of the same schedule beside it measured."""

from __future__ import annotations

import json

from attnlens.lab.phase_projection import later_phases_range, phase_paces, phases
from attnlens.lab.run_progress import describe, progress
from attnlens.training.train_state import STATE_FILE
from tests.test_trainer import run

SCHEDULE = [[8, 6]]          # steps 1-8 at context 6, then 9-12 at the full context


def _log(path, paces, cpu=True):
    """A metrics.jsonl with `paces[i]` tokens per second in phase i of SCHEDULE + 4 steps."""
    records = []
    for step in range(1, 13):
        pace = paces[0] if step <= 8 else paces[1]
        r = {"step": step, "tokens_per_s": pace / 2}
        if cpu:
            r["tokens_per_cpu_s"] = pace
        records.append(r)
    records[4] = {**records[4], "tokens_per_s": 0.1, "val_loss": 3.0}   # an evaluation step
    records[5] = {**records[5], "tokens_per_s": 0.1}                    # charged to the next
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _run(run_dir, at_step, total=12, schedule=SCHEDULE, paces=None, cpu=True):
    """A run directory whose checkpoint says `at_step` of `total` under `schedule`."""
    run(run_dir, steps=3, checkpoint_every=3)
    ckpt = run_dir / (run_dir / "latest").read_text()
    state = json.loads((ckpt / STATE_FILE).read_text())
    state["step"], state["train_config"]["steps"] = at_step, total
    (ckpt / STATE_FILE).write_text(json.dumps(state))
    card = json.loads((ckpt / "card.json").read_text())
    (ckpt / "card.json").write_text(json.dumps({**card, "ctx_schedule": schedule}))
    if paces:
        _log(run_dir / "metrics.jsonl", paces, cpu)
    return {**card, "ctx_schedule": schedule}


def test_phases_of_a_schedule():
    assert phases({"ctx_schedule": SCHEDULE}, 12) == [(1, 8), (9, 12)]
    assert phases({}, 12) == [(1, 12)]
    assert phases({"ctx_schedule": [[4, 2], [4, 4]]}, 10) == [(1, 4), (5, 8), (9, 10)]


def test_phase_paces_leave_out_evaluations_and_keep_each_clock(tmp_path):
    log = tmp_path / "metrics.jsonl"
    _log(log, (100.0, 40.0))
    paces = phase_paces(log, [(1, 8), (9, 12)])
    assert paces == {"tokens_per_cpu_s": [100.0, 40.0], "tokens_per_s": [50.0, 20.0]}
    assert phase_paces(tmp_path / "none.jsonl", [(1, 8)]) == {
        "tokens_per_cpu_s": [None], "tokens_per_s": [None]}


def test_finished_runs_of_the_same_schedule_bound_the_time_left(tmp_path):
    runs = tmp_path / "runs"
    card = _run(runs / "now", at_step=6)
    _run(runs / "slow", at_step=12, paces=(100.0, 50.0), cpu=False)     # 0.5x, wall only
    _run(runs / "fast", at_step=12, paces=(100.0, 80.0))                # 0.8x
    _run(runs / "unfinished", at_step=10, paces=(100.0, 10.0))          # not done: ignored
    _run(runs / "other", at_step=12, schedule=[[4, 6]], paces=(100.0, 10.0))   # other phases
    got = later_phases_range(runs / "now", card, step=6, total=12, tokens_per_step=36_000,
                             pace=10.0)
    # this phase: 2 steps x 3,600 s = 2 h; the next: 4 x 3,600 s / ratio = 4 h / ratio
    assert got == {"low": 7.0, "high": 10.0, "runs": ["fast", "slow"], "ratios": (0.5, 0.8)}
    # in the last phase, or with no finished run beside it: nothing to say
    assert later_phases_range(runs / "now", card, 9, 12, 36_000, 10.0) is None
    alone = tmp_path / "alone"
    assert later_phases_range(alone / "now", _run(alone / "now", 6), 6, 12, 36_000, 10.0) is None


def test_progress_and_describe_give_the_range(tmp_path):
    runs = tmp_path / "runs"
    _run(runs / "now", at_step=6, paces=(48.0, 48.0))
    _run(runs / "done", at_step=12, paces=(100.0, 50.0))
    p = progress(runs / "now")
    assert p["longer_context_ahead"] and p["left_range"]["runs"] == ["done"]
    assert p["left_range"]["ratios"] == (0.5, 0.5)
    p.update(left_h=1.5, left_range={"low": 2.5, "high": 3.25, "runs": ["a", "b"],
                                     "ratios": (0.69, 0.99)})
    assert describe(p).endswith(
        "; at least 1.50 CPU-h left at 48 tokens per CPU-second, longer contexts ahead; "
        "2.50-3.25 CPU-h in all if they slow it as they slowed the 2 finished runs of this "
        "schedule (0.69-0.99x))")
    p["left_range"] = {"low": 2.5, "high": 2.5, "runs": ["a"], "ratios": (0.7, 0.7)}
    assert "; about 2.50 CPU-h in all if they slow it as they slowed the 1 finished run of " \
           "this schedule (0.70x))" in describe(p)


def test_no_checkpoint_no_range(tmp_path):
    assert progress(tmp_path / "empty")["left_range"] is None


def test_the_pace_is_the_current_phases_and_a_shorter_phases_only_as_a_lower_bound(tmp_path):
    """Just after the change to the longer context the last 100 steps are the shorter
    context's: their pace is a lower bound ('at least'), and once steps of the new phase are
    logged their pace alone is used, not a mix of both phases."""
    runs = tmp_path / "runs"
    _run(runs / "now", at_step=8, paces=(100.0, 25.0))      # steps 1-8 logged at 100/CPU-s
    p = progress(runs / "now")
    assert (p["tokens_per_s"], p["longer_context_ahead"]) == (100.0, True)
    assert "at least" in describe(p)
    _run(runs / "later", at_step=10, paces=(100.0, 25.0))   # steps 9-10 logged at 25
    p = progress(runs / "later")
    assert (p["tokens_per_s"], p["longer_context_ahead"]) == (25.0, False)
    assert "; about " in describe(p)
