"""How each bundled model is built and trained: the induction task over a letter alphabet.

Every variant gets the same 2-layer attention-only shape so the dashboard can compare them.
Variant options that need placement on a 2-layer model (e.g. MTA's key-query convolution) are
set here explicitly.
"""

from __future__ import annotations

import string

import torch

from hooked_models.config import VariantConfig
from interp.tasks.induction import repeated_tokens, second_half_loss_mask

ALPHABET = string.ascii_lowercase
MIN_HALF, MAX_HALF = 6, 20
N_CTX = 2 * MAX_HALF + 1

# Per-variant architecture choices. CoPE brings its own positions, so no other scheme is added.
VARIANTS: dict[str, dict] = {
    "mha": dict(positional_embedding_type="rotary"),
    "mta": dict(positional_embedding_type="rotary"),
    "cope": dict(positional_embedding_type="none"),
    "dcmha": dict(positional_embedding_type="rotary"),
    # Segments of 16 tokens: the second copy is mostly in later segments, so the memory matters.
    "infini": dict(positional_embedding_type="rotary",
                   attn_cfg={"segment_len": 16, "update": "delta"}),
}


def config(variant: str, attn_cfg: dict | None = None, seed: int = 0) -> VariantConfig:
    extra = dict(VARIANTS[variant])
    attn_cfg = {**extra.pop("attn_cfg", {}), **(attn_cfg or {})} or None
    return VariantConfig(
        d_model=64, d_head=16, n_layers=2, n_ctx=N_CTX, d_vocab=len(ALPHABET) + 1,
        attn_only=True, attention=variant, attn_cfg=attn_cfg, tokenizer_alphabet=ALPHABET,
        seed=seed, metadata={"task": "induction"}, **extra)


def sample(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of `[BOS] r r` with one random repeat length, and its second-copy loss mask."""
    n = int(torch.randint(MIN_HALF, MAX_HALF + 1, (1,), generator=gen))
    return (repeated_tokens(batch, n, len(ALPHABET) + 1, generator=gen),
            second_half_loss_mask(batch, n))


def default_text() -> str:
    """A repeated run of random-looking letters: the bundled models' task, inside their n_ctx."""
    half = "kqzwxrnbmfhdpsjvl"
    return half + half
