"""How far a resumable run has come and how long the rest should take, read from its run directory.

A run directory (attnlens.training.trainer.fit) holds the latest checkpoint, whose state records the
step, the tokens seen and the training time spent (wall and CPU seconds), and `metrics.jsonl`,
one line per step with its tokens per wall-second and, in logs written since 2026-11-29, per
CPU-second. The time left is projected from the last `window` steps' pace, not the run's average:
in CPU hours from the CPU pace where the log has it (a shared machine's load slows the wall pace
but not the CPU pace, so the projection holds whatever else runs), else in wall hours. The zoo's
runs lengthen their context as they go (a curriculum: `ctx_schedule` in the checkpoint's card),
so while a shorter-context phase runs the projection is a lower bound, and says so
(`longer_context_ahead`); where finished runs of the same schedule lie beside it, their slowdown
in the longer phases bounds the whole time left (`left_range`, `attnlens.lab.phase_projection`).
Steps that ran an evaluation are left out of the pace (an evaluation's time is charged to the
step after it).

    >>> progress(Path.home() / ".cache/attnlens/lab-text/runs/text-mta-l4mlp")  # doctest: +SKIP
    {'step': 2500, 'of': 10000, 'tokens': 10240000, 'cpu_h': 0.81, 'tokens_per_s': 3914.0,
     'clock': 'cpu', 'left_h': 2.18, 'longer_context_ahead': True,
     'left_range': {'low': 2.18, 'high': 2.81, 'runs': [...], 'ratios': (0.72, 1.0)}}
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlens.lab.phase_projection import (
    PACE_KEYS,
    later_phases_range,
    phases,
    plain_steps,
)
from attnlens.training.train_state import latest_checkpoint, read_train_state
from attnlens.training.trainer import METRICS_FILE

WINDOW = 100   # steps the pace is read from



def recent_pace(metrics_path: Path, up_to_step: int, window: int = WINDOW,
                clock: str = "wall", since: int = 1) -> float | None:
    """Median tokens per second of `clock` ("wall" or "cpu") over the last `window` plain steps
    from `since` to `up_to_step` that record it (None when the log has none); the median, so a
    step slowed by a checkpoint or a busy moment on a shared machine does not move it."""
    if clock not in PACE_KEYS:
        raise ValueError(f"clock must be one of {sorted(PACE_KEYS)}, got {clock!r}")
    if not metrics_path.is_file():
        return None
    records = []
    for line in metrics_path.read_text().splitlines()[-4 * window:]:
        if not line.strip():
            continue
        r = json.loads(line)
        if since <= r["step"] <= up_to_step:
            records.append(r)
    key = PACE_KEYS[clock]
    plain = [r[key] for r in plain_steps(records) if r.get(key)]
    pace = sorted(plain[-window:])
    return pace[len(pace) // 2] if pace else None


def progress(run_dir: Path, window: int = WINDOW) -> dict:
    """`step`, `of` (the run's total steps), `tokens`, `cpu_h` (CPU hours the checkpointed steps
    took; None for a checkpoint without timing), `tokens_per_s` (the recent pace, per second of
    `clock`: "cpu" where the log records CPU times, else "wall"), `left_h` (hours of that clock
    the remaining steps take at that pace; None when unknown) and `longer_context_ahead` (the
    run is in a shorter-context phase of its curriculum, so `left_h` is a lower bound). A run
    with no checkpoint is at step 0 with everything else None or False."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return {"step": 0, "of": None, "tokens": 0, "cpu_h": None, "tokens_per_s": None,
                "clock": None, "left_h": None, "longer_context_ahead": False, "left_range": None}
    state = read_train_state(ckpt)
    step, tokens = state["step"], state["tokens"]
    total = state.get("train_config", {}).get("steps")
    timing = state.get("timing")
    metrics = Path(run_dir) / METRICS_FILE
    card_path = ckpt / "card.json"
    card = json.loads(card_path.read_text()) if card_path.is_file() else {}
    phases_end = sum(steps for steps, _ in card.get("ctx_schedule") or ())
    # the pace of the context phase the run is in; just after a phase change, before any of
    # its steps is logged, the last phase's pace, a lower bound like any shorter context's
    start = next((first for first, last in phases(card, total or step) if first <= step + 1
                  <= last), 1)
    clock, pace = _pace(metrics, step, window, since=start)
    from_shorter_context = False
    if pace is None and start > 1:
        clock, pace = _pace(metrics, step, window, since=1)
        from_shorter_context = pace is not None
    left = None
    if pace and total and step:
        left = round((total - step) * (tokens / step) / pace / 3600, 2)
    left_range = None
    if step < phases_end and left is not None:
        left_range = later_phases_range(Path(run_dir), card, step, total, tokens / step, pace)
    return {"step": step, "of": total, "tokens": tokens,
            "cpu_h": round(timing["cpu_s"] / 3600, 2) if timing else None,
            "tokens_per_s": round(pace, 1) if pace else None, "clock": clock,
            "left_h": left, "longer_context_ahead": step < phases_end or from_shorter_context,
            "left_range": left_range}


def _pace(metrics: Path, step: int, window: int, since: int) -> tuple[str | None, float | None]:
    """`(clock, pace)`: the CPU pace where the log records CPU times, else the wall pace
    (a log from before CPU times were recorded), of the plain steps from `since` on."""
    for clock in ("cpu", "wall"):
        pace = recent_pace(metrics, step, window, clock, since=since)
        if pace is not None:
            return clock, pace
    return None, None


def describe(p: dict, ceiling: bool = False) -> str:
    """One line: 'step 2,500 of 10,000 (10.2M tokens, 0.81 CPU-h so far; at least 2.18 CPU-h
    left at 3,914 tokens per CPU-second, longer contexts ahead)' (from a log without CPU times:
    '... 2.18 h left at 3,914 tokens per wall-second ...'). With `ceiling` (a run that stops
    early when its validation loss stops improving), the total steps are a ceiling and the time
    left at most."""
    parts = [f"{p['tokens'] / 1e6:.1f}M tokens"]
    if p["cpu_h"] is not None:
        parts.append(f"{p['cpu_h']:.2f} CPU-h so far")
    text = f"step {p['step']:,} of {'at most ' if ceiling else ''}{p['of']:,} ({', '.join(parts)}"
    if p["left_h"] is not None:
        bound = ("at most" if ceiling and not p["longer_context_ahead"] else
                 "at least" if p["longer_context_ahead"] and not ceiling else "about")
        hours, per = ("CPU-h", "CPU-second") if p.get("clock") == "cpu" else ("h", "wall-second")
        text += (f"; {bound} {p['left_h']:.2f} {hours} left at {p['tokens_per_s']:,.0f} tokens "
                 f"per {per}")
        if p["longer_context_ahead"]:
            text += ", longer contexts ahead"
            rng = p.get("left_range")
            if rng:
                n = len(rng["runs"])
                span = (f"about {rng['low']:.2f}" if rng["low"] == rng["high"]
                        else f"{rng['low']:.2f}-{rng['high']:.2f}")
                least, most = rng["ratios"]
                text += (f"; {span} {hours} in all if they slow it as they slowed the "
                         f"{n} finished run{'s' * (n > 1)} of this schedule ("
                         + (f"{least:.2f}x" if least == most else f"{least:.2f}-{most:.2f}x")
                         + ")")
        if ceiling:
            text += ", early stopping"
    return text + ")"
