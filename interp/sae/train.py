"""Collect a hook's activations and train a `SparseAutoencoder` on them (a thin loop).

Activations are read with `run_with_cache(..., stop_at_layer=l + 1)` as SAELens's activation
store does, so only the blocks up to the hook run. Masked entries of a pre-softmax map
(`-inf` in `hook_attn_scores`) are not data: they are set to 0 for training, and splicing
(`attnlens.interp.sae.splice`) keeps them as they were.

Example:
    >>> sae, history = train_sae(model, "blocks.0.hook_resid_post", tokens,   # doctest: +SKIP
    ...                          d_sae=64, steps=300)
    >>> history[["step", "mse", "l0", "explained_variance"]].tail(1)          # doctest: +SKIP
"""

from __future__ import annotations

import re

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp.sae.sae import SAEConfig, SparseAutoencoder


def stop_layer_for(model, hook_name: str) -> int | None:
    """The `stop_at_layer` that still runs `hook_name` (None: the whole model)."""
    if hook_name not in model.hook_dict:
        raise ValueError(f"unknown hook name {hook_name!r}; see model.hook_dict")
    match = re.match(r"blocks\.(\d+)\.", hook_name)
    if match:
        return int(match.group(1)) + 1
    return 0 if hook_name in ("hook_embed", "hook_pos_embed") else None


@torch.no_grad()
def collect_activations(model, hook_name: str, tokens: Tensor, reshape: str = "last",
                        batch_size: int = 32) -> Tensor:
    """`[n, d_in]` vectors of `hook_name` over `tokens` `[batch pos]` (finite entries only
    count; `-inf` becomes 0)."""
    stop = stop_layer_for(model, hook_name)
    rows = []
    for start in range(0, tokens.shape[0], batch_size):
        _, cache = model.run_with_cache(tokens[start:start + batch_size], names_filter=hook_name,
                                        stop_at_layer=stop, return_cache_object=False)
        act = cache[hook_name]
        act = act.flatten(-2) if reshape == "heads" else act
        rows.append(act.reshape(-1, act.shape[-1]))
    x = torch.cat(rows)
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def train_sae(model, hook_name: str, tokens: Tensor, d_sae: int, steps: int = 300,
              lr: float = 3e-3, l1_coefficient: float = 1e-3, batch_size: int = 256,
              reshape: str = "last", seed: int = 0, log_every: int = 10,
              dtype: torch.dtype = torch.float32) -> tuple[SparseAutoencoder, pd.DataFrame]:
    """Train an SAE on `hook_name`'s activations over `tokens`.

    Loss: mean squared reconstruction error + `l1_coefficient` x sum_i |f_i| ||W_dec[i]||
    (SAELens's standard L1), Adam, decoder rows renormalised each step, `b_dec` started at the
    activations' mean. The SAE is float32 by default whatever the model's dtype (splicing casts
    between the two and keeps the error term in the model's dtype). Returns `(sae, history)`,
    the history a tidy table with columns step, mse, l1, l0 (mean active features) and
    explained_variance (1 - mse / variance).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    x = collect_activations(model, hook_name, tokens, reshape=reshape)
    x = x.to(dtype)
    cfg = SAEConfig(d_in=x.shape[-1], d_sae=d_sae, hook_name=hook_name, reshape=reshape,
                    dtype=dtype)
    sae = SparseAutoencoder(cfg=cfg, seed=seed).to(x.device)
    with torch.no_grad():
        sae.b_dec.copy_(x.mean(0))
    variance = (x - x.mean(0)).pow(2).sum(-1).mean().clamp(min=1e-12)
    optimizer = torch.optim.Adam(sae.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    log = []
    for step in range(steps + 1):
        batch = x[torch.randint(0, x.shape[0], (min(batch_size, x.shape[0]),), generator=gen)]
        f = sae.encode(batch)
        recon = sae.decode(f)
        mse = (recon - batch).pow(2).sum(-1).mean()
        l1 = (f * sae.W_dec.norm(dim=-1)).sum(-1).mean()
        if step % log_every == 0 or step == steps:
            log.append(dict(step=step, mse=mse.item(), l1=l1.item(),
                            l0=(f > 0).float().sum(-1).mean().item(),
                            explained_variance=1 - mse.item() / variance.item()))
        if step == steps:
            break
        optimizer.zero_grad()
        (mse + l1_coefficient * l1).backward()
        optimizer.step()
        sae.normalize_decoder()
    return sae.eval(), pd.DataFrame(log)


__all__ = ["collect_activations", "stop_layer_for", "train_sae"]
