"""Plain-torch building blocks of Multi-Token Attention (Golovneva et al. 2025, arXiv 2504.00927).

Pure functions on `[batch head_index query_pos key_pos]` maps, used by `MultiTokenAttention`
(`layer.py`). The specification of each step is `attnlens.kernels.mta.reference` (the op's one spec,
shared with the fused kernels and the tests); these are the layer's CPU-fast implementations
of it, tested equal to it (tests/test_layer_specs.py):

- `key_query_conv`: the per-head 2-D convolution over (query, key) of Eqs. 5-6, queries padded
  from the past only, keys padded on both sides (or one side, `pad_key`);
- `head_mix`: the head-mixing convolution of Eq. 7 over groups of c_h heads;
- `init_kernel`: the official initialisations of the key-query kernel;
- `depth_scale`: the DIFF-Transformer factor 1 - lambda_init(layer) of the group norm;
- `causal_mta_attention`: the whole map pipeline by causal row blocks, the training path (its
  block convolution, with a hand-written backward, is `block_conv.block_conv`).

Kernel layout (as the official `mta_kernel`): `[head_index, 1, c_q, c_k]`; entry `[h, 0, a, b]`
multiplies the input at query `i - (c_q - 1) + a` and key `j - pad_left + b`, so row `c_q - 1` is
the current query and column `pad_left` (the centre for "both") is the same key. In the paper's
indices of Eq. 4, `theta[i', j'] = kernel[c_q - 1 - i', pad_left - j']`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor

from attnlens.hooked_models.attention.mta.block_conv import block_conv
from attnlens.kernels.mta.reference import key_padding

INIT_METHODS = ("identity", "zero", "const", "uniform", "normal", "diagonal")
# Query rows per block of the banded CPU convolution (see key_query_conv); 64-256 are alike.
BLOCK_ROWS = 128


def key_query_conv(maps: Float[Tensor, "batch head_index query_pos key_pos"],
                   kernel: Float[Tensor, "head_index 1 c_q c_k"],
                   allowed: Bool[Tensor, "batch 1 query_pos key_pos"],
                   pad_key: str = "both", block_rows: int | None = None
                   ) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """Depthwise 2-D convolution of each head's map, `Conv2d_theta(Mask_0(maps))` (Eqs. 5, 6):
    the op specified by `attnlens.kernels.mta.reference.conv_qk`, computed by row blocks (equal to
    it at every allowed entry; tests/test_layer_specs.py).

    Disallowed entries (future keys, padding) are zeroed first (Mask_0), so they cannot leak into
    the output; the query axis is zero-padded by `c_q - 1` rows from the past only (causal), the
    key axis per `pad_key`. Returns a new tensor `[batch head q k]` holding the convolution at
    every allowed entry; entries at disallowed positions are meaningless (finite): the caller
    masks them (Mask_-inf before a softmax, Mask_0 after one).

    `block_rows` (default: BLOCK_ROWS on CPU, all rows elsewhere) convolves blocks of query rows,
    each only up to the last key any of its rows may read, which skips most of the causal upper
    triangle (a loop over a few blocks, not over positions); allowed entries are unchanged.
    (The plain causal training path does not come here: `causal_mta_attention` blocks the whole
    pipeline without reading the mask.)

    Example:
        >>> maps = torch.randn(1, 2, 4, 4)
        >>> ok = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
        >>> eye = torch.zeros(2, 1, 3, 5); eye[:, 0, -1, 2] = 1
        >>> torch.equal(key_query_conv(maps, eye, ok).masked_fill(~ok, 0), maps.masked_fill(~ok, 0))
        True
    """
    n_q, n_k = maps.shape[-2:]
    kernel = kernel.to(maps.dtype)
    if block_rows is None:
        block_rows = BLOCK_ROWS if maps.device.type == "cpu" else n_q
    if n_q <= block_rows:
        return _conv_rows(maps, kernel, allowed, pad_key, 0, n_q, n_k).contiguous()
    out = maps.new_empty(maps.shape[:2] + (n_q, n_k))
    for r0 in range(0, n_q, block_rows):
        r1 = min(n_q, r0 + block_rows)
        reachable = allowed[:, :, r0:r1].any(-2).any(0).any(0).nonzero()
        k_end = int(reachable.max()) + 1 if reachable.numel() else 0
        if k_end:
            out[:, :, r0:r1, :k_end] = _conv_rows(maps, kernel, allowed, pad_key, r0, r1, k_end)
        out[:, :, r0:r1, k_end:] = 0.0
    return out


def _conv_rows(maps: Tensor, kernel: Tensor, allowed: Tensor, pad_key: str, r0: int, r1: int,
               k_end: int) -> Tensor:
    """`Conv2d(Mask_0(maps))` for query rows [r0, r1) and keys [0, k_end); may be channels-last.

    One buffer holds the zero padding and Mask_0 of the rows and keys the outputs read, written
    in a single pass. On CPU it is channels-last (heads innermost), the layout oneDNN's depthwise
    convolution runs fastest on.
    """
    n_heads, _, c_q, c_k = kernel.shape
    left, right = key_padding(c_k, pad_key)
    batch, n_k = maps.shape[0], maps.shape[-1]
    src0 = max(0, r0 - (c_q - 1))            # first input row (zero rows above it)
    top = (c_q - 1) - (r0 - src0)
    cols = min(n_k, k_end + right)           # input keys [0, cols)
    shape = (batch, n_heads, (r1 - r0) + c_q - 1, k_end + left + right)
    if maps.device.type == "cpu":
        buf = maps.new_empty((shape[0], shape[2], shape[3], shape[1])).permute(0, 3, 1, 2)
    else:
        buf = maps.new_empty(shape)
    buf[:, :, :top].zero_()
    buf[:, :, top:, :left].zero_()
    buf[:, :, top:, left + cols:].zero_()
    inner = buf[:, :, top:, left:left + cols]
    src, ok = maps[:, :, src0:r1, :cols], allowed[:, :, src0:r1, :cols]
    if torch.is_grad_enabled() and (maps.requires_grad or kernel.requires_grad):
        inner.copy_(src).masked_fill_(~ok, 0.0)   # out= below has no autograd
    else:
        torch.where(ok, src, maps.new_zeros(()), out=inner)
    return F.conv2d(buf, kernel, groups=n_heads)


def head_mix(maps: Float[Tensor, "batch head_index query_pos key_pos"],
             kernel: Float[Tensor, "n_groups c_h c_h"]
             ) -> Float[Tensor, "batch head_index query_pos key_pos"]:
    """Mix heads within non-overlapping groups of c_h heads (Eq. 7): the op specified by
    `attnlens.kernels.mta.reference.mix_heads`, as one batched matmul per group
    (tests/test_layer_specs.py).

    `kernel[g, n, m]` is the weight of input head `g*c_h + n` in output head `g*c_h + m`
    (the official `head_kernel` layout): `A_new[m] = sum_n A[n] kernel[g, n, m]`. One group
    (c_h = n_heads) is a fully connected mix (the official `wpsm`/`wposm` Linear has weight
    `kernel[0].T`). Returns the mixed maps, same shape. Mixing acts entry-wise in (q, k), so it
    maps zeros at disallowed positions to zeros.
    """
    batch, n_heads, n_q, n_k = maps.shape
    n_groups, c_h, _ = kernel.shape
    grouped = maps.reshape(batch, n_groups, c_h, n_q * n_k)
    mixed = torch.matmul(kernel.transpose(-1, -2).to(maps.dtype), grouped)
    return mixed.reshape(batch, n_heads, n_q, n_k)


def identity_kernel(n_heads: int, c_q: int, c_k: int, pad_key: str = "both",
                    dtype=torch.float32) -> Tensor:
    """`[n_heads 1 c_q c_k]` kernel that copies the current query's score for the same key."""
    kernel = torch.zeros(n_heads, 1, c_q, c_k, dtype=dtype)
    kernel[:, 0, c_q - 1, key_padding(c_k, pad_key)[0]] = 1.0
    return kernel


def init_kernel(kernel: Tensor, method: str, pad_key: str = "both",
                generator: torch.Generator | None = None) -> None:
    """Initialise a `[head 1 c_q c_k]` key-query kernel in place (official `init_method`s).

    "identity" (default): the current query, same key, so the layer starts as plain attention;
    "zero"; "const" (0.3); "uniform" U(-1, 1); "normal" N(0, 0.3) truncated at 3 sd (the official
    "normal" branch crashes, see notes 1.12.3; this is its evident intent); "diagonal": ones on
    the diagonal that ends at the identity tap, i.e. query i - d paired with key j - d
    ("sequence matching"; equals the official pattern for `pad_key="both"`).
    """
    _, _, c_q, c_k = kernel.shape
    with torch.no_grad():
        if method == "identity":
            kernel.copy_(identity_kernel(kernel.shape[0], c_q, c_k, pad_key, kernel.dtype))
        elif method == "zero":
            kernel.zero_()
        elif method == "const":
            kernel.fill_(0.3)
        elif method == "uniform":
            kernel.uniform_(-1.0, 1.0, generator=generator)
        elif method == "normal":
            torch.nn.init.trunc_normal_(kernel, std=0.3, a=-0.9, b=0.9, generator=generator)
        elif method == "diagonal":
            kernel.zero_()
            centre = key_padding(c_k, pad_key)[0]
            for a in range(c_q):
                b = centre - (c_q - 1 - a)
                if 0 <= b < c_k:
                    kernel[:, 0, a, b] = 1.0
        else:
            raise ValueError(f"init_method={method!r}; choose one of {list(INIT_METHODS)}")


def depth_scale(layer: int) -> float:
    """DIFF-Transformer group-norm factor `1 - lambda_init`, lambda_init = 0.8 - 0.6 exp(-0.3 l)."""
    return 1.0 - (0.8 - 0.6 * math.exp(-0.3 * layer))


def rms_norm(x: Float[Tensor, "... d_head"],
             weight: Float[Tensor, "d_head"],  # noqa: F821 (jaxtyping axis)
             eps: float) -> Float[Tensor, "... d_head"]:
    """`x / sqrt(mean(x^2) + eps) * weight` over the last axis, computed in >= float32."""
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    normed = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


# Output rows per block of `causal_mta_attention` (see there).
FAST_BLOCK_ROWS = 32


def _causal_rows(row0: int, n_rows: int, n_k: int, device) -> Tensor:
    """`[rows keys]` causal mask of query rows [row0, row0 + n_rows) over keys [0, n_k)."""
    return torch.ones(n_rows, n_k, dtype=torch.bool, device=device).tril(row0)


def _conv_block(maps: Tensor, row0: int, kernel: Tensor, pad_key: str, mask_input: bool = False,
                mask_output: bool = False) -> tuple[Tensor, int]:
    """Conv2d of maps holding query rows [row0, row0 + R) and every key they read.

    Row 0 has zero rows above it (causal padding); a later block starts with its own c_q - 1
    rows of history. `mask_input` applies Mask_0 (causal) to the input, `mask_output` to the
    output, both inside the op's padding copies. Returns the convolved rows and the first row
    they stand for.
    """
    c_q, c_k = kernel.shape[2:]
    left, right = key_padding(c_k, pad_key)
    top = c_q - 1 if row0 == 0 else 0
    first = row0 + (c_q - 1) - top
    out = block_conv(maps, kernel.to(maps.dtype), top, left, right,
                     row0 if mask_input else None, first if mask_output else None)
    return out, first


def _block_rows(n_q: int, block_rows: int, h_pre: int, h_post: int):
    """(r0, r1, a0, s0) of each block: output rows [r0, r1), softmax rows from a0 (what the
    post convolution reads), score rows from s0 (what the pre convolution reads)."""
    for r0 in range(0, n_q, block_rows):
        a0 = max(0, r0 - h_post)
        yield r0, min(n_q, r0 + block_rows), a0, max(0, a0 - h_pre)


def _mta_block(q: Tensor, k: Tensor, v: Tensor, kernels, pad_key: str, rows) -> Tensor:
    """z `[batch head rows d_head]` of output rows [r0, r1) from q rows [s0, r1) (scaled) and
    k, v rows [0, r1), all `[batch head pos d_head]`."""
    pre_conv, pre_mix, post_conv, post_mix = kernels
    r0, r1, a0, s0 = rows
    scores = q @ k.transpose(-1, -2)
    first = s0
    if pre_conv is not None:   # Eq. 5, Mask_0 inside the op
        scores, first = _conv_block(scores, s0, pre_conv, pad_key, mask_input=True)
    if a0 > first:   # (slice only when needed: a no-op slice still costs a backward)
        scores = scores[:, :, a0 - first:]
    if pre_mix is not None:   # Eq. 7 on the logits
        scores = head_mix(scores, pre_mix)
    causal = _causal_rows(a0, r1 - a0, r1, q.device)
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    maps = torch.softmax(work.masked_fill(~causal, float("-inf")), -1).to(scores.dtype)
    first = a0
    if post_conv is not None:   # Eq. 6; the softmax left zeros, Mask_0 after inside the op
        maps, first = _conv_block(maps, a0, post_conv, pad_key, mask_output=True)
    if r0 > first:
        maps = maps[:, :, r0 - first:]
    if post_mix is not None:
        maps = head_mix(maps, post_mix)
    return maps @ v


def causal_mta_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                         kernels: tuple[Tensor | None, Tensor | None, Tensor | None,
                                        Tensor | None],
                         pad_key: str, block_rows: int | None = None) -> Tensor:
    """z `[batch query_pos head_index d_head]` of MTA's maps on the plain causal mask.

    `kernels` = (pre-softmax conv, pre-softmax head mix, post-softmax conv, post-softmax head
    mix), None for a step that is off. The training path: the hooked layer's equations (Eqs.
    5-7) by blocks of query rows, each over the keys up to its last row (the causal upper
    triangle is never computed). A block recomputes the c_q - 1 rows of history each query-axis
    convolution reads, so the blocks are independent and their maps stay in cache.
    """
    pre_conv, pre_mix, post_conv, post_mix = kernels
    n_q = q.shape[1]
    block_rows = block_rows or FAST_BLOCK_ROWS
    h_pre = 0 if pre_conv is None else pre_conv.shape[2] - 1
    h_post = 0 if post_conv is None else post_conv.shape[2] - 1
    # [batch head pos d_head], contiguous so that every block's slices feed bmm as views
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q * scale, k, v))
    out = [_mta_block(q[:, :, s0:r1], k[:, :, :r1], v[:, :, :r1], kernels, pad_key,
                      (r0, r1, a0, s0))
           for r0, r1, a0, s0 in _block_rows(n_q, block_rows, h_pre, h_post)]
    return torch.cat(out, 2).transpose(1, 2)
