"""Each op has one specification, `kernels/<op>/reference.py`; the layers' own implementations
of a step equal it in float64 (docs/design.md, "one spec per op").

CoPE's and Infini's hooked maps are checked against `attnlens.kernels.cope.reference` /
`attnlens.kernels.infini.reference` stage by stage in tests/test_cope.py and tests/test_infini.py;
DCMHA's hooked Compose *is* `compose_reference`. Here: MTA's CPU-fast convolution and head mixing,
and DCMHA's decoding form of Compose (cached key matrices), against the spec.
"""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models.attention.dcmha.layer import PHASES, _mixing, base_matrix
from attnlens.hooked_models.attention.mta import ops as mta_ops
from attnlens.kernels.dcmha.reference import compose_reference
from attnlens.kernels.mta import reference as mta_spec

from helpers import tiny_model

EXACT = dict(rtol=1e-12, atol=1e-12)


def _allowed(batch: int, n_q: int, n_k: int, padded: bool) -> torch.Tensor:
    valid = torch.ones(batch, n_k, dtype=torch.bool)
    if padded:
        valid[0, :2] = False            # left padding in the first sequence
    return mta_spec.causal_allowed(n_q, n_k, valid, "cpu")


@pytest.mark.parametrize("pad_key", mta_spec.PAD_KEYS)
@pytest.mark.parametrize("block_rows", [3, 64])     # several row blocks, and one
@pytest.mark.parametrize("padded", [False, True])
def test_mta_key_query_conv_is_the_spec(pad_key, block_rows, padded):
    g = torch.Generator().manual_seed(0)
    maps = torch.randn(2, 3, 11, 11, generator=g, dtype=torch.float64)
    kernel = torch.randn(3, 1, 3, 5, generator=g, dtype=torch.float64)
    allowed = _allowed(2, 11, 11, padded)
    fast = mta_ops.key_query_conv(maps, kernel, allowed, pad_key, block_rows=block_rows)
    spec = mta_spec.conv_qk(maps, kernel, allowed, pad_key)
    # entries at disallowed positions are the caller's to mask (both docstrings say so)
    torch.testing.assert_close(fast.masked_fill(~allowed, 0), spec.masked_fill(~allowed, 0),
                               **EXACT)


@pytest.mark.parametrize("groups", [1, 2])
def test_mta_head_mix_is_the_spec(groups):
    g = torch.Generator().manual_seed(1)
    maps = torch.randn(2, 4, 6, 6, generator=g, dtype=torch.float64)
    kernel = torch.randn(groups, 4 // groups, 4 // groups, generator=g, dtype=torch.float64)
    torch.testing.assert_close(mta_ops.head_mix(maps, kernel), mta_spec.mix_heads(maps, kernel),
                               **EXACT)


def test_mta_key_padding_is_the_specs():
    assert mta_ops.key_padding is mta_spec.key_padding
    with pytest.raises(ValueError, match="pad_key"):
        mta_spec.key_padding(3, "middle")


@pytest.mark.parametrize("options", [{}, {"static_proj": True}, {"groups": 2}])
def test_dcmha_decoding_compose_is_the_spec(options):
    """Compose with the cached merged key matrices (incremental decoding) equals the spec
    applied with every position's dynamic weights, for the last query row."""
    model = tiny_model("dcmha", attn_cfg=options, dtype="float64")
    attn = model.blocks[0].attn
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    x = torch.randn(2, 7, model.cfg.d_model, generator=g, dtype=torch.float64)
    dyn = attn.generate_weights(x)
    A = torch.randn(2, model.cfg.n_heads, 7, 7, generator=g, dtype=torch.float64)
    for phase in ("pre", "post"):
        spec = compose_reference(A, attn.compose_weights(phase, dyn))
        kw = torch.stack([_mixing(attn, dyn, p, "k") + base_matrix(attn, p) for p in PHASES],
                         dim=2)
        last = {name: w[:, -1:] for name, w in dyn.items()}
        decoded = attn.compose(A[:, :, -1:], phase, last, kw)
        torch.testing.assert_close(decoded, spec[:, :, -1:], **EXACT)
        assert torch.equal(attn.compose(A, phase, dyn), spec)
