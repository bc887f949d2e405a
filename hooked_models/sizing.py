"""Will a config's model fit in this machine's memory? Checked when a model is built on the CPU.

A size typed one power of two too far (`n_ctx=2**31`) used to be accepted and then cost minutes
of swapping before an out-of-memory kill (16 GB of rotary tables; 64 GB of CoPE position
embeddings), and `n_ctx=2**63` failed deep inside torch with an opaque SymInt error.
`check_sizes` estimates the bytes of the parameters and buffers the model allocates when it is
built and raises a ValueError naming the size fields responsible when they exceed the machine's
physical memory.

The estimate is exact arithmetic on Python ints (no overflow): the embeddings, learned positions
and MLPs from their shapes, and the attention layers (whose tensors depend on the variant and its
options: rotary tables, CoPE's position embeddings, MTA kernels...) by building up to
`SAMPLED_LAYERS` of them on torch's "meta" device, which allocates nothing. That build is skipped
for the common small config whose generous rough bound stays under a quarter of the memory.

Example:
    >>> HookedVariantTransformer(VariantConfig(d_model=64, d_head=16, n_layers=2,
    ...                                        n_ctx=2**31))               # doctest: +SKIP
    ValueError: n_ctx=2147483648, d_model=64: learned positions W_pos need 512.0 GiB; the model
    would need about 512.0 GiB of parameters and buffers, more than this machine's 23.5 GiB of
    memory. Reduce n_ctx or d_model
"""

from __future__ import annotations

import copy
import os

import torch

SAMPLED_LAYERS = 4   # attention layers built on "meta"; the rest are assumed alike on average


def physical_memory() -> int | None:
    """Bytes of physical memory (os.sysconf), or None where the platform does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _shared_terms(cfg) -> list[tuple[str, int, tuple[str, ...]]]:
    """(what, bytes, size fields) of the tensors outside the attention layers."""
    item = torch.empty((), dtype=cfg.dtype).element_size()
    terms = [("the embedding W_E and unembedding W_U", 2 * cfg.d_vocab * cfg.d_model * item,
              ("d_vocab", "d_model"))]
    if cfg.positional_embedding_type == "standard":
        terms.append(("learned positions W_pos", cfg.n_ctx * cfg.d_model * item,
                      ("n_ctx", "d_model")))
    if not cfg.attn_only and cfg.d_mlp:
        mats = 3 if getattr(cfg, "gated_mlp", False) else 2
        terms.append(("the MLP weights", cfg.n_layers * mats * cfg.d_model * cfg.d_mlp * item,
                      ("d_mlp", "d_model", "n_layers")))
    return terms


def _rough_attention(cfg) -> int:
    """A generous bound of the attention layers' bytes (weights, plus tables in n_ctx)."""
    item = 8   # float64 rotary tables
    width = cfg.n_heads * cfg.d_head
    return cfg.n_layers * item * (8 * width * cfg.d_model + 4 * cfg.n_ctx * (cfg.d_model + width))


def _layer_bytes(cfg, layer: int) -> int:
    from attnlens.hooked_models.attention import get_attention_class

    with torch.device("meta"):
        attn = get_attention_class(cfg.attention)(cfg, layer)
    tensors = list(attn.parameters()) + list(attn.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def _attention_terms(cfg) -> list[tuple[str, int, tuple[str, ...]]]:
    """(what, bytes, size fields) of the attention layers, measured on the meta device; the part
    that grows with n_ctx (rotary tables, position embeddings) is its own term."""
    layers = range(min(cfg.n_layers, SAMPLED_LAYERS))
    weights = ("the attention weights", ("n_heads", "d_head", "d_model", "n_layers"))
    tables = ("per-layer tables that grow with n_ctx (rotary, position embeddings)",
              ("n_ctx", "n_layers"))
    short = copy.copy(cfg)   # no __post_init__: the same options with a one-token context
    short.n_ctx = 1
    try:
        small = sum(_layer_bytes(short, layer) for layer in layers)
    except Exception:   # an option that needs a longer context: keep the rough weights
        small = 4 * cfg.n_heads * cfg.d_head * cfg.d_model * len(layers)
    try:
        full = sum(_layer_bytes(cfg, layer) for layer in layers)
    except Exception:   # builds with n_ctx=1 but not with n_ctx: a size torch cannot describe
        full = None     # (e.g. n_ctx=2**63 overflows int64)
    scale = cfg.n_layers / len(layers)
    terms = [(weights[0], int(small * scale), weights[1])]
    if full is None:
        terms.append((tables[0] + ", too large for torch's tensor sizes", 2**64, tables[1]))
    elif full > small:
        terms.append((tables[0], int((full - small) * scale), tables[1]))
    return terms


def check_sizes(cfg, memory: int | None = None) -> None:
    """ValueError naming the size fields when the model of `cfg` cannot fit in `memory` bytes
    (default: this machine's physical memory; no check where it is unknown)."""
    memory = physical_memory() if memory is None else memory
    if memory is None:
        return
    terms = _shared_terms(cfg)
    shared = sum(t[1] for t in terms)
    if shared <= memory // 4 and shared + _rough_attention(cfg) <= memory // 4:
        return
    if shared <= memory:
        terms += _attention_terms(cfg)
    total = sum(t[1] for t in terms)
    if total <= memory:
        return
    what, size, fields = max(terms, key=lambda t: t[1])
    named = ", ".join(f"{f}={getattr(cfg, f)!r}" for f in fields)
    need = "more than 16 EiB" if total >= 2**64 else f"about {_gib(total)}"
    raise ValueError(f"{named}: {what} need {_gib(size) if size < 2**64 else 'more than 16 EiB'}"
                     f"; the model would need {need} of parameters and buffers, more than this "
                     f"machine's {_gib(memory)} of memory. Reduce {' or '.join(fields)}")
