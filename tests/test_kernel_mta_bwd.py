"""The tensor-core MTA backward (`attnlens.kernels.mta.triton_bwd`, `bwd_tiles`) on the Triton
interpreter.

1. Its tap matrices (`bwd_toeplitz`) are the convolutions they stand for: the post-softmax
   taps, their transpose (the kernel flipped in both axes) and the pre-softmax taps transposed
   (dR from dC), against direct sums in float64.
2. Its windows (`bwd_windows`) hold both convolutions' halos around the positions they own.
3. Gradients equal the float64 spec's where the windows matter: sequences spanning several
   programs and key windows at odd lengths (the owned 27 x 22 positions of a 32 x 32 window
   do not divide them), the benchmark's 16 heads with full mixings, each pad_key, the
   diagonal band, padding keys over two batches, queries aligned to the last keys.
"""

import pytest
import torch
from tiers import EXTENDED

from kernel_common import KERNEL_MARKS, nan_empty, spy_launches, to_device  # noqa: F401  (nan_empty: autouse, NaN scratch)

pytestmark = KERNEL_MARKS

from test_kernel_mta import ALL_ON, OFFICIAL, _check_gradients, _qkv  # noqa: E402

from attnlens.kernels.mta.bwd_tiles import bwd_toeplitz  # noqa: E402
from attnlens.kernels.mta.triton_bwd import bwd_windows  # noqa: E402

F32_TAPS = dict(atol=1e-6, rtol=1e-6)           # the taps are held in fp32 (`post_toeplitz`)


def test_backward_tap_matrices_are_the_transposed_convolutions():
    g = torch.Generator().manual_seed(3)
    H, CQ, CK, ac = 3, 2, 5, 16
    th2 = torch.randn(H, CQ, CK, generator=g, dtype=torch.float64)
    th = torch.randn(H, 3, 4, generator=g, dtype=torch.float64)
    post, post_t, pre_t = bwd_toeplitz(th, th2, ac, 4, torch.float64)
    assert post.shape == post_t.shape == (4, CQ, ac, ac) and pre_t.shape == (4, 3, ac, ac)
    x = torch.randn(H, ac, generator=g, dtype=torch.float64)
    for h in range(H):
        for a in range(CQ):
            # forward taps: out[j] = sum_b th2[a, b] x[j + b]
            want = torch.stack([sum(th2[h, a, b] * x[h, j + b] for b in range(CK)
                                    if j + b < ac) for j in range(ac)])
            torch.testing.assert_close(x[h] @ post[h, a], want, **F32_TAPS)
            # transposed taps: the kernel flipped in both axes
            want_t = torch.stack([sum(th2[h, CQ - 1 - a, CK - 1 - b] * x[h, j + b]
                                      for b in range(CK) if j + b < ac) for j in range(ac)])
            torch.testing.assert_close(x[h] @ post_t[h, a], want_t, **F32_TAPS)
        for a in range(3):
            # dR from dC: an entry at key j feeds keys j + b with th[a, b]
            want_r = torch.zeros(ac, dtype=torch.float64)
            for j in range(ac):
                for b in range(4):
                    if j + b < ac:
                        want_r[j + b] += th[h, a, b] * x[h, j]
            torch.testing.assert_close(x[h] @ pre_t[h, a], want_r, **F32_TAPS)
    assert not post[H:].any() and not post_t[H:].any() and not pre_t[H:].any()


@pytest.mark.parametrize("hb, pre, post", [(16, (6, 11), (6, 11)), (16, (3, 5), (2, 3)),
                                           (32, (6, 11), (6, 11)), (16, (1, 1), (6, 11))])
def test_windows_hold_both_halos(hb, pre, post):
    from attnlens.kernels.mta.launch import out_windows

    ar, ac, own_r, own_c = bwd_windows(hb, *pre, *post)
    # the forward's windows for the larger halo with twice the rows, at most 64: longer
    # sweeps and stages, the same [HB, 16, AC] maps in registers
    base_r, base_c = out_windows(hb, max(pre[0], post[0]), max(pre[1], post[1]))
    assert (ar, ac) == (max(base_r, min(64, 2 * base_r)), base_c)
    assert hb * 16 * ac <= 16384 and ar >= 16 and ac >= 16
    for cq, ck in (pre, post):
        assert own_r + cq - 1 <= ar and own_c + ck - 1 <= ac
    assert own_r >= 1 and own_c >= 1
    if (hb, pre, post) == (16, (6, 11), (6, 11)):
        assert (ar, ac, own_r, own_c) == (64, 32, 59, 22)
    # fp32 inputs: at most FP32_ROWS (32) rows, the same keys
    ar32, ac32, own_r32, own_c32 = bwd_windows(hb, *pre, *post, fp32=True)
    assert (ar32, ac32, own_c32) == (max(base_r, min(32, 2 * base_r)), ac, own_c)
    assert own_r32 == ar32 - ar + own_r


@EXTENDED   # several programs' dq and dk slots: the no-atomics test at T 37
def test_gradients_over_several_programs_and_key_windows():
    """T 50 with the official 6 x 11 kernels on fp32's 32-row windows: 2 row windows of 27
    rows (the last 23), up to 3 key windows of 22 keys (the last 6), 5 windows in all (T 61's
    3 row windows took 8 windows and 1.6x the time); each dR window reaches into the row
    window above (dq's fold) and each key window's halo into the next (dk's)."""
    _check_gradients(50, 50, 2, OFFICIAL, "both", 1)


@pytest.mark.parametrize("T_q, T_k, H, opts, pad_key, batch", [
    pytest.param(45, 45, 4, ALL_ON, "right", 2,       # padding keys, empty rows, groups of 2
                 marks=EXTENDED),
    (7, 40, 2, dict(pre=(3, 3), post=(2, 3), post_mix=1), "left", 1),   # aligned to the end
])
def test_gradients_at_odd_lengths(T_q, T_k, H, opts, pad_key, batch):
    """(3 heads at the odd length 37: `test_backward_without_atomics_...`, which checks its
    gradients and runs its backward twice.)"""
    _check_gradients(T_q, T_k, H, opts, pad_key, batch)


def test_trip_models_count_the_backward_windows():
    """`compile_check.trips` models the backward's key windows per program as the kernels'
    loops run them: T 61, 27 rows and 22 keys owned per window: programs at rows 0, 27, 54
    sweep 2, 3 and 3 windows."""
    from attnlens.kernels.compile_check.trips import MODELS

    env = dict(OR=27, ORC=22, AR=32, AC=32, PR=16, T_Q=61, T_K=61, Q_OFFSET=0, H=2, D=64, DCH=16,
               CQ=6, CK=11, LEFT=5, CQ2=6, CK2=11, LEFT2=5, GK=256)
    delta = MODELS["mta_bwd_delta_kernel"](env, (3, 1))
    # the delta and post passes' window loops (`while`) call a function per window: its
    # sweeps carry the windows
    assert delta["while"] == pytest.approx(8 / 3)
    assert delta["r0"] == [pytest.approx(16 / 3)] * 2         # 2 row chunks x 8/3 windows
    post = MODELS["mta_bwd_post_kernel"](env, (3, 1))
    assert post["r0"] == [pytest.approx(16 / 3)] * 3 + [2]     # 2 row chunks x 8/3 windows
    assert post["d0"] == [4, pytest.approx(4 * 8 / 3)]        # dv: one d_head loop a window
    pre = MODELS["mta_bwd_pre_kernel"](env, (3, 1))
    assert pre["k0"] == pytest.approx(4 * 8 / 3) and len(pre["a"]) == 6
    assert pre["d0"] == [4, pytest.approx(4 * 8 / 3), 4]       # dk: one d_head loop a window
    # a turn a window (dv, dk); the post pass's window loop and its turn's poll alike
    assert post["while"] == pre["while"][1] == pytest.approx(8 / 3)
    # dq: one add per item (one a program here) after its last window, in the loop over
    # windows: 1 / (8/3) per window, 2 steps of 2,048 of the 32 x 2 x 64 accumulator each
    assert pre["while"][0] == pytest.approx(3 / 8) and pre["i0"] == pytest.approx(2 * 3 / 8)
    # dth' and dth (`tap_grads`): per window its row taps, each summing the 2 row chunks
    # into one diagonal read (the row chunks inside the taps: 6 x 8/3 diagonal reads a
    # program, was twice that)
    assert post["a"][-1] == pytest.approx(6 * 8 / 3) and pre["a"][4] == pytest.approx(6 * 8 / 3)
    assert pre["r0"][3] == 2
    # the logits' three tap branches (`logits_staging_scores`: the diagonal's Toeplitz taps,
    # factored inside the sequence, masked factored) share CQ per window; then dR (CQ), dth
    # (CQ per window) and dA (CQ2)
    assert sum(pre["a"][:3]) == pytest.approx(6) and pre["a"][3::2] == [6, 6]
    assert len(delta["a"]) == 4 and sum(delta["a"][1:]) == pytest.approx(6)
    # the diagonal's windows take the forward's banded Toeplitz form (`_toeplitz_scores`): no
    # key-tap loop `b`; per row tap 1-2 chunks of AC read keys (`t0`: 16-row sweeps of 32 keys
    # read 32 + 10 keys, cut after the last row's last visible key)
    for model in (delta, post, pre):
        assert "b" not in model and 1 <= model["t0"] <= 2
    # two programs per row window (`key_splits`): split 0 takes key windows 0, 2; split 1
    # takes window 1: 1 + 2 + 2 and 1 + 1 + 1 windows, the same 8 in all
    split = MODELS["mta_bwd_delta_kernel"](dict(env, N_W=3, NS=2), (6, 1))
    assert split["while"] == pytest.approx(8 / 6)
    # the persistent plan (`turn_plan`): the same 8 windows on 2 programs, 4 each
    from attnlens.kernels.mta.out_plan import turn_plan

    table = turn_plan(1, 3, 27, 22, 61, 0, 2, 2).table()
    planned = MODELS["mta_bwd_delta_kernel"](dict(env, N_W=3, N_KW=3, PLAN=table), (2, 1))
    assert planned["while"] == 4
    # its 6 items (3 row windows x 2 splits, none empty) on 2 programs: 3 dq adds a program
    planned = MODELS["mta_bwd_pre_kernel"](dict(env, N_W=3, N_KW=3, PLAN=table), (2, 1))
    assert planned["while"][0] == pytest.approx(3 / 4)


def test_key_splits_fill_the_machine_without_empty_splits():
    from attnlens.kernels.mta.triton_bwd import key_splits

    assert key_splits(152, 187, "cpu") == 2             # 4k: 304 programs on 132 SMs
    assert key_splits(38, 47, "cpu") == 7               # 1k
    assert key_splits(1, 1, "cpu") == 1                 # one key window: nothing to split


@EXTENDED   # the mixing over padded heads: the 2-4 head cases
def test_gradients_at_sixteen_heads_full_mixing():
    """The benchmark's head count: every mixing dot over 16 heads, none padded, both mixings
    full. T 22 is one 32 x 32 window owning 22 rows and keys (the whole sequence); more windows
    and programs, and the official 6 x 11 kernels, are
    `test_gradients_over_several_programs_and_key_windows`'s. 3 x 5 and 2 x 3 kernels: the
    interpreter's time goes to the per-head tap loops (H c_q c_k iterations on the causal
    edge); with 6 x 11 kernels this case took 116-148 s on a loaded 2-core machine."""
    _check_gradients(22, 22, 16, dict(pre=(3, 5), post=(2, 3), pre_mix=1, post_mix=1), "both", 1)


def test_dq_partials_fold_to_the_rows_each_program_holds():
    """`fold_dq_partials` sums every program's `[AR, H, D]` dq slot (by batch, key split s and
    row window w: rows `w * OR - (CQ - 1) + [0, AR)`) into those rows, rows outside the
    sequence dropped, against a direct loop; `fold_dk_partials` every key window's `[AC, H, D]`
    dk slot (keys `kw * ORC - LEFT + [0, AC)`) likewise. Integer values: the sums are exact in
    any order, so the folds must equal the loop bit for bit."""
    from attnlens.kernels.mta.triton_bwd import fold_dk_partials, fold_dq_partials

    g = torch.Generator().manual_seed(7)
    for batch, n_w, ns, ar, own_r, cq, T_Q in ((2, 3, 2, 32, 27, 6, 61), (1, 4, 3, 16, 5, 6, 17),
                                               (1, 1, 1, 32, 30, 1, 9), (1, 3, 1, 32, 22, 6, 61)):
        H, D = 3, 4
        dq_p = torch.randint(-8, 9, (batch, ns, n_w, ar, H, D), generator=g).float()
        want = torch.zeros(batch, T_Q, H, D)
        for b in range(batch):
            for s in range(ns):
                for w in range(n_w):
                    for r in range(ar):
                        row = w * own_r - (cq - 1) + r
                        if 0 <= row < T_Q:
                            want[b, row] += dq_p[b, s, w, r]
        got = fold_dq_partials(dq_p.clone(), batch, n_w, ns, ar, own_r, cq, T_Q)
        assert torch.equal(got, want)
        if ns == 1:                     # the dk slots: one per key window, LEFT = CQ - 1 keys
            got = fold_dk_partials(dq_p[:, 0].clone(), batch, n_w, ar, own_r, cq - 1, T_Q)
            assert torch.equal(got, want)


def test_dq_and_dk_partial_bytes_at_4k():
    """The pre pass's dq accumulators and slots less the fp32 dq they replace, by arithmetic
    at the benchmark's 4k, 16 heads on 132 programs; the dk slots less the fp32 dk: 187 key
    windows of 32 keys (22 owned)."""
    from attnlens.kernels.mta.triton_bwd import dk_partial_bytes, dq_partial_bytes

    # 132 programs' accumulators + 70 row windows' slots of 64 rows (59 owned), less dq
    assert dq_partial_bytes(1, 4096, 16, 128, 132, 70, 64) == 69 * 2 ** 20
    assert dq_partial_bytes(1, 4096, 16, 64, 132, 70, 64) == 34.5 * 2 ** 20
    # at 32 rows (27 owned): 152 row windows
    assert dq_partial_bytes(1, 4096, 16, 128, 132, 152, 32) == 39 * 2 ** 20
    assert dk_partial_bytes(1, 4096, 16, 128, 187, 32) == 14.75 * 2 ** 20
    assert dk_partial_bytes(1, 4096, 16, 64, 187, 32) == 7.375 * 2 ** 20


@pytest.mark.parametrize("T, H, rows_64", [
    (37, 3, False),
    pytest.param(70, 2, True, marks=EXTENDED),       # the 64-row windows of 2k rows and more
])
def test_backward_without_atomics_is_in_slots_and_turns_and_bit_identical(monkeypatch, T, H,
                                                                         rows_64):
    """No fp32 atomics: delta goes to per-split slots (`DELTA [NS, B, H, T_Q]`); dq to each
    program's accumulator (`DQ_ACC [programs, AR, H, D]`), added after each item's last key
    window to its row window's slot (`DQ_W [B, N_W, AR, H, D]`, `dq_partial_bytes` above an
    fp32 dq) in turns and cleared; dk to per-key-window slots (`DK_P [B, N_KW, AC, H, D]`,
    `dk_partial_bytes` above an fp32 dk); dv and dk are added in turns: each key window's
    ticket (post and pre pass) ends at the number of row windows that see it, each row
    window's dq ticket at the number of its items. The three passes on the same windows and
    grid: at the odd length 37 on 3 heads on fp32's 32 x 32 windows (30 rows and 28 keys
    owned: 2 row windows x 2 key splits, 2 key windows), and at 70 on 2 heads on the 64 x 32
    windows of 16-bit inputs (FP32_ROWS patched; 62 x 28 owned: 2 row windows, 3 key
    windows): the gradients against the float64 spec (`_check_gradients`), then the same
    backward once more, bit-identical."""
    from attnlens.kernels.mta import function, triton_bwd

    if rows_64:
        monkeypatch.setattr(triton_bwd, "FP32_ROWS", 64)

    seen, calls = {}, []

    class Capture:
        def __init__(self, real, names):
            self.real, self.names = real, names

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                out = self.real[grid](*args, **kwargs)
                seen.setdefault(self.real.fn.__name__, []).append(
                    (grid, *(args[self.real.arg_names.index(n)].clone() for n in self.names)))
                return out
            return launch

    for name, names in (("mta_bwd_delta_kernel", ["DELTA"]), ("mta_bwd_post_kernel", ["TICKET"]),
                        ("mta_bwd_pre_kernel", ["DQ_ACC", "DQ_W", "DQ_TICKET", "DK_P",
                                                "TICKET"])):
        monkeypatch.setattr(triton_bwd, name, Capture(getattr(triton_bwd, name), names))

    def recorded_bwd(*args, **kwargs):
        out = triton_bwd.mta_bwd(*args, **kwargs)
        calls.append((args, kwargs, [t.clone() for t in out]))
        return out

    monkeypatch.setattr(function, "mta_bwd", recorded_bwd)
    B, D = 1, 16
    _check_gradients(T, T, H, dict(pre=(2, 5), post=(3, 3), pre_mix=1), "both", B, d=D)
    (args, kwargs, first), = calls
    for a, b in zip(first, triton_bwd.mta_bwd(*args, **kwargs), strict=True):
        assert torch.equal(a, b)
    from attnlens.kernels import _triton
    from attnlens.kernels.mta.out_plan import persistent_splits

    # the three passes on fp32's windows (64 rows with FP32_ROWS patched), on one grid
    ar, ac, own_r, own_c = triton_bwd.bwd_windows(16, 2, 5, 3, 3, fp32=True)
    assert ar == (64 if rows_64 else 32)
    n_w, n_kw = -(-T // own_r), -(-T // own_c)
    (grid, delta_p), _ = seen["mta_bwd_delta_kernel"]
    (post_grid, post_tickets), _ = seen["mta_bwd_post_kernel"]
    (pre_grid, dq_acc, dq_w, dq_tickets, dk_p, pre_tickets), _ = seen["mta_bwd_pre_kernel"]
    assert grid == post_grid == pre_grid
    n_prog = grid[0] * grid[1]
    ns = persistent_splits(n_w, own_r, own_c, T, 0, B, _triton.sm_count(dq_w.device))
    assert n_prog > n_w > 1 and n_kw > 1 and delta_p.shape[0] == ns > 1
    assert delta_p.shape[1:] == (B, H, T) and delta_p.dtype == torch.float32
    assert dq_acc.shape == (n_prog, ar, H, D) and dq_acc.dtype == torch.float32
    assert not dq_acc.any()                                   # cleared after every item
    assert dq_w.shape == (B, n_w, ar, H, D) and dq_w.dtype == torch.float32 and dq_w.any()
    assert (dq_acc.numel() + dq_w.numel() - B * T * H * D) * 4 == \
        triton_bwd.dq_partial_bytes(B, T, H, D, n_prog, n_w, ar)
    assert dk_p.shape == (B, n_kw, ac, H, D) and dk_p.dtype == torch.float32
    assert (dk_p.numel() - B * T * H * D) * 4 == triton_bwd.dk_partial_bytes(B, T, H, D, n_kw, ac)

    def seen_by(rows, n_rows):              # per key window, the row windows that see it
        return [sum(kw * own_c < min(T, w * rows + rows) for w in range(n_rows))
                for kw in range(n_kw)]

    assert post_tickets.tolist() == pre_tickets.tolist() == [seen_by(own_r, n_w)]
    items = [sum(s * own_c < min(T, w * own_r + own_r) for s in range(ns)) for w in range(n_w)]
    assert dq_tickets.tolist() == [items]


@pytest.mark.parametrize("seed", range(4))
def test_turn_plan_orders_every_key_window_by_step_then_program(seed):
    """The backward's persistent plan (`out_plan.turn_plan`) on random shapes: every item's key
    windows are run once, by one program; each key window's turns are a permutation of
    0 .. n-1 in increasing (step, program), so every add's predecessors come at an earlier
    (step, program): the least unfinished add never waits (deadlock-free on any dispatch
    order); likewise each row window's dq adds, one per item after its last key window; at
    most `n_sm` programs in all, all resident at once. The table holds the same."""
    import random

    from attnlens.kernels.mta.out_plan import TURN_ENTRY, item_windows, turn_plan

    rng = random.Random(seed)
    for _ in range(6):
        batch, n_sm = rng.choice((1, 2, 3, 5)), rng.choice((1, 4, 7, 16))
        own_r, own_c = rng.choice((5, 22, 27)), rng.choice((6, 22))
        T_K = rng.randrange(1, 200)
        T_Q = rng.randrange(1, T_K + 1)
        n_w, ns = -(-T_Q // own_r), rng.randrange(1, 4)
        tp = turn_plan(batch, n_w, own_r, own_c, T_K, T_K - T_Q, ns, n_sm)
        assert tp.plan.programs * batch <= max(n_sm, batch)
        entries = tp.entries()
        windows = item_windows(n_w, own_r, own_c, T_K, T_K - T_Q, ns)
        want = sorted((i, i // n_w + j * ns) for i, n in enumerate(windows) for j in range(n))
        assert sorted(e for ents in entries for e in ents) == want
        by_kw = {}
        for p, ents in enumerate(entries):
            for j, (_, kwi) in enumerate(ents):
                by_kw.setdefault(kwi, []).append((tp.turns[p][j], (j, p)))
        for seq in by_kw.values():
            seq.sort()
            assert [t for t, _ in seq] == list(range(len(seq)))
            assert [sp for _, sp in seq] == sorted(sp for _, sp in seq)
        # dq: one add per item, right after its last key window; each row window's adds in
        # turns 0 .. n-1 by increasing (step, program)
        by_rw = {}
        for p, ents in enumerate(entries):
            for j, (i, _) in enumerate(ents):
                last = j + 1 == len(ents) or ents[j + 1][0] != i
                assert (tp.flushes[p][j] >= 0) == last
                if last:
                    by_rw.setdefault(i % n_w, []).append((tp.flushes[p][j], (j, p), i))
        for seq in by_rw.values():
            seq.sort()
            assert [t for t, _, _ in seq] == list(range(len(seq)))
            assert [sp for _, sp, _ in seq] == sorted(sp for _, sp, _ in seq)
        assert sorted(i for seq in by_rw.values() for _, _, i in seq) == \
            [i for i, n in enumerate(windows) if n]             # every item once
        # run the programs as the kernels do, each step's key-window add then (the item's last
        # step) its dq add, each waiting for its resource's counter to reach its turn; any
        # program that can go next may: all finish (no deadlock), whatever the choices
        events = [[e for j, (i, kwi) in enumerate(ents)
                   for e in ((("kw", kwi), tp.turns[p][j]),
                             (("rw", i % n_w), tp.flushes[p][j])) if e[1] >= 0]
                  for p, ents in enumerate(entries)]
        counters, at = {}, [0] * len(events)
        while True:
            ready = [p for p, ev in enumerate(events)
                     if at[p] < len(ev) and counters.get(ev[at[p]][0], 0) == ev[at[p]][1]]
            if not ready:
                break
            p = rng.choice(ready)
            counters[events[p][at[p]][0]] = counters.get(events[p][at[p]][0], 0) + 1
            at[p] += 1
        assert at == [len(ev) for ev in events]
        table = tp.table().tolist()
        for p, ents in enumerate(entries):
            body = table[table[2 * p]:table[2 * p + 1]]
            assert body[0::TURN_ENTRY] == [i * tp.plan.kw + kwi for i, kwi in ents]
            assert body[1::TURN_ENTRY] == list(tp.turns[p])
            assert body[2::TURN_ENTRY] == list(tp.flushes[p])


def test_backward_stage_bytes_do_not_grow_with_length():
    """The persistent grid's stages (`bwd_stage_bytes`): bf16, 16 heads, 32 x 32 windows on
    132 programs: 41.25 MiB at any T (the `N_W x NS` grid held 304 programs' at 4k: 95 MiB);
    the launch's program count is the plan's, at most the SMs, at 1k and 4k alike."""
    from attnlens.kernels.mta.out_plan import persistent_splits, turn_plan
    from attnlens.kernels.mta.triton_bwd import bwd_stage_bytes

    assert bwd_stage_bytes(132, 16, 32, 32, 2) == 41.25 * 2 ** 20
    assert bwd_stage_bytes(304, 16, 32, 32, 2) == 95 * 2 ** 20
    for T in (1024, 4096):
        n_w = -(-T // 27)
        ns = persistent_splits(n_w, 27, 22, T, 0, 1, 132)
        assert turn_plan(1, n_w, 27, 22, T, 0, ns, 132).plan.programs == 132


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_backward_passes_read_the_banded_tap_table(monkeypatch, dtype):
    """The three backward passes get the logits' diagonal key taps as one `pre_toeplitz` table
    in the input dtype (fp32 stays fp32: the rounding the fp32 taps' gather did), its rows
    `TT_ROW` = the windows' AC (their C), the same tensor for all three, instead of the fp32
    taps `[H, c_q, c_k]` gathered element by element (`_toeplitz_scores`' old TT_ROW 0
    branch)."""
    from attnlens.kernels.mta import triton_bwd
    from attnlens.kernels.mta.triton_taps import pre_toeplitz

    seen = {}

    def record(kernel, grid, args, meta):
        seen[kernel.fn.__name__] = (args[kernel.arg_names.index("TT")], meta)

    spy_launches(monkeypatch, triton_bwd,
                 ("mta_bwd_delta_kernel", "mta_bwd_post_kernel", "mta_bwd_pre_kernel"), record,
                 run=False)
    H, T, D = 3, 24, 16
    q, k, v = (to_device(x.to(dtype)) for x in _qkv(T, T, H, D))
    g = torch.Generator().manual_seed(5)
    pre = to_device(torch.randn(H, 6, 11, generator=g))
    post = to_device(torch.randn(H, 2, 3, generator=g))
    mix = to_device(torch.eye(H))
    lse = torch.zeros(1, H, T, device=q.device)
    triton_bwd.mta_bwd(torch.ones_like(q), q, k, v, lse, None, pre, mix, post, mix, 5, 1,
                       D ** -0.5)
    (tt, kw), *rest = seen.values()
    assert len(rest) == 2 and all(t is tt for t, _ in rest)
    ac = kw["AC"]
    assert tt.dtype == dtype and tt.shape == (H, 6, 2 * ac + 11, ac)
    assert torch.equal(tt, pre_toeplitz(pre, ac, dtype))
    assert torch.equal(tt, pre_toeplitz(pre, ac, torch.float32).to(dtype))
