"""`python -m attnlens.kernels.compile_check --quick`: every op's forward and backward kernels
compile for sm_90 in bf16 with Triton's real compiler (no GPU), within the launch limits,
spill-free. Those tests are in the extended tier (`make test-extended`, which CI runs): the
quick check compiles every op (about 70 s); the fast tier compiles the flash kernels through
the same compiler (tests/test_compile_check_instruments.py, test_compile_check_by_line.py).

The suite runs under TRITON_INTERPRET=1 (tests/conftest.py), which replaces the compiler, so
the check runs in a subprocess whose environment lacks it. The full matrix (every autotune
config, fp16/bf16/fp32, d_head 64/128, sm_80/sm_90, every option) is one command; its table is
in docs/benchmarks.md.
"""

import json
import os
import subprocess
import sys

import pytest
from tiers import EXTENDED

from attnlens.kernels import _triton
from attnlens.kernels.compile_check.cases import OPS
from attnlens.kernels.compile_check.compiler import SHARED_LIMIT, describe_error, problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = {"op", "kernel", "pass", "config", "arch", "dtype", "registers", "spill_bytes",
            "shared_bytes", "compile_s"}

pytestmark = pytest.mark.skipif(not _triton.available(), reason="needs triton")


def _run_quick(out, results_cache):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnlens.kernels.compile_check", "--quick",
                           "--json",
                           str(out), "--no-progress", "--results-cache", str(results_cache)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    rows = json.loads(out.read_text()) if out.exists() else []
    return proc, rows


@pytest.fixture(scope="module")
def results_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("results_cache")


@pytest.fixture(scope="module")
def quick(tmp_path_factory, results_cache):
    """The quick check compiled from scratch (an empty results cache)."""
    return _run_quick(tmp_path_factory.mktemp("compile_check") / "rows.json", results_cache)


@EXTENDED   # the quick check compiles every op (about 70 s); the fast tier compiles
            # the flash kernels (test_compile_check_instruments, _by_line)
def test_quick_check_exits_zero_and_writes_rows(quick):
    proc, rows = quick
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert rows and all(REQUIRED <= set(r) for r in rows)
    assert f"{len(rows)} kernels checked" in proc.stdout
    assert not any(r["cached"] for r in rows)          # an empty cache: everything compiled


@EXTENDED
def test_a_second_check_reads_every_kernel_from_the_results_cache(quick, results_cache,
                                                                    tmp_path):
    _, first = quick
    proc, again = _run_quick(tmp_path / "rows.json", results_cache)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert len(again) == len(first) and all(r["cached"] for r in again)
    assert "0 compiled" in proc.stdout and f"{len(first)} from the results cache" in proc.stdout
    measured = ("kernel", "arch", "dtype", "registers", "spill_bytes", "shared_bytes")
    assert [[r[k] for k in measured] for r in again] == [[r[k] for k in measured] for r in first]


@EXTENDED
def test_every_op_compiles_forward_and_backward_in_bf16_for_sm90(quick):
    _, rows = quick
    covered = {(r["op"], r["pass"]) for r in rows if r["dtype"] == "bf16" and r["arch"] == "sm_90"}
    assert covered == {(op, p) for op in OPS for p in ("fwd", "bwd")}


@EXTENDED
def test_quick_kernels_fit_the_gpu_and_do_not_spill(quick):
    """Every op's quick-set kernels are spill-free since issue 23 (configs, Infini's
    HAS_MIX / SEGMENTED pruning, MTA / DCMHA launch options and d_head chunks)."""
    _, rows = quick
    assert {r["op"] for r in rows} == set(OPS)
    for r in rows:
        assert r["error"] is None, r
        assert r["shared_bytes"] <= SHARED_LIMIT[r["arch_cc"]], r
        assert r["registers"] * r["num_warps"] * 32 <= 65536, r
        assert r["spill_bytes"] == 0, f"{r['op']} {r['kernel']} {r['config']} spills: {r}"


def test_options_select_cases_by_name():
    from attnlens.kernels.compile_check.__main__ import _args
    from attnlens.kernels.compile_check.run import select_cases

    args = _args(["--ops", "cope", "mta", "--options", "npos256", "H4 mix only"])
    assert args.options == ["npos256", "H4 mix only"]
    chosen = select_cases(args.ops, args.main_only, args.options)
    assert [(c.op, c.name) for c in chosen] == [("cope", "npos256"), ("mta", "H4 mix only")]
    assert [c.name for c in select_cases(["cope"], main_only=True)] == ["npos128"]
    assert select_cases(["cope"], options=["no such option"]) == []


def test_problems_name_the_limit_that_is_exceeded():
    row = dict(arch_cc=80, shared_bytes=170 * 1024, registers=200, num_warps=16)
    found = problems(row)
    assert any("shared memory" in p for p in found) and any("registers" in p for p in found)
    assert problems(dict(arch_cc=90, shared_bytes=170 * 1024, registers=128, num_warps=4)) == []


def test_compiler_errors_are_one_line_with_the_cause():
    try:
        try:
            raise NameError("Cannot access global variable LOG2E")
        except NameError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as e:
        assert describe_error(e) == "RuntimeError: outer"


@pytest.mark.skipif(not _triton.interpreting(), reason="checks the interpreter refusal")
def test_capture_refuses_to_run_under_the_interpreter():
    from attnlens.kernels.compile_check.capture import capturing

    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        with capturing():
            pass


def test_results_cache_round_trip_and_misses(tmp_path):
    """A stored row comes back; another key, an unreadable entry or an error row do not."""
    from attnlens.kernels.compile_check.results_cache import ROW_FIELDS, ResultCache

    cache = ResultCache(tmp_path)
    key = cache.key("launch A")
    assert cache.key("launch A") == key != cache.key("launch B")
    assert cache.get(key) is None
    row = dict(kernel="k", registers=96, spill_bytes=0, stack_bytes=0, shared_bytes=1024,
               compile_s=1.5, error=None)
    cache.put(key, row, b"\x7fELF cubin")
    assert cache.get(key) == {name: row[name] for name in ROW_FIELDS}
    assert cache.get(cache.key("launch B")) is None
    (tmp_path / key[:2] / f"{key}.json").write_text("{not json")
    assert cache.get(key) is None                       # a torn entry is a miss, not a crash
    with pytest.raises(ValueError, match="not cached"):
        cache.put(key, dict(row, error="CompilationError: x"), b"")
    with pytest.raises(ValueError, match="sha256"):
        cache.get("../../etc/passwd")


def test_doc_table_groups_precisions_and_many_head_cases():
    from attnlens.kernels.compile_check.__main__ import doc_table

    def row(dtype, option, regs, spill=0, smem=2048, error=None):
        return dict(op="mta", pass_="fwd", kernel="k", config="16x16 w8 s1", dtype=dtype,
                    option=option, registers=regs, spill_bytes=spill, shared_bytes=smem,
                    error=error, **{"pass": "fwd"})

    rows = [row("fp16", "H4 6x11+mix", 100), row("bf16", "H4 6x11+mix", 120, smem=4096),
            row("fp32", "H4 6x11+mix", 200, spill=16), row("bf16", "H16 6x11+mix", 255, 464),
            row("fp16", "H4 mix only", 0, error="CompilationError: x")]
    lines = doc_table(rows).splitlines()
    assert lines[2:] == [
        "| mta | fwd | k | 16x16 w8 s1 | fp16/bf16 | 2 | 100-120 | 0 | 4 |",
        "| mta | fwd | k | 16x16 w8 s1 | fp32 | 1 | 200 | 16 | 2 |",
        "| mta | fwd | k | 16x16 w8 s1 (H16) | bf16 | 1 | 255 | 464 | 2 |"]


def test_cached_cubins_are_keyed_by_the_checkout_and_its_kernel_files(tmp_path):
    """A cubin's line info holds absolute source paths and line numbers, which the SASS mix
    reads back to name loops (`sass_mix.loop_var`); so `launch_key` (the results cache's key)
    carries `source_fingerprint`: the module's absolute path, and a hash of its sibling files
    and the kernels package's top level. The same kernel file in another checkout (a git
    worktree) or beside a changed helper file gets another key; an unchanged one the same."""
    import inspect
    import shutil

    from attnlens.kernels.compile_check import compiler

    a = tmp_path / "a" / "op"
    a.mkdir(parents=True)
    (a / "kern.py").write_text("def k():\n    for i in range(3):\n        pass\n")
    (a / "helper.py").write_text("X = 1\n")
    first = compiler.source_fingerprint(str(a / "kern.py"))
    assert first.startswith(str(a / "kern.py") + ":")
    assert compiler.source_fingerprint(str(a / "kern.py")) == first
    b = tmp_path / "b" / "op"
    shutil.copytree(a, b)
    assert compiler.source_fingerprint(str(b / "kern.py")) != first        # another checkout
    (a / "helper.py").write_text("\nX = 1\n")                              # lines shift
    assert compiler.source_fingerprint(str(a / "kern.py")) != first
    assert "source_fingerprint(" in inspect.getsource(compiler.launch_key)


def test_triton_cache_is_private_to_the_check(monkeypatch, tmp_path):
    """Triton's own cache is keyed by kernel source, not file: shared with another checkout it
    returns cubins whose line info names that checkout's files. The check compiles into a
    directory of its own (one per process, inherited by its workers; or the one asked for)."""
    import inspect

    from attnlens.kernels.compile_check import compiler, run

    # setenv first: monkeypatch then restores both variables (absent ones are deleted again),
    # so the marker does not leak into later tests' subprocesses
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "shared"))
    monkeypatch.setenv(compiler.PRIVATE_CACHE_ENV, "")
    mine = compiler.private_triton_cache()
    assert mine != str(tmp_path / "shared") and os.path.isdir(mine)
    assert os.environ["TRITON_CACHE_DIR"] == mine == compiler.private_triton_cache()
    assert compiler.private_triton_cache(str(tmp_path / "asked")) == str(tmp_path / "asked")
    assert "private_triton_cache()" in inspect.getsource(compiler.compile_launch)
    assert "private_triton_cache()" in inspect.getsource(run.compile_all)
    monkeypatch.delenv("TRITON_CACHE_DIR")            # marker set, directory gone: a new one
    assert os.path.isdir(compiler.private_triton_cache())
