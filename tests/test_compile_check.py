"""`python -m kernels.compile_check --quick`: every op's forward and backward kernels compile
for sm_90 in bf16 with Triton's real compiler (no GPU), within the launch limits, spill-free.

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

from kernels import _triton
from kernels.compile_check.cases import OPS
from kernels.compile_check.compiler import SHARED_LIMIT, describe_error, problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = {"op", "kernel", "pass", "config", "arch", "dtype", "registers", "spill_bytes",
            "shared_bytes", "compile_s"}

pytestmark = pytest.mark.skipif(not _triton.available(), reason="needs triton")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile_check") / "rows.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "--quick", "--json",
                           str(out), "--no-progress"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    rows = json.loads(out.read_text()) if out.exists() else []
    return proc, rows


def test_quick_check_exits_zero_and_writes_rows(quick):
    proc, rows = quick
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert rows and all(REQUIRED <= set(r) for r in rows)
    assert f"{len(rows)} kernels compiled" in proc.stdout


def test_every_op_compiles_forward_and_backward_in_bf16_for_sm90(quick):
    _, rows = quick
    covered = {(r["op"], r["pass"]) for r in rows if r["dtype"] == "bf16" and r["arch"] == "sm_90"}
    assert covered == {(op, p) for op in OPS for p in ("fwd", "bwd")}


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
    from kernels.compile_check.__main__ import _args
    from kernels.compile_check.run import select_cases

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
    from kernels.compile_check.capture import capturing

    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        with capturing():
            pass
