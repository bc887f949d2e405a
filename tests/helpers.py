"""Shared test utilities: tiny models, and the property checks every variant must pass."""

from __future__ import annotations

import torch

from attnlens.hooked_models import HookedVariantTransformer, KVCache, VariantConfig

# Exactness is checked in float64: its rounding (~1e-16 relative) accumulated over the tiny
# models' few layers of sums of <= 64 terms of size <= ~10 stays far below this, while float32
# rounding in a cancellation (e.g. composed DCMHA scores) can reach 4e-5 and differ by CPU.
EXACT = dict(atol=1e-10, rtol=0)


def tiny_cfg(attention: str = "mha", **overrides) -> VariantConfig:
    """A 2-layer, 4-head, d_model 32 config (float32 unless `dtype` is given, seed 0)."""
    base = dict(d_model=32, d_head=8, n_layers=2, n_ctx=32, d_vocab=50, seed=0,
                attention=attention, act_fn="gelu")
    base.update(overrides)
    return VariantConfig(**base)


def tiny_model(attention: str = "mha", **overrides) -> HookedVariantTransformer:
    return HookedVariantTransformer(tiny_cfg(attention, **overrides)).eval()


def random_tokens(model, batch: int = 2, pos: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=g)


def _pos_dims(model, name: str, tensor: torch.Tensor, seq_len: int) -> list[int]:
    """Axes of `tensor` (a cached activation) that index positions of the input."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[0] == "blocks" and parts[2] == "attn":
        stage = parts[3].removeprefix("hook_")
        for s in model.stages(int(parts[1])):
            if s.name == stage:
                dims = s.shape.split()
                return [i for i, d in enumerate(dims) if d in ("pos", "query_pos")]
    if tensor.ndim >= 2 and tensor.shape[1] == seq_len:
        return [1]
    return []


def _require_float64(model) -> None:
    if model.cfg.dtype != torch.float64:
        raise ValueError(f"exactness checks need a float64 model, got dtype {model.cfg.dtype}")


def assert_causal(model, tokens: torch.Tensor, t: int, atol: float = EXACT["atol"]) -> int:
    """Changing token `t` changes nothing at positions < t: logits and every cached activation.

    Returns how many activations were compared (so a test can check the sweep was not empty).
    The model must be float64 (see EXACT).
    """
    _require_float64(model)
    changed = tokens.clone()
    changed[:, t] = (changed[:, t] + 1) % model.cfg.d_vocab
    with torch.no_grad():
        logits_a, cache_a = model.run_with_cache(tokens)
        logits_b, cache_b = model.run_with_cache(changed)
    torch.testing.assert_close(logits_a[:, :t], logits_b[:, :t], atol=atol, rtol=0)
    seq_len = tokens.shape[1]
    compared = 0
    for name, a in cache_a.items():
        b = cache_b[name]
        for dim in _pos_dims(model, name, a, seq_len):
            idx = [slice(None)] * a.ndim
            idx[dim] = slice(0, t)
            torch.testing.assert_close(a[tuple(idx)], b[tuple(idx)], atol=atol, rtol=0,
                                       msg=lambda m, n=name: f"{n} leaks the future: {m}")
            compared += 1
    return compared


def assert_pattern_identity(model, tokens: torch.Tensor, atol: float = EXACT["atol"]) -> None:
    """docs/design.md contract 4: z[b,q,h] == sum_k pattern[b,h,q,k] v[b,k,h] in every layer
    (float64 model, see EXACT); under grouped-query attention v is its group's value head."""
    _require_float64(model)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        pattern, v, z = cache["pattern", layer], cache["v", layer], cache["z", layer]
        # grouped-query attention: hook_v holds the key/value heads; query head h reads
        # value head h // (n_heads / n_key_value_heads)
        v = v.repeat_interleave(pattern.shape[1] // v.shape[2], dim=2)
        recon = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        torch.testing.assert_close(recon, z, atol=atol, rtol=0,
                                   msg=lambda m, layer=layer: f"layer {layer}: {m}")


def decode_stepwise(model, tokens: torch.Tensor, prefix: int):
    """Logits of `tokens` computed as one cached prefill of `prefix` tokens followed by one
    cached step per remaining token; returns `(logits [batch pos d_vocab], the KVCache)`."""
    cache = KVCache(model.cfg.n_layers)
    steps = [model(tokens[:, :prefix], past_kv_cache=cache)]
    steps += [model(tokens[:, t:t + 1], past_kv_cache=cache)
              for t in range(prefix, tokens.shape[1])]
    return torch.cat(steps, 1), cache
