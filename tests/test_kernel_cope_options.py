"""Fused CoPE with the official options (sep-keys, val-gates, CoPE+rel, rel_extend, a CoPE+rel
layer without CoPE) vs the float64 reference, under TRITON_INTERPRET=1 on CPU.

Outputs, lse and the gradients of q, k, v, E, the gate keys and the relative embeddings are
checked; uninitialised float allocations are NaN, so unwritten elements show.
"""

import inspect

import pytest
import torch

from kernel_common import (  # noqa: F401
    DEVICE,
    KERNEL_MARKS,
    assert_grads_match_reference,
    nan_empty,
)

pytestmark = KERNEL_MARKS

from attnlens.hooked_models.attention.cope import CoPEOptions  # noqa: E402
from attnlens.kernels.cope import (  # noqa: E402
    cope_attention,
    cope_attention_reference,
    cope_pattern_rows,
)
from attnlens.kernels.cope import reference as naive  # noqa: E402
from attnlens.kernels.cope.dispatch import fused_cope_attention  # noqa: E402
from attnlens.kernels.flash_attention.reference import allowed_mask  # noqa: E402

B, T, H, D, NPOS, RNPOS = 2, 21, 2, 16, 7, 9


def _tensors(dtype, seed=0, t_q=T, d=D):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(DEVICE, dtype)  # noqa: E731
    return dict(q=make(B, t_q, H, d), k=make(B, T, H, d), v=make(B, T, H, d),
                gk=make(B, T, H, d), E=make(d, NPOS, s=0.5), R=make(d, RNPOS, s=0.5))


# Padding-aware positions as the model makes them: batch 0 has 3 left-padding slots.
KEY_VALID = torch.tensor([[False] * 3 + [True] * (T - 3), [True] * T])
POSITIONS = (KEY_VALID.long().cumsum(-1) - 1).clamp(min=0)

CASES = {
    "sep_keys": dict(gate="gk"),
    "val_gates": dict(gate="v"),
    "relative": dict(rel=True),
    "rel_extend_padding": dict(rel=True, extend=True, padded=True),
    "relative_without_cope": dict(rel=True, cope=False),
    "all_options": dict(gate="gk", rel=True, extend=True, padded=True, scaling="paper"),
}


def _call(fn, x, case, scale=0.25):
    """Run `fn` (kernel or reference) on the tensors `x` with the options of `case`."""
    gate_k = {"gk": x["gk"], "v": x["v"]}.get(case.get("gate"))
    kw = dict(gate_k=gate_k)
    key_valid = None
    if case.get("rel"):
        kw.update(rel_emb=x["R"], rel_extend=case.get("extend", False))
    if case.get("padded"):
        key_valid = KEY_VALID.to(DEVICE)
        kw.update(q_positions=POSITIONS[:, T - x["q"].shape[1]:].to(DEVICE),
                  k_positions=POSITIONS.to(DEVICE))
    E = x["E"] if case.get("cope", True) else None
    return fn(x["q"], x["k"], x["v"], E, scale, case.get("scaling", "repo"), key_valid, **kw)


def _leaves(x, case):
    names = ["q", "k", "v"] + (["E"] if case.get("cope", True) else [])
    names += ["gk"] if case.get("gate") == "gk" else []
    names += ["R"] if case.get("rel") else []
    return names


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_options_forward_and_backward_match_the_float64_reference(name, dtype):
    _check_against_float64(CASES[name], dtype, D)


@pytest.mark.parametrize("name", ["all_options", "sep_keys", "relative_without_cope"])
def test_fp32_d_head_in_several_chunks_matches_the_float64_reference(name):
    """fp32 sums every product over or along d_head in chunks of 16 (issue 23's spills):
    d_head 40 is three chunks, the last one partly masked (BLOCK_D 64 is four)."""
    from attnlens.kernels.cope.triton_fwd import chunking
    assert chunking(torch.float32, 64) == dict(CHUNKED=True, DCH=16)
    assert chunking(torch.float16, 64) == dict(CHUNKED=False, DCH=64)
    _check_against_float64(CASES[name], torch.float32, 40)


def _check_against_float64(case, dtype, d):
    x = {n: t.requires_grad_() for n, t in _tensors(dtype, d=d).items()}
    ref_x = {n: t.detach().double().requires_grad_() for n, t in x.items()}
    out, lse = _call(cope_attention, x, case)
    ref_out, ref_lse = _call(cope_attention_reference, ref_x, case)
    assert out.dtype == dtype and not out.isnan().any() and not lse.isnan().any()
    # float32: outputs <~4 and gradients <~10 from sums over <= 21 keys and two tables:
    # reordering gives <~1e-6 (observed 3e-6 on gradients); fp16: 1e-3-relative rounding of
    # every input and operation (observed ~4e-3 on gradients of magnitude ~5).
    tol = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(out.double(), ref_out, **tol)
    live = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), live)
    torch.testing.assert_close(lse.double()[live], ref_lse[live], **tol)
    names = _leaves(x, case)
    assert_grads_match_reference(out, lse, ref_out, ref_lse, x, ref_x, names, dtype, tol)


def test_decoding_queries_with_relative_positions():
    case = dict(gate="v", rel=True, padded=True)
    x = _tensors(torch.float32, seed=2, t_q=4)          # 4 queries aligned to the last keys
    out, lse = _call(cope_attention, x, case)
    ref_out, ref_lse = _call(cope_attention_reference,
                             {n: t.double() for n, t in x.items()}, case)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["sep_keys", "rel_extend_padding", "relative_without_cope"])
def test_pattern_rows_from_lse_with_options(name):
    case = CASES[name]
    x = _tensors(torch.float32, seed=3)
    _, lse = _call(cope_attention, x, case)
    heads, queries = (torch.tensor(i, device=DEVICE) for i in ([1], [0, 7, T - 1]))
    kw = dict(gate_k=x["gk"] if case.get("gate") == "gk" else None)
    key_valid = KEY_VALID.to(DEVICE) if case.get("padded") else None
    positions = POSITIONS.to(DEVICE)
    if case.get("rel"):
        kw.update(rel_emb=x["R"], rel_extend=case.get("extend", False))
    if case.get("padded"):
        kw.update(q_positions=positions, k_positions=positions)
    E = x["E"] if case.get("cope", True) else None
    rows = cope_pattern_rows(x["q"], x["k"], E, lse, 0.25, "repo", heads, queries, key_valid,
                             **kw)
    # the pattern as the float64 reference's softmax, to compare with rows rebuilt from lse
    xd = {n: t.double() for n, t in x.items()}
    allowed = allowed_mask(T, T, key_valid, True, DEVICE)
    bias = None
    if case.get("rel"):
        pos = positions if case.get("padded") else torch.arange(T, device=DEVICE).expand(B, T)
        bias = naive.relative_logits_reference(xd["q"], xd["R"], pos, pos, scale=4.0,
                                               extend=case.get("extend", False))
    if E is None:
        logits = torch.einsum("bqhd,bkhd->bhqk", xd["q"], xd["k"]) * 0.25 + bias
        pattern = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
        pattern = torch.nan_to_num(pattern)
    else:
        _, maps = naive.cope_reference(xd["q"], xd["k"], xd["v"], xd["E"], allowed, scale=4.0,
                                       gate_k=None if kw["gate_k"] is None else xd["gk"],
                                       bias=bias)
        pattern = maps["pattern"]
    # probabilities <= 1 recomputed from a float32 lse: ~1e-7 relative error
    torch.testing.assert_close(rows.double(), pattern[:, heads][:, :, queries], atol=1e-6,
                               rtol=1e-5)


def test_defaults_agree_on_the_official_scaling():
    """Kernels, references and the layer all default to the official code's "repo" scaling."""
    official = CoPEOptions().scaling
    assert official == naive.DEFAULT_SCALING == "repo"
    for fn in (naive.cope_reference, cope_attention, cope_attention_reference,
               fused_cope_attention):
        assert inspect.signature(fn).parameters["scaling"].default == official, fn.__name__
    x = _tensors(torch.float32, seed=4)
    out, _ = cope_attention(x["q"], x["k"], x["v"], x["E"])
    explicit, _ = cope_attention(x["q"], x["k"], x["v"], x["E"], scaling="repo")
    torch.testing.assert_close(out, explicit, atol=0, rtol=0)
    z, _ = naive.cope_reference(x["q"].double(), x["k"].double(), x["v"].double(),
                                x["E"].double(), allowed_mask(T, T, device=DEVICE))
    torch.testing.assert_close(out.double(), z, atol=2e-5, rtol=1e-5)


def test_bad_option_inputs_raise_value_error():
    x = _tensors(torch.float32)
    q, k, v, E, R = x["q"], x["k"], x["v"], x["E"], x["R"]
    with pytest.raises(ValueError, match="rel_extend"):
        cope_attention(q, k, v, E, rel_extend=True)
    with pytest.raises(ValueError, match="gate_k"):
        cope_attention(q, k, v, E, gate_k=k[:, :5])
    with pytest.raises(ValueError, match="rel_emb"):
        cope_attention(q, k, v, E, rel_emb=R.T)
    with pytest.raises(ValueError, match="both"):
        cope_attention(q, k, v, E, rel_emb=R, q_positions=POSITIONS)
    with pytest.raises(ValueError, match="integer"):
        cope_attention(q, k, v, E, rel_emb=R, q_positions=POSITIONS.float(),
                       k_positions=POSITIONS.float())
