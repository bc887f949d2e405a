"""The compile check under two Triton versions (`attnlens.kernels.compile_check.versions`, run by
scripts/triton_gpu_compat.sh): the comparison of two runs' rows, the table's exit status, the
capture errors that become rows, and that the script's cases and test list still exist.

Nothing here installs or compiles: the rows are made up (the script itself runs the real
compiles, in a side environment with the GPU image's triton).
"""

import json
import re
from pathlib import Path

import pytest

from attnlens.kernels import _triton

pytestmark = pytest.mark.skipif(not _triton.available(), reason="needs triton")

ROOT = Path(__file__).resolve().parents[1]


def _row(kernel="k", arch="sm_90", regs=128, spill=0, error=None, problems=None, **kw):
    row = dict(op="mta", option="H16 6x11+mix", main=False, dtype="bf16", d_head=64,
               kernel=kernel, config="64x64 w8 s1", arch=arch, arch_cc=int(arch[3:]),
               registers=regs, spill_bytes=spill, stack_bytes=spill, shared_bytes=1024,
               compile_s=1.0, cached=False, error=error)
    row["pass"] = "fwd"
    row.update(kw)
    row["problems"] = problems if problems is not None else ([error] if error else [])
    return row


def test_compare_notes_new_spills_errors_and_missing_kernels():
    from attnlens.kernels.compile_check.versions import compare, failing

    base = [_row("same"), _row("spills", regs=255), _row("breaks"), _row("gone"),
            _row("less", spill=16)]
    target = [_row("same", regs=130), _row("spills", regs=255, spill=32),
              _row("breaks", error="CompilationError: boom"), _row("less", spill=8),
              _row("extra")]
    notes = {e["kernel"]: e["note"] for e in compare(base, target)}
    assert notes == {"same": "", "spills": "new spill 32 B", "breaks": "CompilationError: boom",
                     "gone": "not compiled by the second version", "less": "spill 16 -> 8 B",
                     "extra": "not compiled by the first version"}
    assert [e["kernel"] for e in failing(compare(base, target))] == ["breaks", "gone"]


def test_a_launch_limit_of_the_second_version_is_a_failure():
    from attnlens.kernels.compile_check.versions import compare, failing

    over = _row(problems=["shared memory 240000 B > 232448 B per block"])
    entries = compare([_row()], [over])
    assert entries[0]["note"] == "shared memory 240000 B > 232448 B per block"
    assert failing(entries) == entries


def test_format_and_summary_show_both_versions_side_by_side():
    from attnlens.kernels.compile_check.versions import compare, format_compare, summary_markdown

    base = [_row(regs=200), _row(regs=210, d_head=128), _row(arch="sm_80", regs=255)]
    target = [_row(regs=220), _row(regs=255, spill=32, d_head=128),
              _row(arch="sm_80", error="CompilationError: x")]
    entries = compare(base, target)
    names = ("triton 3.9.0", "triton 3.6.0")
    text = format_compare(entries, names).splitlines()
    assert "triton 3.9.0 regs/spill" in text[0] and "triton 3.6.0 regs/spill" in text[0]
    assert re.search(r"200/0\s+220/0", text[1])
    assert re.search(r"210/0\s+255/32\s+new spill 32 B", text[2])
    assert re.search(r"255/0\s+ERROR\s+CompilationError: x", text[3])
    table = summary_markdown(entries, names).splitlines()
    assert len(table) == 4                       # header, rule, sm_90 (2 kernels), sm_80
    assert "| sm_90 | 2 | 200-210 / 0 | 220-255 / 32 | 64x64 w8 s1 d128: new spill 32 B |" \
        in table[2]
    assert "| sm_80 | 1 | 255 / 0 | - | 64x64 w8 s1 d64: CompilationError: x |" in table[3]


def _write(path, triton, rows):
    path.write_text(json.dumps({"triton": triton, "ptxas": "V12.8.93", "rows": rows}))
    return str(path)


def test_table_exits_one_only_when_the_second_version_fails(tmp_path, capsys):
    from attnlens.kernels.compile_check.versions import main

    base = _write(tmp_path / "a.json", "3.9.0", [_row()])
    spilling = _write(tmp_path / "b.json", "3.6.0", [_row(spill=8)])
    broken = _write(tmp_path / "c.json", "3.6.0", [_row(error="CompilationError: y")])
    md = tmp_path / "summary.md"
    assert main(["table", base, spilling, "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "triton 3.6.0 regs/spill" in out and "1 change their spill" in out
    assert "new spill 8 B" in md.read_text()
    assert main(["table", base, broken]) == 1
    assert "1 fail or are missing under triton 3.6.0" in capsys.readouterr().out


def test_a_case_whose_capture_raises_becomes_one_error_row_per_arch(monkeypatch):
    from attnlens.kernels.compile_check import run as run_module
    from attnlens.kernels.compile_check.cases import Case
    from attnlens.kernels.compile_check.versions import CAPTURE, collect

    def run(cap, dtype, d_head):
        raise AttributeError("module 'triton.language' has no attribute 'new_thing'")

    # the real capture refuses under the suite's TRITON_INTERPRET; the case's own error is
    # what a kernel module using an API the other triton lacks raises on import
    monkeypatch.setattr(run_module, "_record",
                        lambda case, dtype, d, arch=90: case.run(None, dtype, d))

    rows = collect([Case("mta", "broken", run)], ["bf16"], [64], [90, 80])
    assert [(r["kernel"], r["arch"]) for r in rows] == [(CAPTURE, "sm_90"), (CAPTURE, "sm_80")]
    assert all("new_thing" in r["error"] and r["problems"] for r in rows)


def test_each_arch_compiles_the_launch_recorded_for_it(monkeypatch):
    """sm_90-only tiles and paths (flash's HOPPER backward, MTA's whole-window sweep) make the
    launch itself depend on the architecture: an sm_80 row compiles the launch recorded under
    `capturing(80)`, not the sm_90 one (which had shown sm_80 spills no A100 would run)."""
    from attnlens.kernels.compile_check import compiler
    from attnlens.kernels.compile_check import run as run_module
    from attnlens.kernels.compile_check.cases import Case
    from attnlens.kernels.compile_check.versions import collect

    monkeypatch.setattr(run_module, "_record",
                        lambda case, dtype, d, arch=90: [f"launch-for-sm_{arch}"])
    monkeypatch.setattr(compiler, "launch_key", lambda launch, arch: f"{launch}@{arch}")
    monkeypatch.setattr(run_module, "compile_all",
                        lambda jobs, workers=1, cache=None: [(j.launch, j.arch) for j in jobs])
    rows = collect([Case("flash_attention", "causal", None)], ["bf16"], [64], [90, 80])
    assert rows == [("launch-for-sm_90", 90), ("launch-for-sm_80", 80)]


def test_the_compat_cases_are_the_main_options_and_the_documented_many_head_ones():
    from attnlens.kernels.compile_check.cases import CASES, OPS
    from attnlens.kernels.compile_check.versions import COMPAT_OPTIONS, compat_cases

    names = {c.name for c in compat_cases()}
    assert set(COMPAT_OPTIONS) <= names                # a renamed case would drop out silently
    assert {c.op for c in compat_cases()} == set(OPS)
    assert all(c.main for c in CASES if c.name in names - set(COMPAT_OPTIONS))


def test_the_scripts_interpreter_tests_exist():
    script = (ROOT / "scripts" / "triton_gpu_compat.sh").read_text()
    named = re.findall(r"(tests/test_\w+\.py)(?:::(\w+))?", script)
    assert len(named) >= 8
    for path, test in named:
        assert (ROOT / path).is_file(), path
        if test:
            assert re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.M), (path, test)
