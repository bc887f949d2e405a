"""The compile check under two Triton versions: the CPU's (designed against) and the GPU image's.

Every kernel is designed here with the compiler of the CPU's triton (3.9.0), but the lent GPU
runs an image with another (3.6.0). A kernel that does not compile, or spills, under the GPU's
version wastes the rare GPU window, so `scripts/triton_gpu_compat.sh` compiles the same cases
in both versions' environments and compares them:

    python -m attnlens.kernels.compile_check.versions run --json 39.json    # in each venv
    python -m attnlens.kernels.compile_check.versions table 39.json 36.json [--markdown FILE]

`run` compiles `compat_cases()` (each op's main options and the many-head options the docs
measure) and writes the rows with the triton and ptxas versions; a case whose capture fails
(an import or API error under that version) becomes an error row instead of stopping the run.
`table` prints one row per compiled kernel, both versions' registers/spill side by side with
the compile error or the change that matters (a new spill, a limit exceeded), then a summary
per kernel and architecture; it exits 1 when the second version fails a compile or a launch
limit (shared memory, register file), or lacks a kernel the first compiled.

Example:
    >>> compare([row39], [row36])[0]["note"]                      # doctest: +SKIP
    'new spill 32 B'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

# The many-head options whose numbers docs/benchmarks.md reports, besides each op's main ones.
COMPAT_OPTIONS = ("H16 6x11+mix", "H16 6x11+mix 2k rows", "H16 6x11+mix 4k rows",
                  "H16 official", "H32 official")
KEY = ("op", "option", "pass", "kernel", "config", "dtype", "d_head", "arch")
CAPTURE = "(capture)"          # the kernel name of a case whose launches could not be recorded


def compat_cases(options=COMPAT_OPTIONS):
    """Each op's main cases and the cases named in `options`, in `cases.CASES` order."""
    from attnlens.kernels.compile_check.cases import CASES

    return [c for c in CASES if c.main or c.name in options]


def _capture_error_row(case, dtype: str, d_head: int, arch: int, error: str) -> dict:
    from attnlens.kernels.compile_check.compiler import ARCH_NAMES

    return {"op": case.op, "option": case.name, "main": case.main, "dtype": dtype,
            "d_head": d_head, "kernel": CAPTURE, "pass": "-", "config": "-",
            "arch": ARCH_NAMES[arch], "arch_cc": arch, "registers": 0, "spill_bytes": 0,
            "stack_bytes": 0, "shared_bytes": 0, "compile_s": 0.0, "cached": False,
            "error": error, "problems": [error]}


def collect(cases, dtypes, d_heads, archs, workers: int = 1, cache=None) -> list[dict]:
    """Compile every launch of `cases` (all autotune configs) for each dtype, d_head and arch,
    each distinct kernel once (as `run.jobs`); a case x dtype x d_head whose capture raises
    gives one error row per arch instead of stopping the run."""
    from attnlens.kernels.compile_check.compiler import describe_error, launch_key
    from attnlens.kernels.compile_check.run import Job, _record, compile_all

    job_list, failed, seen = [], [], set()
    for case in cases:
        for dtype in dtypes:
            for d_head in d_heads:
                try:
                    # Recorded per architecture, as `run.jobs` does: the launch itself
                    # differs (sm_90-only tiles and paths), so an sm_80 row must compile
                    # what sm_80 launches, not the sm_90 launch built for sm_80.
                    keyed = [(launch, arch, launch_key(launch, arch)) for arch in archs
                             for launch in _record(case, dtype, d_head, arch)]
                except Exception as e:  # noqa: BLE001 - a failing capture is a result
                    failed += [_capture_error_row(case, dtype, d_head, a, describe_error(e))
                               for a in archs]
                    continue
                for launch, arch, key in keyed:
                    if key not in seen:
                        seen.add(key)
                        job_list.append(Job(case, dtype, d_head, launch, arch, key))
    return failed + compile_all(job_list, workers=workers, cache=cache)


def toolchain_versions() -> dict:
    """The triton version and the ptxas release it ships (`ptxas --version`'s last line)."""
    from attnlens.kernels._triton import triton
    from attnlens.kernels.compile_check.compiler import _nvidia_bin

    try:
        text = subprocess.run([_nvidia_bin("ptxas"), "--version"], capture_output=True,
                              text=True, check=True).stdout
        ptxas = next((ln.split(",")[-1].strip() for ln in text.splitlines()
                      if "release" in ln), text.strip().splitlines()[-1])
    except (OSError, subprocess.CalledProcessError, FileNotFoundError, IndexError) as e:
        ptxas = f"unknown ({e})"
    return {"triton": triton.__version__, "ptxas": ptxas}


def _key(row: dict) -> tuple:
    return tuple(row[k] for k in KEY)


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["error"]:
        return "ERROR"
    return f"{row['registers']}/{row['spill_bytes']}"


def _note(base: dict | None, target: dict | None) -> str:
    """What differs that matters: the target's error or launch problem, a spill it adds or
    drops, a kernel only one version compiled."""
    if target is None:
        return "not compiled by the second version"
    if target["problems"]:
        return "; ".join(target["problems"])
    if base is None:
        return "not compiled by the first version"
    if base["error"]:
        return "first version: " + base["error"]
    if target["spill_bytes"] > base["spill_bytes"]:
        return f"new spill {target['spill_bytes']} B" if not base["spill_bytes"] else \
            f"spill {base['spill_bytes']} -> {target['spill_bytes']} B"
    if target["spill_bytes"] < base["spill_bytes"]:
        return f"spill {base['spill_bytes']} -> {target['spill_bytes']} B"
    return ""


def compare(base_rows: list[dict], target_rows: list[dict]) -> list[dict]:
    """One entry per kernel in either list (base order, then the target's extra ones):
    `key` fields, `base` and `target` rows (None where absent) and `note` (`_note`)."""
    base = {_key(r): r for r in base_rows}
    target = {_key(r): r for r in target_rows}
    keys = list(base) + [k for k in target if k not in base]
    return [dict(zip(KEY, k, strict=True), base=base.get(k), target=target.get(k),
                 note=_note(base.get(k), target.get(k))) for k in keys]


def format_compare(entries: list[dict], names: tuple[str, str]) -> str:
    """The per-kernel table as aligned text; regs/spill cells are `registers/spill bytes`."""
    head = ("op", "option", "pass", "kernel", "config", "dtype", "d", "arch",
            f"{names[0]} regs/spill", f"{names[1]} regs/spill", "note")
    table = [head] + [(e["op"], e["option"], e["pass"], e["kernel"], e["config"], e["dtype"],
                       str(e["d_head"]), e["arch"], _cell(e["base"]), _cell(e["target"]),
                       e["note"]) for e in entries]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in table)


def _span(rows: list[dict]) -> str:
    ok = [r for r in rows if not r["error"]]
    if not ok:
        return "-"
    lo, hi = min(r["registers"] for r in ok), max(r["registers"] for r in ok)
    return f"{lo if lo == hi else f'{lo}-{hi}'} / {max(r['spill_bytes'] for r in ok)}"


def summary_markdown(entries: list[dict], names: tuple[str, str]) -> str:
    """Per op, option, pass, kernel and arch: kernels compiled (configs x d_heads), each
    version's registers min-max / largest spill (bytes), and what differs (errors, spills)."""
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        groups.setdefault((e["op"], e["option"], e["pass"], e["kernel"], e["arch"]), []).append(e)
    lines = [f"| op | option | pass | kernel | arch | kernels | {names[0]} regs / max spill B "
             f"| {names[1]} regs / max spill B | differs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (op, option, pass_, kernel, arch), es in groups.items():
        base = [e["base"] for e in es if e["base"] is not None]
        target = [e["target"] for e in es if e["target"] is not None]
        notes = sorted({f"{e['config']} d{e['d_head']}: {e['note']}" for e in es if e["note"]})
        lines.append(f"| {op} | {option} | {pass_} | {kernel} | {arch} | {len(es)} | "
                     f"{_span(base)} | {_span(target)} | {'; '.join(notes) or '-'} |")
    return "\n".join(lines)


def failing(entries: list[dict]) -> list[dict]:
    """The entries the second version fails (error or launch problem) or did not compile."""
    return [e for e in entries if e["target"] is None or e["target"]["problems"]]


def _load(path: str) -> tuple[str, list[dict]]:
    with open(path) as f:
        data = json.load(f)
    return f"triton {data['triton']}", data["rows"]


def _run(args) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("TRITON_INTERPRET is set: unset it (the interpreter replaces the compiler)",
              file=sys.stderr)
        return 2
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile_compat_")
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    from attnlens.kernels.compile_check.results_cache import ResultCache

    versions = toolchain_versions()
    cache = None if args.no_results_cache else ResultCache(args.results_cache)
    print(f"triton {versions['triton']} (ptxas {versions['ptxas']}): compiling", file=sys.stderr)
    rows = collect(compat_cases(), args.dtypes, args.d_heads, args.archs, args.workers, cache)
    with open(args.json, "w") as f:
        json.dump({**versions, "rows": rows}, f, indent=1)
    bad = [r for r in rows if r["problems"]]
    print(f"{len(rows)} kernels, {len(bad)} failing, "
          f"{sum(1 for r in rows if r['spill_bytes'])} spilling -> {args.json}", file=sys.stderr)
    return 1 if bad else 0


def _table(args) -> int:
    (name_a, rows_a), (name_b, rows_b) = _load(args.base), _load(args.target)
    names = (name_a, name_b)
    entries = compare(rows_a, rows_b)
    print(format_compare(entries, names))
    summary = summary_markdown(entries, names)
    print("\n" + summary)
    bad = failing(entries)
    spills = [e for e in entries if e["note"].startswith(("new spill", "spill"))]
    print(f"\n{len(entries)} kernels: {len(bad)} fail or are missing under {name_b}, "
          f"{len(spills)} change their spill")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(summary + "\n")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnlens.kernels.compile_check.versions",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile the compat cases with this environment's triton")
    run.add_argument("--json", required=True, metavar="FILE")
    run.add_argument("--dtypes", nargs="+", default=["bf16"], choices=("fp16", "bf16", "fp32"))
    run.add_argument("--d-heads", nargs="+", type=int, default=[64, 128])
    run.add_argument("--archs", nargs="+", type=int, default=[90, 80], choices=(80, 90))
    run.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    run.add_argument("--results-cache", metavar="DIR")
    run.add_argument("--no-results-cache", action="store_true")
    table = sub.add_parser("table", help="compare two `run` files (first: the reference)")
    table.add_argument("base")
    table.add_argument("target")
    table.add_argument("--markdown", metavar="FILE", help="also write the summary table here")
    args = p.parse_args(argv)
    return _run(args) if args.command == "run" else _table(args)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COMPAT_OPTIONS", "collect", "compare", "compat_cases", "failing", "format_compare",
           "summary_markdown", "toolchain_versions"]
