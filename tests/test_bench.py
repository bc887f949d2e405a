"""`make bench` / `python -m attnlens.bench`: one entry point over every benchmark script."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import EXTENDED

import attnlens.benchmarks
from attnlens import bench

ROOT = Path(__file__).resolve().parents[1]


def test_every_benchmark_script_is_registered():
    """Every module of attnlens/benchmarks/ is a script, registered, but for the helpers the
    scripts share (their names start with "_", as `_kernel_cli`); a helper is no script."""
    modules = {m.name: m for m in pkgutil.iter_modules(attnlens.benchmarks.__path__)}
    scripts = {f"attnlens.benchmarks.{name}" for name in modules if not name.startswith("_")}
    registered = {b.module for b in bench.BENCHMARKS}
    assert scripts == registered
    helpers = [name for name in modules if name.startswith("_")]
    assert "_kernel_cli" in helpers
    for name in helpers:
        source = (ROOT / "attnlens" / "benchmarks" / f"{name}.py").read_text()
        assert "__main__" not in source, f"{name} runs as a script: register it, drop the _"


def test_makefile_bench_target_runs_this_module():
    makefile = (ROOT / "Makefile").read_text()
    assert "-m attnlens.bench" in makefile


def test_unknown_name_is_refused_with_the_known_names(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--only", "nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "nope" in err and "core" in err


@EXTENDED   # three benchmark scripts end to end; the entry point's registry and errors: above
def test_quick_run_prints_each_table_and_exits_zero():
    out = subprocess.run([sys.executable, "-m", "attnlens.bench", "--quick", "--only",
                          "core", "diversity", "kernels"], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "# core hook overhead" in out.stdout and "| plain forward |" in out.stdout
    assert "# head diversity" in out.stdout
    assert "<!-- kernels: exit 0" in out.stdout


def test_a_failing_script_is_named_and_fails_the_run(monkeypatch, capsys):
    broken = bench.Benchmark("broken", "attnlens.benchmarks.no_such_module", "x", ())
    monkeypatch.setattr(bench, "BENCHMARKS", (broken,))
    assert bench.main([]) == 1
    assert "FAILED benchmarks: broken" in capsys.readouterr().err
