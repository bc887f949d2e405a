"""The two fused-kernel scripts (`attnlens.benchmarks.kernels`, `.repeatability`) parse their
shared options through one helper (`attnlens.benchmarks._kernel_cli`), each with its own
defaults per device; and a benchmark run reads the environment once, at its start
(`kernels.RunSettings`), so its rows cannot disagree."""

import pytest
import torch

from attnlens.benchmarks import _kernel_cli as cli
from attnlens.benchmarks import kernels as bench
from attnlens.benchmarks import repeatability as rep

TOY = cli.KernelCli("toy.script",
                    gpu=cli.Defaults(ops="b", T="4096", d="64,128", heads=16, dtype="bf16"),
                    cpu=cli.Defaults(ops=None, T="32,48", d="16", heads=2, dtype="fp32"),
                    no_gpu="it wants one.", cpu_help="tiny")
TOY_OPS = {"a": None, "b": None, "c": None}


def _cases(monkeypatch, argv, cuda: bool, script=TOY, ops=TOY_OPS):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    parser = script.parser(None, ops)
    return script.cases(parser, parser.parse_args(argv), ops)


def test_each_device_takes_the_scripts_own_defaults(monkeypatch):
    gpu = _cases(monkeypatch, [], cuda=True)
    assert (gpu.cuda, gpu.device, gpu.ops, gpu.Ts, gpu.Ds, gpu.heads, gpu.dtype) == (
        True, "cuda", ["b"], [4096], [64, 128], 16, torch.bfloat16)
    cpu = _cases(monkeypatch, ["--cpu"], cuda=True)   # --cpu wins over a GPU
    assert (cpu.cuda, cpu.device, cpu.ops, cpu.Ts, cpu.Ds, cpu.heads, cpu.dtype) == (
        False, "cpu", ["a", "b", "c"], [32, 48], [16], 2, torch.float32)


def test_the_command_line_overrides_every_default(monkeypatch):
    got = _cases(monkeypatch, ["--ops", "c,a", "--T", "7,9", "--d", "32", "--heads", "3",
                               "--dtype", "fp16"], cuda=True)
    assert (got.ops, got.Ts, got.Ds, got.heads, got.dtype_name) == (["c", "a"], [7, 9], [32], 3,
                                                                    "fp16")


def test_without_a_gpu_the_script_says_why_and_runs_nothing(monkeypatch, capsys):
    assert _cases(monkeypatch, [], cuda=False) is None
    assert capsys.readouterr().out == "toy.script: no CUDA GPU found; it wants one.\n"


def test_an_unknown_op_is_a_usage_error(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        _cases(monkeypatch, ["--cpu", "--ops", "a,zz"], cuda=False)
    assert exc.value.code == 2
    assert "unknown ops ['zz']; choose from ['a', 'b', 'c']" in capsys.readouterr().err


@pytest.mark.parametrize("script", [bench, rep], ids=["kernels", "repeatability"])
def test_the_help_states_each_default_of_each_device(script):
    """The help is made from the defaults the run takes, so it cannot go stale."""
    parser = script.CLI.parser(None, bench.OPS)
    text = " ".join(parser.format_help().split())
    assert parser.prog == f"python -m {script.CLI.module}"
    gpu, cpu = script.CLI.gpu, script.CLI.cpu
    for field in ("ops", "T", "d", "heads", "dtype"):
        g, c = (getattr(device, field) or "all" for device in (gpu, cpu))
        assert (f"default {g}" if g == c else f"default {g} on CUDA; {c} on the CPU") in text, \
            (field, text)


def test_the_benchmark_runs_the_gpu_defaults_through_the_helper(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "header", lambda cuda, argv: "header")
    monkeypatch.setattr(bench, "run_op", lambda *a: calls.append(a))
    assert bench.main(["--ops", "flash,mta", "--isolated"]) == 0
    gpu = bench.CLI.gpu
    Ts, Ds = [int(t) for t in gpu.T.split(",")], [int(d) for d in gpu.d.split(",")]
    assert [c[:10] for c in calls] == [
        (op, Ts, Ds, 1, gpu.heads, cli.DTYPES[gpu.dtype], 20, True, "cuda", True)
        for op in ("flash", "mta")]


def test_the_repeatability_check_runs_the_gpu_defaults_through_the_helper(monkeypatch):
    cmds = []

    def run_case(cmd, timeout, env):
        cmds.append((cmd[3:], env["TRITON_INTERPRET"]))
        return {"status": "ok", "out_same": True, "grads": 1, "grads_differ": [],
                "max_diff": 0.0, "ms": 1.0}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(rep, "run_case", run_case)
    assert rep.main([]) == 0
    gpu = rep.CLI.gpu
    assert cmds == [(["--child", op, T, d, str(gpu.heads), gpu.dtype], "0")
                    for op in gpu.ops.split(",") for T in gpu.T.split(",")
                    for d in gpu.d.split(",")]


# -- the environment, read once per run --------------------------------------------------------
def _toy_cases(on_backward):
    """A one-input op whose backward calls `on_backward` (to change the environment midway)."""
    def cases(B, H, T, D, dtype, device):
        def make():
            return [torch.ones(T, D, dtype=dtype, requires_grad=True)]

        def fn(x):
            out = x * 2
            if out.requires_grad:
                out.register_hook(lambda g: on_backward())
            return out

        return {"fused": (make, fn), "reference": (make, fn)}

    return cases


def test_a_runs_rows_agree_when_the_environment_changes_midway(monkeypatch):
    """The first row's backward asks to skip the op's backward: every row still times it."""
    backwards = []

    def skip_from_now_on():
        backwards.append(1)
        monkeypatch.setenv(bench.SKIP_BACKWARD_ENV, "toy")

    monkeypatch.setitem(bench.OPS, "toy", _toy_cases(skip_from_now_on))
    monkeypatch.setenv(bench.SKIP_BACKWARD_ENV, "")
    lines = bench.run_op("toy", [5, 6], [4], 1, 1, torch.float32, 1, False, "cpu")
    rows = [line for line in lines if line.startswith("| 5 |") or line.startswith("| 6 |")]
    assert len(rows) == 4 and not any("skipped" in row for row in rows), rows
    # and a settings object passed down is what counts, not the environment
    lines = bench.run_op("toy", [5], [4], 1, 1, torch.float32, 1, False, "cpu",
                         settings=bench.RunSettings())
    assert "skipped" not in lines[-1]


def test_the_benchmark_reads_the_environment_once_for_all_its_ops(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(bench.SKIP_BACKWARD_ENV, "")
    monkeypatch.setitem(bench.OPS, "toy", _toy_cases(
        lambda: monkeypatch.setenv(bench.SKIP_BACKWARD_ENV, "toy,toy2")))
    monkeypatch.setitem(bench.OPS, "toy2", _toy_cases(lambda: None))
    assert bench.main(["--cpu", "--ops", "toy,toy2", "--T", "5", "--d", "4", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "### toy2" in out and "skipped" not in out


def test_the_accuracy_table_reads_the_environment_once(monkeypatch):
    monkeypatch.setitem(bench.OPS, "toy", _toy_cases(
        lambda: monkeypatch.setenv(bench.SKIP_BACKWARD_ENV, "toy")))
    monkeypatch.setenv(bench.SKIP_BACKWARD_ENV, "")
    lines = bench.check_table(["toy"], [5, 6], [4], 1, 1, torch.float32, "cpu")
    assert len(lines) == 6 and "nan" not in lines[-1], lines    # the last row's gradients
    assert bench.skipped_backward() == {"toy"}                  # the environment did change


def test_settings_read_the_skip_list():
    got = bench.RunSettings.from_env({bench.SKIP_BACKWARD_ENV: "mta,,dcmha"})
    assert got.skip_backward == {"mta", "dcmha"}
    assert bench.RunSettings.from_env({}).skip_backward == frozenset()
