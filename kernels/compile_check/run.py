"""Build the compile matrix (cases x dtypes x d_head x configs x archs) and compile it.

`jobs()` records every case's launches (see `capture`), expands them over the architectures
and drops duplicates (the same kernel, specialisation and options reached from two cases is
compiled once, under the first); `compile_all()` compiles them, in this process or in a pool
of forked workers, and returns one row per compiled kernel.

Example:
    >>> rows = compile_all(jobs(quick=True))                       # doctest: +SKIP
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import torch

from attnlens.kernels.compile_check.capture import Launch, capturing
from attnlens.kernels.compile_check.cases import CASES, Case
from attnlens.kernels.compile_check.compiler import compile_launch, launch_key, problems

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
ARCHS = (80, 90)
D_HEADS = (64, 128)
QUICK = dict(dtypes=("bf16",), archs=(90,), d_heads=(64,))


@dataclass
class Job:
    """One kernel to compile: the launch, where it came from, the architecture."""

    case: Case
    dtype: str
    d_head: int
    launch: Launch
    arch: int
    key: str = ""      # `launch_key(launch, arch)`: what decides the compiled kernel


def _record(case: Case, dtype: str, d_head: int, arch: int = 90) -> list[Launch]:
    with capturing(arch) as cap:
        case.run(cap, DTYPES[dtype], d_head)
    return cap.launches


def _first_configs(launches: list[Launch]) -> list[Launch]:
    """Keep the first autotune config of each tuned kernel (and every untuned launch)."""
    seen, out = set(), []
    for launch in launches:
        key = (launch.name, launch.pass_)
        if launch.tuned and key in seen:
            continue
        seen.add(key)
        out.append(launch)
    return out


def select_cases(ops=None, main_only: bool = False, options=None) -> list[Case]:
    """The cases of `ops` (all if None): main options only, or only those named `options`."""
    return [c for c in CASES if (ops is None or c.op in ops) and (c.main or not main_only)
            and (options is None or c.name in options)]


def jobs(quick: bool = False, ops=None, dtypes=None, archs=None, d_heads=None,
         main_only: bool = False, options=None) -> list[Job]:
    """The de-duplicated compile jobs. `quick`: main options only, first autotune config,
    bf16, sm_90, d_head 64 (each default overridable); `main_only`: main options only;
    `options`: only the cases with these names."""
    dtypes = dtypes or (QUICK["dtypes"] if quick else tuple(DTYPES))
    archs = archs or (QUICK["archs"] if quick else ARCHS)
    d_heads = d_heads or (QUICK["d_heads"] if quick else D_HEADS)
    main_only = main_only or quick
    cases = select_cases(ops, main_only, options)
    out, seen = [], set()
    for case in cases:
        for dtype in dtypes:
            for d_head in d_heads:
                for arch in archs:      # recorded per arch: a wrapper may pick by `gpu_arch`
                    launches = _record(case, dtype, d_head, arch)
                    if quick:
                        launches = _first_configs(launches)
                    for launch in launches:
                        key = launch_key(launch, arch)
                        if key not in seen:
                            seen.add(key)
                            out.append(Job(case, dtype, d_head, launch, arch, key))
    return out


_CACHE: list = [None]      # the ResultCache of this run (None: compile everything)
_MIX: list = [False]       # also read each kernel's instruction mix (`mix_report.launch_mix`)


def _row(job: Job) -> dict:
    cache = _CACHE[0]
    key = cache.key(job.key) if cache is not None and job.key else None
    row = compile_launch(job.launch, job.arch, cache, key, keep_cubin=_MIX[0])
    cubin = row.pop("cubin", None)
    if cubin:
        from attnlens.kernels.compile_check.mix_report import launch_mix

        row["mix"] = launch_mix(cubin, job.launch)
    row = dict(op=job.case.op, option=job.case.name, main=job.case.main, dtype=job.dtype,
               d_head=job.d_head, **row)
    row["pass"] = row.pop("pass_")
    row["problems"] = ([row["error"]] if row["error"] else []) + \
        ([] if row["error"] else problems(row))
    return row


_JOBS: list[Job] = []


def _row_at(i: int) -> dict:
    return _row(_JOBS[i])


def compile_all(job_list: list[Job], workers: int = 1, progress=None,
                cache=None, with_mix: bool = False) -> list[dict]:
    """Rows in job order; `progress(row)` is called after each. `workers > 1` forks a pool.
    `cache` (a `results_cache.ResultCache`): rows of kernels compiled before are read from it
    (`cached` True), new ones are added to it. `with_mix`: each row also gets `mix`, the
    kernel's instruction mix per loop and per launch (`mix_report.launch_mix`)."""
    from attnlens.kernels.compile_check.compiler import private_triton_cache

    private_triton_cache()                 # before the pool forks: one directory for all
    _CACHE[0] = cache
    _MIX[0] = with_mix
    rows = []
    if workers <= 1:
        for job in job_list:
            rows.append(_row(job))
            if progress:
                progress(rows[-1])
        return rows
    global _JOBS
    _JOBS = job_list
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=os.nice, initargs=(0,)) as ex:
        for row in ex.map(_row_at, range(len(job_list))):
            rows.append(row)
            if progress:
                progress(row)
    return rows


__all__ = ["ARCHS", "DTYPES", "D_HEADS", "Job", "QUICK", "compile_all", "jobs", "select_cases"]
