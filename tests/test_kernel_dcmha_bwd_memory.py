"""Memory of the DCMHA tensor-core backward (`kernels/dcmha/triton_bwd_tc.py`).

Issue 58 asks fused fwd+bwd to hold at most 1/10 of the torch path's peak at 4k (3,854 MiB
measured on the H200, batch 1, 16 heads, bf16: docs/benchmarks.md). The backward's memory is
its per-program buffers (scratch, ds scratch, map scratch) and its per-split partials (dq,
query-wise weight gradients), so it is set by the program table (`backward_plan`): key splits
per query tile as its causal key range needs, each split's partial only from its first query
row (split-compact). These tests check the plan and that `backward_buffers` (the formula) is
exactly what the launch holds when the gradient pass starts: the kernels are replaced by a
probe that counts the live tensors there (on the meta device, so 4k costs no memory), and the
4k total is checked against the 1/10 mark.
"""

import gc
import math
import warnings

import pytest
import torch

from attnlens.kernels.dcmha import triton_bwd_tc as bwd

MiB = 2 ** 20
TORCH_PEAK_MIB = 3854        # torch path, fwd+bwd at 4k, H200 2026-12-04 (docs/benchmarks.md)


def _channels(batch, T_q, T_k, H, C=2, key_wise=True, CQ=None, device="meta"):
    """A `grad_channels` tuple (w1q, w2q, gq, w1k, w2k, gk): only shapes matter here. CQ:
    query-wise channels when not C (a static B adds H of them to one phase)."""
    def t(*shape):
        return torch.zeros(shape, device=device)
    k_side = (t(batch, T_k, C, H), t(batch, T_k, C, H), t(batch, T_k, H)) if key_wise else (
        None, None, None)
    CQ = CQ or C
    return (t(batch, T_q, CQ, H), t(batch, T_q, CQ, H), t(batch, T_q, H), *k_side)


def _live_tensors() -> dict:
    """id -> bytes of every live tensor that owns its memory (views count with their base)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # deprecated torch aliases in gc's list
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return {id(t): t.untyped_storage().nbytes() for t in tensors if t._base is None}


def _held_at_gradient_pass(monkeypatch, q_shape, T_k, dtype, pre, post, window=None,
                           key_valid=None, block_m=None, block_n=None) -> int:
    """Bytes of the tensors `dcmha_tc_bwd` allocated and still holds when it launches the
    gradient pass (both kernels replaced by probes: nothing runs)."""
    held = []

    class Probe:
        def __init__(self, record):
            self.record = record

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if self.record:
                    now = _live_tensors()
                    held.append(sum(b for i, b in now.items() if i not in before))
            return launch

    monkeypatch.setattr(bwd, "dcmha_tc_delta_kernel", Probe(False))
    monkeypatch.setattr(bwd, "dcmha_tc_grads_kernel", Probe(True))
    B, T_q, H, D = q_shape
    meta = dict(device="meta", dtype=dtype)
    q, dout = torch.zeros(q_shape, **meta), torch.zeros(q_shape, **meta)
    k, v = torch.zeros(B, T_k, H, D, **meta), torch.zeros(B, T_k, H, D, **meta)
    lse = torch.zeros(B, H, T_q, device="meta")
    gc.collect()
    before = _live_tensors()
    bwd.dcmha_tc_bwd(dout, q, k, v, lse, None, pre, post, 0.125, window, key_valid, block_m,
                     block_n)
    assert len(held) == 1
    return held[0]


@pytest.mark.parametrize("case", [
    dict(q_shape=(2, 40, 3, 24), T_k=40, dtype=torch.bfloat16, key_wise=True, window=None),
    dict(q_shape=(1, 70, 2, 16), T_k=90, dtype=torch.float16, key_wise=False, window=20),
    dict(q_shape=(2, 33, 4, 32), T_k=33, dtype=torch.float32, key_wise=True, window=7),
    dict(q_shape=(1, 100, 2, 16), T_k=100, dtype=torch.bfloat16, key_wise=True, window=None,
         block_m=16, block_n=16),
])
def test_the_formula_is_what_the_launch_holds(monkeypatch, case):
    """`backward_buffers` lists exactly the tensors alive (beyond the inputs) when the
    gradient pass starts, at small shapes: d_head padded or not, query-wise only, a window,
    more keys than queries, fp32's blocks, batch 2, given blocks, a static B (H more
    query-wise channels) in the post phase."""
    case = dict(case)
    B, T_q, H, _ = case["q_shape"]
    pre = _channels(B, T_q, case["T_k"], H, key_wise=case.pop("key_wise"))
    post = _channels(B, T_q, case["T_k"], H, CQ=2 + H, key_wise=pre[3] is not None)
    held = _held_at_gradient_pass(monkeypatch, pre=pre, post=post, **case)
    blocks = {k: case[k] for k in ("block_m", "block_n") if k in case}
    expected = bwd.buffer_bytes(bwd.backward_buffers(case["q_shape"], case["T_k"],
                                                     case["dtype"], pre, post, case["window"],
                                                     **blocks))
    assert held == expected


def _covered(plan, T_q, T_k, window, bm, bn):
    """Check every query tile's programs split its causal key range into whole tiles."""
    off = T_k - T_q
    for m0 in range(0, T_q, bm):
        lo = 0 if window is None else max(off + m0 - window, 0) // bn * bn
        hi = min(T_k, off + m0 + bm)
        spans = sorted((s, e) for m, s, e, _, _ in plan.programs if m == m0)
        assert spans[0][0] == lo and spans[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert all(s % bn == 0 and s < e for s, e in spans)


@pytest.mark.parametrize("batch, T_q, T_k, window", [(1, 4096, 4096, None), (2, 300, 420, 50),
                                                     (3, 200, 200, None)])
def test_splits_follow_the_causal_keys_and_partials_are_compact(batch, T_q, T_k, window):
    """A query tile gets as many key splits as its key range needs at the longest program's
    length (the forward's split count of the longest tile), longest programs first; split
    s's partial starts at its first query tile, and every (program, batch element, row)
    has its own partial row. At 4k: 190 programs (was 320), 2.97 T partial rows (was 5 T)."""
    bm, bn = 64, 16
    plan = bwd.backward_plan(batch, T_q, T_k, window, bm, bn)
    _covered(plan, T_q, T_k, window, bm, bn)
    lengths = [e - s for _, s, e, _, _ in plan.programs]
    assert lengths == sorted(lengths, reverse=True)
    seen = set()
    for m0, _, _, base, stride in plan.programs:
        for b in range(batch):
            rows = {base + b * stride + t for t in range(m0, min(T_q, m0 + bm))}
            assert not rows & seen and min(rows) >= 0 and max(rows) < plan.rows
            seen |= rows
    assert plan.rows == sum(batch * (T_q - r) for r in plan.row0)
    if (batch, T_q, window) == (1, 4096, None):
        ns = bwd.split_count(64, 1, 256)
        assert ns == 5 and max(lengths) == math.ceil(256 / ns) * bn
        assert len(plan.programs) == 190 and plan.rows == 12160


def test_combined_partials_equal_the_sum_over_splits():
    """`combine_partials` adds split s's block into rows row0[s]: of the same plan, a partial
    holding each program's id in its rows sums to the ids of each row's programs."""
    batch, T_q = 2, 300
    plan = bwd.backward_plan(batch, T_q, T_q, None, 64, 16)
    flat = torch.zeros(plan.rows, dtype=torch.float64)
    want = torch.zeros(batch, T_q, dtype=torch.float64)
    for p, (m0, _, _, base, stride) in enumerate(plan.programs):
        for b in range(batch):
            rows = torch.arange(m0, min(T_q, m0 + 64))
            flat[base + b * stride + rows] += p + 1
            want[b, rows] += p + 1
    assert torch.equal(bwd.combine_partials(flat, plan, batch, T_q), want)


def _forward_saved_bytes(B, T, H, D, C, elem):
    """What the fused forward leaves alive through the backward beside the inputs: the output
    (q's dtype), lse fp32 and `function.kernel_weights` fp32 of both phases (static B [H H],
    w1, w2 `[B T C H]` and the gate `[B T H]` of each side)."""
    weights = 2 * (H * H + 4 * B * T * C * H + 2 * B * T * H)
    return B * T * H * D * elem + 4 * B * H * T + 4 * weights


@pytest.mark.parametrize("d_head", [64, 128])
def test_fwd_bwd_extra_memory_at_4k_is_under_a_tenth_of_torch(monkeypatch, d_head):
    """Official Compose (rank 2, query- and key-wise), 4k, 16 heads, bf16, batch 1: the
    backward's buffers at the gradient pass (its peak) plus the forward's saved tensors stay
    under 1/10 of torch's measured 3,854 MiB (main's layout, counted the same way: 392.8 /
    528.8 MiB at d_head 64 / 128; now 243.0 / 330.5 MiB: docs/benchmarks.md)."""
    B, T, H, C = 1, 4096, 16, 2
    pre, post = _channels(B, T, T, H, C), _channels(B, T, T, H, C)
    held = _held_at_gradient_pass(monkeypatch, (B, T, H, d_head), T, torch.bfloat16, pre, post)
    assert held == bwd.buffer_bytes(bwd.backward_buffers((B, T, H, d_head), T, torch.bfloat16,
                                                         pre, post, None))
    total = held + _forward_saved_bytes(B, T, H, d_head, C, 2)
    assert total <= TORCH_PEAK_MIB * MiB / 10, total / MiB


def test_trip_model_reads_the_program_table():
    """The roofline's trip model of both kernels (`compile_check.trips`) takes each program's
    key tiles from PROGS: at 4k the 190 programs sweep the 8,320 causal key tiles (64 query
    tiles of 4 (m + 1)), as the 320 of the old grid did."""
    from attnlens.kernels.compile_check.trips import MODELS
    plan = bwd.backward_plan(1, 4096, 4096, None, 64, 16)
    env = dict(BLOCK_M=64, BLOCK_N=16, H=16, BLOCK_D=128, ACH=16, DQ_GROUP=4,
               PROGS=torch.tensor(plan.programs, dtype=torch.int32))
    trips = MODELS["dcmha_tc_grads_kernel"](env, (190, 1))
    assert trips["n0"] * 190 == pytest.approx(8320)
    assert MODELS["dcmha_tc_delta_kernel"](dict(env, HB=16), (190, 1))["n0"] == trips["n0"]


def test_no_query_rows_plan_no_programs():
    """T_Q = 0: no programs, no partial rows, and the backward returns zero gradients of the
    inputs' shapes without launching (the plan is made before that early return)."""
    plan = bwd.backward_plan(1, 0, 5, None, 64, 16)
    assert plan.programs == () and plan.rows == 0
    pre = _channels(1, 0, 5, 2, device="cpu")
    q, k = torch.zeros(1, 0, 2, 24), torch.zeros(1, 5, 2, 24)
    dq, dk, dv, g_pre, _ = bwd.dcmha_tc_bwd(q, q, k, k, torch.zeros(1, 2, 0), None, pre, pre,
                                            0.1, None)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape and not dk.any()
    assert [tuple(g.shape) for g in g_pre] == [tuple(t.shape) for t in pre]
