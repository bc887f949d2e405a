"""Benchmark of the test tiers: each tier's wall time and its slowest tests (docs/benchmarks.md).

    python -m scripts.suite_time                  # the fast tier (make test's pytest part)
    python -m scripts.suite_time --tier extended  # the extended tier (make test-extended)
    python -m scripts.suite_time --tier reproduce # the reproduce tier, from scratch
    python -m scripts.suite_time --update         # also rewrite tests/tier_durations.json
    python -m scripts.suite_time --files tests/test_x.py tests/test_y.py
                                                  # measure those files alone and put their
                                                  # seconds into tests/tier_durations.json

A benchmark, not a test: it prints measured numbers. tests/tier_durations.json, which it
writes with --update, is what tests/test_tiers.py reads to keep slow tests out of the fast tier:
every test file has its measured fast-tier seconds there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out" / "suite-time"
DURATIONS = ROOT / "tests" / "tier_durations.json"


def machine() -> str:
    """The CPU model and core count (for the record beside each number)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def junit_times(path: Path) -> dict[str, float]:
    """{nodeid-ish "file::name": seconds (setup + call + teardown)} from a junit XML file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        file = "/".join(module[:2]) + ".py" if len(module) >= 2 else case.get("file", "?")
        out[f"{file}::{case.get('name')}"] = float(case.get("time", 0.0))
    return out


def per_file(times: dict[str, float]) -> dict[str, float]:
    files: dict[str, float] = defaultdict(float)
    for node, seconds in times.items():
        files[node.split("::")[0]] += seconds
    return dict(sorted(files.items()))


def fast_tier_files(times: dict[str, float]) -> dict[str, float]:
    """Every test file's fast-tier seconds (None for a file whose tests all run in the
    reproduce tier), as tests/tier_durations.json records them."""
    measured = per_file(times)
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    return {f: round(measured[f], 2) if f in measured else None for f in files}


def run_fast(workers: str, files: list[str] | None = None,
             tier: str = "fast") -> tuple[float, dict[str, float], int]:
    """The fast tier (or, `tier` "extended", the extended tier) as make test runs it: its wall
    time, each test's seconds, pytest's exit status."""
    OUT.mkdir(parents=True, exist_ok=True)
    xml = OUT / ("files.xml" if files else f"{tier}.xml")
    marks = "extended" if tier == "extended" else "not extended"
    # the schedule of make test (scripts/test.sh, tests/schedule.py)
    cmd = [sys.executable, "-m", "pytest", "-n", workers, "--dist", "loadfile",
           "--no-loadscope-reorder", "-m", f"{marks} and not reproduce and not install",
           "-q",
           "-p", "no:cacheprovider", f"--junitxml={xml}", "-o", "junit_duration_report=total",
           *(files or [])]
    start = time.monotonic()
    code = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}).returncode
    return time.monotonic() - start, junit_times(xml), code


def run_reproduce(workers: str) -> tuple[float, dict[str, float]]:
    state = OUT / "reproduce-state.json"
    cmd = [sys.executable, "-m", "scripts.reproduce", "--fresh", "--state", str(state)]
    if workers != "auto":
        cmd += ["--workers", workers]
    start = time.monotonic()
    code = subprocess.run(cmd, cwd=ROOT).returncode
    wall = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"the reproduce tier failed (exit {code})")
    tests = json.loads(state.read_text())["tests"]
    return wall, {node: t["seconds"] for node, t in tests.items()}


def merge_files(recorded: dict, measured: dict[str, float], files: list[str]) -> dict:
    """tests/tier_durations.json's content with `files`' seconds replaced by `measured` (a file
    with no fast-tier test gets None) and each such file dated under "files_measured_alone":
    the full run's wall time stays as it was measured; test_tiers's two-worker estimate reads
    the per-file seconds, so it sees the new ones."""
    merged = json.loads(json.dumps(recorded))
    seconds = per_file(measured)
    for file in files:
        merged["files"][file] = round(seconds[file], 2) if file in seconds else None
        merged.setdefault("files_measured_alone", {})[file] = (
            f"{datetime.date.today()}, {machine()}")
    merged["files"] = dict(sorted(merged["files"].items()))
    return merged


def report(tier: str, wall: float, times: dict[str, float], slowest: int = 20) -> str:
    lines = [f"## {tier} tier: {wall:.0f} s wall ({wall / 60:.1f} min), {len(times)} tests, "
             f"{sum(times.values()):.0f} s of test time", "",
             f"| {slowest} slowest tests | seconds |", "|---|---:|"]
    for node, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:slowest]:
        lines.append(f"| `{node}` | {seconds:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tier", choices=("fast", "extended", "reproduce", "both"),
                        default="fast")
    parser.add_argument("--workers", default="auto", help="pytest-xdist workers (default auto)")
    parser.add_argument("--update", action="store_true",
                        help="write the fast tier's per-file seconds to tests/tier_durations.json")
    parser.add_argument("--files", nargs="+", default=None,
                        help="measure only these test files (one worker each, as make test "
                             "runs whole files) and write their seconds into "
                             "tests/tier_durations.json")
    args = parser.parse_args(argv)
    print(f"# test tiers on {machine()}, {datetime.date.today()}\n")
    if args.files:
        files = [str(Path(f).resolve().relative_to(ROOT)) for f in args.files]
        missing = [f for f in files if not (ROOT / f).is_file()]
        if missing:
            parser.error(f"no such test files: {missing}")
        wall, times, code = run_fast("1", files)
        print(report("these files' fast", wall, times) + "\n")
        if code != 0:
            print(f"these files FAILED (exit {code}): nothing written", file=sys.stderr)
            return code
        DURATIONS.write_text(json.dumps(merge_files(json.loads(DURATIONS.read_text()), times,
                                                    files), indent=1) + "\n")
        print(f"wrote {DURATIONS.relative_to(ROOT)} ({len(files)} files)")
        return 0
    if args.tier in ("fast", "both"):
        wall, times, code = run_fast(args.workers)
        print(report("fast", wall, times) + "\n")
        if code != 0:
            print(f"the fast tier FAILED (exit {code}): the times above are of a failing run",
                  file=sys.stderr)
        if args.update:
            DURATIONS.write_text(json.dumps({
                "measured": str(datetime.date.today()), "machine": machine(),
                "workers": args.workers, "wall_seconds": round(wall),
                "files": fast_tier_files(times)},
                indent=1) + "\n")
            print(f"wrote {DURATIONS.relative_to(ROOT)}")
        if code != 0:
            return code
    if args.tier == "extended":
        wall, times, code = run_fast(args.workers, tier="extended")
        print(report("extended", wall, times) + "\n")
        if code != 0:
            print(f"the extended tier FAILED (exit {code})", file=sys.stderr)
            return code
    if args.tier in ("reproduce", "both"):
        wall, times = run_reproduce(args.workers)
        print(report("reproduce", wall, times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
