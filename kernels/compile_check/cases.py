"""The option combinations of each op whose compiled code differs, as runnable cases.

A `Case` calls an op's autograd entry point (the function its model dispatch calls) on CPU
tensors, forward then backward, inside `capture.capturing()`; the launches it records are the
kernels a GPU user of that option would compile. Only what changes the compiled code is a
separate case: constexpr flags (causal, segments, padding, CoPE's sep-keys / val-gates /
relative layers, DCMHA's key-wise terms), and the sizes that become constexprs (d_head; the
head count for MTA and DCMHA, whose programs hold every head; MTA's kernel sizes through its
halo windows; CoPE's table size through its tile choice). DCMHA windows and MTA's mixing
matrices are runtime arguments: one case each shows that they add no kernel.

Example:
    >>> [c.name for c in CASES if c.op == "cope"][:2]              # doctest: +SKIP
    ['npos128', 'npos256']
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

B, T = 1, 256            # lengths only reach the kernels as ints (16-divisible, as typical)


@dataclass(frozen=True)
class Case:
    """`op` and option `name`; `run(dtype, d_head)` calls the op forward then backward under
    an active capture (`cap`), `main` marks the option a default model takes."""

    op: str
    name: str
    run: Callable
    main: bool = False
    train: bool = True


def _qkv(dtype, d_head, heads, grad=True, t=T):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, t, heads, d_head, generator=g).to(dtype).requires_grad_(grad)
            for _ in range(3)]


def _fwd_bwd(cap, fn, leaves, train=True):
    with cap.phase("fwd"):
        out = fn()
    if not train:
        return
    outs = out if isinstance(out, tuple) else (out,)
    first = outs[0]
    with cap.phase("bwd"):
        torch.autograd.grad(first, [t for t in leaves if t.requires_grad],
                            torch.ones_like(first), allow_unused=True)


# -- flash_attention ------------------------------------------------------------------------

def _flash(causal=True, padding=False, tma=False):
    """`tma`: with `triton_fwd.TMA_ENV` set, so the forward takes the TMA kernel (sm_90)."""
    def run(cap, dtype, d_head):
        from attnlens.kernels.flash_attention.function import flash_attention
        from attnlens.kernels.flash_attention.triton_fwd import TMA_ENV
        q, k, v = _qkv(dtype, d_head, 2)
        kv = torch.ones(B, T, dtype=torch.bool) if padding else None
        saved = os.environ.get(TMA_ENV)
        os.environ[TMA_ENV] = "1" if tma else "0"
        try:
            _fwd_bwd(cap, lambda: flash_attention(q, k, v, key_valid=kv, causal=causal),
                     [q, k, v])
        finally:
            if saved is None:
                del os.environ[TMA_ENV]
            else:
                os.environ[TMA_ENV] = saved
    return run


# -- infini ---------------------------------------------------------------------------------

def _infini(train=True, padding=False):
    def run(cap, dtype, d_head):
        from attnlens.kernels.infini.function import infini_attention
        q, k, v = _qkv(dtype, d_head, 2, grad=train)
        gate = torch.full((2,), 0.5)
        valid = torch.ones(B, T, dtype=torch.bool) if padding else None
        _fwd_bwd(cap, lambda: infini_attention(q, k, q, k, v, 64, gate, valid=valid), [q, k, v],
                 train)
    return run


# -- cope -----------------------------------------------------------------------------------

def _cope(npos=128, cope=True, gate_keys=False, relative=False, rel_extend=False):
    def run(cap, dtype, d_head):
        from attnlens.kernels.cope.function import cope_attention
        q, k, v = _qkv(dtype, d_head, 2)
        E = torch.zeros(d_head, npos, dtype=dtype, requires_grad=True) if cope else None
        gk = (torch.randn(B, T, 2, d_head).to(dtype).requires_grad_()) if gate_keys else None
        R = torch.zeros(d_head, npos - 1, dtype=dtype, requires_grad=True) if relative else None
        leaves = [t for t in (q, k, v, E, gk, R) if t is not None]
        _fwd_bwd(cap, lambda: cope_attention(q, k, v, E, gate_k=gk, rel_emb=R,
                                             rel_extend=rel_extend), leaves)
    return run


# -- mta ------------------------------------------------------------------------------------

def _mta(heads, pre=(6, 11), post=(6, 11), mix=True, t=T):
    def run(cap, dtype, d_head):
        from attnlens.kernels.mta.function import mta_attention
        q, k, v = _qkv(dtype, d_head, heads, t=t)
        pk = None if pre is None else torch.randn(heads, 1, *pre, requires_grad=True)
        qk = None if post is None else torch.randn(heads, 1, *post, requires_grad=True)
        mx = torch.randn(1, heads, heads, requires_grad=True) if mix else None
        mx2 = torch.randn(1, heads, heads, requires_grad=True) if mix else None
        leaves = [t for t in (q, k, v, pk, mx, qk, mx2) if t is not None]
        _fwd_bwd(cap, lambda: mta_attention(q, k, v, pk, mx, qk, mx2), leaves)
    return run


# -- dcmha ----------------------------------------------------------------------------------

def _dcmha(heads, key_wise=True, window=None, rank=2, static=True, sm90_head_stages=None):
    """sm90_head_stages: sm_90's forward head loops pipelined so deep (`fwd_tiles.
    arch_head_stages`: the autotuning pass's other candidate there); other architectures
    compile their default."""
    def run(cap, dtype, d_head):
        from attnlens.kernels.dcmha.function import dcmha_attention
        from attnlens.kernels.dcmha.reference import ComposeWeights
        q, k, v = _qkv(dtype, d_head, heads)

        def weights():
            def w(*shape):
                return (0.1 * torch.randn(*shape)).to(dtype).requires_grad_()
            side = [w(B, T, 1, rank, heads), w(B, T, 1, rank, heads), w(B, T, 1, heads)]
            return ComposeWeights(*side, *(side if key_wise else (None,) * 3),
                                  static=w(1, heads, heads) if static else None)

        pre, post = weights(), weights()
        leaves = [q, k, v, *(t for t in pre.tensors() + post.tensors() if t is not None)]
        if sm90_head_stages is None:
            _fwd_bwd(cap, lambda: dcmha_attention(q, k, v, pre, post, window=window), leaves)
            return
        from attnlens.kernels.dcmha.fwd_tiles import arch_head_stages
        with arch_head_stages("sm_90", sm90_head_stages):
            _fwd_bwd(cap, lambda: dcmha_attention(q, k, v, pre, post, window=window), leaves)
    return run


CASES: list[Case] = [
    Case("flash_attention", "causal", _flash(), main=True),
    Case("flash_attention", "causal+padding", _flash(padding=True)),
    Case("flash_attention", "non-causal", _flash(causal=False)),
    Case("flash_attention", "causal+tma", _flash(tma=True)),
    Case("infini", "segments(train)", _infini(), main=True),
    Case("infini", "segments(inference)", _infini(train=False), train=False),
    Case("infini", "segments+padding", _infini(padding=True)),
    Case("cope", "npos128", _cope(128), main=True),
    Case("cope", "npos256", _cope(256)),
    Case("cope", "sep-keys/val-gates", _cope(128, gate_keys=True)),
    Case("cope", "cope+rel", _cope(128, relative=True)),
    Case("cope", "cope+rel(extend)", _cope(128, relative=True, rel_extend=True)),
    Case("cope", "rel-only", _cope(128, cope=False, relative=True)),
    Case("mta", "H4 6x11+mix", _mta(4), main=True),
    Case("mta", "H16 6x11+mix", _mta(16)),
    # from 2,048 rows MTA's forward takes other tiles (64 x 64 lse tiles and out windows:
    # `launch.ROWS_64_FROM`; the backward's 64-row windows are the same at every length)
    Case("mta", "H16 6x11+mix 2k rows", _mta(16, t=2048)),
    # from 4,096 rows the lse pass takes 128 x 128 tiles ("square", `launch.ROWS_128_FROM`)
    Case("mta", "H16 6x11+mix 4k rows", _mta(16, t=4096)),
    Case("mta", "H4 pre-conv only", _mta(4, post=None, mix=False)),
    Case("mta", "H4 mix only", _mta(4, pre=None, post=None)),
    Case("dcmha", "H4 q+k-wise", _dcmha(4), main=True),
    Case("dcmha", "H32 q+k-wise", _dcmha(32)),
    Case("dcmha", "H4 q-wise", _dcmha(4, key_wise=False)),
    Case("dcmha", "H4 window", _dcmha(4, window=32)),
    Case("dcmha", "H4 official", _dcmha(4, static=False), main=True),   # tensor-core forward
    Case("dcmha", "H16 official", _dcmha(16, static=False)),      # DCFormer: B = I
    Case("dcmha", "H32 official", _dcmha(32, static=False)),
    # sm_90's forward with the head loops 3 deep: the autotuning pass times it there
    Case("dcmha", "H16 official stages3", _dcmha(16, static=False, sm90_head_stages=3)),
    Case("dcmha", "H32 official stages3", _dcmha(32, static=False, sm90_head_stages=3)),
]

OPS = tuple(dict.fromkeys(c.op for c in CASES))

__all__ = ["CASES", "OPS", "Case"]
