"""The latency instruments of the compile check (`chain.py`, `latency.py`) on SASS text: no
compile, no GPU (the hot loops under tests/data/sass were cut from sm_90 cubins that triton
3.9.0 made of the flash forward, docs/benchmarks.md "Causal attention forward on sm_90: the
row sum on the tensor cores")."""

from pathlib import Path

import pytest

from attnlens.kernels.compile_check.chain import LATENCIES, chain_cycles, mean_cycles, registers
from attnlens.kernels.compile_check.sass_mix import Instr, parse

SASS = Path(__file__).parent / "data" / "sass"


def body(*lines: str) -> list[Instr]:
    """Instructions from `OPCODE operands` strings, 16 bytes apart."""
    out = []
    for n, line in enumerate(lines):
        op, _, rest = line.partition(" ")
        out.append(Instr(16 * n, op, rest))
    return out


QK = "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0"          # 32 tensor cycles
WAIT_ALL = "WARPGROUP.DEPBAR.LE gsb0, 0x0"


@pytest.mark.parametrize("name, cycles", [("flash_fwd_64x64_w4_d64_ahead.sass", 423),
                                          ("flash_fwd_128x64_w8_d128_ahead.sass", 625)])
def test_chain_reproduces_the_documented_hand_counts(name, cycles):
    assert chain_cycles(parse((SASS / name).read_text())) == cycles


def test_chain_waits_for_the_tensor_queue_and_overlaps_work_left_in_flight():
    assert chain_cycles(body(QK, WAIT_ALL, "FADD R1, R2, R3")) == 35
    # P V (64 tensor cycles) issued right after the wait, left in flight across 40 MUFU: the
    # next pass's Q K^T queues behind it, so the wait is its 64 - 41 = 23 cycles not covered
    # + Q K^T's 32; pass = QK issue 1 + wait 23 + 32 + DEPBAR 1 + PV issue 1 + 40 MUFU
    pv = "HGMMA.64x128x16.F32.BF16 R40, R8, gdesc[UR8], R40, gsb0"
    assert chain_cycles(body(QK, WAIT_ALL, pv, *["MUFU.EX2 R1, R1"] * 40)) == 98
    # issued at the end instead, nothing hides it: + 64 - 23 cycles
    assert chain_cycles(body(QK, WAIT_ALL, *["MUFU.EX2 R1, R1"] * 40, pv)) == 138
    # DEPBAR.LE gsb0, 1 waits for the previous pass's group only: the tensor cores' 32 cycles
    # per pass bound 3 instructions; 40 more instructions hide them
    one_left = "WARPGROUP.DEPBAR.LE gsb0, 0x1"
    assert chain_cycles(body(QK, one_left, "FADD R1, R2, R3")) == 32
    assert chain_cycles(body(QK, one_left, *["FADD R1, R2, R3"] * 40)) == 42


def test_latencies_wait_for_operands_and_pipelined_copies_hide_them():
    dependent = body(*["FFMA R1, R1, R2, R3"] * 8)
    independent = body(*[f"FFMA R{10 + i}, R2, R3, R4" for i in range(8)])
    assert chain_cycles(dependent) == chain_cycles(independent) == 8
    assert chain_cycles(dependent, LATENCIES) == 8 * LATENCIES.alu
    assert chain_cycles(independent, LATENCIES) == 8
    # a copy committed and waited in the same pass costs its global latency ...
    alu = [f"IADD3 R{20 + i}, R2, R3, RZ" for i in range(100)]
    same = body("LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64]", "LDGDEPBAR",
                "DEPBAR.LE SB0, 0x0", *alu)
    assert chain_cycles(same, LATENCIES) == 2 + LATENCIES.global_ + 100
    # ... one waited two commits later (num_stages 3) spreads it over 3 passes (one long pass
    # in three: the mean)
    ahead = body("LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64]", "LDGDEPBAR",
                 "DEPBAR.LE SB0, 0x2", *alu)
    assert mean_cycles(ahead, LATENCIES) == pytest.approx((2 + LATENCIES.global_ + 100) / 3)
    assert mean_cycles(body("LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64]", "LDGDEPBAR",
                            "DEPBAR.LE SB0, 0x6", *alu), LATENCIES) == 103
    assert chain_cycles(ahead) == len(ahead)                  # no latencies: issue only


def test_registers_read_and_written():
    assert registers(Instr(0, "LDG.E.128", "R4, desc[UR4][R2.64]")) == ([4, 5, 6, 7], [2, 3])
    assert registers(Instr(0, "STG.E", "desc[UR4][R2.64], R7")) == ([], [2, 3, 7])
    assert registers(Instr(0, "FFMA", "R1, R2, UR4, RZ")) == ([1], [2])
    with pytest.raises(ValueError):
        chain_cycles(body(QK), passes=2, measured_pass=3)
