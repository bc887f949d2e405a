"""The attention extension point: `VariantAttention`, the stage catalogue and the layer cache.

A variant subclasses `VariantAttention`, declares its ordered map `stages` (docs/design.md contract
3)
and an `Options` dataclass, and implements `attend(q, k, v, ctx) -> z`. The base class owns the
TransformerLens-layout weights (`W_Q/W_K/W_V [head_index d_model d_head]`, `W_O [head_index d_head
d_model]`, biases), the q/k/v/rot/z/result hooks, one HookPoint per declared stage, masking,
rotary positions, the KV cache and grouped-query attention (`cfg.n_key_value_heads`: k and v are
computed, hooked, rotated and cached with kv_heads heads and expanded to n_heads once, before
`attend`), so every variant gets them identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import FactoredMatrix
from transformer_lens.hook_points import HookPoint

from attnlens.hooked_models.attention.observe import is_observed
from attnlens.hooked_models.attention.options import check_option_names
from attnlens.hooked_models.attention.pattern_heads import (
    PatternHookPoint,
    fused_with_head_maps,
    head_selected_only,
)
from attnlens.hooked_models.rotary import Rotary

MAP_SHAPE = "batch head_index query_pos key_pos"


@dataclass(frozen=True)
class Stage:
    """One entry of a variant's stage catalogue.

    Attributes:
        name: hook suffix; the hook is `blocks.{l}.attn.hook_{name}`.
        description: one line for docs, plots and the dashboard.
        softmax: whether the stage is before ("pre") or after ("post") the softmax, or
            "neither": a side quantity that is not a logit nor weights (CoPE's gates, positions).
        row_stochastic: rows are probability distributions (False for e.g. MTA's post-softmax
            convolution or DCMHA's post-composition maps).
        shape: the dimension names of the hooked tensor.
    """

    name: str
    description: str
    softmax: Literal["pre", "post", "neither"]
    row_stochastic: bool = False
    shape: str = MAP_SHAPE

    @property
    def hook_name(self) -> str:
        return f"hook_{self.name}"

    @property
    def is_map(self) -> bool:
        return self.shape == MAP_SHAPE


@dataclass
class NoOptions:
    """Options of a variant that has none."""


@dataclass
class LayerCache:
    """Per-layer state for incremental decoding.

    `k`, `v` hold the keys (after rotary) and values of every past token; `extra` holds whatever
    else a variant needs (MTA keeps past queries, DCMHA its key-wise composition weights).
    """

    k: Tensor | None = None
    v: Tensor | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def append(self, name: str, new: Tensor, dim: int = 1) -> Tensor:
        """Concatenate `new` to the stored tensor `name` along `dim`; returns the whole."""
        old = getattr(self, name) if name in ("k", "v") else self.extra.get(name)
        full = new if old is None else torch.cat([old, new], dim=dim)
        if name in ("k", "v"):
            setattr(self, name, full)
        else:
            self.extra[name] = full
        return full


@dataclass
class AttentionContext:
    """What `attend` needs besides q, k, v.

    Attributes:
        x: the attention input (after ln1) for the new positions `[batch pos d_model]`.
        allowed: causal & padding mask, True where query i may read key j, `[batch 1 q k]`.
        q_positions / k_positions: integer positions (padding-aware) `[batch q]` / `[batch k]`.
        cache: the layer's cache when decoding incrementally, else None.
    """

    x: Float[Tensor, "batch pos d_model"]
    allowed: Bool[Tensor, "batch 1 query_pos key_pos"]
    q_positions: Int[Tensor, "batch query_pos"]
    k_positions: Int[Tensor, "batch key_pos"]
    cache: LayerCache | None = None


def mark_plain_causal(allowed: Tensor) -> Tensor:
    """Tag a mask built as the plain square causal mask (no padding, no cache) so that layers
    may use `F.scaled_dot_product_attention(is_causal=True)` without inspecting (and syncing on)
    its values. Returns `allowed` itself."""
    allowed._attnlens_plain_causal = True
    return allowed


def is_plain_causal(allowed: Tensor) -> bool:
    """Whether `allowed` was built by `mark_plain_causal` (see there)."""
    return getattr(allowed, "_attnlens_plain_causal", False)


def masked_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the last axis in >= float32; rows with no allowed key give zeros, not NaN."""
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    pattern = torch.softmax(work, dim=-1).to(scores.dtype)
    if is_plain_causal(allowed):  # every row has its own key: nothing to zero, no sync
        return pattern
    has_key = allowed.any(-1, keepdim=True)
    if bool(has_key.all()):  # the usual case: no fully masked row, nothing to zero
        return pattern
    return pattern.masked_fill(~has_key, 0.0)


class _KVWeight:
    """`W_K`, `W_V`, `b_K`, `b_V` of a `VariantAttention`: per query head, `[head_index ...]`.

    Without GQA this returns the parameter itself. Under GQA it returns the stored `_W_K`...
    `[kv_heads ...]` repeat_interleaved over the heads of each group, like TransformerLens's
    GroupedQueryAttention.W_K: a fresh tensor, so edit (or read the gradient of) `_W_K` instead.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, module: "VariantAttention | None", owner: type | None = None):
        if module is None:
            return self
        params = module._parameters
        if self.name in params:
            return params[self.name]
        grouped = params.get("_" + self.name)
        if grouped is None:  # not registered yet (nn.Module's own hasattr checks)
            raise AttributeError(self.name)
        return grouped.repeat_interleave(module.kv_group, dim=0)


class VariantAttention(nn.Module):
    """Base class of every attention variant (registered with `register_attention`).

    Subclasses set `stages` (ordered, first to last) and `Options`, and implement `attend`.
    `hook_attn_scores` (raw scaled content scores, causal mask as -inf) and `hook_pattern` (the
    effective pattern, `z = pattern @ v`, docs/design.md contract 4) belong to every catalogue.
    """

    variant: ClassVar[str] = "?"
    Options: ClassVar[type] = NoOptions
    stages: ClassVar[tuple[Stage, ...]] = (
        Stage("attn_scores", "scaled q.k scores, causal mask as -inf", "pre"),
        Stage("pattern", "softmax of the scores: the weights on the values", "post", True),
    )

    W_K, W_V, b_K, b_V = _KVWeight(), _KVWeight(), _KVWeight(), _KVWeight()
    # Whether `forward` accepts the model's `past_kv_cache` (a LayerCache); `generate` re-runs
    # the whole prefix each step for a variant that sets this False.
    supports_kv_cache: ClassVar[bool] = True

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        H, D, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        dtype = cfg.dtype
        # Grouped-query attention (TransformerLens's GroupedQueryAttention): query head h reads
        # key/value head h // kv_group. Under GQA the K/V parameters are `_W_K, _W_V, _b_K,
        # _b_V` `[kv_heads ...]` and `W_K`... are per-query-head views (`_KVWeight`); without
        # it they are plain parameters named `W_K`..., so existing checkpoints load unchanged.
        self.kv_heads = cfg.n_key_value_heads or H
        self.kv_group = H // self.kv_heads
        kv, Hk = ("_" if self.kv_heads != H else ""), self.kv_heads
        self.W_Q = nn.Parameter(torch.empty(H, D, dh, dtype=dtype))
        self.register_parameter(kv + "W_K", nn.Parameter(torch.empty(Hk, D, dh, dtype=dtype)))
        self.register_parameter(kv + "W_V", nn.Parameter(torch.empty(Hk, D, dh, dtype=dtype)))
        self.W_O = nn.Parameter(torch.empty(H, dh, D, dtype=dtype))
        self.b_Q = nn.Parameter(torch.zeros(H, dh, dtype=dtype))
        self.register_parameter(kv + "b_K", nn.Parameter(torch.zeros(Hk, dh, dtype=dtype)))
        self.register_parameter(kv + "b_V", nn.Parameter(torch.zeros(Hk, dh, dtype=dtype)))
        self.b_O = nn.Parameter(torch.zeros(D, dtype=dtype))
        for name in ("q", "k", "v", "z", "result"):
            setattr(self, f"hook_{name}", HookPoint())
        self.rotary = None
        if cfg.positional_embedding_type == "rotary" and self.uses_rotary():
            self.rotary = Rotary(dh, cfg.rotary_dim, cfg.n_ctx, cfg.rotary_base,
                                 cfg.rotary_adjacent_pairs, scaling=cfg.rope_scaling)
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names) or not {"attn_scores", "pattern"} <= set(names):
            raise TypeError(f"{type(self).__name__}.stages must be unique and include "
                            f"'attn_scores' and 'pattern', got {names}")
        for stage in self.stages:   # hook_pattern can carry chosen heads only (pattern_heads)
            setattr(self, stage.hook_name,
                    PatternHookPoint() if stage.name == "pattern" else HookPoint())
        self.opts = cfg.attn_cfg

    # -- variant interface ---------------------------------------------------------------
    @classmethod
    def make_options(cls, value: Any, cfg) -> Any:
        """Turn None / a dict / an Options instance into a validated `cls.Options`."""
        if value is None:
            value = cls.Options()
        elif isinstance(value, dict):
            # Official option names first (aliases), then unknown names are explained.
            from_official = getattr(cls.Options, "from_official", None)
            if from_official is not None:
                value = from_official(value)
            check_option_names(cls.Options, value, cls.variant)
            value = cls.Options(**value)
        elif not isinstance(value, cls.Options):
            raise ValueError(f"attn_cfg for {cls.variant!r} must be a dict or "
                             f"{cls.Options.__name__}, got {type(value).__name__}")
        check = getattr(value, "validate", None)
        if check is not None:
            check(cfg)
        return value

    def uses_rotary(self) -> bool:
        """Whether this layer applies the model's rotary embedding (override per variant)."""
        return True

    def attend(self, q: Float[Tensor, "batch query_pos head_index d_head"],
               k: Float[Tensor, "batch key_pos head_index d_head"],
               v: Float[Tensor, "batch key_pos head_index d_head"],
               ctx: AttentionContext) -> Float[Tensor, "batch query_pos head_index d_head"]:
        """Return z. Must pass its maps through the stage hooks, ending with hook_pattern."""
        raise NotImplementedError

    def link_layers(self, layers: list["VariantAttention"]) -> None:
        """Called once by the model, before `init_weights`, with every layer's attention in order.

        A variant that shares a parameter across layers overrides this and keeps the tensor
        registered on one layer only, referenced (not registered) by the others, so state_dict
        and safetensors hold it once. Default: nothing is shared.
        """

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 style: N(0, initializer_range) weights, zero biases. Variants extend this."""
        std = self.cfg.initializer_range
        for w in (self.W_Q, self.kv_param("W_K"), self.kv_param("W_V"), self.W_O):
            nn.init.normal_(w, std=std, generator=generator)

    # -- shared machinery ----------------------------------------------------------------
    def forward(self, x: Float[Tensor, "batch pos d_model"], allowed: Tensor,
                q_positions: Tensor, k_positions: Tensor,
                cache: LayerCache | None = None) -> Float[Tensor, "batch pos d_model"]:
        q, k, v = self.project_qkv(x)
        q, k = self.prepare_qk(q, k)
        if self.rotary is not None:
            # On a plain causal mask the positions are 0..pos-1: their max is known.
            top = q.shape[1] - 1 if cache is None and is_plain_causal(allowed) else None
            q = self.hook_rot_q(self.rotary(q, q_positions, top))
            k = self.hook_rot_k(self.rotary(k, q_positions, top))
        if cache is not None:  # the cache holds the kv_heads keys/values, as HF's does
            k, v = cache.append("k", k), cache.append("v", v)
        k, v = self.expand_kv(k), self.expand_kv(v)
        ctx = AttentionContext(x, allowed, q_positions, k_positions, cache)
        z = self.maybe_fused(q, k, v, ctx)
        if z is None and not self.maps_observed():
            z = self.fast_attend(q, k, v, ctx)
        if z is None:
            z = self.attend(q, k, v, ctx)
        z = self.hook_z(z)
        return self.project_out(self.heads_to_output(z, ctx))

    def project_qkv(self, x: Float[Tensor, "batch pos d_model"]) -> tuple[Tensor, Tensor, Tensor]:
        """Hooked q `[batch pos head_index d_head]` and k, v `[batch pos kv_heads d_head]`.

        Under GQA, hook_k / hook_v carry the un-repeated kv_heads tensors, as TransformerLens
        does (`expand_kv` makes the per-query-head copies after hooks, rotary and the cache).
        """
        q = self.hook_q(torch.einsum("bpm,hmd->bphd", x, self.W_Q) + self.b_Q)
        k = torch.einsum("bpm,hmd->bphd", x, self.kv_param("W_K")) + self.kv_param("b_K")
        v = torch.einsum("bpm,hmd->bphd", x, self.kv_param("W_V")) + self.kv_param("b_V")
        return q, self.hook_k(k), self.hook_v(v)

    def kv_param(self, name: str) -> nn.Parameter:
        """The stored "W_K"/"W_V"/"b_K"/"b_V" parameter: `[kv_heads ...]` under GQA."""
        params = self._parameters
        return params[name] if name in params else params["_" + name]

    def expand_kv(self, t: Float[Tensor, "batch pos kv_heads d_head"]
                  ) -> Float[Tensor, "batch pos head_index d_head"]:
        """One copy of each key/value head per query head of its group (no-op without GQA)."""
        return t if self.kv_group == 1 else t.repeat_interleave(self.kv_group, dim=2)

    # -- pay for what you look at (docs/design.md contract 5) ------------------------------------
    # Set by `attnlens.kernels.dispatch.patterns_for`: while True, `fused_attend` keeps what it
    # needs to recompute pattern rows (e.g. q, k and the row log-sum-exp) in `fused_state`.
    keep_fused_state: bool = False
    fused_state: Any = None

    def fused_attend(self, q: Float[Tensor, "batch query_pos head_index d_head"],
                     k: Float[Tensor, "batch key_pos head_index d_head"],
                     v: Float[Tensor, "batch key_pos head_index d_head"],
                     ctx: AttentionContext) -> Tensor | None:
        """z from a fused kernel that never materialises a `[query, key]` map, or None.

        Override in a variant that has kernels (see `kernels/`); return None for calls the
        kernel does not cover (dtype, mask shape, options), which then take `attend`. Only
        called when `cfg.backend` allows it and no hook is attached to a map stage. When
        `self.keep_fused_state` is True, store in `self.fused_state` an object whose
        `pattern(heads, queries)` recomputes exact pattern rows (`attnlens.kernels.dispatch`).
        """
        return None

    def fast_attend(self, q: Float[Tensor, "batch query_pos head_index d_head"],
                    k: Float[Tensor, "batch key_pos head_index d_head"],
                    v: Float[Tensor, "batch key_pos head_index d_head"],
                    ctx: AttentionContext) -> Tensor | None:
        """z by the fastest exact torch formulation while no map stage is observed, or None.

        The CPU training path (docs/design.md contract 5): called when the fused kernels did not run
        and no hook (of any client) is on a map stage of this layer, so the maps need not be
        materialised in hookable form. It must equal `attend` to float tolerance, gradients
        included (tests/test_fast_path.py). Default None: take `attend`.
        """
        return None

    def has_fused_path(self) -> bool:
        """Whether this variant overrides `fused_attend`."""
        return type(self).fused_attend is not VariantAttention.fused_attend

    def maybe_fused(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """The dispatch: `fused_attend(...)` when the backend allows it and no map is observed.

        backend "torch": never; "auto": on CUDA tensors; "triton": on CUDA, or on CPU under the
        Triton interpreter (TRITON_INTERPRET=1), else ValueError. A hook on any map stage of this
        layer (including `run_with_cache` asking for one) switches it to `attend`, except a
        forward hook on a head-selective `hook_pattern` (`pattern_heads=`) alone: the kernel
        still runs and the hook gets the asked heads' maps recomputed from the saved log-sum-exp
        (`pattern_heads.fused_with_head_maps`).
        """
        if self.cfg.backend == "torch" or not self.has_fused_path():
            return None
        from attnlens.kernels.dispatch import fused_backend_enabled

        if not fused_backend_enabled(self.cfg.backend, q):
            return None
        if not self.maps_observed():
            return self.fused_attend(q, k, v, ctx)
        if head_selected_only(self):
            return fused_with_head_maps(self, q, k, v, ctx)
        return None

    def prepare_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Transform q, k after hook_q/hook_k and before rotary (identity; DCMHA's QK-norm)."""
        return q, k

    def heads_to_output(self, z: Tensor, ctx: AttentionContext) -> Tensor:
        """Per-head transform between hook_z and W_O (identity; MTA's group norm overrides)."""
        return z

    def transforms_heads(self) -> bool:
        """Whether `heads_to_output` is overridden, i.e. the head result is not hook_z @ W_O."""
        return type(self).heads_to_output is not VariantAttention.heads_to_output

    def project_out(self, z: Float[Tensor, "batch pos head_index d_head"]) -> Tensor:
        # TransformerLens rebuilds missing head results as hook_z @ W_O, which is wrong when a
        # per-head transform sits between them (MTA's norm/gate). Such a layer therefore fires
        # hook_result whenever it is observed (e.g. by run_with_cache), as if use_attn_result.
        observed = is_observed(self.hook_result)
        if self.cfg.use_attn_result or (observed and self.transforms_heads()):
            result = self.hook_result(torch.einsum("bphd,hdm->bphm", z, self.W_O))
            return result.sum(-2) + self.b_O
        return torch.einsum("bphd,hdm->bpm", z, self.W_O) + self.b_O

    def content_scores(self, q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
        """Scaled q.k scores `[batch head_index q k]` with disallowed entries at -inf."""
        # In place on the fresh einsum output: one [b h q k] allocation instead of three.
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k).div_(self.cfg.attn_scale)
        return scores.masked_fill_(~allowed, float("-inf"))

    def head_mixing(self) -> dict[str, Tensor | None]:
        """Static cross-head mixing, for composed circuits (DCMHA Theorems 2.1 / 2.2).

        Returns {"pre": M or None, "post": M or None}, each M `[head_index head_index]` with
        `mixed[:, g] = sum_h M[h, g] * unmixed[:, h]` applied to the scores ("pre", before the
        softmax) or to the probabilities ("post"). None means no static mixing at that stage.
        Variants with head mixing (MTA, DCMHA's static part) override this.
        """
        return {"pre": None, "post": None}

    def head_mixing_at(self, source: Any, t: int, s: int) -> dict[str, Tensor | None]:
        """Cross-head mixing at one (query t, key s) pair of a given input (dynamic composition).

        `source` is the attention input x `[batch pos d_model]` or an `ActivationCache` / dict
        holding this layer's hooks for that input. Returns {"pre": M or None, "post": M or None},
        each M `[batch head_index head_index]` (or `[1 ...]` when it does not depend on the input)
        in the convention of `head_mixing`. Default: the static `head_mixing()` at every pair.
        Variants whose mixing depends on the input (DCMHA) override this.
        """
        return {k: None if m is None else m[None] for k, m in self.head_mixing().items()}

    def map_hooks(self) -> list[HookPoint]:
        """The HookPoints of this layer's map stages (for the pay-for-what-you-look-at dispatch)."""
        return [getattr(self, s.hook_name) for s in self.stages if s.is_map]

    def maps_observed(self) -> bool:
        """True while any hook is attached to one of this layer's map stages."""
        return any(is_observed(hp) for hp in self.map_hooks())

    @property
    def QK(self) -> FactoredMatrix:
        """`[head_index d_model d_model]` content QK circuit, W_Q W_K^T (right-multiplied; under
        GQA with the per-query-head W_K, so head h pairs with its group's key head)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """`[head_index d_model d_model]` OV circuit, W_V W_O (right-multiplied)."""
        return FactoredMatrix(self.W_V, self.W_O)


def sdpa_heads(q: Float[Tensor, "batch query_pos head_index d_head"],
               k: Float[Tensor, "batch key_pos head_index d_head"],
               v: Float[Tensor, "batch key_pos head_index d_head"],
               scale: float) -> Float[Tensor, "batch query_pos head_index d_head"]:
    """Causal softmax attention by `F.scaled_dot_product_attention` in our head layout."""
    z = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True, scale=scale)
    return z.transpose(1, 2)


def mha_fast_attend(self: VariantAttention, q: Tensor, k: Tensor, v: Tensor,
                    ctx: AttentionContext) -> Tensor | None:
    """`mha_attend` without materialising the maps: SDPA on a plain causal mask, else None."""
    if ctx.cache is not None or not is_plain_causal(ctx.allowed):
        return None
    return sdpa_heads(q, k, v, 1.0 / self.cfg.attn_scale)


def mha_attend(self: VariantAttention, q: Tensor, k: Tensor, v: Tensor,
               ctx: AttentionContext) -> Tensor:
    """Standard causal softmax attention through hook_attn_scores and hook_pattern."""
    scores = self.hook_attn_scores(self.content_scores(q, k, ctx.allowed))
    pattern = self.hook_pattern(masked_softmax(scores, ctx.allowed))
    return torch.einsum("bhqk,bkhd->bqhd", pattern, v)

