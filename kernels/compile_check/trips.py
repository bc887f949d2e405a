"""Trip counts of a kernel's loops for one recorded launch, from its arguments and grid.

A SASS loop is named by the `for` statement its backward branch comes from (the source line
nvdisasm prints, `sass_mix.loop_var`). `MODELS[kernel](env, grid)` gives, per loop variable,
the iterations of one entry of that loop, averaged over the launch's programs, where `env`
holds the launch's arguments by parameter name (ints such as T_Q, H, D, CQ, and the
constexprs BLOCK_M, BLOCK_N, ...) and `grid` its program grid. How each is derived:

- key tiles of a causal query tile (`start_n`, `i`, `n0`): query tile `pid` (rows from
  `Q_OFFSET + pid * BLOCK_M`) sweeps keys up to `min(T_K, Q_OFFSET + (pid + 1) * BLOCK_M)` in
  BLOCK_N steps: `ceil(end / BLOCK_N)` iterations, averaged over `pid < grid[0]` (about
  `T / (2 * BLOCK_N)` at long T). The causal flash forward splits this in two loops (source
  order = SASS order): the unmasked tiles left of the diagonal, `floor(first / BLOCK_N)`, then
  the masked ones crossing it (with Infini's segments a third, masked, range first: from the
  segment's start). Its backward: dQ of a query tile sweeps the same keys
  (`start_n`); dK/dV of key tile `pid` sweeps the query tiles from the first that sees it,
  `(pid * BLOCK_N - Q_OFFSET) // BLOCK_M`, to T_Q (`start_m`);
- loops over heads (`n`: H), channels (`c`: C), convolution taps (`a`: CQ, `kb`: CK) and
  d_head chunks (`d0`) are their runtime bounds. MTA's pre-softmax taps run either as banded
  Toeplitz dots (`a` x key chunks `t0`, windows at the causal edge: `_mta_toeplitz_chunks`)
  or factored (`a`): each branch's `a` is CQ times the share of windows taking it
  (`_mta_direct_share`); its out pass steps keys by AC - CK2 + 1
  and adds row chunks (`r0`) with the post-softmax row taps (`a`: CQ2).

A variable listing one value per SASS loop gets them in address order. A variable may close
more SASS loops than the model lists when ptxas unrolled a runtime loop: an unrolled main loop
directly followed by its smaller remainder loop, both innermost, from the same source line at
the same depth. The unroll factor u is the ratio of the two bodies' instruction counts of one
class (global loads, else FFMA, else all); the main loop then runs floor(N / u) times and the
remainder N mod u (MTA's 11 key taps: twice 4, then 3).
A kernel without a model, or with a loop its model does not name, has no trip counts (None).
"""

from __future__ import annotations

import math


def kernel_env(launch) -> dict:
    """The launch's arguments by parameter name (positional) and its keyword constexprs."""
    env = dict(zip(launch.kernel.arg_names, launch.args, strict=False))
    env.update(launch.kwargs)
    return env


def _avg(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _causal_tiles(env, grid, start=lambda first: 0):
    """Average key tiles per query tile: keys [start(first), min(T_K, first + BLOCK_M))."""
    bm, bn = env["BLOCK_M"], env["BLOCK_N"]
    out = []
    for pid in range(grid[0]):
        first = env["Q_OFFSET"] + pid * bm
        lo, hi = start(first), min(env["T_K"], first + bm)
        out.append(max(0, math.ceil((hi - lo) / bn)))
    return _avg(out)


def _steps(lo, hi, step) -> int:
    """Iterations of `range(lo, hi, step)`."""
    return max(0, math.ceil((hi - lo) / step))


def _tiles(T, block) -> int:
    """Tiles of a `head_tile` launch over T positions: flash's kernels put them on grid axis 0
    or 1 (`HEAVY_FIRST`), so they are counted from the length, not read off the grid."""
    return math.ceil(T / block)


def _flash_fwd(env, grid):
    """`attn_fwd_kernel`'s three key ranges (its `_fwd_tiles` calls): masked [start, u_lo),
    unmasked [u_lo, u_hi), masked [u_hi, hi). Causal without segments has start = u_lo = 0,
    a constant empty first loop the compiler drops: two loops. With AHEAD (sm_90, plain
    causal, `ahead_fits` tiles) the first masked tile runs outside the loops: the second loop
    sweeps [u_hi + BLOCK_N, hi)."""
    bm, bn, t_q, t_k, off = (env[k] for k in ("BLOCK_M", "BLOCK_N", "T_Q", "T_K", "Q_OFFSET"))
    if not env.get("CAUSAL"):
        return {"start_n": [t_k // bn, _steps(t_k // bn * bn, t_k, bn)]}
    parts = []
    for pid in range(_tiles(t_q, bm)):
        first = off + pid * bm
        start, u_lo, u_hi, hi = 0, 0, max(first // bn * bn, 0), min(t_k, first + bm)
        if env.get("SEGMENTED"):
            seg = env["SEG_LEN"]
            last = off + min(pid * bm + bm, t_q) - 1
            start = first // seg * seg // bn * bn
            u_lo = -(-(last // seg * seg) // bn) * bn
            u_hi = max(u_hi, u_lo)
        parts.append((_steps(start, u_lo, bn), _steps(u_lo, u_hi, bn), _steps(u_hi, hi, bn)))
    masked_lo, unmasked, masked_hi = (_avg(p[i] for p in parts) for i in range(3))
    if env.get("SEGMENTED"):
        return {"start_n": [masked_lo, unmasked, masked_hi]}
    from attnlens.kernels.flash_attention.triton_fwd import ahead_fits

    if env.get("AHEAD") and ahead_fits(bm, bn, env["BLOCK_D"], bool(env.get("HAS_KVALID")),
                                       bool(env.get("HAS_MIX"))):
        # the scores-ahead loop, then the first masked tile outside any loop, then the rest
        return {"start_n": [unmasked, _avg(max(0, p[2] - 1) for p in parts)]}
    return {"start_n": [unmasked, masked_hi]}


def _flash_fwd_tma(env, grid):
    """`attn_fwd_tma_kernel`'s one key loop over [0, min(T_K, first + BLOCK_M)) (every tile
    masked). Warp-specialised, the loop is in the SASS once per partition (the producer's
    copies and each consumer warpgroup's math), every copy running every tile."""
    return {"start_n": _causal_tiles(env, (_tiles(env["T_Q"], env["BLOCK_M"]),))}


def _flash_dq(env, grid):
    """dQ of query tile `pid`: keys from its segment's first tile (0 unsegmented) to the
    causal end. HOPPER (sm_90, causal, unsegmented): two loops, the key tiles every row sees
    whole, `[0, (first + 1) // BLOCK_N * BLOCK_N)`, then the masked ones up to the end."""
    bm, bn, t_k, off = (env[k] for k in ("BLOCK_M", "BLOCK_N", "T_K", "Q_OFFSET"))
    if not env.get("CAUSAL"):
        return {"start_n": _steps(0, t_k, bn)}
    seg = env.get("SEG_LEN") if env.get("SEGMENTED") else None
    pids = range(_tiles(env["T_Q"], bm))
    if env.get("HOPPER") and not seg:
        ends = [min(t_k, off + (pid + 1) * bm) for pid in pids]
        mids = [min((off + pid * bm + 1) // bn * bn, end)
                for pid, end in zip(pids, ends, strict=True)]
        return {"start_n": [_avg(_steps(0, m, bn) for m in mids),
                            _avg(_steps(m, e, bn) for m, e in zip(mids, ends, strict=True))]}
    return {"start_n": _avg(
        _steps((off + pid * bm) // seg * seg // bn * bn if seg else 0,
               min(t_k, off + (pid + 1) * bm), bn) for pid in pids)}


def _flash_dkdv(env, grid):
    """dK/dV of key tile `pid`: query tiles from the first that sees it to T_Q (segmented: to
    the end of its last key's segment). HOPPER (sm_90, causal, unsegmented): two loops, the
    query tiles crossing the diagonal up to the first that sees every key of the tile, then
    the rest."""
    bm, bn, t_q, t_k, off = (env[k] for k in ("BLOCK_M", "BLOCK_N", "T_Q", "T_K", "Q_OFFSET"))
    split = env.get("HOPPER") and env.get("CAUSAL") and not env.get("SEGMENTED")
    trips, masked = [], []
    for pid in range(_tiles(t_k, bn)):
        start_n = pid * bn
        lo = max(start_n - off, 0) // bm * bm if env.get("CAUSAL") else 0
        hi = t_q
        if env.get("SEGMENTED"):
            seg = env["SEG_LEN"]
            hi = min(t_q, ((min(start_n + bn, t_k) - 1) // seg + 1) * seg - off)
        if split:
            full = max(min(start_n + bn, t_k) - 1 - off, 0)
            mid = min(max(-(-full // bm) * bm, lo), hi)
            masked.append(_steps(lo, mid, bm))
            lo = mid
        trips.append(_steps(lo, hi, bm))
    if split:
        return {"start_m": [_avg(masked), _avg(trips)]}
    return {"start_m": _avg(trips)}


def _cope_fwd(env, grid):
    return {"i": _causal_tiles(env, grid)}


def _mta_direct_share(env, windows) -> float:
    """Share of `(row0, R, col0, C)` logit windows whose pre-softmax taps reach a causally
    masked pair (`_fwd_conv_scores` takes the banded Toeplitz form there, `a` then `t0`; the
    rest take CQ factored dots): last key tap `col0 + C - 1 - LEFT + CK - 1` beyond the first row's
    `row0 - (CQ - 1) + Q_OFFSET`."""
    cq, ck, left, off = env["CQ"], env["CK"], env["LEFT"], env["Q_OFFSET"]
    direct = [col0 + c - 1 - left + ck - 1 > row0 - (cq - 1) + off
              for row0, r, col0, c in windows]
    return _avg(direct)


def _mta_toeplitz_chunks(env, windows) -> float:
    """Mean key chunks (`t0`) of `triton_fwd._toeplitz_scores` over the logit windows
    `(row0, R, col0, C)` at the diagonal (those `_mta_direct_share` counts): the `C + CK - 1`
    read keys from `col0 - LEFT`, cut after the last row's last visible key, in chunks of C
    (`_toeplitz_chunks`); 1 where no window is at the diagonal."""
    cq, ck, left, off = env["CQ"], env["CK"], env["LEFT"], env["Q_OFFSET"]
    chunks = [math.ceil(max(min(c + ck - 1, row0 + r + off - (col0 - left)), 1) / c)
              for row0, r, col0, c in windows
              if col0 + c - 1 - left + ck - 1 > row0 - (cq - 1) + off]
    return _avg(chunks) if chunks else 1.0


def _mta_split_windows(env, grid, rows, step):
    """The forward's key splits (`launch.key_splits`): program `pid` of the grid's axis 0
    takes row window `N - 1 - pid % N` (rows from that times `rows`) and its key windows from
    `(pid // N) * step` in steps of `NS * step`, N the row windows (`N_T` / `N_W`; the whole
    axis without a split). Returns `[(row0, [n0, ...]) per program]`."""
    n_w = env.get("N_T", env.get("N_W", grid[0]))
    ns = env.get("NS", 1)
    out = []
    for pid in range(grid[0]):
        m0, split = (n_w - 1 - pid % n_w) * rows, pid // n_w
        end = min(env["T_K"], env["Q_OFFSET"] + m0 + rows)
        out.append((m0, range(split * step, end, ns * step)))
    return out


def _mta_tap_shares(env, windows) -> tuple[float, float, float]:
    """Shares of the logit windows `(row0, R, col0, C)` per branch of `_fwd_conv_scores`:
    the diagonal's Toeplitz taps, factored inside the sequence (`_interior`: rows
    `row0 - (CQ - 1) .. row0 + R - 1` and keys `col0 .. col0 + C - 1` in range, d_head one
    unpadded chunk: bf16 / fp16), factored with masks; in source order."""
    direct = _mta_direct_share(env, windows)
    fast = _avg(_mta_unmasked_factored(env, *w) for w in windows)
    return direct, fast, 1.0 - direct - fast


def _mta_unmasked_factored(env, row0, r, col0, c) -> bool:
    """The logit window `(row0, R, col0, C)` takes `_factored_scores`' unmasked branch: its
    taps reach no causally masked pair (`_mta_direct_share`), rows `row0 - (CQ - 1) .. row0 +
    R - 1` and keys `col0 .. col0 + C - 1` in range, d_head one unpadded chunk (`_interior`)."""
    cq, ck, left, off = env["CQ"], env["CK"], env["LEFT"], env["Q_OFFSET"]
    return (env.get("SCH") == env.get("BLOCK_D") == env["D"] and row0 - (cq - 1) >= 0
            and row0 + r <= env["T_Q"] and col0 >= 0 and col0 + c <= env["T_K"]
            and not col0 + c - 1 - left + ck - 1 > row0 - (cq - 1) + off)


def _mta_lse(env, grid):
    """MTA lse pass (`mta_lse_kernel`, persistent): per program its key tiles (`it`,
    `_mta_out_windows` with row tiles of BLOCK_M and key tiles of BLOCK_N), heads `n`, then
    per head the diagonal's banded Toeplitz taps (`a`, then key chunks `t0`:
    `_mta_toeplitz_chunks`; `_fwd_conv_scores`, no key-tap loop),
    the factored ones inside the sequence or the masked factored ones (`a`), in source order;
    their `a` trips are CQ times the share of windows taking each branch (`_mta_tap_shares`:
    so the products count the work); then the staged
    scores' mixing in key chunks `c0` of KC (`triton_fwd.mta_fwd`: KC = min(LSE_KC,
    BLOCK_N))."""
    from attnlens.kernels.mta.triton_fwd import LSE_HALF

    half = LSE_HALF.value
    bm, bn = env["BLOCK_M"], env["BLOCK_N"]
    progs = _mta_out_windows(dict(env, N_W=env.get("N_T")), grid, bm, bn)
    windows = [(m0, bm, n0, bn) for prog in progs for m0, n0 in prog]
    w, h, cq = _avg(len(p) for p in progs), env["H"], env["CQ"]
    out = {"it": w, "n": h, "c0": bn // env.get("KC", min(8, bn))}
    if bn <= half:
        shares = _mta_tap_shares(env, windows)
        return out | {"a": [cq * f for f in shares], "t0": _mta_toeplitz_chunks(env, windows)}
    # Wide tiles: phase 1 is `_lse_wide_head`, called per head (`calls`: H per tile), its own
    # SASS function after the kernel's code: a tile at the diagonal in LSE_HALF-key halves
    # (`h0`, each `_fwd_conv_scores`' branches: `a` Toeplitz / inside / masked, `t0`), else
    # the factored taps over all keys (`a` inside, with d_head chunks `e0` of at most
    # LSE_HALF; `a` masked, with `dot_rows`' chunks `d0` after its first), in address order.
    # (`triton_fwd.LSE_HALF`: the halves' keys and the chunks' d_head)
    diagonal = [_mta_direct_share(env, [win]) == 1.0 for win in windows]
    halves = [(m0, r, n0 + h0, half) for (m0, r, n0, c), at in zip(windows, diagonal,
                                                                    strict=True)
              if at for h0 in range(0, c, half)]
    wide = [win for win, at in zip(windows, diagonal, strict=True) if not at]
    share = len(wide) / len(windows) if windows else 0.0
    inside = _avg(_mta_unmasked_factored(env, *win) for win in wide) * share
    calls = w * h
    dch = min(env["SCH"], half)
    return out | {"calls": calls, "h0": calls * (1.0 - share) * bn / half,
                  "a": [cq * f for f in _mta_tap_shares(env, halves)]
                  + [calls * cq * inside, calls * cq * (share - inside)],
                  "t0": _mta_toeplitz_chunks(env, halves),
                  "e0": math.ceil(env["D"] / half),
                  "d0": math.ceil(env["D"] / dch) - 1}


def _mta_out_windows(env, grid, rows, step, with_modes: bool = False):
    """The persistent out pass's work (`mta/out_plan.py`): per program (grid axis 0), the key
    windows of its row of the plan PLAN (int32: `[start, end)` per program, then windows
    `item * KW + key window index`, times 4 plus a phase-5 mode where PAIRS), each as
    `(m0, n0)` (item i: row window `N_W - 1 - i % N_W`, rows from that times `rows`; keys from
    the index times `step`), or `(m0, n0, mode)` with `with_modes` (0 without PAIRS).
    Without a plan, the key windows of `_mta_split_windows`' programs."""
    if env.get("PLAN") is None:
        return [[(m0, n0, 0)[:3 if with_modes else 2] for n0 in steps] for m0, steps in
                _mta_split_windows(env, grid, rows, step)]
    plan, n_w, kw = env["PLAN"].tolist(), env["N_W"], env["KW"]
    pairs = bool(env.get("PAIRS"))
    out = []
    for p in range(grid[0]):
        prog = []
        for e in plan[plan[2 * p]:plan[2 * p + 1]]:
            code, mode = (e // 4, e % 4) if pairs else (e, 0)
            w = ((n_w - 1 - (code // kw) % n_w) * rows, (code % kw) * step, mode)
            prog.append(w[:3 if with_modes else 2])
        out.append(prog)
    return out


def _mta_pair_staged(env, row0, col0) -> bool:
    """`triton_fwd._pair_staged`: the out pass stages the key-window pair whose first window
    starts at rows `row0`, keys `col0` (halos included) together, its second NS windows on:
    the span of both, as one window, takes the unmasked factored taps."""
    span = env["NS"] * (env["AC"] - env["CK2"] + 1) + env["AC"]
    return _mta_unmasked_factored(env, row0, env["AR"], col0, span)


def _mta_out(env, grid):
    """MTA out pass (`mta_out_kernel`, persistent): per program its key windows (`it`,
    `_mta_out_windows`) of AR x AC with outputs AR - CQ2 + 1 rows. Per window: phase 1, each
    head's (`n`) Toeplitz (diagonal: `a`, key chunks `t0`) / inside / masked taps (`a`); the
    two mixing phases' key chunks
    `c0` (AC / KC each); per head (`n`) the post-softmax row taps (`a`: CQ2, one Toeplitz dot
    each), then phase 5: per head (`n`) the d_head chunks `d0` of z for a window alone (mode
    0: every window without PAIRS), per head (`n2`) the chunks `d0` for a pair's second window
    (mode 2; both head loops call `_z_add_head`, inlined: its `d0` loop once in each), nothing
    for a pair's first (mode 1); each head loop's trips are H times the share of windows in
    its mode. With PAIR_SCORES a pair that `_pair_staged` admits stages both windows' scores
    at its first (`_stage_pair_scores`, a SASS function of its own after the kernel's code:
    heads `n`, row taps `a`, d_head chunks of at most 64 `e0`; its head loop carries the
    windows per program that call it, `calls`) and its second skips phase 1; phase 1's
    per-window loops run for the other windows (their branch shares among those).
    With STAGE_CALL phase 1 is its own SASS function after the kernel's code: its head loop
    carries the windows per program that call it."""
    ar, ac = env["AR"], env["AC"]
    bme, bne = ar - env["CQ2"] + 1, ac - env["CK2"] + 1
    progs = _mta_out_windows(env, grid, bme, bne, with_modes=True)
    windows = [(m0 - (env["CQ2"] - 1), ar, n0 - env["LEFT2"], ac)
               for prog in progs for m0, n0, _ in prog]
    modes = [mode for prog in progs for _, _, mode in prog]
    alone, second = (_avg(m == k for m in modes) if modes else 0.0 for k in (0, 2))
    paired = bool(env.get("PAIR_SCORES"))
    staged = [0] * len(windows)
    if paired:
        step = env["NS"] * bne
        staged = [m * _mta_pair_staged(env, row0, col0 - (m == 2) * step)
                  for (row0, _, col0, _), m in zip(windows, modes, strict=True)]
    joint = _avg(s == 1 for s in staged) if staged else 0.0
    single = [w for w, s in zip(windows, staged, strict=True) if s == 0]
    alone_staged = len(single) / len(windows) if windows else 0.0
    shares = _mta_tap_shares(env, single)
    w, h, c = _avg(len(p) for p in progs), env["H"], ac // env["KC"]
    pre, post = [env["CQ"] * f for f in shares], [env["CQ2"]]
    chunks = math.ceil(env["D"] / env["DCH"])
    out = {"it": w, "c0": [c, c], "t0": _mta_toeplitz_chunks(env, single),
           "d0": chunks, "n2": h * second}
    pair, pair_a = ([h * w * joint], [env["CQ"]]) if paired else ([], [])
    if paired:                                # the pair's d_head chunks of at most 64
        out |= {"e0": env["BLOCK_D"] // min(env["BLOCK_D"], 64), "calls": w * joint}
    if env.get("PAIR_PHASES"):
        # a pair's first window runs phases 1-2 for both in loops `w` (phase 1: the windows
        # staged one by one, `single`; phase 2 two windows, its second none) and phase 3 for
        # both (`n`, `a`: `_conv_post_pair`); a window alone phase 3 as before (`n`, `a`)
        first = _avg(m == 1 for m in modes) if modes else 0.0
        out |= {"w": [alone_staged, alone + 2 * first]}
        post, n3 = [env["CQ2"], env["CQ2"]], [h * first, h * alone]
        phase1 = [h]                          # per window of its `w` loop
    else:
        n3, phase1 = [h], [h * alone_staged]
    if env.get("STAGE_CALL"):                 # (both called: calls summed, an approximation)
        return out | {"n": n3 + [h * alone] + pair + [h * w * alone_staged],
                      "a": post + pair_a + pre, "calls": w * (alone_staged + joint)}
    return out | {"n": phase1 + n3 + [h * alone] + pair, "a": pre + post + pair_a}


# MTA's backward (`mta/triton_bwd.py`): persistent programs run the key windows of their row
# of the plan PLAN (`out_plan.turn_plan`: per key window `item * N_KW + key window index`, turn,
# flush); item i owns OR rows from `(N_W - 1 - i % N_W) * OR`, its key windows step by ORC
# (`bwd_windows`) from `i // N_W` in steps of NS); without a plan, one program per item
# (`_mta_split_windows`' numbering); a window's work is PR-row sweeps (`r0`, AR / PR each). The
# three passes call scalar-argument functions per window, which ptxas keeps as SASS functions
# of their own after the kernel's code: their loops are not inside the key loop's addresses,
# so their trips carry the windows per program (`w`), and their code outside their loops
# counts once per call (`calls`: w; until 2026-12-06 once per program, an undercount of
# 1.4-2.1% of a pass's instructions at 4k).
def _mta_bwd_windows(env, grid, row_shift, col_shift):
    """(windows per program, the tap-branch shares (`_mta_tap_shares`: the diagonal's
    Toeplitz taps, factored inside the sequence, masked factored) of the logit windows at
    `(m0 + row_shift + r0, PR, n0 + col_shift, AC)`, their mean Toeplitz key chunks
    (`_mta_toeplitz_chunks`): the backward forms its logits with the forward's
    `_fwd_conv_scores`, `bwd_logits.logits_staging_scores`)."""
    own_r, own_c, ar, pr = env["OR"], env["ORC"], env["AR"], env["PR"]
    if env.get("PLAN") is None:
        progs = [[(m0, n0) for n0 in steps] for m0, steps in
                 _mta_split_windows(env, grid, own_r, own_c)]
    else:
        n_w, n_kw = env["N_W"], env["N_KW"]
        progs = [[((n_w - 1 - (e // n_kw) % n_w) * own_r, (e % n_kw) * own_c) for e in codes]
                 for codes in _mta_bwd_plan_codes(env, grid)]
    windows = [(m0 + row_shift + r0, pr, n0 + col_shift, env["AC"])
               for prog in progs for m0, n0 in prog for r0 in range(0, ar, pr)]
    return (_avg(len(p) for p in progs), _mta_tap_shares(env, windows),
            _mta_toeplitz_chunks(env, windows))


def _mta_bwd_plan_codes(env, grid) -> list[list[int]]:
    """Per program, the codes (`item * N_KW + key window index`) of its key windows in the
    backward's plan PLAN, in run order."""
    from attnlens.kernels.mta.out_plan import TURN_ENTRY

    plan = env["PLAN"].tolist()
    return [plan[plan[2 * p]:plan[2 * p + 1]:TURN_ENTRY] for p in range(grid[0])]


def _mta_bwd_items(env, grid) -> float:
    """Items (row window, key split) per program of the backward's plan (a run of entries with
    one item code; one per program without a plan): the pre pass adds each item's dq to its
    row window's slot once, after the item's last key window."""
    if env.get("PLAN") is None:
        return 1.0
    n_kw = env["N_KW"]
    items = [[e // n_kw for e in codes] for codes in _mta_bwd_plan_codes(env, grid)]
    return _avg(sum(1 for j, c in enumerate(its) if j + 1 == len(its) or its[j + 1] != c)
                for its in items)


def _mta_bwd_delta(env, grid):
    """`mta_bwd_delta_kernel`: the kernel's window loop (`while`, w per program) calls
    `_delta_window`, whose sweeps carry the windows (`r0`, r x w each): G staged (d_head
    chunks `d0`), then per row chunk the transposed post taps (`a`: CQ2) and the logits
    (heads `n`, Toeplitz `a` and key chunks `t0` / factored `a`)."""
    w, shares, chunks = _mta_bwd_windows(env, grid, 0, 0)
    r, cq = env["AR"] // env["PR"], env["CQ"]
    return {"while": w, "calls": w, "r0": [r * w, r * w], "d0": math.ceil(env["D"] / env["DCH"]),
            "a": [env["CQ2"]] + [cq * f for f in shares], "n": env["H"], "t0": chunks}


def _mta_bwd_post(env, grid):
    """`mta_bwd_post_kernel` (the window loop, `while`, w per program, calls `_post_window`):
    three sweeps per window (A with the logits; P2 and P, `a` CQ2; dP, `d0`), dv, one d_head
    loop per window (`d0`) in the program's turn (`while`, `wait_turn`: one poll per window,
    no waiting modeled), then dth' (`tap_grads`: per window its row taps `a` CQ2, each over
    the row chunks `r0`)."""
    w, shares, chunks = _mta_bwd_windows(env, grid, -(env["CQ2"] - 1), -env["LEFT2"])
    r, cq, d0 = env["AR"] // env["PR"], env["CQ"], math.ceil(env["D"] / env["DCH"])
    return {"calls": w, "r0": [r * w] * 3 + [r], "n": env["H"], "t0": chunks,
            "d0": [d0, d0 * w], "while": w,
            "a": [cq * f for f in shares] + [env["CQ2"], env["CQ2"] * w]}


def _mta_bwd_pre(env, grid):
    """`mta_bwd_pre_kernel`: in the key-window loop `it`, after an item's last window, the dq
    accumulator's add to the row window's slot in its turn (`while`, one poll, no waiting
    modeled; `i0` FLUSH_BLOCK elements a step); then its functions in address order:
    `_pre_dc` (logits: `n`, `a`, `t0`), `stage_gram` (`k0`), `_pre_dr` (dR `a` CQ; dq `d0`
    per row chunk; dk one `d0` loop per window in the program's turn, `while`: one poll per
    window, no waiting modeled; dth by `tap_grads`, per window its row taps `a` CQ over the
    row chunks `r0`), `_pre_stage` (G `d0`; R one dot per head `n`; dA `a` CQ2)."""
    from attnlens.kernels.mta.triton_bwd import FLUSH_BLOCK

    w, shares, chunks = _mta_bwd_windows(env, grid, 0, 0)
    r, cq, d0 = env["AR"] // env["PR"], env["CQ"], math.ceil(env["D"] / env["DCH"])
    rw = r * w
    flush = _mta_bwd_items(env, grid) / w if w else 0.0      # per window of the loop `it`
    return {"it": w, "calls": w, "r0": [rw, rw, rw, r, rw, rw], "n": [env["H"], env["H"] * w],
            "t0": chunks,
            "while": [flush, w],
            "i0": flush * math.ceil(env["AR"] * env["H"] * env["D"] / FLUSH_BLOCK.value),
            "a": [cq * f for f in shares] + [cq, cq * w, env["CQ2"]],
            "d0": [d0, d0 * w, d0],
            "k0": env["AR"] * env["AC"] // env["GK"] * w}


# CoPE's backward splits each query tile's keys into the band next to the diagonal, where the
# gate carry is still below npos - 1, and the clamped keys left of it (`cope/triton_bwd_kv.py`);
# where the split falls depends on the gates, so the model assumes a mean gate (0.5: random
# scores, sigmoid of a zero-mean logit, as in the benchmark's inputs): the band of a query tile
# reaches `BLOCK_M + (NPOS - 1) / COPE_MEAN_GATE` keys left of its first row.
COPE_MEAN_GATE = 0.5


def _cope_band_keys(env) -> float:
    return (env["NPOS"] - 1) / COPE_MEAN_GATE if env.get("HAS_COPE") else 0.0


def _cope_bwd(env, grid):
    """`cope_bwd_kernel`: per query tile, the band sweep twice (`while`: U_i, then `i` with
    the gradients) and the clamped tiles once (`i`); d_head chunk loops (`d0`, fp32) by D.
    With relative logits every tile is band."""
    bm, bn, t_k, off = (env[k] for k in ("BLOCK_M", "BLOCK_N", "T_K", "Q_OFFSET"))
    band, clamped = [], []
    for pid in range(grid[0]):
        first = off + pid * bm
        n_tiles = _steps(0, min(t_k, first + bm), bn)
        if env.get("HAS_REL"):          # relative logits: every tile is band
            nb = n_tiles
        elif env.get("HAS_COPE"):
            nb = min(n_tiles, math.ceil((bm + _cope_band_keys(env)) / bn) + 1)
        else:
            nb = 0
        band.append(nb)
        clamped.append(n_tiles - nb)
    nb, nc = _avg(band), _avg(clamped)
    d0 = max(1, math.ceil(env["D"] / env["DCH"]))
    return {"while": nb, "i": [nb, nc], "d0": d0}


def _cope_bwd_dkdv(env, grid):
    """`cope_bwd_dkdv_kernel`: key tile `pid` sweeps the query tiles that see it (`start_m`);
    counted are those holding a clamped pair (the rest skip the body after one small load):
    query rows beyond the key tile's start plus the band."""
    bm, bn, t_q, off = (env[k] for k in ("BLOCK_M", "BLOCK_N", "T_Q", "Q_OFFSET"))
    trips = []
    for pid in range(grid[0]):
        first_row = max(pid * bn + int(_cope_band_keys(env)) - off, 0)
        trips.append(_steps(first_row // bm * bm, t_q, bm))
    return {"start_m": _avg(trips)}


def _mta_fold(env, grid):
    """`fold_keys_kernel`: per program, the row taps `a` (CQ); 16-bit k: each tap 2 PARTS
    dots of banded tap tables with the program's read keys (unrolled, no inner loop); fp32 k
    (F32): each tap sums the key taps `kb` (CK) on CUDA cores."""
    return {"a": env["CQ"], "kb": env["CK"]}


def _mta(env, grid):
    """The MTA forward's two kernels: the out pass has windows (AR), the lse pass tiles."""
    return (_mta_out if "AR" in env else _mta_lse)(env, grid)


def _dcmha(env, grid):
    window = env["WINDOW"]

    def start(first):
        return 0 if window < 0 else max(first - window, 0) // env["BLOCK_N"] * env["BLOCK_N"]

    return {"n0": _causal_tiles(env, grid, start), "n": env["H"], "c": env["C"],
            "d0": env["BLOCK_D"] // env["DCH"]}


def _dcmha_tc_ranges(env, grid) -> list[tuple[int, int, int]]:
    """`(m0, start, end)` of every program of one batch element: the forward's rows of its
    program table PROGS (`fwd_plan.forward_plan`: columns m0, split, start, end), or, without
    a table, a grid `(query tiles, NS, batch)` of equal key splits (ceil(tiles / NS) tiles
    each, the last split fewer; the backward's default budget, `triton_bwd_tc`)."""
    if env.get("PROGS") is not None:
        return [(m0, start, end) for m0, _, start, end in env["PROGS"].tolist()]
    bm, bn, ns, window = env["BLOCK_M"], env["BLOCK_N"], env["NS"], env["WINDOW"]
    ranges = []
    for pid in range(grid[0]):
        first = env["Q_OFFSET"] + pid * bm
        lo = 0 if window < 0 else max(first - window, 0) // bn * bn
        hi = min(env["T_K"], first + bm)
        chunk = math.ceil(_steps(lo, hi, bn) / ns) * bn
        ranges += [(pid * bm, lo + s * chunk, min(hi, lo + (s + 1) * chunk)) for s in range(ns)]
    return ranges


def _dcmha_tc_splits(env, grid, unmasked: bool | None = None) -> list[int]:
    """Key tiles of every program (`_dcmha_tc_ranges`); unmasked True / False: only the
    tiles before / from the program's first masked one (`_unmasked_end`: keys every row of
    the query tile sees, no window, no key padding, not fp32)."""
    bn, window = env["BLOCK_N"], env["WINDOW"]
    trips = []
    for m0, start, end in _dcmha_tc_ranges(env, grid):
        first = env["Q_OFFSET"] + m0
        mid = start
        if window < 0 and not env.get("HAS_KVALID") and not env.get("IEEE"):
            seen = min(first + 1, env["T_K"]) - start
            mid = min(start + max(seen, 0) // bn * bn, max(end, start))
        if unmasked is None:
            trips.append(_steps(start, end, bn))
        else:
            trips.append(_steps(start, mid, bn) if unmasked else _steps(mid, end, bn))
    return trips


def _dcmha_tc(env, grid):
    """`triton_fwd_tc`: a program sweeps its split of the query tile's key tiles
    (`_dcmha_tc_splits`, its row of the program table) in two loops, the unmasked tiles then the
    masked ones (`n0`, one value each); every head loop runs H times per key tile, listed one
    per SASS loop and tile loop: `n` once in the lse kernel (the pre hidden maps, scores kept in
    the scratch) and twice in the out kernel (the same, then each head's probabilities with the
    post hidden maps); with MAPS_APART (each phase's maps in a loop of their own) twice in the
    lse kernel (the scores, the pre maps) and four times in the out kernel (the scores, the pre
    maps, the probabilities, the post maps); `m` (per output head) once in each; d_head chunks
    are unrolled (`static_range`). The lse kernel is the one with HB."""
    apart = bool(env.get("MAPS_APART"))
    loops = (1 + apart) if "HB" in env else (4 if apart else 2)
    return {"n0": [_avg(_dcmha_tc_splits(env, grid, True)),
                   _avg(_dcmha_tc_splits(env, grid, False))],
            "n": [env["H"]] * (2 * loops), "m": [env["H"]] * 2}


def _dcmha_tc_bwd(env, grid):
    """`triton_bwd_tc`: program p sweeps the keys `[start, end)` of row p of its program table
    PROGS (`backward_plan`: columns m0, start, end, base, stride; the same for every batch
    element, grid axis 1), or, without a table (a grid
    `(query tiles, splits, batch)`), the forward's key splits (`_dcmha_tc`); every head loop
    (`n`) runs H times per key tile, listed once per SASS loop (3 in the delta kernel, 10 in
    the gradient kernel: two adjacent `_stored_hidden` loops share a source line and would
    otherwise read as an unrolled loop and its remainder). The gradient kernel's last head
    loop (dq over a group of DQ_GROUP key tiles) runs once per group: H x (groups / key
    tiles) per key tile, over the launch's programs. d_head chunks (`d0`: BLOCK_D / ACH, a
    runtime loop ptxas unrolls) and the score dots' chunks have no loop."""
    if env.get("PROGS") is not None:
        bn = env["BLOCK_N"]
        tiles = [_steps(start, end, bn) for _, start, end, _, _ in env["PROGS"].tolist()]
    else:
        tiles = _dcmha_tc_splits(env, grid)
    n0, H = _avg(tiles), env["H"]
    if "ACH" not in env:
        return {"n0": n0, "n": [H] * 3, "d0": 1}
    groups = _avg(math.ceil(t / env["DQ_GROUP"]) for t in tiles)
    return {"n0": n0, "n": [H] * 9 + [H * groups / n0 if n0 else 0.0],
            "d0": env["BLOCK_D"] // env["ACH"]}


MODELS = {"attn_fwd_kernel": _flash_fwd, "attn_fwd_tma_kernel": _flash_fwd_tma,
          "_bwd_dq": _flash_dq, "_bwd_dkdv": _flash_dkdv,
          "cope_fwd_kernel": _cope_fwd, "cope_bwd_kernel": _cope_bwd,
          "cope_bwd_dkdv_kernel": _cope_bwd_dkdv,
          "mta_lse_kernel": _mta, "mta_out_kernel": _mta, "fold_keys_kernel": _mta_fold,
          "mta_bwd_delta_kernel": _mta_bwd_delta, "mta_bwd_post_kernel": _mta_bwd_post,
          "mta_bwd_pre_kernel": _mta_bwd_pre,
          "dcmha_lse_kernel": _dcmha, "dcmha_out_kernel": _dcmha,
          "dcmha_tc_lse_kernel": _dcmha_tc, "dcmha_tc_out_kernel": _dcmha_tc,
          "dcmha_delta_kernel": _dcmha, "dcmha_bwd_kernel": _dcmha,
          "dcmha_tc_delta_kernel": _dcmha_tc_bwd, "dcmha_tc_grads_kernel": _dcmha_tc_bwd}


def _unroll(main, rest, kinds=("ldg", "ffma", "instructions")) -> int:
    for k in kinds:
        if main.get(k) and rest.get(k):
            return max(1, round(main[k] / rest[k]))
    return 1


def loop_trips(loop_rows: list[dict], model: dict) -> list[float] | None:
    """Trips per SASS loop (`sass_mix.loop_rows` rows, in address order) from a
    model's `{var: n or [n per occurrence]}`; None when a loop is not covered."""
    by_var: dict[str, list[int]] = {}
    for i, lo in enumerate(loop_rows):
        by_var.setdefault(lo["var"], []).append(i)
    trips: list[float | None] = [None] * len(loop_rows)
    for var, idx in by_var.items():
        if var not in model:
            return None
        value = model[var]
        values = value if isinstance(value, list) else [value]
        if len(values) == len(idx):                 # one value per SASS loop
            for n, i in zip(values, idx, strict=True):
                trips[i] = n
            continue
        groups = _occurrences(loop_rows, idx)
        if len(values) == 1:
            values = values * len(groups)
        if len(values) != len(groups):
            return None
        for n, group in zip(values, groups, strict=True):
            if len(group) == 1:
                trips[group[0]] = n
            else:                                   # unrolled main loop + remainder loop
                main, rest = group
                u = _unroll(loop_rows[main]["mix"], loop_rows[rest]["mix"])
                trips[main], trips[rest] = n // u, n % u
    return trips


def _occurrences(loop_rows, idx) -> list[list[int]]:
    """Group a variable's loops into source occurrences: an innermost loop directly followed
    (no loop between) by a smaller innermost loop of the same line and depth is an unrolled
    main loop and its remainder."""
    groups: list[list[int]] = []
    for i in idx:
        prev = groups[-1][-1] if groups else None
        a, b = (loop_rows[prev], loop_rows[i]) if prev is not None else (None, None)
        if (prev is not None and len(groups[-1]) == 1 and i == prev + 1
                and a["inner"] and b["inner"] and a["line"] == b["line"]
                and a["depth"] == b["depth"] and a["end"] < b["start"]
                and b["mix"].get("instructions", 0) < a["mix"].get("instructions", 0)):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def calls_for(launch) -> float:
    """Calls per program of the launch's `noinline` functions (its model's `calls`, default 1):
    their code outside their own loops counts that many times (`sass_mix.weighted_mix`)."""
    fn = MODELS.get(launch.name)
    grid = getattr(launch, "grid", None)
    if fn is None or grid is None:
        return 1.0
    model = fn(kernel_env(launch), grid)
    return 1.0 if model is None else float(model.get("calls", 1.0))


def trips_for(launch, loop_rows: list[dict]) -> list[float] | None:
    """Trip counts of `loop_rows` for `launch` (None: no model for this kernel or loop)."""
    fn = MODELS.get(launch.name)
    grid = getattr(launch, "grid", None)
    if fn is None or grid is None:
        return None
    model = fn(kernel_env(launch), grid)
    return None if model is None else loop_trips(loop_rows, model)


__all__ = ["MODELS", "calls_for", "kernel_env", "loop_trips", "trips_for"]
