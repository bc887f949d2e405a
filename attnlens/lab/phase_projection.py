"""How long the longer-context phases still ahead of a run should take, read from the finished
runs of the same schedule beside it.

A zoo run lengthens its context as it goes (`ctx_schedule` in its card: 16 x 256 for 6,250
steps, then 8 x 512), and a step of the later phase costs more: attention grows with the
context, the rest does not. While the earlier phase runs, the pace of the later one is not in
the run's own log, so `run_progress` can only give a lower bound. Finished runs of the same
schedule in the same runs directory measured both phases: each gives the ratio of its
later-phase pace to its pace in the phase the run is in now (median tokens per second of all
plain steps of each phase, per CPU-second where both phases have it, else per wall-second).
The run's recent pace times each finished run's ratios gives one projection; their least and
greatest bound the time left. The ratio depends on the variant (on 2026-11-29, `sibling_ratios`
of the four finished 4-layer runs, 256 -> 512 tokens: 0.72x MTA, 0.78x CoPE, 0.85x MHA, 1.00x
Infini, whose local attention is per segment), so the range is wide, and honest.
"""

from __future__ import annotations

import json
from pathlib import Path

from attnlens.training.train_state import latest_checkpoint, read_train_state
from attnlens.training.trainer import METRICS_FILE

PACE_KEYS = {"cpu": "tokens_per_cpu_s", "wall": "tokens_per_s"}   # the CPU pace preferred


def plain_steps(records: list[dict]) -> list[dict]:
    """The steps of a `metrics.jsonl` whose pace is the training's own: not step 1 (start-up,
    compilation), not a step that ran an evaluation, nor the step after it (an evaluation's time
    is charged to the next step)."""
    after_eval = {r["step"] + 1 for r in records if "val_loss" in r}
    return [r for r in records
            if r["step"] > 1 and "val_loss" not in r and r["step"] not in after_eval]


def phases(card: dict, total: int) -> list[tuple[int, int]]:
    """`[(first step, last step)]` of each context phase of a run of `total` steps whose card
    has `ctx_schedule` (`[[steps, ctx], ...]` for the phases before the last); [(1, total)]
    without one."""
    bounds, start = [], 1
    for steps, _ in card.get("ctx_schedule") or ():
        bounds.append((start, start + steps - 1))
        start += steps
    if start <= total:
        bounds.append((start, total))
    return bounds


def phase_paces(metrics_path: Path, bounds: list[tuple[int, int]]) -> dict[str, list]:
    """`{key: [median pace of each phase or None]}` for each pace key of `PACE_KEYS`, over the
    `plain_steps` of each phase."""
    keys = list(PACE_KEYS.values())
    per = {key: [[] for _ in bounds] for key in keys}
    if not metrics_path.is_file():
        return {key: [None] * len(bounds) for key in keys}
    records = [json.loads(line) for line in metrics_path.read_text().splitlines()
               if line.strip()]
    for r in plain_steps(records):
        for i, (first, last) in enumerate(bounds):
            if first <= r["step"] <= last:
                for key in keys:
                    if r.get(key):
                        per[key][i].append(r[key])
    return {key: [sorted(v)[len(v) // 2] if v else None for v in lists]
            for key, lists in per.items()}


def _finished(run_dir: Path) -> tuple[dict, int] | None:
    """`(card, total steps)` of a run that reached its last step, else None."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None or not (ckpt / "card.json").is_file():
        return None
    state = read_train_state(ckpt)
    total = state.get("train_config", {}).get("steps")
    if not total or state["step"] < total:
        return None
    return json.loads((ckpt / "card.json").read_text()), total


def sibling_ratios(run_dir: Path, bounds: list[tuple[int, int]],
                   current: int) -> dict[str, list[float]]:
    """`{finished run: [pace of each later phase / pace of phase `current`]}` for every
    finished run beside `run_dir` with the same phases (`bounds`) and both paces logged."""
    out = {}
    for other in sorted(Path(run_dir).parent.iterdir()):
        if other == Path(run_dir) or not other.is_dir():
            continue
        done = _finished(other)
        if done is None or phases(*done) != bounds:
            continue
        paces = phase_paces(other / METRICS_FILE, bounds)
        for key in PACE_KEYS.values():
            mine = paces[key]
            if mine[current] and all(mine[current + 1:]):
                out[other.name] = [p / mine[current] for p in mine[current + 1:]]
                break
    return out


def later_phases_range(run_dir: Path, card: dict, step: int, total: int,
                       tokens_per_step: float, pace: float) -> dict | None:
    """The hours of `pace`'s clock the rest of a run at `step` should take, as
    `{"low": h, "high": h, "runs": [names], "ratios": (least, greatest ratio)}`, where
    finished runs of its schedule beside it say how much slower the later phases are; None
    when the run is in its last phase or no such run exists."""
    bounds = phases(card, total)
    current = next((i for i, (first, last) in enumerate(bounds) if first <= step + 1 <= last),
                   None)
    if current is None or current == len(bounds) - 1 or not pace:
        return None
    ratios = sibling_ratios(run_dir, bounds, current)
    if not ratios:
        return None
    now_left = (bounds[current][1] - step) * tokens_per_step / pace
    hours = []
    for later in ratios.values():
        seconds = now_left + sum((last - first + 1) * tokens_per_step / (pace * r)
                                 for (first, last), r in zip(bounds[current + 1:], later,
                                                              strict=True))
        hours.append(seconds / 3600)
    flat = [r for later in ratios.values() for r in later]
    return {"low": round(min(hours), 2), "high": round(max(hours), 2), "runs": list(ratios),
            "ratios": (round(min(flat), 2), round(max(flat), 2))}


__all__ = ["PACE_KEYS", "later_phases_range", "phase_paces", "phases", "plain_steps",
           "sibling_ratios"]
