"""How each bundled toy model is built: a 2-layer attention-only shape over a letter alphabet.

Every variant gets the same shape so the dashboard can compare them. The task that trains them
(batches, metrics) is in `attnlens.interp.tasks.zoo_induction`, one floor up.
Variant options that need placement on a 2-layer model (e.g. MTA's key-query convolution) are
set here explicitly.
"""

from __future__ import annotations

import string

from attnlens.hooked_models.config import VariantConfig

ALPHABET = string.ascii_lowercase
MIN_HALF, MAX_HALF = 6, 20
N_CTX = 2 * MAX_HALF + 1

# Per-variant architecture choices. CoPE brings its own positions, so no other scheme is added.
VARIANTS: dict[str, dict] = {
    "mha": dict(positional_embedding_type="rotary"),
    "mta": dict(positional_embedding_type="rotary"),
    # The shipped induction-cope was trained with the appendix scaling (before "repo" became
    # the default); pinned so the train command rebuilds the same architecture.
    "cope": dict(positional_embedding_type="none", attn_cfg={"scaling": "paper"}),
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


def default_text() -> str:
    """A repeated run of random-looking letters: the bundled models' task, inside their n_ctx."""
    half = "kqzwxrnbmfhdpsjvl"
    return half + half
