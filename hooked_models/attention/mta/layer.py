"""Multi-Token Attention (Golovneva, Wang, Weston, Sukhbaatar 2025, arXiv 2504.00927): "mta".

Per layer, with `A_hat = q k^T / sqrt(d_head)` (rotary already applied, as in the official code):

    L = Mask_-inf(Mix_pre(Mask_-inf(Conv_pre(Mask_0(A_hat)))))     Eqs. 5, 7 (pre-softmax)
    A = Softmax(L)
    P = Mix_post(Mask_0(Conv_post(Mask_0(A))))                     Eqs. 6, 7 (post-softmax)
    z = P v;  out = [gate *] GroupRMSNorm(z) [* (1 - lambda_l)] W_O     paper 3.3, notes 1.4

Every step is a hook (`stages`): the pre-softmax maps carry -inf at disallowed entries like
`hook_attn_scores`; `hook_pattern` is P, so `z = pattern @ v` holds (docs/design.md contract 4)
while its
rows need not sum to one. Steps that are switched off are identities, and cost nothing.

Placement (official `mta_layers`): the key-query convolutions run on `conv_layers` (default every
layer, as the official code; `mta_layers="paper"`: every 4th layer from layer 2, paper 4.2); head
mixing, norm and gate run in every layer. Options: `options.MTAOptions`.

Per-head results: TransformerLens's `ActivationCache.compute_head_results` multiplies hook_z by W_O,
which ignores the norm and gate. So `hook_result` (`hook_head_out @ W_O`, the normed, gated heads)
fires whenever it is observed, not only under `use_attn_result=True`, and `run_with_cache` caches
it with hook_z; `stack_head_results` then reads it (`VariantAttention.project_out`).

Incremental decoding keeps the last `(c_q - 1) + (c_q' - 1)` queries in the layer cache
(`LayerCache.extra["q"]`), because the query-axis kernels need the score rows of past queries.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlens.hooked_models.attention.base import (
    AttentionContext,
    LayerCache,
    Stage,
    VariantAttention,
    is_plain_causal,
    masked_softmax,
)
from attnlens.hooked_models.attention.mta.ops import (
    causal_mta_attention,
    depth_scale,
    head_mix,
    identity_kernel,
    init_kernel,
    key_query_conv,
    rms_norm,
)
from attnlens.hooked_models.attention.mta.options import MTAOptions
from attnlens.hooked_models.attention.observe import is_observed
from attnlens.hooked_models.attention.registry import register_attention

HEADS = "batch pos head_index d_head"


GATE_PER_DIM = Stage("gate", "sigmoid gate per head, position and dimension (gate_1d=False)",
                     "post", shape=HEADS)


@register_attention("mta")
class MultiTokenAttention(VariantAttention):
    """Multi-Token Attention: key-query convolutions, head mixing, gated group norm.

    Parameters (present only when their step is on; layouts as the official code):
    `mta_kernel` / `mta_kernel_after_sm` `[head_index 1 c_q c_k]`, `pre_sm_head_kernel` /
    `head_kernel` `[n_groups c_h c_h]` (input head, output head), `subln_w` `[d_head]`,
    `W_gate` `[d_head]`, `b_gate` `[1]` (gate_1d; else `W_gate [d_head d_head]` right-multiplied,
    `b_gate [d_head]`).

    Example:
        >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
        >>> cfg = VariantConfig(d_model=32, d_head=8, n_layers=1, n_ctx=16, d_vocab=50, seed=0,
        ...                     attention="mta", attn_cfg={"query_kernel_size": 2,
        ...                     "key_kernel_size": 3, "head_kernel_size": 2})
        >>> model = HookedVariantTransformer(cfg)
        >>> [s.name for s in model.stages(0)][:6]
        ['attn_scores', 'pre_sm_conv', 'pre_sm_mix', 'softmax', 'post_sm_conv', 'pattern']
    """

    Options = MTAOptions
    stages = (
        Stage("attn_scores", "scaled q.k scores A_hat, causal mask as -inf", "pre"),
        Stage("pre_sm_conv", "after the pre-softmax key-query convolution (Eq. 5), -inf masked",
              "pre"),
        Stage("pre_sm_mix", "after pre-softmax head mixing: the logits entering the softmax",
              "pre"),
        Stage("softmax", "softmax of the mixed logits", "post", row_stochastic=True),
        Stage("post_sm_conv", "after the post-softmax key-query convolution (Eq. 6), Mask_0",
              "post"),
        Stage("pattern", "after post-softmax head mixing (Eq. 7): the weights on the values",
              "post"),
        Stage("z", "head outputs pattern @ v, before the group norm", "post", shape=HEADS),
        Stage("normed", "head outputs after the group RMSNorm and depth scaling (z without norm)",
              "post", shape=HEADS),
        Stage("gate", "sigmoid gate per head and position (only when add_gating)", "post",
              shape="batch pos head_index"),
        Stage("head_out", "per-head vectors entering W_O (normed, gated)", "post", shape=HEADS),
    )

    def __init__(self, cfg, layer: int):
        if not cfg.attn_cfg.add_gating:   # the catalogue lists only stages that fire
            self.stages = tuple(s for s in self.stages if s.name != "gate")
        elif not cfg.attn_cfg.gate_1d:
            # The gate has a d_head axis: this layer's catalogue says so (interp reads shapes).
            self.stages = tuple(GATE_PER_DIM if s.name == "gate" else s for s in self.stages)
        super().__init__(cfg, layer)
        opts: MTAOptions = self.opts
        H, dh, dtype = cfg.n_heads, cfg.d_head, cfg.dtype
        self.has_conv = layer in opts.conv_layers(cfg.n_layers)
        self.mta_kernel = self.mta_kernel_after_sm = None
        self.pre_sm_head_kernel = self.head_kernel = None
        self.q_window = 0  # past queries the query-axis kernels read (cached when decoding)
        if self.has_conv and opts.query_kernel_size is not None:
            self.mta_kernel = nn.Parameter(torch.empty(
                H, 1, opts.query_kernel_size, opts.key_kernel_size, dtype=dtype))
            self.q_window += opts.query_kernel_size - 1
        if self.has_conv and opts.after_sm_query_kernel_size is not None:
            self.mta_kernel_after_sm = nn.Parameter(torch.empty(
                H, 1, opts.after_sm_query_kernel_size, opts.after_sm_key_kernel_size,
                dtype=dtype))
            self.q_window += opts.after_sm_query_kernel_size - 1
        for attr, name in (("pre_sm_head_kernel", "pre_sm_head_kernel_size"),
                           ("head_kernel", "head_kernel_size")):
            c_h = opts.group_size(name, H)
            if c_h is not None:
                setattr(self, attr, nn.Parameter(torch.empty(H // c_h, c_h, c_h, dtype=dtype)))
        self.subln_w = nn.Parameter(torch.ones(dh, dtype=dtype)) if opts.group_norm else None
        if opts.add_gating:   # official Linear(d_head, 1) (gate_1d) or Linear(d_head, d_head)
            shape = (dh,) if opts.gate_1d else (dh, dh)
            self.W_gate = nn.Parameter(torch.empty(shape, dtype=dtype))
            self.b_gate = nn.Parameter(torch.zeros(1 if opts.gate_1d else dh, dtype=dtype))
        self.norm_scale = depth_scale(layer) if opts.layer_norm_rescale else 1.0
        self._init_mta()

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Base W_Q..W_O init, then the MTA parameters (identity kernels and mixings, unit norm
        weight, gate weight trunc-normal with std d_model^-0.5 as in the official code)."""
        super().init_weights(generator)
        self._init_mta(generator)

    def _init_mta(self, generator: torch.Generator | None = None) -> None:
        opts: MTAOptions = self.opts
        with torch.no_grad():
            if self.mta_kernel is not None:
                init_kernel(self.mta_kernel, opts.init_method, opts.pad_key, generator)
            if self.mta_kernel_after_sm is not None:
                _, _, c_q, c_k = self.mta_kernel_after_sm.shape
                self.mta_kernel_after_sm.copy_(identity_kernel(
                    self.cfg.n_heads, c_q, c_k, opts.pad_key, self.mta_kernel_after_sm.dtype))
            for kernel in (self.pre_sm_head_kernel, self.head_kernel):
                if kernel is not None:
                    kernel.copy_(torch.eye(kernel.shape[-1], dtype=kernel.dtype).expand_as(kernel))
            if self.subln_w is not None:
                self.subln_w.fill_(1.0)
            if opts.add_gating:
                std = self.cfg.d_model ** -0.5
                nn.init.trunc_normal_(self.W_gate, std=std, a=-3 * std, b=3 * std,
                                      generator=generator)
                self.b_gate.zero_()

    # -- attention maps (Eqs. 5-7) ---------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """Return z `[batch pos head_index d_head]` = pattern @ v, through every map stage.

        Hooked maps follow the catalogue: -inf at disallowed entries before the softmax, 0 after.
        A stage without a hook is not materialised in that form: entries at disallowed positions
        only need the right value where the next step reads them (the convolution zeroes them
        itself, head mixing acts entry-wise, the softmax needs -inf), so the masking passes run
        once, in place, on tensors no hook has seen.
        """
        allowed = ctx.allowed
        n_past = 0
        if ctx.cache is not None and self.q_window:
            q, allowed, n_past = self._extend_queries(q, allowed, ctx.cache)
        not_allowed = ~allowed
        neg_inf = float("-inf")
        opts: MTAOptions = self.opts

        def observed(point) -> bool:
            return is_observed(point)

        def hook(point, maps: Tensor) -> Tensor:
            return self._hook_new_rows(point, maps, n_past)

        # A_hat = q k^T / sqrt(d) (same ops as content_scores); `finite`: disallowed entries hold
        # finite values (not yet -inf), and the tensor is ours to mask in place.
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k).div_(self.cfg.attn_scale)
        finite = True
        if observed(self.hook_attn_scores):
            scores = hook(self.hook_attn_scores, scores.masked_fill_(not_allowed, neg_inf))
            finite = False
        if self.mta_kernel is not None:   # Eq. 5: Conv(Mask_0(A_hat)), Mask_-inf below
            scores = key_query_conv(scores, self.mta_kernel, allowed, opts.pad_key)
            finite = True
        if observed(self.hook_pre_sm_conv):
            if finite:
                scores = scores.masked_fill_(not_allowed, neg_inf)
            scores, finite = hook(self.hook_pre_sm_conv, scores), False
        if self.pre_sm_head_kernel is not None:   # Eq. 7 on the logits (entry-wise)
            if not finite:
                scores = scores.masked_fill(not_allowed, 0.0)
            scores, finite = head_mix(scores, self.pre_sm_head_kernel), True
        if finite:
            scores = scores.masked_fill_(not_allowed, neg_inf)   # Mask_-inf
        if observed(self.hook_pre_sm_mix):
            scores = hook(self.hook_pre_sm_mix, scores)
        maps = self._softmax(scores, allowed)
        if observed(self.hook_softmax):
            maps = hook(self.hook_softmax, maps)
        if self.mta_kernel_after_sm is not None:   # Eq. 6: Mask_0(Conv(Mask_0(A)))
            maps = key_query_conv(maps, self.mta_kernel_after_sm, allowed, opts.pad_key)
            maps = maps.masked_fill_(not_allowed, 0.0)
        if observed(self.hook_post_sm_conv):
            maps = hook(self.hook_post_sm_conv, maps)
        if self.head_kernel is not None:   # Eq. 7 on the weights; keeps zeros at zero
            maps = head_mix(maps, self.head_kernel)
        pattern = hook(self.hook_pattern, maps)[:, :, n_past:]
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v)

    def fused_attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """z from the fused MTA kernels (`attnlens.kernels.mta`) when no map is hooked; None (take
        `attend`) while decoding with a KV cache or for dtypes / masks they do not cover."""
        if ctx.cache is not None:
            return None
        from attnlens.kernels.mta.dispatch import fused_mta_attention

        params = (self.mta_kernel, self.pre_sm_head_kernel, self.mta_kernel_after_sm,
                  self.head_kernel)
        res = fused_mta_attention(q, k, v, ctx.allowed, params, self.opts.pad_key,
                                  1.0 / self.cfg.attn_scale, keep_state=self.keep_fused_state)
        if res is None:
            return None
        z, self.fused_state = res
        return z

    def fast_attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """`attend` with nothing observed on a plain causal mask (the training path), else None.

        The same equations by blocks of query rows (`causal_mta_attention`): each block stops
        at its last key, recomputes the few rows of history its query-axis convolutions read,
        and stays in cache; block sizes follow from shapes alone, so a compiled training step
        is a single graph.
        """
        if ctx.cache is not None or not is_plain_causal(ctx.allowed):
            return None
        kernels = (self.mta_kernel, self.pre_sm_head_kernel, self.mta_kernel_after_sm,
                   self.head_kernel)
        return causal_mta_attention(q, k, v, 1.0 / self.cfg.attn_scale, kernels,
                                    self.opts.pad_key)

    @staticmethod
    def _softmax(scores: Tensor, allowed: Tensor) -> Tensor:
        """Softmax over keys in >= float32 (`masked_softmax`, without its pass when every row
        has an allowed key)."""
        rows_ok = allowed.any(-1, keepdim=True)
        if is_plain_causal(allowed) or bool(rows_ok.all()):
            work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
            return torch.softmax(work, dim=-1).to(scores.dtype)
        return masked_softmax(scores, allowed)

    def _extend_queries(self, q: Tensor, allowed: Tensor, cache: LayerCache):
        """Prepend up to `q_window` cached past queries (and their mask rows); store the new
        window. Returns (queries, allowed, number of past rows prepended)."""
        past = cache.extra.get("q")
        full = q if past is None else torch.cat([past, q], dim=1)
        cache.extra["q"] = full[:, -self.q_window:]
        n_past = full.shape[1] - q.shape[1]
        if n_past == 0:
            return q, allowed, 0
        n_keys = allowed.shape[-1]
        q_idx = torch.arange(n_keys - full.shape[1], n_keys, device=q.device)
        causal = torch.arange(n_keys, device=q.device)[None, :] <= q_idx[:, None]
        # The last row of `allowed` (the newest query) permits exactly the valid keys.
        allowed = causal[None, None] & allowed[:, :, -1:, :]
        return full, allowed, n_past

    @staticmethod
    def _hook_new_rows(point, maps: Tensor, n_past: int) -> Tensor:
        """Call a map hook on the rows of the new queries only (when decoding with a window of
        past queries); without hooks attached this is free."""
        if n_past == 0:
            return point(maps)
        if not is_observed(point):
            return maps
        return torch.cat([maps[:, :, :n_past], point(maps[:, :, n_past:])], dim=2)

    # -- analysis seam ----------------------------------------------------------------------
    def head_mixing(self) -> dict[str, Tensor | None]:
        """The head-mixing kernels (Eq. 7) as `[head_index head_index]` matrices.

        Block-diagonal over the groups of c_h heads, in the convention of `head_mix`
        (`A_new[m] = sum_n M[n, m] A[n]`); "pre" mixes the logits, "post" the weights.
        """
        return {phase: None if kernel is None else torch.block_diag(*kernel.unbind(0))
                for phase, kernel in (("pre", self.pre_sm_head_kernel),
                                      ("post", self.head_kernel))}

    # -- head outputs: group norm and gate (paper 3.3) --------------------------------------
    def heads_to_output(self, z: Tensor, ctx: AttentionContext) -> Tensor:
        """Return the per-head vectors for W_O: [sigmoid gate *] RMSNorm(z) [* (1 - lambda)]."""
        out = z
        if self.subln_w is not None:
            out = rms_norm(z, self.subln_w, self.opts.norm_eps)
            if self.norm_scale != 1.0:
                out = out * self.norm_scale
        out = self.hook_normed(out)
        if self.opts.add_gating:
            # gate_1d: [b p h] one scalar per head; else [b p h d_head] one per dimension.
            gate = self.hook_gate(torch.sigmoid(out @ self.W_gate + self.b_gate))
            out = out * (gate[..., None] if self.opts.gate_1d else gate)
        return self.hook_head_out(out)
