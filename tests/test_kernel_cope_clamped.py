"""Fused CoPE backward where most positions are clamped at npos - 1 (TRITON_INTERPRET=1, CPU).

The backward splits the pairs (`kernels/cope/triton_bwd_kv.py`): the band next to the diagonal,
where positions are below npos - 1, goes through the query-tile pass with the full position
machinery; the clamped pairs left of it get their dK / dV from a key-tile pass and their dQ
and position gradient from a plain sweep. With npos 3 and 16-key tiles almost every pair of a
70-token row is clamped, so a wrong split shows in dK / dV / dQ / dE. Against the float64
reference, tolerances as in test_kernel_cope_options.py.
"""

import pytest
import torch
from tiers import extended_cases

from kernel_common import (  # noqa: F401
    DEVICE,
    KERNEL_MARKS,
    assert_grads_match_reference,
    nan_empty,
)

pytestmark = KERNEL_MARKS

from attnlens.kernels.cope import cope_attention, cope_attention_reference  # noqa: E402

B, T, H, D, NPOS, RNPOS = 2, 70, 2, 16, 3, 5
KEY_VALID = torch.tensor([[False] * 5 + [True] * (T - 5), [True] * T])
POSITIONS = (KEY_VALID.long().cumsum(-1) - 1).clamp(min=0)

CASES = {
    "plain": dict(),
    "padding": dict(padded=True),
    "sep_keys": dict(gate="gk"),
    "rel_extend_padding": dict(rel=True, extend=True, padded=True),
    "relative_without_cope": dict(rel=True, cope=False),
    "all_options": dict(gate="gk", rel=True, extend=True, padded=True, scaling="paper"),
}


def _tensors(dtype, t_q):
    g = torch.Generator().manual_seed(3)
    make = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(DEVICE, dtype)  # noqa: E731
    return dict(q=make(B, t_q, H, D), k=make(B, T, H, D), v=make(B, T, H, D),
                gk=make(B, T, H, D), E=make(D, NPOS, s=0.5), R=make(D, RNPOS, s=0.5))


def _run(fn, x, case):
    kw = dict(gate_k={"gk": x["gk"]}.get(case.get("gate")))
    key_valid = None
    if case.get("padded"):
        key_valid = KEY_VALID.to(DEVICE)
    if case.get("rel"):
        kw.update(rel_emb=x["R"], rel_extend=case.get("extend", False),
                  q_positions=POSITIONS[:, T - x["q"].shape[1]:].to(DEVICE),
                  k_positions=POSITIONS.to(DEVICE))
    E = x["E"] if case.get("cope", True) else None
    return fn(x["q"], x["k"], x["v"], E, 0.5, case.get("scaling", "repo"), key_valid, **kw)


# Every option in fp32; fp16 and decoding-style queries (37 queries aligned to the last of 70
# keys) on two of them (the interpreter is slow: ~7 s a case). The extended tier runs the cases
# whose options another case holds too ("all_options" has rel, extend and padding; fp16 on
# "all_options", 37 queries on "padding").
RUNS = ([(n, torch.float32, T) for n in CASES]
        + [(n, torch.float16, T) for n in ("plain", "all_options")]
        + [(n, torch.float32, 37) for n in ("padding", "all_options")])
EXTENDED_RUNS = [("rel_extend_padding", torch.float32, T), ("plain", torch.float16, T),
                 ("all_options", torch.float32, 37)]


@pytest.mark.parametrize("name, dtype, t_q", extended_cases(RUNS, EXTENDED_RUNS))
def test_clamped_pairs_match_the_float64_reference(name, dtype, t_q):
    case = CASES[name]
    x = {n: t.requires_grad_() for n, t in _tensors(dtype, t_q).items()}
    ref_x = {n: t.detach().double().requires_grad_() for n, t in x.items()}
    out, lse = _run(cope_attention, x, case)
    ref_out, ref_lse = _run(cope_attention_reference, ref_x, case)
    tol = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(out.double(), ref_out, **tol)
    names = ["q", "k", "v"] + (["E"] if case.get("cope", True) else [])
    names += (["gk"] if case.get("gate") else []) + (["R"] if case.get("rel") else [])
    assert_grads_match_reference(out, lse, ref_out, ref_lse, x, ref_x, names, dtype, tol)


def test_most_pairs_are_clamped_at_this_size():
    """The premise of the cases above: in the reference, most allowed positions sit at
    npos - 1 (so the key-tile pass, not the band, carries most of dK / dV)."""
    x = _tensors(torch.float32, T)
    q, k = x["q"].double(), x["k"].double()
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.5
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    gates = torch.sigmoid(s).masked_fill(~allowed, 0.0)
    pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=NPOS - 1)
    assert (pos[..., allowed] == NPOS - 1).double().mean() > 0.8
