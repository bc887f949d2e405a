"""`python -m attnlens.benchmarks.kernels`: exits cleanly without a GPU, and runs tiny sizes with
--cpu."""

import pytest
import torch

from attnlens.benchmarks import kernels as bench
from attnlens.kernels import _triton


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_gpu_prints_a_message_and_exits_zero(capsys):
    assert bench.main([]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


@pytest.mark.kernels
@pytest.mark.skipif(not (_triton.available() and _triton.interpreting()),
                    reason="needs TRITON_INTERPRET=1")
def test_cpu_smoke_run_prints_a_table(capsys):
    assert bench.main(["--cpu", "--T", "17", "--d", "16", "--reps", "1", "--ops", "flash"]) == 0
    out = capsys.readouterr().out
    assert "| 17 | 16 | fused |" in out and "| 17 | 16 | sdpa |" in out
    assert "device: CPU" in out and "command: python -m attnlens.benchmarks.kernels --cpu" in out


@pytest.mark.kernels
@pytest.mark.skipif(not (_triton.available() and _triton.interpreting()),
                    reason="needs TRITON_INTERPRET=1")
def test_cope_options_row_runs_fused_and_reference(capsys):
    assert bench.main(["--cpu", "--T", "9", "--d", "16", "--reps", "1",
                       "--ops", "cope_options"]) == 0
    out = capsys.readouterr().out
    assert "### cope_options" in out
    assert "| 9 | 16 | fused |" in out and "| 9 | 16 | reference |" in out


@pytest.mark.kernels
@pytest.mark.skipif(not (_triton.available() and _triton.interpreting()),
                    reason="needs TRITON_INTERPRET=1")
def test_check_measures_errors_against_float64(capsys):
    """--check: fused and torch errors against the float64 reference, small in fp32."""
    assert bench.main(["--cpu", "--check", "--T", "12", "--d", "16", "--ops", "flash,mta"]) == 0
    out = capsys.readouterr().out
    assert "error against the float64 reference" in out
    rows = [line for line in out.splitlines() if line.startswith("| flash") or
            line.startswith("| mta")]
    assert len(rows) == 2
    for row in rows:
        errors = [float(c) for c in row.strip("|").split("|")[3:]]
        assert len(errors) == 4 and all(0 < e < 1e-5 for e in errors), row


def test_a_failing_kernel_row_is_reported_not_raised(capsys, monkeypatch):
    def broken(*args):
        raise RuntimeError("compile failed")

    monkeypatch.setitem(bench.OPS, "flash", lambda *a: {"fused": (lambda: [], broken)})
    lines = bench.run_op("flash", [8], [16], 1, 1, torch.float32, 1, False, "cpu")
    assert "error: RuntimeError" in lines[-1]
    assert "compile failed" in capsys.readouterr().err
