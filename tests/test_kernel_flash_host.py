"""The host side of a fused flash call: what it launches and allocates, and the benchmark's
timing method (calls back to back, or each synchronised)."""

import pytest
import torch

from attnlens.benchmarks import kernels as bench
from attnlens.kernels import _triton

from kernel_common import spy

pytestmark = pytest.mark.skipif(not _triton.available(), reason="needs triton")


def test_host_overhead_tool_times_the_host_side_without_launching():
    from attnlens.kernels.flash_attention import function, host_overhead

    q = torch.zeros(1, 32, 2, 16, requires_grad=True)
    with host_overhead.launches_mocked() as fake:
        out, _ = function.flash_attention(q, q, q)
        out.sum().backward()
    assert fake.calls == 4            # forward; backward: preprocess, dK/dV, dQ
    assert host_overhead.host_ms(T=32, H=2, D=16, backward=True, reps=3) > 0


@pytest.mark.parametrize("use_lse", [False, True])
def test_an_unused_lse_reaches_the_backward_as_none(monkeypatch, use_lse):
    """No zero tensor is made (and filled on the GPU) for the gradient of an unused lse."""
    from attnlens.kernels.flash_attention import function, host_overhead

    seen = spy(monkeypatch, function, "attn_bwd", [], lambda *a, **kw: a[9])
    q = torch.zeros(1, 32, 2, 16, requires_grad=True)
    with host_overhead.launches_mocked():
        out, lse = function.flash_attention(q, q, q)
        (out.sum() + (lse.sum() if use_lse else 0)).backward()
    assert (seen[0] is not None) == use_lse


def test_no_key_mask_placeholder_is_made_once_per_device():
    from attnlens.kernels.flash_attention.triton_fwd import no_key_mask

    a, b = no_key_mask(torch.device("cpu")), no_key_mask(torch.device("cpu"))
    assert a is b and a.dtype == torch.int8 and a.shape == (1, 1)


class _FakeEvent:
    log: list = []

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = len(_FakeEvent.log)
        _FakeEvent.log.append("event")

    def elapsed_time(self, end):
        return float(end.t - self.t)


@pytest.mark.parametrize("isolated", [False, True])
def test_cuda_timing_syncs_once_back_to_back_or_after_every_call(monkeypatch, isolated):
    _FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: _FakeEvent.log.append("sync"))
    calls = []
    ms, host = bench._time_cuda(lambda: calls.append(1), 4, isolated)
    syncs = _FakeEvent.log.count("sync")
    assert syncs == (1 + 4 + 1 if isolated else 2)
    assert len(calls) == (4 if isolated else 5)     # back to back: one call queued ahead
    assert ms == 1.0 and host >= 0             # one event before and one after each call
