"""Whether CI runs the reproduce tier too: yes when the change since the previous landed commit
touches a model, a card, docs/, notebooks/ or the README (what `make reproduce` re-derives), and
when that cannot be told (no base recorded, base not in the clone's history, no git).

    python -m scripts.ci_reproduce            # prints the decision and why; exit 0: run it,
                                              # exit 3: skip it (anything else: run it)
    python -m scripts.ci_reproduce --mark     # record HEAD as the landed base (.ci/landed)

The base is the commit recorded in .ci/landed: the landed main a session started from
(`--mark` at the start of a session, docs/testing.md). A stale base only widens the diff, so
it can make CI reproduce more often, never less.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_FILE = ROOT / ".ci" / "landed"
# what the reproduce tier re-derives or checks against (prefixes of repository paths)
SKIP = 3   # the exit status that skips the tier; an error (1, 2) must not skip it
WATCHED = ("hooked_models/zoo/", "docs/", "notebooks/", "README.md")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def watched(paths: list[str]) -> list[str]:
    """The changed paths that ask for a reproduce run: models, cards, docs, notebooks."""
    return [p for p in paths if p.startswith(WATCHED) or p.endswith("card.json")]


def decide(base_file: Path = BASE_FILE) -> tuple[bool, str]:
    """(run the reproduce tier?, why)."""
    if not base_file.is_file():
        return True, f"no landed base recorded ({base_file}): full run"
    base = base_file.read_text().split()[0] if base_file.read_text().split() else ""
    try:
        _git("cat-file", "-e", f"{base}^{{commit}}")
    except (OSError, subprocess.CalledProcessError):
        return True, f"landed base {base[:12] or '(empty)'} is not in this clone: full run"
    changed = [p for p in _git("diff", "--name-only", base, "HEAD").splitlines() if p]
    hits = watched(changed)
    if hits:
        shown = ", ".join(hits[:5]) + (f" and {len(hits) - 5} more" if len(hits) > 5 else "")
        return True, f"{len(hits)} documented files changed since {base[:12]}: {shown}"
    return False, (f"{len(changed)} files changed since {base[:12]}, none a model, card, doc "
                   f"or notebook")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mark", action="store_true",
                        help="record HEAD as the landed base in .ci/landed")
    args = parser.parse_args(argv)
    if args.mark:
        head = _git("rev-parse", "HEAD").strip()
        BASE_FILE.write_text(head + "\n")
        print(f"landed base: {head}")
        return 0
    run, why = decide()
    print(f"reproduce tier: {'run' if run else 'skipped'} ({why})")
    return 0 if run else SKIP


if __name__ == "__main__":
    sys.exit(main())
