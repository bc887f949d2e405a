"""The depthwise convolution of MTA's row-block training path, one opaque op for torch.compile.

`block_conv(maps, kernel, top, left, right)` convolves each head's map (a block of query rows
and the keys they read, `[batch head_index rows keys]`) with its own `[c_q c_k]` kernel after
zero-padding `top` rows above and `left` / `right` keys (`_mta_ops.causal_mta_attention` calls
it for Eqs. 5-6). It is a custom op (`attnlens::mta_block_conv`) because oneDNN's depthwise
convolution is about 3x faster on channels-last (heads innermost) input, a layout inductor does
not keep for it on CPU. Its backward is written out:

- the map gradient is the same forward convolution with the flipped kernel, on the gradient
  zero-padded by c_q - 1 / c_k - 1 (less the forward padding, so only input entries come out);
- the kernel gradient, `sum_{n, i, j} grad[n, h, i, j] x[n, h, i + a, j + b]` over the padded
  input x, is `depthwise_weight_grad`: a few batched matrix products over chunks of keys instead
  of oneDNN's depthwise weight gradient (5x slower than its forward at the zoo shape).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Keys per chunk of `depthwise_weight_grad`: each product computes chunk x (chunk + c_k - 1)
# lags to keep c_k of them; 8-32 were alike at the zoo shape (c_k = 11), 16 marginally best.
WEIGHT_GRAD_CHUNK = 16


def pad_channels_last(maps: Tensor, top: int, bottom: int, left: int, right: int) -> Tensor:
    """`maps` zero-padded (rows above / below, keys either side), in channels-last memory."""
    return F.pad(maps.permute(0, 2, 3, 1),
                 (0, 0, left, right, top, bottom)).permute(0, 3, 1, 2)


def depthwise_weight_grad(grad: Tensor, maps: Tensor, c_q: int, c_k: int, top: int, left: int,
                          right: int, chunk: int | None = None) -> Tensor:
    """The kernel gradient `[head_index 1 c_q c_k]` of `block_conv(maps, kernel, top, ...)`.

    With x the padded maps, `dW[h, a, b] = sum_{n, i, j} grad[n, h, i, j] x[n, h, i + a, j + b]`.
    Output keys are cut into chunks of `chunk`; for each chunk the rows (n, i) of the gradient
    and the rows (n, i + a) of x's chunk plus its c_k - 1 following keys give one matrix product
    `[chunk rows] @ [rows chunk + c_k - 1]`, whose diagonals `j' - j = b` hold the lag-b sums.
    Laid out with `c_q - 1` zero rows after each batch item in the gradient, the row shift by a
    is an offset into the flattened (n, row) axis, so each a is one batched product over (head,
    chunk). Returns the gradient in `maps.dtype`.

    Example:
        >>> g, m = torch.randn(2, 3, 5, 9, dtype=torch.float64), torch.randn(2, 3, 6, 7,
        ...                                                              dtype=torch.float64)
        >>> ref = torch.ops.aten.convolution_backward(g, F.pad(m, (1, 2, 1, 0)),
        ...     torch.zeros(3, 1, 3, 2, dtype=torch.float64), None, [1, 1], [0, 0], [1, 1],
        ...     False, [0, 0], 3, [False, True, False])[1]
        >>> torch.allclose(depthwise_weight_grad(g, m, 3, 2, 1, 1, 2), ref)
        True
    """
    chunk = chunk or WEIGHT_GRAD_CHUNK
    batch, n_heads, n_rows, n_keys = grad.shape
    x_rows = n_rows + c_q - 1                # = top + maps rows
    n_chunks = -(-n_keys // chunk)
    width = chunk + c_k - 1
    # Gradient as [head chunk batch x_rows chunk_keys], zero below each item's rows and past
    # the last key.
    g = grad.new_empty(n_heads, n_chunks, batch, x_rows, chunk)
    g[:, :, :, n_rows:].zero_()
    keys_pad = n_chunks * chunk - n_keys
    src = F.pad(grad, (0, keys_pad)) if keys_pad else grad
    g[:, :, :, :n_rows].copy_(src.unflatten(3, (n_chunks, chunk)).permute(1, 3, 0, 2, 4))
    # Padded input as overlapping key windows [head chunk batch x_rows width].
    x = F.pad(maps, (left, right + keys_pad, top, 0))
    x = x.unfold(3, width, chunk).permute(1, 3, 0, 2, 4).contiguous()
    flat = batch * x_rows
    g = g.view(n_heads * n_chunks, flat, chunk)
    x = x.view(n_heads * n_chunks, flat, width)
    # lags[a, (h, c), w, j] = sum_t x[t + a, w] g[t, j] (x on the left: MKL runs this
    # orientation about 1.4x faster); g rows t pair with x rows t + a of the same batch item.
    lags = grad.new_empty(c_q, n_heads * n_chunks, width, chunk)
    for a in range(c_q):
        torch.bmm(x[:, a:].transpose(1, 2), g[:, :flat - a], out=lags[a])
    lags = lags.view(c_q, n_heads, n_chunks, width, chunk)
    s = lags.stride()
    diagonals = lags.as_strided((c_q, n_heads, n_chunks, chunk, c_k),
                                (s[0], s[1], s[2], chunk + 1, chunk))   # [.., j, b]: w = j + b
    return diagonals.sum((2, 3)).transpose(0, 1).unsqueeze(1).contiguous()


@torch.library.custom_op("attnlens::mta_block_conv", mutates_args=())
def block_conv(maps: Tensor, kernel: Tensor, top: int, left: int, right: int) -> Tensor:
    """Depthwise Conv2d of `maps` padded by `top` zero rows and `left` / `right` zero keys."""
    padded = pad_channels_last(maps, top, 0, left, right)
    return F.conv2d(padded, kernel, groups=kernel.shape[0]).contiguous()


@block_conv.register_fake
def _(maps, kernel, top, left, right):
    batch, n_heads, n_q, n_k = maps.shape
    _, _, c_q, c_k = kernel.shape
    return maps.new_empty(batch, n_heads, n_q + top - c_q + 1, n_k + left + right - c_k + 1)


@torch.library.custom_op("attnlens::mta_block_conv_backward", mutates_args=())
def block_conv_backward(grad: Tensor, maps: Tensor, kernel: Tensor, top: int, left: int,
                        right: int) -> tuple[Tensor, Tensor]:
    """(map gradient, kernel gradient) of `block_conv`."""
    _, _, c_q, c_k = kernel.shape
    # d maps[i, j] = sum_{a, b} W[a, b] grad[i + top - a, j + left - b]: the correlation with
    # the flipped kernel, over the gradient padded so that exactly the maps' entries come out.
    padded = pad_channels_last(grad, c_q - 1 - top, c_q - 1, c_k - 1 - left, c_k - 1 - right)
    grad_maps = F.conv2d(padded, kernel.flip(2, 3), groups=kernel.shape[0]).contiguous()
    return grad_maps, depthwise_weight_grad(grad, maps, c_q, c_k, top, left, right)


@block_conv_backward.register_fake
def _(grad, maps, kernel, top, left, right):
    return maps.new_empty(maps.shape), kernel.new_empty(kernel.shape)


def _setup_block_conv(ctx, inputs, output) -> None:
    maps, kernel, *ctx.args = inputs
    ctx.save_for_backward(maps, kernel)


def _block_conv_grad(ctx, grad):
    maps, kernel = ctx.saved_tensors
    grad_maps, grad_kernel = block_conv_backward(grad, maps, kernel, *ctx.args)
    return (grad_maps, grad_kernel) + (None,) * len(ctx.args)


block_conv.register_autograd(_block_conv_grad, setup_context=_setup_block_conv)
