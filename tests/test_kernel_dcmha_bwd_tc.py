"""The tensor-core DCMHA backward (`kernels/dcmha/triton_bwd_tc.py`) against the float64 spec.

Every gradient (q, k, v and each Compose weight of both phases) of a random linear loss on
the output and the finite lse rows equals the float64 reference's within the tolerance of
test_kernel_dcmha.py's gradient test (FP32 after scaling by the reference's largest entry:
key-side and static gradients sum up to T^2 * H terms). A spy checks which backward ran:
the tensor-core one whenever each phase has <= MAX_CHANNELS query-wise channels (a given
static B counting H more), the all-heads one otherwise.
"""

import numpy as np
import pytest
import torch
from tiers import EXTENDED

from kernel_common import (  # noqa: F401
    DEVICE,
    KERNEL_MARKS,
    assert_fp16_grads_close,
    nan_empty,
    spy,
    spy_launches,
    to_device,
)

pytestmark = KERNEL_MARKS

from test_kernel_dcmha import _qkv, _to, _weights, check_fused_gradients  # noqa: E402

from attnlens.kernels._triton import interpreting  # noqa: E402
from attnlens.kernels.dcmha import (  # noqa: E402
    ComposeWeights,
    dcmha_attention,
    dcmha_attention_reference,
)


def _backwards(monkeypatch) -> list:
    from attnlens.kernels.dcmha import function
    log: list = []
    spy(monkeypatch, function, "dcmha_tc_bwd", log, "tc")
    spy(monkeypatch, function, "dcmha_bwd", log, "heads")
    return log


def _check_grads(T_q, T_k, H, d=16, batch=1, window=None, key_valid=None, scale=0.25,
                 block_m=None, block_n=None, weights=None, **opts):
    q, k, v = _qkv(T_q, T_k, H, d, batch)
    pre, post = weights or (_weights(batch, T_q, T_k, H, seed=s, **opts) for s in (2, 3))
    check_fused_gradients(q, k, v, pre, post, scale, window, to_device(key_valid), block_m,
                          block_n)


@EXTENDED   # 21 s; the fast tier keeps the smaller gradient cases below
def test_query_tiles_key_splits_padding_window_and_padded_head_dim(monkeypatch):
    """Official Compose (rank 2, query- and key-wise, B = I), 16-row tiles: 3 query tiles,
    key ranges split over programs (delta partials summed, gradients added across programs),
    padding keys with empty rows in batch row 1, a window, d_head 24 (padded to 32)."""
    from attnlens.kernels.dcmha import triton_fwd_tc
    assert triton_fwd_tc.split_count(3, 2, 3) == 3
    log = _backwards(monkeypatch)
    key_valid = torch.rand(2, 41, generator=torch.Generator().manual_seed(3)) > 0.3
    key_valid[1, :4] = False
    _check_grads(37, 41, 4, d=24, batch=2, window=20, key_valid=key_valid, scale=0.2,
                 block_m=16, block_n=16)
    assert log == ["tc"]


@pytest.mark.parametrize("T_q, T_k, H, opts", [
    (5, 21, 2, dict(key_wise=False, static=True)),     # aligned to the end, query-wise, B
    (20, 20, 4, dict(groups=2, rank=1)),              # groups: channels zero outside a group
    (18, 18, 3, {}),                                  # 3 heads (padded to 4)
])
def test_gradients_equal_the_specs(monkeypatch, T_q, T_k, H, opts):
    log = _backwards(monkeypatch)
    _check_grads(T_q, T_k, H, window=6 if T_q == 5 else None, block_m=16, **opts)
    assert log == ["tc"]


def test_head_dim_over_several_key_side_chunks(monkeypatch):
    """d_head 80 (padded to 128): dk and dv in two KEY_DCH (64) chunks, dq in GRAD_DCH ones."""
    from attnlens.kernels.dcmha import triton_bwd_tc
    assert triton_bwd_tc.KEY_DCH < 128
    log = _backwards(monkeypatch)
    _check_grads(12, 12, 2, d=80, block_m=16)
    assert log == ["tc"]


@pytest.mark.parametrize("window", [pytest.param(None, marks=EXTENDED), 37])   # 37: both groups
def test_dq_over_groups_of_key_tiles(monkeypatch, window):
    """One key split per query tile (the backward's split count patched to 1): 6 key tiles
    of 16 per query tile, so dq = ds k runs over a full group of DQ_GROUP (4) tiles and a
    partial one (stale ds columns of the scratch taken as 0); with a window the sweep starts
    past key 0."""
    from attnlens.kernels.dcmha import triton_bwd_tc
    assert triton_bwd_tc.DQ_GROUP == 4
    monkeypatch.setattr(triton_bwd_tc, "split_count", lambda *args: 1)
    log = _backwards(monkeypatch)
    _check_grads(20, 90, 2, window=window, block_m=16, block_n=16)
    assert log == ["tc"]


def test_static_b_equal_to_identity_still_gets_its_gradient(monkeypatch):
    """A given static B equal to I: the forward takes no extra channels, the backward does
    (H more), so dB is the spec's."""
    log = _backwards(monkeypatch)
    pre, post = (_weights(1, 12, 12, 2, seed=s) for s in (2, 3))
    eye = torch.eye(2)[None]
    _check_grads(12, 12, 2, weights=(ComposeWeights(*pre.tensors()[:6], eye.clone()),
                                     ComposeWeights(*post.tensors()[:6], None)))
    assert log == ["tc"]


def test_more_channels_take_the_all_heads_backward(monkeypatch):
    """Groups of 2 at rank 2 with a static B: 4 + 4 channels > MAX_CHANNELS."""
    log = _backwards(monkeypatch)
    _check_grads(10, 10, 4, groups=2, static=True)
    assert log == ["heads"]


def _fp16_grads_close_to_spec():
    """fp16 gradients of a small windowed case (18 queries, 4 heads) against the spec."""
    q, k, v = (t.half() for t in _qkv(18, 18, 4))
    pre, post = (_to(_weights(1, 18, 18, 4, seed=s), torch.float32) for s in (2, 3))
    assert_fp16_grads_close(lambda *qkv: dcmha_attention(*qkv, pre, post, scale=0.25, window=6,
                                                         block_m=16),
                            lambda *qkv: dcmha_attention_reference(*qkv, pre, post, 0.25, 6),
                            q, k, v)


def test_fp16_gradients_close_to_spec(monkeypatch):
    log = _backwards(monkeypatch)
    _fp16_grads_close_to_spec()
    assert log == ["tc"]


def test_pipelined_head_loops_give_the_same_gradients(monkeypatch):
    """ATTNLENS_DCMHA_BWD_STAGES "3,2" (`triton_bwd_tc.bwd_head_stages`, for a GPU run to time):
    the delta pass's head loops 3 deep, the gradient pass's 2, and fp16 gradients as close to
    the spec as the plain loops' (the interpreter runs loops in order: this checks the
    plumbing and the loops' bodies; the compile check the compiled form); fp32 keeps 1, 1."""
    from attnlens.kernels.dcmha import triton_bwd_tc
    monkeypatch.setenv(triton_bwd_tc.BWD_STAGES_ENV, "3,2")
    seen = []
    spy_launches(monkeypatch, triton_bwd_tc, ("dcmha_tc_delta_kernel", "dcmha_tc_grads_kernel"),
                 lambda kernel, grid, args, meta: seen.append(meta["HEAD_STAGES"]))
    _fp16_grads_close_to_spec()
    assert seen and set(seen[0::2]) == {3} and set(seen[1::2]) == {2}
    seen.clear()
    _check_grads(18, 18, 4, block_m=16)
    assert seen == [1, 1]


@pytest.mark.parametrize("value, stages", [("", (1, 1)), ("3,2", (3, 2)), (" 1, 4 ", (1, 4))])
def test_backward_stages_from_the_environment(monkeypatch, value, stages):
    from attnlens.kernels.dcmha import triton_bwd_tc
    monkeypatch.setenv(triton_bwd_tc.BWD_STAGES_ENV, value)
    assert triton_bwd_tc.bwd_head_stages() == stages
    assert triton_bwd_tc.bwd_head_stages(fp32=True) == (1, 1)


@pytest.mark.parametrize("value", ["3", "3,2,1", "0,2", "3,x", "5,1"])
def test_bad_backward_stages_name_the_variable(monkeypatch, value):
    from attnlens.kernels.dcmha import triton_bwd_tc
    monkeypatch.setenv(triton_bwd_tc.BWD_STAGES_ENV, value)
    with pytest.raises(ValueError, match="ATTNLENS_DCMHA_BWD_STAGES"):
        triton_bwd_tc.bwd_head_stages()


def _atomic_targets(monkeypatch) -> list:
    """`(addresses, semantic)` of every atomic add the interpreter executes (masked-on lanes)."""
    from triton.runtime import interpreter
    log: list = []
    original = interpreter.InterpreterBuilder.create_atomic_rmw

    def record(self, op, ptr, val, mask, sem, scope):
        log.append((ptr.data[mask.data.astype(bool)], sem))
        return original(self, op, ptr, val, mask, sem, scope)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_atomic_rmw", record)
    return log


@pytest.mark.skipif(not interpreting(), reason="reads the interpreter's atomics")
def test_only_key_side_gradients_are_added_atomically(monkeypatch):
    """dq and the query-wise weight gradients: each program adds its own rows of its key
    split's partial with plain loads and stores (summed over splits in torch), so the only
    atomic adds left (3 query tiles, 3 key splits) land in dk, dv and the key-wise weight
    gradients; all relaxed (read only after the kernel: no fence around each add)."""
    from triton.runtime.interpreter import _ir

    from attnlens.kernels.dcmha import function
    atomics = _atomic_targets(monkeypatch)
    results: list = []
    backward = function.dcmha_tc_bwd

    def run_backward(*args, **kwargs):
        atomics.clear()                # the forward's output adds are not counted
        results.append(backward(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(function, "dcmha_tc_bwd", run_backward)
    _check_grads(37, 37, 2, block_m=16, block_n=16)
    _, dk, dv, g_pre, g_post = results[0]
    key_side = [dk, dv, *g_pre[3:], *g_post[3:]]
    spans = [(t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes()) for t in key_side]
    addresses = np.concatenate([a for a, _ in atomics])
    assert addresses.size > 0
    inside = np.zeros(addresses.shape, dtype=bool)
    for lo, hi in spans:
        inside |= (addresses >= lo) & (addresses < hi)
    assert inside.all(), f"{(~inside).sum()} of {addresses.size} atomic adds outside"
    assert {sem for _, sem in atomics} == {_ir.MEM_SEMANTIC.RELAXED}
