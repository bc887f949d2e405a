"""The test tiers (docs/testing.md).

- The fast tier, `make test`: every test not marked `reproduce` or `extended`.
- The extended tier, `make test-extended` (CI runs it on every change): every test marked
  `extended`: a costlier case of a path that the fast tier also runs on a cheaper one (a kernel
  at a larger shape or another tile shape, a page of the dashboard on one more model). The
  fast tier stays inside its 12 minutes on a slow 2-core machine; nothing is dropped, CI runs
  both.
- The reproduce tier, `make reproduce` (`python -m scripts.reproduce`): every test marked
  `documented(kind)`: a re-derivation of a number, card, circuit, figure or notebook output that
  the docs or the zoo state. Each kind keeps one cheap representative in the fast tier (the
  smallest model of its kind); the rest are marked `reproduce` as well and run only there.

`documented_params` builds such a parametrisation; `ReproducePlugin` is what `make reproduce`
adds to pytest: resume (skip what passed on this very tree), a progress bar and a summary table.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("paper card", "text card", "toy card", "transcoder card", "circuit", "notebook", "study",
         "report")


def documented(kind: str) -> pytest.MarkDecorator:
    """The marker of a test that re-derives a documented result of `kind`."""
    if kind not in KINDS:
        raise ValueError(f"documented kind {kind!r} is not one of {KINDS}")
    return pytest.mark.documented(kind=kind)


def reproduce(kind: str) -> list[pytest.MarkDecorator]:
    """The marks of a re-derivation that runs only in the reproduce tier."""
    return [documented(kind), pytest.mark.reproduce]


# a whole test: `@EXTENDED`; some cases of a list: `extended_cases(cases, those)`
EXTENDED = pytest.mark.extended


def extended_cases(cases: Iterable, extended: Iterable) -> list:
    """`cases` (parametrize's argument tuples or single values) with those in `extended` marked
    `extended`; an extended case that is not among `cases` is an error (renamed or removed?)."""
    cases, extended = list(cases), list(extended)
    unknown = [c for c in extended if c not in cases]
    if unknown:
        raise ValueError(f"extended cases {unknown} are not among the cases")
    return [pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=EXTENDED)
            if c in extended else c for c in cases]


def page_grid(pages: Iterable[str], names: Iterable[str]) -> list:
    """The (page, name) cases of a browser grid (ids "name-page"): every page stays in the fast
    tier on one of the models, the models taken in turn, so each page and each model is drawn
    at least once in `make test`; the other cases are `extended`."""
    pages, names = list(pages), list(names)
    if not pages or not names:
        raise ValueError("page_grid needs at least one page and one model")
    fast = {(page, names[i % len(names)]) for i, page in enumerate(pages)}
    fast |= {(pages[i % len(pages)], name) for i, name in enumerate(names)}
    return [pytest.param(page, name, id=f"{name}-{page}",
                         marks=() if (page, name) in fast else EXTENDED)
            for page in pages for name in names]


def documented_params(kind: str, items: Iterable, ids: Callable[[object], str],
                      size: Callable[[object], float] | None = None,
                      group: Callable[[object], str] | None = None,
                      keep: Iterable[str] = ()) -> list:
    """`items` as `pytest.param`s marked `documented(kind)`; all but the representatives are
    marked `reproduce` too, so the fast tier keeps a cheap one of each group. Representatives:
    the ids in `keep` (chosen by measured cost, tests/tier_durations.json), else the smallest
    item by `size` (ties by id) of each `group` (default: one group).

    >>> documented_params("text card", names, ids=str, keep=["text-mha-l1"])
    """
    items = list(items)
    keep = set(keep)
    unknown = keep - {ids(it) for it in items}
    if unknown:
        raise ValueError(f"representatives {sorted(unknown)} are not among the {kind} cases: "
                         "choose others (a model was renamed or removed?)")
    if not keep:
        if size is None:
            raise ValueError("documented_params needs `keep` or `size`")
        groups: dict[str, list] = {}
        for it in items:
            groups.setdefault(group(it) if group else "", []).append(it)
        keep = {ids(min(members, key=lambda it: (size(it), ids(it))))
                for members in groups.values()}
    return [pytest.param(it, id=ids(it),
                         marks=[documented(kind)] if ids(it) in keep else reproduce(kind))
            for it in items]


def check_marks(items) -> None:
    """Every `reproduce` test is a documented re-derivation of a known kind; a test is in one
    tier only (`extended` and `reproduce` exclude each other)."""
    for item in items:
        if item.get_closest_marker("reproduce") and item.get_closest_marker("extended"):
            raise pytest.UsageError(f"{item.nodeid} is marked both reproduce and extended: "
                                    "one tier only")
        if item.get_closest_marker("reproduce") and not item.get_closest_marker("documented"):
            raise pytest.UsageError(f"{item.nodeid} is marked reproduce but not "
                                    "documented(kind): say what it re-derives")
        mark = item.get_closest_marker("documented")
        if mark is not None and (mark.args or mark.kwargs.get("kind") not in KINDS):
            raise pytest.UsageError(f"{item.nodeid}: documented{mark.args}{mark.kwargs} must be "
                                    f"documented(kind=...), one of {KINDS}")


def tree_key(root: Path = ROOT) -> str:
    """What the results are valid for: HEAD plus the uncommitted changes of tracked files."""
    def git(*args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True).stdout

    try:
        head = git("rev-parse", "HEAD").decode().strip()
        diff = hashlib.sha256(git("diff", "HEAD", "--binary")).hexdigest()[:16]
    except (OSError, subprocess.CalledProcessError):
        return "no-git"
    return f"{head}+{diff}"


class ReproducePlugin:
    """Resume, progress bar and summary of a reproduce run, state in one JSON file:
    `{"tree": key, "tests": {nodeid: {"outcome", "seconds", "kind", "message"}}}`.
    A test that passed on this tree is not run again; everything else is."""

    def __init__(self, config, state: Path):
        self.path = Path(state)
        self.tree = tree_key()
        self.state = self._load()
        self.is_worker = hasattr(config, "workerinput")
        self.ran: dict[str, dict] = {}
        self.bar = None

    def _load(self) -> dict:
        if self.path.is_file():
            state = json.loads(self.path.read_text())
            if state.get("tree") == self.tree:
                return state
        return {"tree": self.tree, "tests": {}}

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def passed_before(self, nodeid: str) -> bool:
        return self.state["tests"].get(nodeid, {}).get("outcome") == "passed"

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        keep = [it for it in items if not self.passed_before(it.nodeid)]
        done = [it for it in items if self.passed_before(it.nodeid)]
        if done:
            config.hook.pytest_deselected(items=done)
            items[:] = keep
        if not self.is_worker:
            self._open_bar(len(keep), len(done))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        """Under xdist the workers collect (and skip what passed); the first one's list sizes
        the bar."""
        if self.bar is None:
            done = sum(t["outcome"] == "passed" for t in self.state["tests"].values())
            self._open_bar(len(ids), done)

    def _open_bar(self, todo: int, done: int) -> None:
        from tqdm import tqdm

        if done:
            print(f"\nattnlens reproduce: {done} passed on this tree already, {todo} to run",
                  file=sys.stderr)
        self.bar = tqdm(total=todo, unit="test", file=sys.stderr, dynamic_ncols=True,
                        desc="reproduce")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        mark = item.get_closest_marker("documented")
        report.user_properties.append(("kind", mark.kwargs["kind"] if mark else "other"))

    def pytest_runtest_logreport(self, report):
        if self.is_worker:
            return
        entry = self.ran.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0,
                                                    "kind": "other", "message": ""})
        entry["seconds"] += report.duration
        entry["kind"] = dict(report.user_properties).get("kind", entry["kind"])
        if report.failed:
            entry["outcome"] = "failed"
            crash = getattr(report.longrepr, "reprcrash", None)
            entry["message"] = (crash.message if crash else str(report.longrepr)).splitlines()[0]
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
        if report.when == "teardown":
            self.state["tests"][report.nodeid] = entry
            self._save()
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix_str(report.nodeid.split("::")[-1][-48:])

    def pytest_sessionfinish(self, session):
        if self.is_worker:
            return
        if self.bar is not None:
            self.bar.close()
        print("\n" + summary_table(self.state["tests"], self.ran), file=sys.stderr)


def summary_table(tests: dict[str, dict], ran: dict[str, dict]) -> str:
    """Per kind: how many results were recomputed now, taken from an earlier run on the same
    tree, and how many differ from what is documented (failed), then each difference."""
    kinds = sorted({t["kind"] for t in tests.values()})
    rows = [("kind", "recomputed now", "passed earlier", "differs", "skipped", "seconds now")]
    for kind in kinds:
        mine = {n: t for n, t in tests.items() if t["kind"] == kind}
        now = [n for n in mine if n in ran]
        rows.append((kind, str(len(now)), str(len(mine) - len(now)),
                     str(sum(t["outcome"] == "failed" for t in mine.values())),
                     str(sum(t["outcome"] == "skipped" for t in mine.values())),
                     f"{sum(ran[n]['seconds'] for n in now):.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    failed = [(n, t["message"]) for n, t in sorted(tests.items()) if t["outcome"] == "failed"]
    if failed:
        lines += ["", "differs from what is documented:"]
        lines += [f"  {n}: {m}" for n, m in failed]
    return "\n".join(lines)
