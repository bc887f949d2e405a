"""The compile check's per-source-line reading (`compile_check/by_line.py`): trip-weighted SASS
summed per kernel line, global accesses given their true lines from the PTX.

The pure parts run on hand-written SASS and PTX; one check compiles the benchmark's flash
forward at T 256 for sm_90 in a subprocess (TRITON_INTERPRET unset) and skips without triton's
ptxas / nvdisasm / cuobjdump.
"""

import os
import subprocess
import sys

import pytest
from test_compile_check_instruments import _tools_present

from attnlens.kernels.compile_check.by_line import (
    NO_LINE,
    fix_lines,
    line_counts,
    ptx_line_fixes,
    table,
)
from attnlens.kernels.compile_check.sass_mix import instruction_weights, loops, parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# nvdisasm -g style: a loop over lines 12 (a tensor-core MMA, a 16-byte load) and 11 (the
# branch), entered from line 10. ptxas gave the load line 14: the PTX below moved it there.
SASS = """
	//## File "/src/k.py", line 10
        /*0000*/                   MOV R0, RZ ;
.L_x_0:
	//## File "/src/k.py", line 12
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
	//## File "/src/k.py", line 14
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
	//## File "/src/k.py", line 12
        /*0030*/                   FADD R1, R1, R2 ;
	//## File "/src/k.py", line 11
        /*0040*/              @!P3 BRA `(.L_x_0) ;
        /*0050*/                   EXIT ;
"""

# Triton's inline asm for a v4 load at line 12 (its default value's movs numbered on: the
# ld.global lands on 14... here on 12 + 2 for two movs), and a store whose block starts and
# ends on line 20 (a global access of line 20 itself).
PTX = """
	.file	1 "/src/k.py"
	.loc	1 12 5
	// begin inline asm
	.loc	1 12 24
	mov.u32 %r1, 0x0;
	.loc	1 13 24
	mov.u32 %r2, 0x0;
	.loc	1 14 24
	@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];

	// end inline asm
	.loc	1 14 9
	add.s32 %r5, %r1, %r2;
	// begin inline asm
	.loc	1 20 9
	@%p2 st.global.b32 [ %rd2 + 0 ], { %r5 };
	// end inline asm
"""


def test_ptx_line_fixes_move_an_inline_asm_access_to_its_statement():
    assert ptx_line_fixes(PTX) == {("/src/k.py", 14): 12}


def test_a_line_with_an_access_of_its_own_keeps_it():
    """Line 14 also starts a load of its own: a load ptxas put on line 14 may be either."""
    own = PTX + """
	// begin inline asm
	.loc	1 14 30
	ld.global.b32 { %r9 }, [ %rd3 + 0 ];
	// end inline asm
"""
    assert ptx_line_fixes(own) == {}


def test_counts_per_line_weight_the_loop_and_take_the_fixed_lines():
    instrs = parse(SASS)
    found = loops(instrs)
    assert fix_lines(instrs, ptx_line_fixes(PTX)) == 1      # the LDG only, not other classes
    weights = instruction_weights(instrs, found, [5])
    lines = line_counts(instrs, weights, scale=2)            # 2 warps x programs
    k12, k11, k10 = ("/src/k.py", 12), ("/src/k.py", 11), ("/src/k.py", 10)
    assert set(lines) == {k10, k11, k12}
    assert lines[k12]["instructions"] == 3 * 5 * 2             # HGMMA, LDG, FADD
    assert lines[k12]["global_bytes"] == 16 * 32 * 5 * 2
    assert lines[k12]["mma_flops"] == 2 * 64 * 64 * 16 // 4 * 5 * 2
    assert lines[k11]["instructions"] == (5 + 1) * 2              # the branch, then EXIT
    assert lines[k10]["instructions"] == 2
    assert ("/src/k.py", 14) not in lines and NO_LINE not in lines


def test_table_orders_by_the_chosen_count_and_names_a_bad_one():
    instrs = parse(SASS)
    lines = line_counts(instrs, instruction_weights(instrs, loops(instrs), [5]))
    text = table("k", lines, sort="instructions", top=2)
    rows = [r for r in text.splitlines() if r.startswith("| k.py:")]
    # unfixed: the LDG stays on 14 (5); 12 has the HGMMA and FADD (10), 11 BRA and EXIT (6)
    assert [r.split(" |")[0] for r in rows] == ["| k.py:12", "| k.py:11"]
    assert "k.py:14" not in text and "the top 2 lines by instructions" in text
    with pytest.raises(ValueError, match="sort='flops': expected one of bytes, instructions"):
        table("k", lines, sort="flops")


@pytest.mark.skipif(not _tools_present(), reason="needs triton with ptxas, nvdisasm, cuobjdump")
def test_cli_on_the_flash_forward_puts_tensor_work_on_dots_and_bytes_on_loads():
    """`--op flash --T 256 --d 64 --sort mma`, every line: the forward's line with most tensor
    FLOPs is `_dot`'s `tl.dot`, and every line with global bytes is a `tl.load` or `tl.store`
    statement (without the PTX fix the k and v loads sat on the lines after theirs)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "attnlens.kernels.compile_check.by_line",
                           "--op", "flash", "--T", "256", "--d", "64", "--sort", "mma",
                           "--top", "200"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = [r.split(" | ") for r in proc.stdout.splitlines() if r.startswith("| ")
            and r[2:3] != "-" and not r.startswith("| line")]
    assert "tl.dot" in rows[0][1], proc.stdout
    with_bytes = [r for r in rows if float(r[4]) > 0]
    assert len(with_bytes) >= 4, proc.stdout                 # q, k, v loads; o, lse stores
    assert all("tl.load" in r[1] or "tl.store" in r[1] for r in with_bytes), proc.stdout
