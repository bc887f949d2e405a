"""The compile check's instruments (issue 57 item 1): the SASS instruction mix per loop body and
per launch (`sass_mix`, `trips`, `mix_report`), and the roofline estimate (`roofline`).

The pure parts run on hand-written SASS and made-up mixes; one check compiles the flash op's
quick kernels for sm_90 in a subprocess (TRITON_INTERPRET unset, as tests/test_compile_check.py)
and skips when triton or the wheel's nvdisasm/cuobjdump is missing.
"""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from tiers import EXTENDED

from attnlens.kernels import _triton
from attnlens.kernels.compile_check.roofline import (
    PEAKS,
    Peak,
    estimate,
    fastest,
    resident_warps,
)
from attnlens.kernels.compile_check.sass_mix import (
    access_bytes,
    callee_starts,
    innermost,
    loops,
    mix,
    mma_flops,
    parse,
    weighted_mix,
)
from attnlens.kernels.compile_check.trips import loop_trips, trips_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# cuobjdump -sass style: an outer loop 0x0040-0x00c0 around an inner loop 0x0060-0x0090, a
# forward branch, and the trap at the end (a branch to itself, not a loop).
SNIPPET = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;       /* 0x000000040204798 */
        /*0020*/               @P0 BRA 0xd0 ;                             /* 0x0000000000000000 */
        /*0030*/                   MOV R0, RZ ;
        /*0040*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*0050*/                   LDS.U16 R9, [R3] ;
        /*0060*/                   FFMA R10, R11, R12, R10 ;
        /*0070*/                   FMUL R13, R13, 0.5 ;
        /*0080*/                   SHFL.BFLY PT, R14, R13, 0x1, 0x1f ;
        /*0090*/              @!P1 BRA 0x60 ;
        /*00a0*/                   STG.E.64 desc[UR4][R2.64], R8 ;
        /*00b0*/                   ISETP.GE.AND P2, PT, R0, 0x4, PT ;
        /*00c0*/              @!P2 BRA 0x40 ;
        /*00d0*/                   EXIT ;
        /*00e0*/                   BRA 0xe0;
"""

# The same shape as nvdisasm -g -c prints it: labels and source lines.
LABELLED = """
	//## File "/src/k.py", line 10
        /*0000*/                   MOV R0, RZ ;
.L_x_0:
	//## File "/src/k.py", line 12
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0020*/                   FADD R1, R1, R2 ;
	//## File "/src/k.py", line 11
        /*0030*/              @!P3 BRA `(.L_x_0) ;
        /*0040*/                   EXIT ;
"""


def test_loop_finder_on_handwritten_sass():
    instrs = parse(SNIPPET)
    found = loops(instrs)
    assert [(lo.start, lo.end, lo.depth, lo.inner) for lo in found] == [
        (0x40, 0xc0, 0, False), (0x60, 0x90, 1, True)]
    assert [(lo.start, lo.end) for lo in innermost(found)] == [(0x60, 0x90)]
    inner = mix(instrs, 0x60, 0x90)
    assert (inner["ffma"], inner["fmul"], inner["shfl"], inner["mma"]) == (1, 1, 1, 0)
    assert inner["cuda_flops"] == 2 * 32 + 32                # FFMA 2, FMUL 1 per lane
    outer = mix(instrs, 0x40, 0xc0)
    assert (outer["mma"], outer["lds"], outer["stg"]) == (1, 1, 1)
    assert outer["mma_flops"] == 2 * 16 * 8 * 16
    whole = mix(instrs)
    assert whole["ldg"] == 1 and whole["global_bytes"] == (16 + 8) * 32     # .128 + .64


def test_weighted_mix_multiplies_the_trips_of_enclosing_loops():
    instrs = parse(SNIPPET)
    found = loops(instrs)
    c = weighted_mix(instrs, found, [3, 5])                  # outer 3 times, inner 5 per entry
    assert c["ffma"] == 15 and c["mma"] == 3 and c["ldg"] == 1
    assert c["mma_flops"] == 3 * 4096 and c["global_bytes"] == 16 * 32 + 3 * 8 * 32


# nvdisasm style: a kernel whose loop calls a function (one address range, the callee after
# the kernel's code); the callee has a loop of its own and straight-line code around it.
CALLING = """
        .type           k,@function
.text.k:
        /*0000*/                   MOV R0, RZ ;
        /*0010*/                   CALL.REL.NOINC 0x40 ;
        /*0020*/              @!P0 BRA 0x10 ;
        /*0030*/                   EXIT ;
        .type           $k$window,@function
$k$window:
        /*0040*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0050*/                   FFMA R10, R11, R12, R10 ;
        /*0060*/              @!P1 BRA 0x50 ;
        /*0070*/                   STG.E desc[UR4][R2.64], R4 ;
        /*0080*/                   RET.REL.NODEC R20 0x0 ;
"""


def test_a_called_function_counts_its_straight_line_code_once_per_call():
    """`noinline` functions sit after the kernel: their loops' trips carry the calls (the
    trip models'), the code outside their loops counts `calls` times per program."""
    instrs = parse(CALLING)
    assert callee_starts(CALLING) == [0x40]
    found = loops(instrs)                                # the kernel's loop, the callee's
    assert [(lo.start, lo.end) for lo in found] == [(0x10, 0x20), (0x50, 0x60)]
    # 4 calls per program, the callee's loop 6 times per call: 24 in all
    c = weighted_mix(instrs, found, [4, 24], callee_starts(CALLING), calls=4)
    assert c["ffma"] == 24 and c["ldg"] == 4 and c["stg"] == 4
    assert c["global_bytes"] == 8 * 4 * 32
    before = weighted_mix(instrs, found, [4, 24])                # once per program
    assert before["ldg"] == 1 and before["ffma"] == 24
    assert weighted_mix(instrs, found, [4, 24], [], calls=4)["ldg"] == 1   # no callee


def test_nvdisasm_labels_and_source_lines():
    instrs = parse(LABELLED)
    (lo,) = loops(instrs)
    assert (lo.start, lo.end, lo.source) == (0x10, 0x30, ("/src/k.py", 11))
    assert mix(instrs, lo.start, lo.end)["mma_flops"] == 2 * 64 * 64 * 16 // 4   # per warp


def test_opcode_shapes_and_widths():
    assert mma_flops("HMMA.16816.F32.BF16") == 4096
    assert mma_flops("HMMA.1688.F32.TF32") == 2 * 16 * 8 * 8
    assert mma_flops("HGMMA.64x128x16.F32.BF16") == 2 * 64 * 128 * 16 // 4
    assert [access_bytes(o) for o in ("LDG.E.128", "LDG.E.64", "LDG.E.U16", "STG.E.U8",
                                      "LDG.E", "LDGSTS.E.BYPASS.128")] == [16, 8, 2, 1, 4, 16]


def test_relaxed_atomics_count_as_atomics():
    """RED / REDG / ATOMG are all atomics: sm_90 writes a relaxed fp32 atomic add whose
    result is unused as REDG (acq_rel ones as ATOMG with fences); each counts its bytes."""
    text = """
        /*0000*/                   REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR4][R2.64], R5 ;
        /*0010*/                   ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, RZ, [R2.64], R5 ;
        /*0020*/                   RED.E.ADD [R2.64], R5 ;
        /*0030*/                   EXIT ;
"""
    c = mix(parse(text))
    assert c["atom"] == 3 and c["other"] == 1 and c["global_bytes"] == 3 * 4 * 32


def _row(line, var, depth, inner, n, start):
    return dict(line=line, var=var, depth=depth, inner=inner, start=start, end=start + 8,
                mix=dict(instructions=n, ldg=n // 10))


def test_trips_unrolled_remainder_and_occurrences():
    # MTA's shape: n0 { n {dot} ; n { a { b x4 ; b rest } } }
    rows = [_row(1, "n0", 0, False, 700, 0), _row(2, "n", 1, True, 60, 10),
            _row(3, "n", 1, False, 180, 20), _row(4, "a", 2, False, 140, 30),
            _row(5, "b", 3, True, 40, 40), _row(5, "b", 3, True, 10, 50)]
    trips = loop_trips(rows, dict(n0=128.5, n=16, a=6, b=11))
    assert trips == [128.5, 16, 16, 6, 2, 3]                  # 11 taps: 2 x 4 + 3
    assert loop_trips(rows, dict(n0=1, n=16, a=6)) is None   # `b` has no model
    flash = [_row(51, "start_n", 0, True, 350, 0), _row(51, "start_n", 0, True, 460, 100)]
    assert loop_trips(flash, {"start_n": [1, 2]}) == [1, 2]  # one value per loop, in order


def test_flash_forward_trip_model_at_a_small_shape():
    kernel = SimpleNamespace(arg_names=["T_Q", "T_K", "Q_OFFSET"])
    launch = SimpleNamespace(name="attn_fwd_kernel", kernel=kernel, args=(256, 256, 0),
                             kwargs=dict(CAUSAL=True, SEGMENTED=False, BLOCK_M=128, BLOCK_N=64),
                             grid=(2, 2, 1))
    flash = [_row(51, "start_n", 0, True, 350, 0), _row(51, "start_n", 0, True, 460, 100)]
    # query tile 0: keys [0, 128) = 0 unmasked + 2 masked; tile 1: 2 unmasked + 2 masked
    assert trips_for(launch, flash) == [1.0, 2.0]
    assert trips_for(SimpleNamespace(name="no_model", grid=(1,)), flash) is None



@pytest.mark.parametrize("T_q, T_k, bm, bn", [(4096, 4096, 64, 64), (4096, 4096, 32, 64),
                                              (96, 224, 32, 16), (45, 61, 32, 16)])
def test_flash_backward_trip_models_split_the_diagonal_loops(T_q, T_k, bm, bn):
    """HOPPER (sm_90) backward launches run two loops per pass (dK/dV: masked diagonal query
    tiles, then the rest; dQ: unmasked key tiles, then the diagonal ones): the models give one
    value per loop, in that order, summing to the single loop's trips."""
    from attnlens.kernels.compile_check.trips import MODELS

    env = dict(BLOCK_M=bm, BLOCK_N=bn, T_Q=T_q, T_K=T_k, Q_OFFSET=T_k - T_q, CAUSAL=True)
    for name in ("_bwd_dkdv", "_bwd_dq"):
        (var, one), = MODELS[name](env, None).items()
        two = MODELS[name](dict(env, HOPPER=True), None)[var]
        assert len(two) == 2 and sum(two) == pytest.approx(one)
    square = dict(env, HOPPER=True, T_Q=4096, T_K=4096, Q_OFFSET=0, BLOCK_M=64, BLOCK_N=64)
    assert MODELS["_bwd_dkdv"](square, None)["start_m"][0] == 1    # one diagonal tile each
    assert MODELS["_bwd_dq"](square, None)["start_n"][1] == 1

def test_roofline_arithmetic_on_a_made_up_mix():
    peak = Peak(tensor=1e15, fp32=64e12, hbm=4e12, sms=100)
    counts = dict(mma_flops=2e12, cuda_flops=6.4e10, instructions=1e9)
    e = estimate(counts, 8e9, peak, programs=400)
    assert e["tensor_s"] == pytest.approx(2e-3) and e["cuda_s"] == pytest.approx(1e-3)
    assert e["hbm_s"] == pytest.approx(2e-3) and e["time_s"] == pytest.approx(5e-3)
    # clock = 64e12 / (100 SMs x 128 lanes x 2) = 2.5 GHz; 1e9 / (100 x 4 x 2.5e9) = 1 ms
    assert peak.clock == pytest.approx(2.5e9) and e["issue_s"] == pytest.approx(1e-3)
    # no MUFU, no special-function time; 5e8 MUFU x 32 / (100 SMs x 16 x 2.5e9) = 4 ms, a
    # bound apart (not in time_s: the units run beside the others)
    assert e["sfu_s"] == 0
    sfu = estimate(dict(counts, mufu=5e8), 8e9, peak, programs=400)
    assert sfu["sfu_s"] == pytest.approx(4e-3) and sfu["time_s"] == pytest.approx(5e-3)
    half = estimate(counts, 8e9, peak, programs=50)           # half the SMs have a program
    assert half["tensor_s"] == pytest.approx(4e-3) and half["hbm_s"] == pytest.approx(2e-3)
    assert PEAKS["H200"].hbm > PEAKS["H100"].hbm and PEAKS["H100"].tensor == 989e12


def test_fastest_keeps_each_kernels_least_time_config_in_first_recorded_order():
    rows = [("b", "fwd", 3.0), ("a", "fwd", 2.0), ("b", "fwd", 1.0), ("a", "bwd", 0.5),
            ("a", "fwd", 2.0)]
    by_name = fastest(rows, key=lambda r: r[0], seconds=lambda r: r[2])
    assert by_name == [("b", "fwd", 1.0), ("a", "bwd", 0.5)]
    by_pass = fastest(rows, key=lambda r: r[:2], seconds=lambda r: r[2])
    assert by_pass == [("b", "fwd", 1.0), ("a", "fwd", 2.0), ("a", "bwd", 0.5)]
    assert by_pass[1] is rows[1]                          # a tie keeps the first recorded
    assert fastest([], key=len, seconds=len) == []


def test_resident_warps_take_the_tightest_limit():
    assert resident_warps(255, 8, 40 * 1024) == 8           # 256 regs x 256 threads: 1 block
    assert resident_warps(240, 4, 33 * 1024) == 8           # registers: 2 blocks of 4 warps
    assert resident_warps(32, 4, 100 * 1024) == 8           # shared memory: 2 blocks
    assert resident_warps(16, 1, 0) == 32                   # the 32-block limit


def test_calibration_table_states_estimate_over_measured():
    from attnlens.kernels.compile_check.calibrate import markdown

    r = dict(op="flash", T=4096, d_head=64, measured_ms=0.5, kernels=["k 64x64 w4 s3"],
             occupancy=["1024 x 4 / 12"],
             tensor_flops=1e9, cuda_flops=0, io_bytes=1e6, sass_bytes=2e6, instructions=1e6,
             H100_io_s=2e-4, H200_io_s=1e-4, H200_sass_s=2e-4, H200_issue_s=5e-4)
    last = markdown([r]).splitlines()[-1]
    assert last.startswith("| flash | 4096 | 64 | k 64x64 w4 s3 | 1024 x 4 / 12 |")
    assert last.endswith("| 0.5 | 0.2 | 0.4 | 1 |")


def _tools_present() -> bool:
    if not _triton.available():
        return False
    from attnlens.kernels.compile_check.compiler import _nvidia_bin

    try:
        return all(os.path.exists(_nvidia_bin(t)) for t in ("nvdisasm", "cuobjdump", "ptxas"))
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _tools_present(), reason="needs triton with ptxas, nvdisasm, cuobjdump")
def test_mix_report_on_the_flash_quick_kernels(tmp_path):
    """`--quick --ops flash_attention --mix` (T 256, 2 heads, d 64): the forward's tl.dot
    shows as HGMMA in its loops, the preprocess kernel (no tl.dot) has none, and the forward's
    tensor FLOPs are the tiles it visits: 6 key tiles of 128 x 64 per head (2 query tiles:
    2 and 4 tiles), two dots of d 64 each (2 FLOPs a multiply-add), and the bf16 row sum on
    the tensor cores (`triton_fwd.rowsum_on_tensor_cores`: P @ ones, 16 columns) in each."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "attnlens.kernels.compile_check", "--quick",
                           "--ops", "flash_attention", "--mix", "--json", str(out),
                           "--no-progress", "--results-cache", str(tmp_path / "cache")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "Instruction mix" in proc.stdout
    rows = {r["kernel"]: r for r in json.loads(out.read_text())}
    fwd = rows["attn_fwd_kernel"]["mix"]
    hot = [lo for lo in fwd["loops"] if lo["inner"]]
    assert hot and all(lo["var"] == "start_n" and lo["mix"]["mma"] > 0 for lo in hot)
    from attnlens.kernels.flash_attention.triton_fwd import ROWSUM_COLS

    heads, tiles, dots, rowsum = 2, 6, 2, ROWSUM_COLS
    assert fwd["per_launch"]["mma_flops"] == heads * tiles * 2 * 128 * 64 * (dots * 64 + rowsum)
    assert rows["_bwd_preprocess"]["mix"]["once"]["mma"] == 0
    # one exp2 (MUFU) per score of the tiles, over 32 lanes, and a few per row for the
    # running max's rescale: what `sfu_s` reads (`roofline.estimate`)
    scores = heads * tiles * 128 * 64 / 32
    assert scores <= fwd["per_launch"]["mufu"] <= 1.1 * scores
    assert rows["_bwd_preprocess"]["mix"]["once"]["mufu"] <= 2    # an index division's rcp
    assert rows["_bwd_dq"]["mix"]["per_launch"]["mma"] > 0


@EXTENDED   # compiles every MTA and DCMHA quick kernel; the flash kernels' mix: tests above
@pytest.mark.skipif(not _tools_present(), reason="needs triton with ptxas, nvdisasm, cuobjdump")
def test_trip_models_cover_every_mta_and_dcmha_kernel(tmp_path):
    """`--quick --ops mta dcmha --mix`: every kernel's loops have trip counts (`per_launch`
    set), so the roofline can weigh them. The MTA backward forms its logits with the
    forward's `logits_staging_scores`, whose third tap branch (factored taps inside the
    sequence) its models lacked: "trip model does not cover its loops"."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "attnlens.kernels.compile_check", "--quick",
                           "--ops", "mta", "dcmha", "--mix", "--json", str(out),
                           "--no-progress", "--results-cache", str(tmp_path / "cache")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rows = json.loads(out.read_text())
    assert {r["kernel"] for r in rows} >= {"mta_bwd_delta_kernel", "mta_bwd_post_kernel",
                                          "mta_bwd_pre_kernel", "dcmha_tc_lse_kernel",
                                          "dcmha_tc_grads_kernel"}
    uncovered = {r["kernel"]: r["mix"]["why"] for r in rows if r["mix"]["per_launch"] is None}
    assert not uncovered, uncovered


_SAME_LAUNCHES = """
import json, torch
from attnlens.benchmarks.kernels import OPS
from attnlens.kernels.compile_check import calibrate
from attnlens.kernels.compile_check.capture import capturing

def sig(launches):
    return [(l.name, l.grid, sorted((k, str(v)) for k, v in l.kwargs.items()),
             [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in l.args])
            for l in launches]

out = {}
for op in ("flash", "cope", "mta", "dcmha"):
    make, fn = OPS[op](1, 4, 64, 32, torch.bfloat16, "cpu")["fused"]
    inputs = make()
    with capturing() as cap:
        with cap.phase("fwd"):
            fn(*inputs)
    out[op] = sig(cap.launches) == sig(calibrate.record(op, 64, 32, heads=4)) != []
print(json.dumps(out))
"""


@pytest.mark.skipif(not _triton.available(), reason="needs triton")
def test_calibration_records_the_benchmarks_launches():
    """`calibrate` rebuilds the benchmark's cases (the kernels floor may not import
    attnlens.benchmarks): both record the same launches (kernels, grids, constexprs, shapes)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _SAME_LAUNCHES], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == dict(flash=True, cope=True, mta=True,
                                                             dcmha=True)
