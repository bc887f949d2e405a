"""The headline kernel estimates of docs/benchmarks.md, recomputed (`make reproduce` runs it).

    env -u TRITON_INTERPRET python -m attnlens.kernels.compile_check.headline [--only mta]

Each headline is an issue bound on the H200 (sm_90 SASS x trip counts, `calibrate.op_estimate`'s
`H200_issue_s`: the benchmark's launches at batch 1, 16 heads, bf16) of one pass of one fused
op, as the section it names states it, or, where it says so (`bound`), the special-function
bound (`H200_sfu_s`: the exp2s, `roofline.estimate`). The calibrated ranges and the "x torch"
figures of those sections are this bound times ratios measured on the H200 on 2026-12-04
(or a modelled finish/even share), so a bound that holds carries them. The compile check
compiles every launch for sm_90 with Triton's real compiler, so the numbers belong to the
triton they were computed with (`TRITON`); another version prints them but `check` refuses
to compare.

Prints one markdown row per headline: documented, recomputed, their ratio, and whether the
documented text is still in its section.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
TRITON = "3.9.0"           # the compiler the documented bounds were computed with
TOLERANCE = 0.01           # the docs round to 3 significant digits


@dataclass(frozen=True)
class Headline:
    op: str
    T: int
    d_head: int
    pass_: str             # "fwd" or "bwd"
    issue_ms: float        # as documented (ms of `bound`)
    text: str              # how the section writes it
    section: str           # the heading's start
    bound: str = "issue"   # or "sfu": `calibrate.op_estimate`'s H200_<bound>_s


# The sections the headlines are written in (heading starts).
_DCMHA_FWD = "## DCMHA forward: 4 warps per program tried, the causal split's grid"
_MTA_FWD = "## Fused MTA forward: the lse pass on 128 x 128 tiles"
_MTA_FWD_1K = "## Fused MTA forward: a key-window pair's scores staged together"
_MTA_BWD = "## Fused MTA backward: every pass on 64-row windows at every length"
_SFU = "## The special-function units in the compile check's readings"

HEADLINES = [
    Headline("dcmha", 4096, 64, "fwd", 0.322, "**0.322**", _DCMHA_FWD),
    Headline("dcmha", 4096, 128, "fwd", 0.362, "**0.362**", _DCMHA_FWD),
    Headline("mta", 4096, 64, "fwd", 0.837, "**0.837 / 3.81**", _MTA_FWD),
    Headline("mta", 4096, 128, "fwd", 1.023, "**1.023 / 5.48**", _MTA_FWD),
    Headline("mta", 1024, 128, "fwd", 0.118, "**0.118 / 0.679**", _MTA_FWD_1K),
    Headline("mta", 4096, 64, "bwd", 6.479, "**6.479** / 33.67", _MTA_BWD),
    Headline("mta", 4096, 128, "bwd", 8.314, "**8.314** / 49.07", _MTA_BWD),
    Headline("mta", 1024, 128, "bwd", 0.625, "**0.625** / 3.58", _MTA_BWD),
    # the wide tile's exp2s, over its issue bound (0.0310): the low reading's floor at d 64
    Headline("flash", 4096, 64, "fwd", 0.0342, "**0.0342**", _SFU, bound="sfu"),
]


TABLE_SECTION = "## After the merges of 2026-12-05 (fifth session)"
_TABLE_ROW = re.compile(r"^\| (\w+) \| (\d+) \| (\d+) \| (fwd|bwd) \| ([\d.]+) \|", re.M)


class Sections:
    """benchmarks.md read once (`read`, or the text given) and cut into its "## " sections: each
    section's text from the newline before its heading up to the next "## " heading or the end.
    A headline check looks every section up here instead of re-reading and re-searching the
    whole file per headline."""

    def __init__(self, docs: str):
        starts = [m.start() for m in re.finditer(r"\n## ", docs)]
        self._texts = [docs[a:b] for a, b in zip(starts, [*starts[1:], len(docs)], strict=True)]

    @classmethod
    def read(cls) -> Sections:
        return cls(DOCS.read_text())

    def text(self, heading_start: str) -> str:
        """The first section whose heading starts with `heading_start` (which starts "## ")."""
        for text in self._texts:
            if text.startswith("\n" + heading_start):
                return text
        raise LookupError(f"no section starting {heading_start!r} in {DOCS.name}")


def _sections(docs: str | Sections | None) -> Sections:
    if isinstance(docs, Sections):
        return docs
    return Sections.read() if docs is None else Sections(docs)


def table_headlines(docs: str | Sections | None = None) -> list[Headline]:
    """The rows `| op | T | d_head | pass | issue ms |` of TABLE_SECTION's table (every fused
    op's passes on one main, written by `--table`) as headlines. `docs`: benchmarks.md's text
    or `Sections` (read here when None), as for `section_text`."""
    text = _sections(docs).text(TABLE_SECTION)
    return [Headline(op, int(T), int(d), pass_, float(ms), f"| {op} | {T} | {d} | {pass_} | {ms} |",
                     TABLE_SECTION) for op, T, d, pass_, ms in _TABLE_ROW.findall(text)]


def all_headlines(docs: str | Sections | None = None) -> list[Headline]:
    return HEADLINES + table_headlines(docs)


def section_text(heading_start: str, docs: str | Sections | None = None) -> str:
    """The text of the benchmarks.md section whose heading starts with `heading_start`
    (`docs`: its text, or `Sections` already cut; None reads the file)."""
    return _sections(docs).text(heading_start)


def issue_ms(op: str, T: int, d_head: int, pass_: str, cache=None, bound: str = "issue") -> float:
    """The H200 issue bound (ms) of `op`'s `pass_` launches at (T, d_head); `bound="sfu"`: the
    special-function bound of the same launches."""
    from attnlens.kernels.compile_check.backward_roofline import record
    from attnlens.kernels.compile_check.calibrate import ARCH, op_estimate
    from attnlens.kernels.compile_check.cases import Case
    from attnlens.kernels.compile_check.compiler import launch_key
    from attnlens.kernels.compile_check.run import Job, compile_all

    case = Case(op, f"benchmark T={T} {pass_}", None)
    jobs = [Job(case, "bf16", d_head, la, ARCH, launch_key(la, ARCH))
            for la in record(op, T, d_head) if la.pass_ == pass_]
    est = op_estimate(compile_all(jobs, workers=1, cache=cache, with_mix=True))
    if "error" in est:
        raise RuntimeError(f"{op} T={T} d={d_head} {pass_}: {est['error']}")
    return est[f"H200_{bound}_s"] * 1e3


def print_table(ops, Ts, Ds) -> int:
    """The table TABLE_SECTION holds: each op's fwd and bwd issue bound at every (T, d)."""
    from attnlens.kernels.compile_check.results_cache import ResultCache

    cache = ResultCache(None)
    print("| op | T | d_head | pass | H200 issue bound, ms (ESTIMATE) |\n|---|---|---|---|---|",
          flush=True)
    for op in ops:
        for T in Ts:
            for d in Ds:
                for pass_ in ("fwd", "bwd"):
                    print(f"| {op} | {T} | {d} | {pass_} | "
                          f"{_three(issue_ms(op, T, d, pass_, cache))} |", flush=True)
    return 0


def _three(ms: float) -> str:
    """3 significant digits, as the docs write them."""
    return f"{ms:#.3g}"


def row(h: Headline, ms: float, in_docs: bool) -> str:
    what = "" if h.bound == "issue" else f" ({h.bound})"
    return (f"| {h.op} | {h.T} | {h.d_head} | {h.pass_}{what} | {h.issue_ms:.3f} | {ms:.4f} "
            f"| {ms / h.issue_ms:.4f} | {'yes' if in_docs else 'NO'} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", default=None, help="ops to recompute (default all)")
    p.add_argument("--table", nargs="+", default=None, metavar="OP",
                   help="instead: print the rows of TABLE_SECTION's table for these ops")
    p.add_argument("--T", nargs="+", type=int, default=[4096], help="with --table")
    p.add_argument("--d", nargs="+", type=int, default=[64, 128], help="with --table")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.table:
        return print_table(args.table, args.T, args.d)
    import triton

    from attnlens.kernels.compile_check.results_cache import ResultCache

    cache = ResultCache(None)
    sections = Sections.read()      # once per check
    print(f"triton {triton.__version__} (documented with {TRITON})\n\n"
          "| op | T | d_head | pass (bound if not issue) | documented ms | recomputed | ratio "
          "| in its section |\n"
          "|---|---|---|---|---|---|---|---|", flush=True)
    bad = 0
    for h in all_headlines(sections):
        if args.only and h.op not in args.only:
            continue
        ms = issue_ms(h.op, h.T, h.d_head, h.pass_, cache, bound=h.bound)
        in_docs = h.text in sections.text(h.section)
        print(row(h, ms, in_docs), flush=True)
        bad += (not in_docs) or abs(ms / h.issue_ms - 1) > TOLERANCE
    return 1 if bad and triton.__version__ == TRITON else 0


if __name__ == "__main__":
    raise SystemExit(main())
