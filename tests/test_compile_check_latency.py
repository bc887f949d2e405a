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


def small_kernel(loop: list[str]) -> list[Instr]:
    """A kernel of SASS: a global load waited at once, `loop` closed by a backward branch."""
    head = body("LDG.E R2, desc[UR4][R6.64]", "FADD R3, R2, R2")
    inner = [Instr(32 + 16 * i, ins.opcode, ins.operands) for i, ins in enumerate(body(*loop))]
    return head + inner + [Instr(32 + 16 * len(loop), "BRA", "0x20"), Instr(48 + 16 * len(loop),
                                                                             "EXIT", "")]


def test_latency_reading_of_a_small_launch_takes_the_longest_term():
    from attnlens.kernels.compile_check.latency import program_cycles, reading
    from attnlens.kernels.compile_check.roofline import PEAKS
    from attnlens.kernels.compile_check.sass_mix import loops

    instrs = small_kernel(["FFMA R1, R1, R2, R3"] * 10)            # a dependent chain
    found = loops(instrs)
    assert len(found) == 1
    per_warp = program_cycles(instrs, found, [100])
    # 100 passes of 11 (10 FFMA + BRA) + LDG, FADD, EXIT once; a pass takes 10 x 4 cycles
    # (the BRA hides in the wait): 29 waited per pass; outside, the FADD waits 599 on the LDG
    assert per_warp["instructions"] == 1103
    assert per_warp["chain"] == 1103 + 100 * 29 + 599
    h200 = PEAKS["H200"]
    one = reading(per_warp, warps=4, programs=132, resident_programs=4, io_bytes=0, peak=h200)
    assert one["bound"] == "latency"                                # 1 program per SM
    assert one["latency_s"] == pytest.approx(per_warp["chain"] / h200.clock)
    many = reading(per_warp, warps=4, programs=132 * 64, resident_programs=16, io_bytes=0,
                   peak=h200)
    assert many["bound"] == "issue"                      # 64 programs per SM, 16 side by side
    assert many["latency_s"] == pytest.approx(4 * per_warp["chain"] / h200.clock)
    assert many["issue_s"] == pytest.approx(64 * 4 * 1103 / 4 / h200.clock)
    assert reading(per_warp, 4, 132, 4, io_bytes=1e9, peak=h200)["bound"] == "hbm"
    with pytest.raises(ValueError, match="no program fits"):
        reading(per_warp, 4, 132, 0, io_bytes=0, peak=h200)


def test_exp_heavy_programs_are_bound_by_the_special_function_units():
    """The SFU term: a warp's MUFU holds its partition's 4 special-function lanes 8 clocks,
    so a program with more than one MUFU per 8 instructions is bound there, not by issue."""
    from attnlens.kernels.compile_check.latency import reading
    from attnlens.kernels.compile_check.roofline import PEAKS

    h200 = PEAKS["H200"]
    per_warp = dict(instructions=1000, chain=1000, mma_flops=0, mufu=200)
    r = reading(per_warp, warps=8, programs=132, resident_programs=1, io_bytes=0, peak=h200)
    # issue 8 warps x 1000 / 4 schedulers = 2000 clocks; SFU 8 x 200 x 32 lanes / 16 = 3200
    assert r["bound"] == "sfu" and r["time_s"] == r["sfu_s"]
    assert r["sfu_s"] == pytest.approx(3200 / h200.clock)
    assert r["issue_s"] == pytest.approx(2000 / h200.clock)
    even = reading(dict(per_warp, mufu=125), 8, 132, 1, io_bytes=0, peak=h200)
    assert even["sfu_s"] == pytest.approx(even["issue_s"])          # one MUFU per 8
    fewer = reading(dict(per_warp, mufu=100), 8, 132, 1, io_bytes=0, peak=h200)
    assert fewer["bound"] == "issue"
    no_count = {k: v for k, v in per_warp.items() if k != "mufu"}
    assert reading(no_count, 8, 132, 1, io_bytes=0, peak=h200)["sfu_s"] == 0


def test_one_constant_fit_and_leave_one_out():
    from attnlens.kernels.compile_check.latency import fit_scale, leave_one_out

    pairs = [(1.0, 2.0), (2.0, 4.0), (3.0, 6.0)]                   # (reading, measured)
    assert fit_scale(pairs) == pytest.approx(2.0)
    assert leave_one_out(pairs) == pytest.approx([1.0, 1.0, 1.0])
    assert leave_one_out([(1.0, 1.0), (1.0, 4.0)]) == pytest.approx([4.0, 0.25])
    with pytest.raises(ValueError):
        fit_scale([])


def test_stalls_name_what_each_wait_is_for_and_add_up_to_the_waits():
    from attnlens.kernels.compile_check.chain import stalls

    # a global load used at once: the FADD waits the load's latency, less the one cycle
    # between; a dot's queue waited by the DEPBAR; a cp.async group waited right after its
    # commit
    loop = body("LDG.E R10, desc[UR4][R6.64]", "FADD R11, R10, R3",
                QK, WAIT_ALL,
                "LDGSTS.E.BYPASS.128 [R5], desc[UR4][R8.64]", "LDGDEPBAR",
                "DEPBAR.LE SB0, 0x0", "FADD R12, R2, R3")
    rows = stalls(loop, LATENCIES)
    by_addr = {r["addr"]: r for r in rows}
    assert by_addr[16]["cause"] == "operand"
    assert by_addr[16]["producer"] == "0x0000 LDG.E"
    assert by_addr[16]["source"] is None and by_addr[16]["producer_source"] is None
    assert by_addr[16]["cycles"] == pytest.approx(LATENCIES.global_ - 1)
    assert by_addr[48]["cause"] == "tensor" and by_addr[48]["cycles"] > 0
    assert by_addr[96]["cause"] == "copy"
    assert by_addr[96]["cycles"] == pytest.approx(LATENCIES.global_ - 1)   # from the commit
    assert [r["cycles"] for r in rows] == sorted((r["cycles"] for r in rows), reverse=True)
    assert sum(r["cycles"] for r in rows) == pytest.approx(
        mean_cycles(loop, LATENCIES) - len(loop))
    # a load issued more than its latency ahead of its use is not waited for; right before
    # it, it is
    work = [f"IADD3 R{20 + i}, R2, R3, RZ" for i in range(700)]
    assert stalls(body("LDG.E R10, desc[UR4][R6.64]", *work, "FADD R11, R10, R3"),
                  LATENCIES) == []
    late = stalls(body(*work, "LDG.E R10, desc[UR4][R6.64]", "FADD R11, R10, R3"), LATENCIES)
    assert [(r["addr"], r["cycles"]) for r in late] == [(16 * 701, LATENCIES.global_ - 1)]


def test_waits_report_lists_the_loops_that_wait_and_their_longest_waits():
    from attnlens.kernels.compile_check.latency import program_cycles, waits_report
    from attnlens.kernels.compile_check.sass_mix import loops

    instrs = small_kernel(["FFMA R1, R1, R2, R3"] * 10)
    found = loops(instrs)
    per_warp = program_cycles(instrs, found, [100])
    assert per_warp["loops"][0]["waits"][0]["cause"] == "operand"
    row = dict(pass_="fwd", kernel="k", config="64x64 w4 s1", reading=dict(bound="latency"),
               per_warp=per_warp, loops=per_warp["loops"])
    text = waits_report([dict(op="flash", T=4096, d=64, rows=[row])])
    lines = text.splitlines()
    assert lines[0].startswith("flash T=4096 d=64 fwd k 64x64 w4 s1: chain")
    assert "100.0 passes, body 11" in lines[1]
    assert "(operand from" in lines[2] and "FFMA" in lines[2]
    # with source lines (`nvdisasm -g`), the loop's and each wait's are named
    per_warp["loops"][0]["source"] = ("/k/kernel.py", 12)
    per_warp["loops"][0]["waits"][0]["source"] = ("/k/kernel.py", 14)
    lines = waits_report([dict(op="flash", T=4096, d=64, rows=[row])]).splitlines()
    assert "loop 0 (kernel.py:12):" in lines[1]
    assert "FFMA (kernel.py:14) (operand from" in lines[2]
    # a loop whose waits are below the share is left out
    assert len(waits_report([dict(op="flash", T=4096, d=64, rows=[row])],
                            least_share=0.9).splitlines()) == 1
