"""Contextual Position Encoding (CoPE; Golovneva, Wang, Weston, Sukhbaatar 2024, arXiv 2405.18719).

Per head, with the scaled content scores s_ij = q_i.k_j / sqrt(d) (causal/padding mask -inf):

    g_ij = sigmoid(s_ij)                      gates, 0 for disallowed keys        (eq. 3)
    p_ij = min(sum_{t=j}^{i} g_it, npos-1)   contextual positions                (eq. 4)
    z_i[n] = q_i.e[n]  for n = 0..npos-1      one [T, npos] table per head        (eq. 7)
    q_i.e[p_ij] = (p - floor p) z_i[ceil p] + (1 - p + floor p) z_i[floor p]      (eq. 7)
    a_ij = softmax_j((q_i.k_j + q_i.e[p_ij]) / sqrt(d))   "repo" scaling (official code default)
    a_ij = softmax_j(s_ij + q_i.e[p_ij])      "paper" scaling (appendix code, --cope-nodiv) (eq. 6)

e is `[d_head, npos_max]` per layer, shared by the heads and zero-initialised. The two scalings
give the same function family (rescale e by sqrt(d)) but their weights are not interchangeable;
`hook_pos_logits` always shows the term as added to the scores (so /sqrt(d) under "repo").
Options mirror the official flags (their names are accepted as aliases, see `CoPEOptions`):
sep-keys, val-gates, CoPE on every k-th layer, embeddings shared across layers, and CoPE+relative
positions (optionally extended past rel_npos); with `positional_embedding_type="rotary"` the
gates and logits use the rotated q, k (CoPE+RoPE).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformer_lens import FactoredMatrix
from transformer_lens.hook_points import HookPoint

from attnlens.hooked_models.attention.base import (
    AttentionContext,
    Stage,
    VariantAttention,
    is_plain_causal,
    sdpa_heads,
)
from attnlens.hooked_models.attention.cope.ops import (
    causal_cope_attention,
    context_positions,
    interpolate_position_logits,
    safe_softmax,
)
from attnlens.hooked_models.attention.cope.options import CoPEOptions
from attnlens.hooked_models.attention.observe import is_edited_forward, is_observed
from attnlens.hooked_models.attention.registry import register_attention

MAP = "batch head_index query_pos key_pos"
COPE_STAGES = (
    Stage("attn_scores", "scaled content scores q.k/sqrt(d), causal/padding mask as -inf", "pre"),
    Stage("gates", "g = sigmoid(q.k/sqrt(d)) (or q.k_gate, q.v), 0 for disallowed keys",
          "neither"),
    Stage("positions", "p_ij = sum of gates from key j to query i, clamped to npos_max-1",
          "neither"),
    Stage("pos_logits", "interpolated q_i.e[p_ij] as added to the scores (/sqrt(d) if repo)",
          "pre"),
    Stage("rel_logits", "relative-position logits q_i.r[i-j]/sqrt(d) (option relative)", "pre"),
    Stage("attn_logits", "total logits: scores + position (+ relative) logits, mask -inf",
          "pre"),
    Stage("pattern", "softmax of the total logits: the weights on the values", "post", True),
)


@register_attention("cope")
class CoPEAttention(VariantAttention):
    """CoPE attention. `stages` is the full catalogue; each layer keeps the stages it computes.

    Parameters beyond the base class: `pos_emb` e `[d_head npos_max]` (CoPE layers; with
    `shared`, on the first CoPE layer only), `W_K_gate [head_index d_model d_head]` and `b_K_gate`
    (sep_keys), `rel_emb` r `[d_head rel_npos]` (relative; with rel_shared on layer 0 only).
    Extra hooks: `hook_pos_table` q.e[n] `[batch query_pos head_index npos]` and `hook_k_gate`.

    Example:
        >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
        >>> model = HookedVariantTransformer(VariantConfig(
        ...     d_model=32, d_head=8, n_layers=2, n_ctx=16, d_vocab=50, attention="cope",
        ...     attn_cfg=dict(npos_max=8, every=2, relative=True), seed=0))
        >>> [s.name for s in model.stages(0)], len(model.stages(1))
        (['attn_scores', 'rel_logits', 'attn_logits', 'pattern'], 7)
    """

    Options = CoPEOptions
    stages = COPE_STAGES

    def __init__(self, cfg, layer: int):
        opts = cfg.attn_cfg
        self.has_cope = (layer + 1) % opts.every == 0
        skip = set() if self.has_cope else {"gates", "positions", "pos_logits"}
        if not opts.relative:
            skip.add("rel_logits")
        self.stages = tuple(s for s in COPE_STAGES if s.name not in skip)
        super().__init__(cfg, layer)
        dh, dtype = cfg.d_head, cfg.dtype
        self.npos_max = opts.npos_max or cfg.n_ctx + 1
        self.rel_npos = opts.rel_npos or cfg.n_ctx
        if self.has_cope:
            self.pos_emb = nn.Parameter(torch.zeros(dh, self.npos_max, dtype=dtype))
            self.hook_pos_table = HookPoint()
            if opts.sep_keys and not opts.val_gates:   # value gates win (official code)
                self.W_K_gate = nn.Parameter(torch.empty(cfg.n_heads, cfg.d_model, dh,
                                                         dtype=dtype))
                self.b_K_gate = nn.Parameter(torch.zeros(cfg.n_heads, dh, dtype=dtype))
                self.hook_k_gate = HookPoint()
        if opts.relative:
            self.rel_emb = nn.Parameter(torch.empty(dh, self.rel_npos, dtype=dtype))
        self._owners: dict[str, CoPEAttention] = {}

    # -- parameters shared across layers -------------------------------------------------
    def link_layers(self, layers: list[VariantAttention]) -> None:
        """Point shared embeddings at their owner layer and unregister this layer's copy."""
        opts = self.opts
        if opts.shared and self.has_cope:
            owner = next(a for a in layers if getattr(a, "has_cope", False))
            self._share("pos_emb", owner)
        if opts.relative and opts.rel_shared:
            self._share("rel_emb", layers[0])

    def _share(self, name: str, owner: CoPEAttention) -> None:
        if owner is not self:
            del self._parameters[name]
            self._owners[name] = owner  # a plain dict: the owner is not registered twice

    def _param(self, name: str) -> Tensor:
        owner = self._owners.get(name)
        return self._parameters[name] if owner is None else owner._param(name)

    @property
    def E(self) -> Tensor:
        """This layer's position embeddings e `[d_head npos_max]` (possibly a shared tensor)."""
        return self._param("pos_emb")

    @property
    def R(self) -> Tensor:
        """This layer's relative-position embeddings r `[d_head rel_npos]`."""
        return self._param("rel_emb")

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Base init; e = 0 (paper), W_K_gate ~ N(0, initializer_range), r ~ N(0, 1/d_head)."""
        super().init_weights(generator)
        with torch.no_grad():
            if "pos_emb" in self._parameters:
                self.pos_emb.zero_()
            if "W_K_gate" in self._parameters:
                nn.init.normal_(self.W_K_gate, std=self.cfg.initializer_range,
                                generator=generator)
            if "rel_emb" in self._parameters:
                nn.init.normal_(self.rel_emb, std=self.cfg.d_head ** -0.5, generator=generator)

    @property
    def QK_gate(self) -> FactoredMatrix:
        """`[head_index d_model d_model]` gate circuit W_Q W_K_gate^T (sep_keys), else QK."""
        if not hasattr(self, "W_K_gate"):
            return self.QK
        return FactoredMatrix(self.W_Q, self.W_K_gate.transpose(-2, -1))

    # -- forward -------------------------------------------------------------------------
    def content_scores(self, q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
        """Scaled q.k scores `[batch head_index q k]`, disallowed at -inf (the base class's
        values, computed in place on the fresh product to spare two [q, k] temporaries)."""
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
        return scores.div_(self.cfg.attn_scale).masked_fill_(~allowed, float("-inf"))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """Return z `[batch query_pos head_index d_head]` = pattern @ v (module docstring)."""
        allowed = ctx.allowed
        scores = self.hook_attn_scores(self.content_scores(q, k, allowed))
        logits = scores
        if self.opts.relative:
            logits = logits + self.hook_rel_logits(self.relative_logits(q, ctx))
        if self.has_cope:
            gates = self.hook_gates(self.gates(q, v, scores, ctx))                 # eq. 3
            positions = self.hook_positions(context_positions(gates, self.npos_max))  # eq. 4
            table = torch.einsum("bqhd,dn->bqhn", q, self.E)                       # eq. 7
            if self.opts.scaling == "repo":
                table = table / self.cfg.attn_scale
            table = self.hook_pos_table(table).permute(0, 2, 1, 3)
            in_range = not is_edited_forward(self.hook_positions)  # else a hook may move positions
            pos_logits = self.hook_pos_logits(
                interpolate_position_logits(table, positions, in_range))
            logits = logits + pos_logits                                           # eq. 6
        if logits is scores:
            logits = logits.clone()  # hook_attn_logits must not alias hook_attn_scores
        logits = self.hook_attn_logits(logits)
        pattern = self.hook_pattern(safe_softmax(logits, allowed))
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v)

    def fused_attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """Fused kernels when no map is hooked: `attnlens.kernels.cope` for every option (separate
        gate keys, value gates, relative logits; `attnlens.kernels.flash_attention` on a plain layer
        without CoPE); None when the call does not fit them (float64, a hooked `hook_pos_table`)."""
        opts = self.opts
        scale = 1.0 / self.cfg.attn_scale
        if self.has_cope or opts.relative:
            if self.has_cope and is_observed(self.hook_pos_table):
                return None
            from attnlens.kernels.cope.dispatch import fused_cope_attention

            gate_k = None
            if self.has_cope and opts.val_gates:      # value gates win (see CoPEOptions)
                gate_k = v
            elif self.has_cope and opts.sep_keys:
                gate_k = self.gate_keys(ctx)
            rel = dict(rel_emb=self.R, q_positions=ctx.q_positions,
                       k_positions=ctx.k_positions, rel_extend=opts.rel_extend) \
                if opts.relative else {}
            res = fused_cope_attention(q, k, v, self.E if self.has_cope else None, ctx.allowed,
                                       scale, opts.scaling, keep_state=self.keep_fused_state,
                                       gate_k=gate_k, **rel)
        else:
            from attnlens.kernels.flash_attention.dispatch import fused_causal_attention

            res = fused_causal_attention(q, k, v, ctx.allowed, scale,
                                         keep_state=self.keep_fused_state)
        if res is None:
            return None
        z, self.fused_state = res
        return z

    def fast_attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """`attend` with nothing observed on a plain causal mask (the training path), else None.

        CoPE layers take `causal_cope_attention` (row blocks that skip the causal upper
        triangle), layers without CoPE take SDPA. Relative logits, 16-bit dtypes (whose
        positions the hooked path counts in float32) and a hooked `hook_pos_table` decline.
        """
        opts = self.opts
        if ctx.cache is not None or not is_plain_causal(ctx.allowed) or opts.relative \
                or q.dtype in (torch.float16, torch.bfloat16):   # those count in float32
            return None
        scale = 1.0 / self.cfg.attn_scale
        if not self.has_cope:
            return sdpa_heads(q, k, v, scale)
        if is_observed(self.hook_pos_table):
            return None
        gate_k = None
        if opts.val_gates:      # value gates win (see CoPEOptions)
            gate_k = v
        elif opts.sep_keys:
            gate_k = self.gate_keys(ctx)
        pos_scale = scale if opts.scaling == "repo" else 1.0
        return causal_cope_attention(q, k, v, gate_k, self.E, scale, pos_scale, self.npos_max)

    def gates(self, q: Tensor, v: Tensor, scores: Tensor, ctx: AttentionContext) -> Tensor:
        """g_ij = sigmoid(gate logit) `[batch head_index q k]`, exactly 0 where not allowed."""
        if self.opts.val_gates:
            gate_logits = self.content_scores(q, v, ctx.allowed)
        elif self.opts.sep_keys:
            gate_logits = self.content_scores(q, self.gate_keys(ctx), ctx.allowed)
        else:
            gate_logits = scores  # the appendix reuses the attention logits
            if is_edited_forward(self.hook_attn_scores):  # a hook may have un-masked the scores
                return torch.where(ctx.allowed, torch.sigmoid(gate_logits), 0.0)
        return torch.sigmoid(gate_logits)  # sigma(-inf) = 0 exactly for disallowed keys

    def gate_keys(self, ctx: AttentionContext) -> Tensor:
        """sep-keys: x W_K_gate + b_K_gate (rotated like k under RoPE), past keys from cache."""
        k_gate = torch.einsum("bpm,hmd->bphd", ctx.x, self.W_K_gate) + self.b_K_gate
        k_gate = self.hook_k_gate(k_gate)
        if self.rotary is not None:
            k_gate = self.rotary(k_gate, ctx.q_positions)
        if ctx.cache is not None:
            k_gate = ctx.cache.append("k_gate", k_gate)
        return k_gate

    def relative_logits(self, q: Tensor, ctx: AttentionContext) -> Tensor:
        """q_i.r[i-j] / sqrt(d) `[batch head_index q k]`, 0 for j > i and beyond rel_npos
        (with rel_extend, distances >= rel_npos read r[rel_npos-1], the official --rel-pos-extend).

        Distances count real tokens (padding-aware positions), so padding does not shift them.
        """
        n = self.rel_npos
        table = torch.einsum("bqhd,dn->bhqn", q, self.R) / self.cfg.attn_scale
        table = torch.cat([table, table.new_zeros(table.shape[:-1] + (1,))], dim=-1)  # [n]: 0
        dist = ctx.q_positions[:, :, None] - ctx.k_positions[:, None, :]
        if self.opts.rel_extend:
            dist = dist.clamp(max=n - 1)
        index = torch.where((dist >= 0) & (dist < n), dist, n)[:, None]
        return table.gather(-1, index.expand(-1, table.shape[1], -1, -1))

