"""`make reproduce`: re-derive every documented number, card, circuit, figure and notebook output
(every test marked `documented`, tests/tiers.py), in parallel over the cores, resumable.

    python -m scripts.reproduce                 # all of it; a rerun skips what passed on this tree
    python -m scripts.reproduce --fresh         # forget earlier results on this tree
    python -m scripts.reproduce --kind circuit  # one kind (paper card, text card, circuit, ...)
    python -m scripts.reproduce --workers 1     # one process (default: one per core)

It prints a progress bar and, at the end, a table per kind: recomputed now, passed in an earlier
run on the same tree (HEAD and uncommitted changes), differing from what is documented, seconds.
State: out/reproduce/state.json. Exit status 0 only when nothing differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / "out" / "reproduce" / "state.json"
sys.path.insert(0, str(ROOT / "tests"))
from tiers import KINDS  # noqa: E402


def command(workers: int, kind: str | None, state: Path, extra: list[str]) -> list[str]:
    """The pytest command line of a reproduce run."""
    marker = "documented" if kind is None else f"documented(kind={kind_literal(kind)})"
    cmd = [sys.executable, "-m", "pytest", "-m", marker, "-q", "--no-header",
           f"--reproduce-state={state}", "-p", "no:cacheprovider"]
    if workers > 1:
        cmd += ["-n", str(workers), "--dist", "worksteal"]
    return cmd + extra


def kind_literal(kind: str) -> str:
    """`kind` quoted for a -m expression (pytest matches a marker's keyword arguments)."""
    if kind not in KINDS:
        raise SystemExit(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    return f'"{kind}"'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="parallel pytest workers (default: one per core)")
    parser.add_argument("--kind", help=f"only this kind: {', '.join(KINDS)}")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results")
    parser.add_argument("--state", type=Path, default=STATE)
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: must be at least 1")
    if args.fresh and args.state.is_file():
        args.state.unlink()
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = command(args.workers, args.kind, args.state, args.pytest_args)
    print("attnlens reproduce:", " ".join(cmd[2:]), file=sys.stderr)
    code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    if code == 5:   # pytest: nothing selected, i.e. everything passed earlier on this tree
        print("attnlens reproduce: nothing left to run on this tree (--fresh runs it again)",
              file=sys.stderr)
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
