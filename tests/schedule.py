"""The fast tier's schedule on the workers (issue 56 item 7, docs/testing.md).

`make test` runs pytest-xdist with `--dist loadfile --no-loadscope-reorder` (scripts/test.sh):
a file's tests stay on one worker, so its module fixtures (a served app, a Chromium, a store of
18 text models) are built once instead of once per worker that gets a share of them, and the
files go out in the order conftest.py puts them: longest first by tests/tier_durations.json
(files not measured yet first of all, their cost unknown). That is the greedy longest-first
schedule: no long file starts last while the other worker idles. `lpt_wall` estimates the wall
time of that schedule, which tests/test_tiers.py holds to the budget.
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS_FILE = ROOT / "tests" / "tier_durations.json"
WORKERS = 2               # the 2-core machine of the budget
# One worker's start before its first test: interpreter, torch and the package imports, and the
# collection of every test file. An estimate: `pytest --collect-only` of the fast tier took 15.7 s
# of CPU (92 s of wall clock on the shared machine, 2026-12-05), and xdist starts the workers at
# once on the two cores; twice that leaves room for a cold disk.
WORKER_SETUP_S = 30.0
XDIST_ARGS = ("--dist", "loadfile", "--no-loadscope-reorder")


def file_durations(path: Path = DURATIONS_FILE) -> dict[str, float | None]:
    """Every test file's measured fast-tier seconds (None: all its tests are in the reproduce
    tier or outside the fast tier)."""
    return json.loads(Path(path).read_text())["files"]


def order_key(durations: dict[str, float | None]):
    """A sort key for test node ids: unmeasured files first, then the longest files first; the
    tests of a file keep their order (a stable sort by file)."""
    def key(nodeid: str):
        seconds = durations.get(nodeid.split("::", 1)[0])
        return (0, 0.0) if seconds is None else (1, -seconds)

    return key


def lpt_wall(seconds: list[float], workers: int = WORKERS,
             setup_s: float = WORKER_SETUP_S) -> float:
    """The wall time of running jobs of `seconds` longest first, each on the worker that frees
    first, after every worker's `setup_s`: the greedy (LPT) schedule xdist's loadfile mode
    follows with the files in that order."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    loads = [setup_s] * workers
    heapq.heapify(loads)
    for s in sorted(seconds, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + s)
    return max(loads)
