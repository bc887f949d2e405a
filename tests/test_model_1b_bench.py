"""`python -m attnlens.benchmarks.model_1b`: refuses without a GPU, and its --tiny smoke run prints
every row (forward torch / triton, one-head and all-heads pattern hooks) on the CPU."""

import pytest
import torch

from attnlens.benchmarks import model_1b as bench
from attnlens.kernels import _triton


def test_without_gpu_refuses_naming_the_smoke_option(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "build", lambda *a, **kw: pytest.fail("built a model"))
    assert bench.main([]) == 0            # a note, not a failure: `make bench` runs through
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out and "--tiny" in out


def test_tiny_on_the_cpu_without_the_interpreter_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(_triton, "interpreting", lambda: False)
    with pytest.raises(SystemExit, match="TRITON_INTERPRET=1"):
        bench.main(["--tiny"])


def test_bad_arguments_are_refused_before_any_model_is_built(monkeypatch):
    monkeypatch.setattr(bench, "build", lambda *a, **kw: pytest.fail("built a model"))
    for argv in (["--tiny", "--variants", "gpt"], ["--tiny", "--reps", "0"]):
        with pytest.raises(SystemExit):
            bench.main(argv)


def test_the_1b_shape_has_about_a_billion_parameters():
    s = bench.SHAPE_1B
    per_layer = 4 * s["d_model"] * s["n_heads"] * s["d_head"] + 2 * s["d_model"] * s["d_mlp"]
    assert (s["n_layers"], s["d_model"], s["n_heads"]) == (24, 2048, 16)
    assert 1.1e9 < s["n_layers"] * per_layer + 2 * s["d_vocab"] * s["d_model"] < 1.5e9


@pytest.mark.kernels
@pytest.mark.skipif(not (_triton.available() and _triton.interpreting()),
                    reason="needs TRITON_INTERPRET=1")
def test_tiny_smoke_run_prints_every_row(capsys):
    assert bench.main(["--tiny", "--variants", "mha,cope", "--T", "12", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and "device: CPU" in out
    for variant in ("mha", "cope"):
        for run in ("forward, torch", "forward, triton", "triton + L1H0 pattern (1 head)",
                    "triton + L1 pattern (all heads)"):
            assert f"| {variant} | {run}" in out, (variant, run)
