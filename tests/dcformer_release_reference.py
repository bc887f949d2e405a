"""Pieces of the DCFormer releases' prefill forward (modeling_dcformer.py, modeling_dcpythia.py)
shared by the independent float64 references `naive_dcformer` (tests/test_dcformer_import.py)
and `naive_dcpythia` (tests/test_dcpythia_import.py), written from the raw release tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers import EXACT, decode_stepwise


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_release(x, base, rd=None):
    """The release's 'half' mode: the first `rd` dims (all by default) rotated in pairs
    (j, j + rd/2), results written interleaved; the other dims pass through."""
    T, rd = x.shape[1], x.shape[-1] if rd is None else rd
    freqs = 1.0 / base ** (torch.arange(0, rd, 2).double() / rd)
    ang = torch.arange(T).double()[:, None] * freqs[None]
    cos, sin = ang.cos().to(x.dtype)[None, :, None], ang.sin().to(x.dtype)[None, :, None]
    a, b = x[..., : rd // 2], x[..., rd // 2: rd]
    rot = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(3)
    return torch.cat([rot, x[..., rd:]], -1)


def composed_probs(logits, h, sd, a, layer, window_size):
    """The probabilities [b, n, t, s] of one DCMHA layer from its raw scores `logits` and its
    input `h` (float64 tensors `sd`, names prefixed `a`): the dynamic weights
    (DynamicWeightProjection.forward, G = 1), Compose as explicit per-(t, s) N x N matrices
    I + W_q(t) + W_k(s) before and after the softmax, the window mask `col + w >= row` on even
    layers (window_type null) and the fp16-minimum fill."""
    B, N, T = logits.shape[:3]
    hid = F.gelu(torch.einsum("btd,dck->btck", h, sd[a + "dyn_w_proj.dw1"][:, 0]))
    w = torch.einsum("btck,ckim->btcim", hid, sd[a + "dyn_w_proj.qkw"][0])
    w1, w2 = w[..., :2, :], w[..., 2:, :]
    w1 = w1 * torch.rsqrt(w1.pow(2).mean(-1, keepdim=True) + 1e-6)
    dd = torch.tanh(h @ sd[a + "dyn_w_proj.dd"][:, 0]).view(B, T, 4, N)
    # per-position N x N matrices W[b, t, c] = w1^T w2 + diag(dd)
    W = torch.einsum("btcin,btcim->btcnm", w1, w2) + torch.diag_embed(dd)
    eye = torch.eye(N, dtype=torch.float64)
    pre = eye + W[:, :, None, 0] + W[:, None, :, 1]     # [b t s n m]
    post = eye + W[:, :, None, 2] + W[:, None, :, 3]
    logits = torch.einsum("bnts,btsnm->bmts", logits, pre)
    row, col = torch.arange(T)[:, None], torch.arange(T)[None]
    mask = col <= row
    if layer % 2 == 0:  # window_type null: even layers local
        mask = mask & (col + window_size >= row)
    logits = torch.where(mask, logits, torch.finfo(torch.float16).min)
    return torch.einsum("bnts,btsnm->bmts", logits.softmax(-1), post)


def assert_matches_release(model, idx, ref, patterns):
    """A float64 model's logits and every layer's pattern equal the naive release's `ref` and
    `patterns` on tokens `idx`, also when decoded step by step after a 6-token prefill."""
    logits, cache = model.run_with_cache(idx)
    torch.testing.assert_close(logits, ref, **EXACT)
    for layer, pattern in enumerate(patterns):
        torch.testing.assert_close(cache["pattern", layer], pattern, **EXACT)
    stepwise, _ = decode_stepwise(model, idx, prefix=6)
    torch.testing.assert_close(stepwise, ref, **EXACT)
