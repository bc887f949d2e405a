"""The depthwise convolution of MTA's row-block training path, one opaque op for torch.compile.

`block_conv(maps, kernel, top, left, right, in_diag, out_diag)` convolves each head's map (a
block of query rows and the keys they read, `[batch head_index rows keys]`) with its own
`[c_q c_k]` kernel after zero-padding `top` rows above and `left` / `right` keys
(`ops.causal_mta_attention` calls it for Eqs. 5-6). The causal masks of those equations
are folded in: `in_diag` is Mask_0 of the input (entry (i, j) with j > i + in_diag reads as
zero, Eq. 5) and `out_diag` Mask_0 of the output (Eq. 6), each applied inside a copy the op makes
anyway (the padding), so neither costs a pass of its own, forward or backward.

It is a custom op (`attnlens::mta_block_conv`) for its layout: batch and heads are folded into
one channel axis of a plain (NCHW) depthwise convolution with the kernel repeated per batch item,
which oneDNN runs about 2x faster than the heads-only channels-last layout used before (4
channels fill a quarter of an AVX-512 vector; 64 fill four) and needs no channels-last copies.
Inductor would not pick that layout. Its backward is written out:

- the map gradient is the same forward convolution with the flipped kernel, on the gradient
  zero-padded by c_q - 1 / c_k - 1 (less the forward padding, so only input entries come out);
- the kernel gradient, `sum_{n, i, j} grad[n, h, i, j] x[n, h, i + a, j + b]` over the padded
  input x, is `weight_grad_of_padded`: x correlated with the gradient as a (large) kernel, one
  depthwise convolution over the folded channels, instead of oneDNN's depthwise weight gradient
  (5x slower than its forward at the zoo shape).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def padded(maps: Tensor, top: int, bottom: int, left: int, right: int,
           diag: int | None = None) -> Tensor:
    """`maps` zero-padded (rows above / below, keys either side) in one pass; with `diag`, the
    entries above that diagonal (`tril(diag)`, key j > row i + diag) are zeroed in the same pass.
    """
    batch, n_heads, rows, keys = maps.shape
    buf = maps.new_empty(batch, n_heads, top + rows + bottom, left + keys + right)
    if top:
        buf[:, :, :top].zero_()
    if bottom:
        buf[:, :, top + rows:].zero_()
    if left:
        buf[:, :, top:top + rows, :left].zero_()
    if right:
        buf[:, :, top:top + rows, left + keys:].zero_()
    inner = buf[:, :, top:top + rows, left:left + keys]
    if diag is None:
        inner.copy_(maps)
    else:
        torch.tril(maps, diag, out=inner)
    return buf


def depthwise_conv(x: Tensor, kernel: Tensor) -> Tensor:
    """Valid depthwise Conv2d of `x` `[batch head rows keys]` with `kernel` `[head 1 c_q c_k]`,
    batch and heads folded into the channels (kernel repeated per batch item); contiguous."""
    batch, n_heads = x.shape[:2]
    out = F.conv2d(x.reshape(1, batch * n_heads, *x.shape[2:]), kernel.repeat(batch, 1, 1, 1),
                   groups=batch * n_heads)
    return out.view(batch, n_heads, *out.shape[2:])


def depthwise_weight_grad(grad: Tensor, maps: Tensor, c_q: int, c_k: int, top: int, left: int,
                          right: int) -> Tensor:
    """The kernel gradient `[head_index 1 c_q c_k]` of `block_conv(maps, kernel, top, ...)`.

    With x the padded maps, `dW[h, a, b] = sum_{n, i, j} grad[n, h, i, j] x[n, h, i + a, j + b]`
    (`weight_grad_of_padded` on x).

    Example:
        >>> g, m = torch.randn(2, 3, 5, 9, dtype=torch.float64), torch.randn(2, 3, 6, 7,
        ...                                                              dtype=torch.float64)
        >>> ref = torch.ops.aten.convolution_backward(g, F.pad(m, (1, 2, 1, 0)),
        ...     torch.zeros(3, 1, 3, 2, dtype=torch.float64), None, [1, 1], [0, 0], [1, 1],
        ...     False, [0, 0], 3, [False, True, False])[1]
        >>> torch.allclose(depthwise_weight_grad(g, m, 3, 2, 1, 1, 2), ref)
        True
    """
    return weight_grad_of_padded(grad, padded(maps, top, 0, left, right), c_q, c_k)


def weight_grad_of_padded(grad: Tensor, x: Tensor, c_q: int, c_k: int) -> Tensor:
    """`dW[h, a, b] = sum_{n, i, j} grad[n, h, i, j] x[n, h, i + a, j + b]`, `[head 1 c_q c_k]`,
    for the padded input x `[batch head rows + c_q - 1 keys + c_k - 1]`.

    For each (n, h) that sum is the valid correlation of x with the gradient as its kernel
    (`rows x keys` taps, a `c_q x c_k` output): one depthwise convolution over the folded
    (batch, head) channels, then a sum over the batch. It does exactly the needed multiply-adds
    and oneDNN runs it 2-6x faster than chunked batched products (2.4x the work) or its own
    depthwise weight gradient.
    """
    batch, n_heads, n_rows, n_keys = grad.shape
    channels = batch * n_heads
    out = F.conv2d(x.reshape(1, channels, *x.shape[2:]),
                   grad.reshape(channels, 1, n_rows, n_keys), groups=channels)
    return out.view(batch, n_heads, c_q, c_k).sum(0).unsqueeze(1)


@torch.library.custom_op("attnlens::mta_block_conv", mutates_args=())
def block_conv(maps: Tensor, kernel: Tensor, top: int, left: int, right: int,
               in_diag: int | None = None, out_diag: int | None = None) -> Tensor:
    """Depthwise Conv2d of `maps` (Mask_0 above diagonal `in_diag` if given) padded by `top`
    zero rows and `left` / `right` zero keys; Mask_0 above `out_diag` of the output if given."""
    out = depthwise_conv(padded(maps, top, 0, left, right, in_diag), kernel)
    return out if out_diag is None else out.tril_(out_diag)


@block_conv.register_fake
def _(maps, kernel, top, left, right, in_diag=None, out_diag=None):
    batch, n_heads, n_q, n_k = maps.shape
    _, _, c_q, c_k = kernel.shape
    return maps.new_empty(batch, n_heads, n_q + top - c_q + 1, n_k + left + right - c_k + 1)


@torch.library.custom_op("attnlens::mta_block_conv_backward", mutates_args=())
def block_conv_backward(grad: Tensor, maps: Tensor, kernel: Tensor, top: int, left: int,
                        right: int, in_diag: int | None = None,
                        out_diag: int | None = None) -> tuple[Tensor, Tensor]:
    """(map gradient, kernel gradient) of `block_conv`."""
    _, _, c_q, c_k = kernel.shape
    n_rows, n_keys = grad.shape[2:]
    # d maps[i, j] = sum_{a, b} W[a, b] grad[i + top - a, j + left - b]: the correlation with
    # the flipped kernel, over the gradient (Mask_0-ed as the output was) padded so that
    # exactly the maps' entries come out; the input's mask zeroes the rest.
    g_top, g_left = c_q - 1 - top, c_k - 1 - left
    g_pad = padded(grad, g_top, c_q - 1, g_left, c_k - 1 - right, out_diag)
    grad_maps = depthwise_conv(g_pad, kernel.flip(2, 3))
    if in_diag is not None:
        grad_maps.tril_(in_diag)
    masked_grad = grad if out_diag is None else \
        g_pad[:, :, g_top:g_top + n_rows, g_left:g_left + n_keys]
    x = padded(maps, top, 0, left, right, in_diag)
    return grad_maps, weight_grad_of_padded(masked_grad, x, c_q, c_k)


@block_conv_backward.register_fake
def _(grad, maps, kernel, top, left, right, in_diag=None, out_diag=None):
    return maps.new_empty(maps.shape), kernel.new_empty(kernel.shape)


def _setup_block_conv(ctx, inputs, output) -> None:
    maps, kernel, *ctx.args = inputs
    ctx.save_for_backward(maps, kernel)


def _block_conv_grad(ctx, grad):
    maps, kernel = ctx.saved_tensors
    grad_maps, grad_kernel = block_conv_backward(grad, maps, kernel, *ctx.args)
    return (grad_maps, grad_kernel) + (None,) * len(ctx.args)


block_conv.register_autograd(_block_conv_grad, setup_context=_setup_block_conv)
