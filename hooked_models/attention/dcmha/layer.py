"""Dynamically Composable Multi-Head Attention (Xiao et al., ICML 2024, arXiv 2405.08553): "dcmha".

DCMHA mixes heads per (query t, key s) with a matrix generated from the input. For a score or
weight tensor `A [batch head t s]` the Compose operation is (variants.md section 3.2)

    A'[:, t, s] = (B + W_q(t) + W_k(s))^T A[:, t, s]
    W_q(t) = qw1(t)^T qw2(t) + diag(qdd(t)),   W_k(s) = kw1(s)^T kw2(s) + diag(kdd(s)),

with B the identity (the released DCFormer-2.8B) or a learned static matrix (talking heads), and
rank-R factors `qw1, qw2, kw1, kw2 [R, H]`. It is applied to the scaled logits before masking
("pre") and to the softmax probabilities ("post"); the post-composed map multiplies the values.
The dynamic weights come from the attention input x (after ln1), `DynamicWeightProjection`:

    hidden = GELU(x dw1)            dw1 [d_model, G, 4, K]   C = pre-q, pre-k, post-q, post-k
    w1, w2 = split(hidden qkw, R)   qkw [G, 4, K, 2R, M]     w1 RMS-normalised over heads
    qdd, kdd = tanh(x dd)           dd  [d_model, G, 4M]

with heads split into G groups of M = H/G (head h = g*M + m) that compose only within their group.
Parameter names and shapes are the release's, so `attnlens.hooked_models.converters.dcformer` copies
them.

Options (`DCMHAOptions`): rank, groups, hidden size K, query-wise only, static B, QK-norm (RMS over
d_head with a learned scale, before rotary), window attention on chosen layers. The rotary
fraction is the model's `cfg.rotary_dim` (first dims rotated in "half" pairs, as DCPythia's 25%).

Incremental decoding caches, per key, the merged key-wise matrix B + W_k(s) for both phases
(`LayerCache.extra["kw"]`, `[batch key_pos 2 group head head]`), as the release's `KVKWCache`.

Example:
    >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
    >>> cfg = VariantConfig(d_model=32, d_head=8, n_layers=1, n_ctx=16, d_vocab=50, seed=0,
    ...                     attention="dcmha", positional_embedding_type="rotary")
    >>> model = HookedVariantTransformer(cfg)
    >>> _, cache = model.run_with_cache(torch.arange(6)[None])
    >>> cache["blocks.0.attn.hook_pattern"].shape, cache["blocks.0.attn.hook_pre_qw1"].shape
    (torch.Size([1, 4, 6, 6]), torch.Size([1, 6, 1, 2, 4]))
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from attnlens.hooked_models.attention.base import (
    AttentionContext,
    LayerCache,
    Stage,
    VariantAttention,
    is_plain_causal,
    masked_softmax,
)
from attnlens.hooked_models.attention.dcmha.ops import causal_dcmha_attention
from attnlens.hooked_models.attention.dcmha.options import DCMHAOptions
from attnlens.hooked_models.attention.registry import register_attention
from attnlens.kernels.dcmha.reference import ComposeWeights, compose_reference

PHASES = ("pre", "post")
# Order of the generator's C axis (dw1, qkw, dd), as in the release.
CHANNELS = (("pre", "q"), ("pre", "k"), ("post", "q"), ("post", "k"))
# Release window patterns (`window_types`); L = local (windowed), G = global.
WINDOW_ALIASES = {"LG": "LG", "LGLL": "LGLL", "LGL6": "LGLLLLLL"}
NORM_EPS = 1e-6  # RMSnormNoscale epsilon of the release
W_SHAPE = "batch pos group rank head_index"
DD_SHAPE = "batch pos group head_index"


def _weight_stages() -> tuple[Stage, ...]:
    out = []
    for phase in PHASES:
        where = "logits" if phase == "pre" else "probabilities"
        for side, pos in (("q", "query t"), ("k", "key s")):
            out += [
                Stage(f"{phase}_{side}w1", f"{phase}-softmax {side}w1 at {pos}: rank-R head "
                      f"read-out, RMS-normalised over heads ({where})", phase, shape=W_SHAPE),
                Stage(f"{phase}_{side}w2", f"{phase}-softmax {side}w2 at {pos}: rank-R head "
                      f"write-back ({where})", phase, shape=W_SHAPE),
                Stage(f"{phase}_{side}dd", f"{phase}-softmax {side}dd at {pos}: tanh per-head "
                      f"gate ({where})", phase, shape=DD_SHAPE),
            ]
    return tuple(out)


def base_matrix(attn: "DCMHAttention", phase: str) -> Tensor:
    """B for `phase`: `[group head head]`, the identity plus the static weights if learned."""
    G, M = attn.opts.groups, attn.heads_per_group
    eye = torch.eye(M, dtype=attn.W_Q.dtype, device=attn.W_Q.device).expand(G, M, M)
    return eye + getattr(attn, f"W_{phase}_static") if attn.opts.static_proj else eye


@register_attention("dcmha")
class DCMHAttention(VariantAttention):
    """DCMHA: softmax attention whose logits and probabilities are composed across heads.

    Stages, in the order their hooks fire (a client that reads several stages in one pass, such
    as nnsight, must ask in this order): the dynamic weights `{pre,post}_{q,k}{w1,w2,dd}`
    (key-side ones absent when query-wise), computed from x before any map, then the four maps
    `attn_scores -> composed_scores -> probs -> pattern`.
    `z = pattern @ v` exactly (docs/design.md contract 4); `pattern` rows need not sum to 1.
    """

    Options = DCMHAOptions
    stages = _weight_stages() + (
        Stage("attn_scores", "scaled q.k logits (causal/window mask as -inf), before Compose",
              "pre"),
        Stage("composed_scores", "logits after the pre-softmax Compose (B + W_q + W_k)^T A, "
              "masked", "pre"),
        Stage("probs", "softmax of the composed logits, before the post-softmax Compose",
              "post", True),
        Stage("pattern", "probabilities after the post-softmax Compose: the weights on the "
              "values (rows need not sum to 1)", "post"),
    )

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        o: DCMHAOptions = self.opts
        H, D, G, R = cfg.n_heads, cfg.d_model, o.groups, o.rank
        M, K = H // G, o.hidden_dim(H)
        self.heads_per_group = M
        self.window = o.layer_window(layer)
        dt = cfg.dtype
        self.dw1 = nn.Parameter(torch.zeros(D, G, 4, K, dtype=dt))
        self.qkw = nn.Parameter(torch.zeros(G, 4, K, 2 * R, M, dtype=dt))
        self.dd = nn.Parameter(torch.zeros(D, G, 4 * M, dtype=dt))
        if o.static_proj:
            self.W_pre_static = nn.Parameter(torch.zeros(G, M, M, dtype=dt))
            self.W_post_static = nn.Parameter(torch.zeros(G, M, M, dtype=dt))
        if o.qk_norm:
            self.q_norm_scale = nn.Parameter(torch.ones(cfg.d_head, dtype=dt))
            self.k_norm_scale = nn.Parameter(torch.ones(cfg.d_head, dtype=dt))
        if o.query_wise:  # the key-wise weights are never used: no hooks, no catalogue entries
            key_side = {f"{p}_k{n}" for p in PHASES for n in ("w1", "w2", "dd")}
            self.stages = tuple(s for s in type(self).stages if s.name not in key_side)
            for name in key_side:
                delattr(self, f"hook_{name}")

    # -- initialisation --------------------------------------------------------------------
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Q/K/V/O as the base class; the generator near the identity composition.

        Stds of the released PyTorch trainer (variants.md section 3.6), with M heads per group:
        dw1 sqrt(2 / (D + K)), qkw 0.02 / (sqrt(2 M R) (M + R)), dd 0.05 sqrt(2 / (M + D));
        static weights (if any) 0.1 sqrt(1 / M) (the JAX init), so B starts near I.
        """
        super().init_weights(generator)
        D, M, R = self.cfg.d_model, self.heads_per_group, self.opts.rank
        K = self.dw1.shape[-1]
        with torch.no_grad():
            nn.init.normal_(self.dw1, std=math.sqrt(2 / (D + K)), generator=generator)
            nn.init.normal_(self.qkw, std=0.02 / (math.sqrt(2 * M * R) * (M + R)),
                            generator=generator)
            nn.init.normal_(self.dd, std=0.05 * math.sqrt(2 / (M + D)), generator=generator)
            if self.opts.static_proj:
                for w in (self.W_pre_static, self.W_post_static):
                    nn.init.normal_(w, std=0.1 * math.sqrt(1 / M), generator=generator)

    # -- pieces ----------------------------------------------------------------------------
    def prepare_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """QK-norm before rotary: x / sqrt(mean(x^2) + eps) * scale over d_head (if enabled)."""
        if not self.opts.qk_norm:
            return q, k
        eps = self.opts.qk_norm_eps

        def rms(x: Tensor, scale: Tensor) -> Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * scale

        return rms(q, self.q_norm_scale), rms(k, self.k_norm_scale)

    def generate_weights(self, x: Float[Tensor, "batch pos d_model"]) -> dict[str, Tensor]:
        """The dynamic weights of positions `x`, unhooked (variants.md section 3.2).

        Returns a dict with `{pre,post}_{q,k}{w1,w2}` `[batch pos group rank head_index]` and
        `{pre,post}_{q,k}dd` `[batch pos group head_index]` (key-side ones omitted if query-wise).
        """
        R, M = self.opts.rank, self.heads_per_group
        hidden = F.gelu(torch.einsum("btd,dgck->btgck", x, self.dw1))
        w = torch.einsum("btgck,gckim->btgcim", hidden, self.qkw)
        w1, w2 = w[..., :R, :], w[..., R:, :]
        w1 = w1 * torch.rsqrt(w1.pow(2).mean(-1, keepdim=True) + NORM_EPS)  # RMS over heads
        dd = torch.tanh(torch.einsum("btd,dgm->btgm", x, self.dd)).unflatten(-1, (4, M))
        out = {}
        for c, (phase, side) in enumerate(CHANNELS):
            if side == "k" and self.opts.query_wise:
                continue
            out[f"{phase}_{side}w1"] = w1[:, :, :, c]
            out[f"{phase}_{side}w2"] = w2[:, :, :, c]
            out[f"{phase}_{side}dd"] = dd[:, :, :, c]
        return out

    def layer_mask(self, ctx: AttentionContext) -> Tensor:
        """`ctx.allowed`, and on local layers also q_pos - k_pos <= window (`[batch 1 q k]`)."""
        if self.window is None:
            return ctx.allowed
        dist = ctx.q_positions[:, :, None] - ctx.k_positions[:, None, :]
        return ctx.allowed & (dist <= self.window)[:, None]

    def key_matrices(self, dyn: dict[str, Tensor], cache: LayerCache) -> Tensor:
        """Append B + W_k(s) for the new keys to the cache; returns all `[b s 2 g head head]`.

        This is the release's KW cache ("absorb residual or sw into kw cache").
        """
        mats = [_mixing(self, dyn, p, "k") + base_matrix(self, p) for p in PHASES]
        return cache.append("kw", torch.stack(mats, dim=2))

    def compose_weights(self, phase: str, dyn: dict[str, Tensor]) -> ComposeWeights:
        """The weights of one Compose phase in the spec's form (`attnlens.kernels.dcmha.reference`):
        the (hooked) dynamic weights `dyn` of every position, and B where it is learned."""
        names = [f"{phase}_{side}{n}" for side in "qk" for n in ("w1", "w2", "dd")]
        static = base_matrix(self, phase) if self.opts.static_proj else None
        return ComposeWeights(*(dyn.get(n) for n in names), static=static)

    def compose(self, A: Float[Tensor, "batch head_index query_pos key_pos"], phase: str,
                dyn: dict[str, Tensor], kw: Tensor | None = None) -> Tensor:
        """Compose: `A'[:, t, s] = (B + W_q(t) + W_k(s))^T A[:, t, s]` within each group.

        `dyn` holds the (hooked) dynamic weights of the query positions and of all key
        positions: then this is the op's spec, `attnlens.kernels.dcmha.reference.compose_reference`.
        While decoding, `kw` holds the cached merged key matrices `[b s 2 g n m]` (B included)
        of every key, and `dyn` those of the new query positions only.
        Returns the composed tensor, same shape as `A`.
        """
        if kw is None:
            return compose_reference(A, self.compose_weights(phase, dyn))
        a = A.unflatten(1, (self.opts.groups, self.heads_per_group))  # b g n t s
        out = torch.einsum("bgnts,bsgnm->bgmts", a, kw[:, :, PHASES.index(phase)])
        w1, w2, dd = (dyn[f"{phase}_q{n}"] for n in ("w1", "w2", "dd"))
        hidden = torch.einsum("bgnts,btgrn->bgrts", a, w1)
        out = out + torch.einsum("bgrts,btgrm->bgmts", hidden, w2)
        gate = dd.permute(0, 2, 3, 1)  # b g m pos
        return (out + a * gate[..., :, None]).flatten(1, 2)

    # -- forward ---------------------------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor:
        """z = Compose_post(softmax(mask(Compose_pre(q k^T / sqrt(d_head))))) v."""
        allowed = self.layer_mask(ctx)
        dyn = {name: getattr(self, f"hook_{name}")(w)
               for name, w in self.generate_weights(ctx.x).items()}
        kw = None
        if ctx.cache is not None and not self.opts.query_wise:
            kw = self.key_matrices(dyn, ctx.cache)
        scores = self.hook_attn_scores(self.content_scores(q, k, allowed))
        # The release composes the unmasked logits and masks afterwards. Compose mixes heads at
        # one (t, s) only and the mask is shared by heads, so composing zeros in masked places
        # and re-masking gives the same allowed entries, while keeping hook edits effective.
        logits = self.compose(torch.where(allowed, scores, 0.0), "pre", dyn, kw)
        composed = self.hook_composed_scores(logits.masked_fill(~allowed, float("-inf")))
        probs = self.hook_probs(masked_softmax(composed, allowed))
        pattern = self.hook_pattern(self.compose(probs, "post", dyn, kw))
        return torch.einsum("bhqk,bkhd->bqhd", pattern, v)

    def fast_attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """`attend` on a plain causal mask (else None), by causal blocks of query rows.

        The training path: the same equations in blocks that stop at their last key, so the
        upper triangle is never computed and no whole map is built; each phase mixes a block
        with the per-query `B + W_q(t)` and per-key `W_k(s)` matrices
        (`ops.causal_dcmha_attention`). The dynamic-weight hooks still fire.
        """
        if ctx.cache is not None or not is_plain_causal(ctx.allowed):
            return None
        dyn = {name: getattr(self, f"hook_{name}")(w)
               for name, w in self.generate_weights(ctx.x).items()}
        key_wise = not self.opts.query_wise
        pre, post = ((_mixing(self, dyn, p, "q"), _mixing(self, dyn, p, "k") if key_wise else None)
                     for p in PHASES)
        return causal_dcmha_attention(q, k, v, pre, post, 1.0 / self.cfg.attn_scale, self.window)

    def fused_attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """z from the fused DCMHA kernels (`attnlens.kernels.dcmha`) when no map is hooked (the
        dynamic-weight hooks still fire); None (take `attend`) while decoding with a KV cache,
        for a window on positions that are not the token indices, or dtypes / masks the
        kernels do not cover."""
        if ctx.cache is not None:
            return None
        from attnlens.kernels.dcmha.dispatch import dcmha_call_fits, fused_dcmha_attention

        fits, key_valid = dcmha_call_fits(q, k, v, ctx.allowed, self.window,
                                          (ctx.q_positions, ctx.k_positions))
        if not fits:
            return None
        dyn = {name: getattr(self, f"hook_{name}")(w)
               for name, w in self.generate_weights(ctx.x).items()}
        phases = {p: self.compose_weights(p, dyn) for p in PHASES}
        z, self.fused_state = fused_dcmha_attention(
            q, k, v, key_valid, phases["pre"], phases["post"], 1.0 / self.cfg.attn_scale,
            self.window, keep_state=self.keep_fused_state)
        return z

    # -- analysis helper -------------------------------------------------------------------
    def head_mixing(self) -> dict[str, Tensor | None]:
        """The static part of Compose: B `[head_index head_index]` (block-diagonal over groups)
        when `static_proj`; with the released identity base there is no static mixing (None)."""
        if not self.opts.static_proj:
            return {"pre": None, "post": None}
        return {p: torch.block_diag(*base_matrix(self, p).unbind(0)) for p in PHASES}

    def head_mixing_at(self, source, t: int, s: int) -> dict[str, Tensor | None]:
        """The full mixing `B + W_q(t) + W_k(s)` of each phase, `[batch head head]`
        (`mixing_matrix`); `source` is the attention input x or a cache of this layer's hooks."""
        return {p: self.mixing_matrix(source, t, s, p) for p in PHASES}

    def mixing_matrix(self, source, t: int, s: int, phase: str = "pre") -> Tensor:
        """The effective head-mixing matrix `B + W_q(t) + W_k(s)` `[batch head_index head_index]`.

        `source` is either the attention input x `[batch pos d_model]` or an `ActivationCache`
        (or dict) holding this layer's dynamic-weight hooks over all positions. Entry `[n, m]` is
        how much head n's map at (t, s) adds to head m's: `A'[m] = sum_n M[n, m] A[n]`
        (variants.md section 3.2); block-diagonal over groups.

        Example:
            >>> M = attn.mixing_matrix(cache, t=5, s=2, phase="post")  # doctest: +SKIP
        """
        if phase not in PHASES:
            raise ValueError(f"phase must be 'pre' or 'post', got {phase!r}")
        if isinstance(source, Tensor):
            dyn = self.generate_weights(source)
        else:
            prefix = f"blocks.{self.layer}.attn.hook_"
            dyn = {n: source[prefix + n] for n in self.generate_weights_names()}
        T = next(iter(dyn.values())).shape[1]
        if not (0 <= t < T and 0 <= s < T):
            raise ValueError(f"t and s must lie in [0, {T}), got t={t}, s={s}")
        mat = base_matrix(self, phase).to(dyn[f"{phase}_qw1"].dtype)
        sides = (("q", t),) + ((("k", s),) if not self.opts.query_wise else ())
        for side, pos in sides:
            w1, w2, dd = (dyn[f"{phase}_{side}{n}"][:, pos] for n in ("w1", "w2", "dd"))
            mat = mat + torch.einsum("bgrn,bgrm->bgnm", w1, w2) + torch.diag_embed(dd)
        return torch.stack([torch.block_diag(*m.unbind(0)) for m in mat])

    def generate_weights_names(self) -> list[str]:
        """Names of the dynamic-weight stages of this layer (without the `hook_` prefix)."""
        return [s.name for s in self.stages if not s.is_map]


def _mixing(attn: DCMHAttention, dyn: dict[str, Tensor], phase: str, side: str) -> Tensor:
    """One side's per-position mixing matrices `[batch pos group n m]`: `qw1^T qw2 + diag(qdd)`
    (plus B on the query side, so that the two sides sum to `B + W_q(t) + W_k(s)`)."""
    w1, w2, dd = (dyn[f"{phase}_{side}{n}"] for n in ("w1", "w2", "dd"))
    mat = torch.einsum("bpgrn,bpgrm->bpgnm", w1, w2) + torch.diag_embed(dd)
    return mat + base_matrix(attn, phase).to(mat.dtype) if side == "q" else mat
