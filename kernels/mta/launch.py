"""The MTA kernels' launch shapes and grids, chosen on the host: the launch options both
directions share (`LAUNCH`), the backward's windows (`out_windows`) and key splits
(`key_splits`), and the forward's shapes by length (the lse pass's tiles and warps, `lse_shape`,
`lse_blocks`; the out pass's windows, `fwd_out_windows`; its key-window pairs and where its
phase 1 is a call), its grids (`forward_grids`) and the memory cap on its key splits
(`out_split_cap`). The kernels they launch are in `triton_fwd` and `triton_bwd`; the persistent
plans in `out_plan`. A GPU run measures the shapes chosen by estimate alone both ways through
the environment variables named here (scripts/gpu_validate.sh).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

from attnlens.kernels import _triton
from attnlens.kernels._triton import next_pow2
from attnlens.kernels.mta.out_plan import persistent_splits

# Launch options of the MTA kernels on a GPU (the out pass, the fold and the backward; the lse
# pass: `LSE_LAUNCH`): 8 warps, no software
# pipelining, up to 255 registers (ptxas otherwise caps some 8-warp builds at 128 and spills).
# With 4 warps and 3 stages they spilled up to 1.1 KB per thread (python -m
# attnlens.kernels.compile_check, docs/benchmarks.md).
LAUNCH = dict(num_warps=8, num_stages=1, maxnreg=255)

# The lse pass's 4-warp launch (`LSE_SHAPES`: the default below 2k rows): two programs per SM
# (`LSE_PROGRAMS_PER_SM`; 255 registers x 128 threads x 2 fit an SM's 65,536). With 8 warps on
# its 32 x 32 tiles each warp held one m16n8 piece of every dot: a serial HMMA accumulator
# chain padded with no-op issues, and the per-warp address and loop work paid eight times per
# tile; 4 warps halve that, two resident programs keep 8 warps per SM. H200 issue bound
# (ESTIMATE, sm_90 SASS x trips, bf16, 16 heads, 6 x 11 + mixings): docs/benchmarks.md, "Fused
# MTA forward: the lse pass on 4-warp programs, two per SM".
LSE_LAUNCH = dict(num_warps=4, num_stages=1, maxnreg=255)
LSE_PROGRAMS_PER_SM = 2
# Keys per mixing dot of the lse pass (its phase 2: `[HB, BLOCK_M * KC]` operands). At 4 warps
# KC 8 spilled 408-504 B at 64 x 64 under the GPU image's triton 3.6.0 (sm_90 / sm_80, d_head
# 64 / 128; 0 B under 3.9.0); KC 4 is 0 B under both and issues fewer instructions.
LSE_KC = 4


def default_blocks() -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): all heads of a tile live in one program (`[H, rows + halo, keys +
    halo]` fp32 tensors), so tiles stay small; to be tuned on a GPU."""
    return 16, 16


# Stage bytes an SM's resident lse programs may hold: the footprint of the 8-warp 64 x 64 shape
# at 16 heads (256 KiB a program, one per SM: 33 MiB on 132 SMs, within the H100's and H200's
# 50 MB L2). Each tile writes and re-reads its whole fp32 stage, so stages beyond the L2 would
# go to HBM (4k: ~1 GB a pass).
LSE_STAGE_BYTES_PER_SM = 256 * 1024

# Query rows from which both forward passes take 64-row tiles / windows (below, 32 rows: the
# causal 64-row ones are too few to share out over 132 SMs, `lse_blocks`, `fwd_out_windows`),
# and the lse pass its 8-warp default shape (`lse_shape`; 128-row tiles from ROWS_128_FROM).
ROWS_64_FROM = 2048


class LseShape(NamedTuple):
    """The lse pass's launch options, programs per SM, keys per mixing dot (KC), the stage
    bytes an SM's programs may hold (`lse_blocks`) and the tiles' rows (0: by length, 64 from
    ROWS_64_FROM query rows, 32 below)."""

    launch: dict
    programs_per_sm: int
    kc: int
    stage_bytes_per_sm: int
    rows: int = 0
    cols: int = 0


# Query rows from which the lse pass takes its 128-row tiles by default (`lse_shape`:
# "square" for 16-bit inputs).
ROWS_128_FROM = 4096

# The lse pass's shapes, by name. "4warps": 4 warps, two programs per SM, KC 4, 64 x 32 tiles
# from 2k rows at 16 heads; "8warps" (every length before 2026-12-06, from 2k rows after):
# `LAUNCH`, one program per SM, KC 8, 64 x 64; "wide": 4 warps, two per SM, 64 x 64; "tall"
# (the 16-bit default from ROWS_128_FROM rows in the tenth session): `LAUNCH`, one program per
# SM, 128 x 64 tiles, KC 4 (KC 8 spilled 480-528 B under the GPU image's triton 3.6.0; KC 4 0 B
# under 3.6.0 and 3.9.0, sm_90 / sm_80, d_head 64 / 128). "tall" reads the folded keys half as
# often per logit as "8warps" (each key tile serves 128 rows): at 4k, 16 heads, d 128 the H200
# issue bound 0.377 -> 0.283 ms and the SASS-bytes bound 2.05 -> 1.66 ms (ESTIMATES,
# docs/benchmarks.md). "square" (the 16-bit default from ROWS_128_FROM rows since the twelfth
# session, 2026-12-06): "tall" on 128 x 128 tiles, phase 1 per head in `_lse_wide_head`, so
# that q is read half as often per logit too: the SASS-bytes bound 1.66 -> 1.37 ms, the issue
# bound unchanged (0.283 ms; ESTIMATES). Its fp32 stages are 1 MiB a program, "tall"'s 512 KiB
# (132 / 66 MiB on 132 SMs, both over the 50 MB L2; the same stage bytes per logit): were
# every stage byte to miss the L2, that is ~1.1 GB of HBM traffic per pass at 4k, ~0.23 ms;
# the GPU run measures "tall" beside it. Below 4k the 128-row tiles are too few to share out
# (2k: the last SM at 1.46x the even share). The default (`lse_shape`): "4warps" below
# ROWS_64_FROM query rows (32 x 32 tiles: both estimates agree it is faster), "8warps" from
# there, "square" from ROWS_128_FROM for 16-bit inputs; a GPU run measures the others by
# LSE_SHAPE_ENV (scripts/gpu_validate.sh).
LSE_SHAPES = {
    "4warps": LseShape(LSE_LAUNCH, LSE_PROGRAMS_PER_SM, LSE_KC, LSE_STAGE_BYTES_PER_SM),
    "8warps": LseShape(LAUNCH, 1, 8, LSE_STAGE_BYTES_PER_SM),
    "wide": LseShape(LSE_LAUNCH, LSE_PROGRAMS_PER_SM, LSE_KC, 2 * LSE_STAGE_BYTES_PER_SM),
    "tall": LseShape(LAUNCH, 1, LSE_KC, 2 * LSE_STAGE_BYTES_PER_SM, rows=128),
    "square": LseShape(LAUNCH, 1, LSE_KC, 4 * LSE_STAGE_BYTES_PER_SM, rows=128, cols=128),
}
LSE_SHAPE_ENV = "ATTNLENS_MTA_LSE_SHAPE"


def lse_shape(t_q: int, fp32: bool = False) -> LseShape:
    """The lse pass's shape at `t_q` query rows: LSE_SHAPES[os.environ[LSE_SHAPE_ENV]] where
    set, else "4warps" below ROWS_64_FROM rows, "8warps" from there and "square" from
    ROWS_128_FROM for 16-bit inputs (fp32 inputs keep "8warps": their IEEE lse pass at 4k
    spilled 248 B on sm_80 under triton 3.9.0 with "tall", 160 B with "8warps" as before);
    ValueError naming the shapes for an unknown name."""
    name = os.environ.get(LSE_SHAPE_ENV, "")
    if name == "":
        name = ("square" if t_q >= ROWS_128_FROM and not fp32 else
                "8warps" if t_q >= ROWS_64_FROM else "4warps")
    if name not in LSE_SHAPES:
        raise ValueError(f"{LSE_SHAPE_ENV}={name!r}: expected one of {sorted(LSE_SHAPES)} "
                         "(or unset)")
    return LSE_SHAPES[name]


def lse_blocks(hb: int, block_m: int | None, block_n: int | None,
               block_d: int = 64, t_q: int = 4096,
               programs_per_sm: int | None = None, fp32: bool = False) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the lse pass: `lse_shape(t_q, fp32)`'s rows and keys (128 x 128
    for "square", the 16-bit default from ROWS_128_FROM rows; 128 rows for "tall"), else 64
    from 2,048 query rows and 32 below; BLOCK_N halved (to 16 at least) until the stages of
    an SM's `programs_per_sm` programs (the shape's by default; `[max(hb, 16), BLOCK_M,
    BLOCK_N]` fp32 each) fit its `stage_bytes_per_sm`: 128 x 128 for "square" and 128 x 64
    for "tall" at 16 heads, 64 x 32 with
    two programs per SM (64 x 64 with one), 64 x 16 at 32 heads; explicit blocks (tests)
    win. The pass stages each head's convolved scores and mixes them KC keys at a time
    (`mta_lse_kernel`), so no `[HB, rows, keys]` tensor lives in registers (before, the
    mixed logits of all heads were one register tensor: 32 x 32 at 16 heads, 64 x 32
    spilled 728-816 B). Below 2,048 rows the causal 64 x 64 tiles are too few to share out
    (T 1024: 136 for 132 SMs, the last finishing at 1.9x the even share); 32 x 32 gives
    528. `block_d` is unused."""
    del block_d
    shape = lse_shape(t_q, fp32)
    side = 64 if t_q >= ROWS_64_FROM else 32
    bm, bn = block_m or shape.rows or side, block_n or shape.cols or side
    if block_n is None:
        per_key = (programs_per_sm or shape.programs_per_sm) * max(hb, 16) * bm * 4
        while bn > 16 and per_key * bn > shape.stage_bytes_per_sm:
            bn //= 2
    return bm, bn


def out_windows(hb: int, cq2: int, ck2: int) -> tuple[int, int]:
    """(AR, AC) of the backward's windows (the forward's out pass before it was staged; now
    `fwd_out_windows`): powers of two with `hb * AR * AC <= 16384` fp32 (the logits,
    probabilities and pattern of all heads, one at a time), each at least twice the post-
    softmax halo, at most 64."""
    ar = next_pow2(2 * cq2)
    ac = next_pow2(2 * ck2)
    while hb * ar * ac < 16384 and min(ar, ac) < 64:
        if ar <= ac:
            ar *= 2
        else:
            ac *= 2
    return ar, ac


# The out pass's key chunk of its two mixing dots (phases 2 and 4: `[HB, AR * KC]` operands,
# as the lse pass's KC) and its d_head chunk of the pattern-times-v dots (phase 5).
OUT_KC = 4
OUT_DCH = 64


def fwd_out_windows(cq2: int, ck2: int, t_q: int = 4096, fp32: bool = False) -> tuple[int, int]:
    """(AR, AC) of the forward's out pass: 64 x 64 from 2,048 query rows, 32 x 64 below (or
    the next power of two of twice the post-softmax halo where that is larger). The pass
    works on one head's `[AR, AC]` map or on KC keys of all heads at a time
    (`mta_out_kernel`), so its windows no longer shrink with the head count (before:
    `out_windows`, 32 x 32 at 16 heads, still the backward's). 64 rows own 59 x 54 outputs at
    6 x 11 (32 x 32: 27 x 22), so per output the halo costs 1.29 logits instead of 1.72, and
    q / folded keys are read half as often per logit. Below 2,048 rows the 64-row windows are
    too few to share out (T 1024: 196 key windows, the last SM finishing at 1.35x the even
    share of 132; 32 x 64: 380 windows, 1.04x; `split_windows`, `makespan`). fp32 inputs keep
    32 x 64 (64 x 64 spilled 344 / 296 B on sm_90 / sm_80; 32 x 64 0 B)."""
    rows = 64 if t_q >= ROWS_64_FROM and not fp32 else 32
    return max(rows, next_pow2(2 * cq2)), max(64, next_pow2(2 * ck2))


# Where the out pass's phase 1 runs inline (STAGE_CALL False): architecture -> the smallest
# d_head chunk (BLOCK_D) inlined there. On sm_90 inlined it compiles with 0 B spill at 16
# heads, d_head 64 and 128 (bf16), while as its own function the kernel spilled 16 B there
# (the call's saved registers); on sm_80 inlined spilled 8-48 B, as a function 0 B
# (triton 3.9.0, 2026-12-05, fifth session). With the diagonal's taps as one tile load
# (`pre_toeplitz`, sixth session) sm_80 at d_head 128 as a function spilled 56 B under the
# GPU image's triton 3.6.0 (64 x 64 windows), inlined 0 B under 3.6.0 and 3.9.0; at d_head 64
# inlined spilled 8 B under 3.6.0, as a function 0 B (python -m attnlens.kernels.compile_check).
INLINE_STAGE_FROM = {"sm_90": 0, "sm_80": 128}

_STAGE_CALL: dict = {}


def stage_call(block_d: int = 64) -> bool:
    """STAGE_CALL of `mta_out_kernel` at d_head chunk `block_d`: phase 1 (`_stage_scores`) as
    its own SASS function except where INLINE_STAGE_FROM inlines it and under the interpreter
    (where both are the same code). `_triton.gpu_arch` is read through its module: the compile
    check's capture replaces it there to record each architecture's launch; the answer is kept
    per `gpu_arch` function (a driver query) and block_d."""
    if _triton.interpreting():
        return False
    arch_of = _triton.gpu_arch
    call = _STAGE_CALL.get((arch_of, block_d))
    if call is None:
        try:
            call = block_d < INLINE_STAGE_FROM.get(arch_of(), 1 << 30)
        except (AssertionError, RuntimeError):   # no CUDA device
            call = True
        _STAGE_CALL[(arch_of, block_d)] = call
    return call


def key_splits(row_programs: int, key_windows: int, device) -> int:
    """How many programs share a row window's (or row tile's) key windows (NS): enough for two
    programs per SM (132 on an H100 / H200; the device's count on a GPU), at most one per key
    window. Split s takes key windows s, s + NS, ...: causal rows near the end hold twice the
    mean windows, and one program per row window left the last ones as the critical path
    (the backward's passes and both forward passes)."""
    return max(1, min(math.ceil(2 * _triton.sm_count(device) / max(row_programs, 1)), key_windows))


def split_windows(n_rows: int, rows: int, step: int, T_K: int, q_offset: int,
                  ns: int) -> list[int]:
    """Key windows of each program of a forward pass's grid axis 0 (launch order): program
    `pid` takes row window `n_rows - 1 - pid % n_rows` (rows from that times `rows`, the last
    rows first) and its key windows from `(pid // n_rows) * step` in steps of `ns * step`,
    causal (keys up to `q_offset` past its last row)."""
    out = []
    for pid in range(n_rows * ns):
        m0, split = (n_rows - 1 - pid % n_rows) * rows, pid // n_rows
        out.append(len(range(split * step, min(T_K, q_offset + m0 + rows), ns * step)))
    return out


class ForwardGrids(NamedTuple):
    """The forward's launch plan: the lse pass's tiles (BLOCK_M x BLOCK_N), row tiles `n_t` and
    key splits `ns_lse`; the out pass's windows (AR x AC at HB heads), row windows `n_w` and
    key splits `ns_out`. Both passes are persistent (`out_plan`), the lse pass on
    `lse_programs(n_sm, T_Q)` programs (`lse_shape`), the out pass on about one per SM:
    `n_t * ns_lse` and `n_w * ns_out` items per batch element."""

    block_m: int
    block_n: int
    n_t: int
    ns_lse: int
    hb_out: int
    ar: int
    ac: int
    n_w: int
    ns_out: int


def forward_grids(B: int, T_Q: int, T_K: int, H: int, cq2: int, ck2: int, device,
                  block_m: int | None = None, block_n: int | None = None,
                  splits: tuple[int, int] | None = None, block_d: int = 64,
                  fp32: bool = False) -> ForwardGrids:
    """`ForwardGrids` of `mta_fwd`: tiles `lse_blocks`, windows `fwd_out_windows` (at least
    16 heads: the mixing dots), key splits `persistent_splits` (both passes are persistent;
    the out pass's at most `out_split_cap`, unless that leaves fewer items than SMs) unless
    `splits` (lse, out) is given."""
    hb = next_pow2(H, minimum=1)
    lm, ln = lse_blocks(hb, block_m, block_n, block_d, T_Q, fp32=fp32)
    n_t = math.ceil(T_Q / lm)
    hb2 = max(hb, 16)
    ar, ac = fwd_out_windows(cq2, ck2, T_Q, fp32)
    n_w = math.ceil(T_Q / (ar - cq2 + 1))
    n_sm, off = _triton.sm_count(device), T_K - T_Q
    cap = out_split_cap(B, T_Q, T_K, H, block_d, hb2, ar, ac, out_programs(B, n_sm),
                        pairs=out_pairs(fp32), pair_scores=pair_scores(fp32))
    if cap is not None:                  # never fewer items than SMs
        cap = max(cap, math.ceil(n_sm / (n_w * B)))
    ns1, ns2 = splits or (persistent_splits(n_t, lm, ln, T_K, off, B, lse_programs(n_sm, T_Q)),
                          persistent_splits(n_w, ar - cq2 + 1, ac - ck2 + 1, T_K, off, B, n_sm,
                                            cap))
    return ForwardGrids(lm, ln, n_t, ns1, hb2, ar, ac, n_w, ns2)


# The out pass's key-window pairs (`mta_out_kernel`, PAIRS) by architecture: on where a GPU
# of it is found (and under the interpreter, where both are the same code), off elsewhere. On
# sm_80 the pair loop's loop-invariant offsets pushed the kernel past 255 registers at 4k:
# 32 / 32 B spilled at d_head 64 / 128 under triton 3.9.0, 0 / 40 B under the GPU image's
# 3.6.0 (without pairs 0 B under both); sm_90 0 B under both. fp32 inputs (IEEE dots, which
# spilled 168-192 B on sm_90 without pairs) keep them off: with pairs 232-272 B. OUT_PAIRS_ENV
# "0" / "1" turns them off / on anywhere, so that a GPU run can measure both
# (scripts/gpu_validate.sh) and the interpreter tests run the fp32 pair loop.
PAIRS_ARCHS = ("sm_90",)
OUT_PAIRS_ENV = "ATTNLENS_MTA_OUT_PAIRS"


def out_pairs(fp32: bool = False) -> bool:
    """Whether the out pass takes an item's key windows in pairs (`mta_out_kernel`, PAIRS):
    OUT_PAIRS_ENV's "0" / "1" where set (ValueError naming it for another value), else not
    for fp32 inputs (`fp32`), and for 16-bit ones under the interpreter and on PAIRS_ARCHS
    (and without a GPU to ask), not on other architectures. `_triton.gpu_arch` is read
    through its module: the compile check's capture replaces it to record each
    architecture's launch."""
    value = os.environ.get(OUT_PAIRS_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{OUT_PAIRS_ENV}={value!r}: expected 0 or 1 (or unset)")
    if value:
        return value == "1"
    if fp32:
        return False
    if _triton.interpreting():
        return True
    try:
        return _triton.gpu_arch() in PAIRS_ARCHS
    except (AssertionError, RuntimeError):     # no CUDA device
        return True


# The out pass stages a key-window pair's scores together (`mta_out_kernel`, PAIR_SCORES:
# one q tile read per head and row tap for both windows' dots, `_stage_pair_scores`) wherever
# it takes pairs (`out_pairs`); PAIR_SCORES_ENV "0" turns it off (the GPU run measures both).
# Its fp32 stage doubles (132 x 256 KiB more at 4k, 16 heads: `out_split_cap`).
PAIR_SCORES_ENV = "ATTNLENS_MTA_PAIR_SCORES"


def pair_scores(fp32: bool = False) -> bool:
    """PAIR_SCORES of the out pass: with `out_pairs(fp32)` unless PAIR_SCORES_ENV is "0"
    (ValueError naming it for a value other than "0" / "1")."""
    value = os.environ.get(PAIR_SCORES_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{PAIR_SCORES_ENV}={value!r}: expected 0 or 1 (or unset)")
    return out_pairs(fp32) and value != "0"


# A key-window pair's first window runs phases 1-3 for both (`mta_out_kernel`, PAIR_PHASES:
# the post-softmax Toeplitz tiles read once per pair, each head's C written over its P, no
# stage part more) wherever pairs' scores are staged together (`pair_scores`), from
# ROWS_64_FROM query rows and at PAIR_PHASES_HEADS heads, where it compiles clean (sm_90,
# d_head 64 / 128, triton 3.9.0 and the GPU image's 3.6.0). Elsewhere it spilled: on the
# 32-row windows below 2k rows 8-24 B at d_head 128 under 3.6.0; at 4k rows with 4 or 8 heads
# 72 B (3.9.0) / 24 B (3.6.0) at d_head 128, 32 heads 216-272 B (3.9.0), where without it the
# out pass already spilled 32 / 8 B and 184-192 B. PAIR_PHASES_ENV "0" / "1" turns it off / on
# anywhere pairs' scores are staged together (the GPU run measures both; the interpreter tests
# force it on).
PAIR_PHASES_ENV = "ATTNLENS_MTA_PAIR_PHASES"
PAIR_PHASES_HEADS = (16,)


def pair_phases(fp32: bool = False, *, t_q: int, heads: int) -> bool:
    """PAIR_PHASES of the out pass at `t_q` query rows and `heads` heads: with
    `pair_scores(fp32)`, from ROWS_64_FROM rows at PAIR_PHASES_HEADS heads unless
    PAIR_PHASES_ENV is "0", anywhere where it is "1" (ValueError naming it for another
    value)."""
    value = os.environ.get(PAIR_PHASES_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{PAIR_PHASES_ENV}={value!r}: expected 0 or 1 (or unset)")
    if value == "0" or not pair_scores(fp32):
        return False
    return value == "1" or (t_q >= ROWS_64_FROM and heads in PAIR_PHASES_HEADS)


def lse_programs(n_sm: int, t_q: int) -> int:
    """The SM count the lse pass's plan shares its tiles over: `lse_shape(t_q)`'s programs per SM
    (`out_plan` launches at most one program per item, `ceil(n / batch)` per batch element)."""
    return lse_shape(t_q).programs_per_sm * n_sm


def out_programs(B: int, n_sm: int) -> int:
    """The most programs of the persistent out pass, all batch elements together (its plan
    launches at most one per item): one per SM (`LAUNCH`: 255 registers x 256 threads, one
    resident program per SM), batch elements alike."""
    return max(1, B) * math.ceil(n_sm / max(1, B))


# Issue 58's memory target: the fused path's peak <= 1/10 of the torch path's, which holds
# about 16 B per (query, key, head) (4k, 16 heads, bf16: 4,148 MiB fwd+bwd, docs/benchmarks.md).
TORCH_PEAK_BYTES_PER_LOGIT = 16
PEAK_SHARE = 0.1


def out_split_cap(B: int, T_Q: int, T_K: int, H: int, D: int, hb: int, ar: int, ac: int,
                  programs: int, cq: int = 6, itemsize: int = 2,
                  pairs: bool = True, pair_scores: bool = False) -> int | None:
    """The most key splits of the out pass that keep the forward's peak under PEAK_SHARE of
    the torch path's: q, k, v, out and the folded keys (c_q times k), the persistent
    programs' stages (`programs x [hb, ar, ac]` fp32, twice with `pair_scores`, and twice
    that in the input dtype, three times with `pairs`: fixed, whatever T and the splits;
    `out_plan`) plus, per split, an fp32 z partial `[B, T_Q, H, D]`. 4k, 16 heads: stages
    66 MiB at 132 programs (83 MiB with pairs, 116 MiB with pair scores too); d 128: 160 MiB
    + 116 MiB + 32 MiB per split against 410 MiB, so 4 (5 without pair scores; before, with
    stages per item, 67 MiB per split: 3); d 64: 80 + 116 + 16 per split, 13. None (no
    cap) where not even one split fits (short sequences: at T 1024 the folded keys alone are
    24 of the 26 MiB)."""
    budget = PEAK_SHARE * TORCH_PEAK_BYTES_PER_LOGIT * B * T_Q * T_K * H
    fixed = (B * H * D * itemsize * (2 * T_Q + (2 + cq) * T_K)
             + programs * hb * ar * ac * (4 * (2 if pair_scores else 1)
                                          + (3 if pairs else 2) * itemsize))
    per_split = B * T_Q * H * D * 4
    most = int((budget - fixed) // per_split)
    return most if most >= 1 else None


__all__ = ["INLINE_STAGE_FROM", "LAUNCH", "LSE_KC", "LSE_LAUNCH", "LSE_PROGRAMS_PER_SM",
           "LSE_SHAPES", "LSE_SHAPE_ENV", "LSE_STAGE_BYTES_PER_SM", "OUT_DCH", "OUT_KC",
           "OUT_PAIRS_ENV", "PAIRS_ARCHS", "PAIR_PHASES_ENV", "PAIR_PHASES_HEADS",
           "PAIR_SCORES_ENV", "PEAK_SHARE", "ROWS_128_FROM", "ROWS_64_FROM",
           "TORCH_PEAK_BYTES_PER_LOGIT", "ForwardGrids", "LseShape", "default_blocks",
           "forward_grids", "fwd_out_windows", "key_splits", "lse_blocks", "lse_programs",
           "lse_shape", "out_pairs", "out_programs", "out_split_cap", "out_windows",
           "pair_phases", "pair_scores", "split_windows", "stage_call"]
