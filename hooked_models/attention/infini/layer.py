"""Infini-attention (Munkhdalai, Faruqui, Gopal 2024, arXiv 2404.07143): the "infini" variant.

Each layer cuts its input into segments of `segment_len` tokens and processes them in order:
causal softmax attention inside the segment (A_dot, Eq. 6; positional encoding on this local path
only), a read of a per-head compressive memory M, z built from all previous segments (A_mem,
Eq. 7), a learned per-head gate mixing the two (Eq. 10), then the memory update (linear Eq. 8 or
linear + delta Eq. 9). The plain-torch equations live in `attnlens.kernels.infini.reference` (the
op's one spec).

Choices (see also `attnlens.kernels.infini.reference`):
- Segments follow the padding-aware token positions: position p is in segment p // segment_len.
- Rotary (if the model uses it) rotates q and k by their position *within* the segment. RoPE
  scores depend only on q-k offsets, so this equals absolute positions inside a segment, and it
  keeps the rotary table bounded for streams longer than n_ctx. The memory uses unrotated q, k
  (paper section 4.1). With `positional_embedding_type="standard"` the model adds learned
  absolute positions to the embeddings, which the memory then sees and which stop at n_ctx:
  use "rotary" or "none" with infini (streaming refuses "standard").
- While a query's memory is empty (its first segment) the gate is off and A = A_dot, so a
  segment at least as long as the input gives exactly MHA.
- Gradients flow through M, z across segments (BPTT, as in the paper); `detach_every=n` cuts them
  after every n-th segment.
- The model's `past_kv_cache` (which would keep every past key) is refused with a ValueError;
  `attnlens.hooked_models.streaming.InfiniStream` is the constant-memory incremental API.

Hooks. A forward with no hook on a stage of the catalogue runs the segment loop only (no
`[query, key]` map beyond one segment). When any stage is hooked the layer materialises the
whole-context maps: `hook_pattern` is the exact effective weight matrix over all tokens,
`(1 - g) * local softmax + g * memory read weights`, and `z == pattern @ v` (the delta rule is
linear in the values, so this holds for it too). Every stage up to `pattern` is live: editing
`attn_scores`, `local_pattern`, `mem_weights`, `gate`, `pattern`, `a_dot` or `a_mem` changes z.
The memory states `memory` and `memory_z` are read-only records: z is computed from the read
weights (`mem_weights`), not from M, and an edited M has no per-token weights, so a hook that
returns (or leaves in place) a changed memory raises ValueError instead of being ignored. Knock
the memory out by setting `hook_gate` to 0; edit what is read through `hook_mem_weights` or
`hook_a_mem`. Streaming (`InfiniStream`) fires `a_dot`, `a_mem` and `gate` per segment piece,
edits included, and raises ValueError while a whole-context stage (`WHOLE_CONTEXT_STAGES`) is
hooked, since a stream never holds the whole context.

Example:
    >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
    >>> cfg = VariantConfig(d_model=32, d_head=8, n_layers=1, n_ctx=16, d_vocab=50, seed=0,
    ...                     attention="infini", positional_embedding_type="rotary",
    ...                     attn_cfg={"segment_len": 4})
    >>> model = HookedVariantTransformer(cfg)
    >>> _, cache = model.run_with_cache(torch.arange(10)[None])
    >>> cache["pattern", 0].shape, cache["blocks.0.attn.hook_memory"].shape
    (torch.Size([1, 4, 10, 10]), torch.Size([1, 3, 4, 8, 8]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn

from attnlens.hooked_models.attention.base import (
    AttentionContext,
    Stage,
    VariantAttention,
    is_plain_causal,
    masked_softmax,
)
from attnlens.hooked_models.attention.infini.options import InfiniOptions
from attnlens.hooked_models.attention.observe import is_observed
from attnlens.hooked_models.attention.registry import register_attention
from attnlens.kernels.infini import reference as mem

PER_TOKEN = "batch query_pos head_index d_head"


@dataclass
class InfiniLayerState:
    """One layer's streaming state: constant size, whatever the stream length.

    Attributes:
        M, z: compressive memory after the last completed segment (memory dtype), or None.
        k_rot, k, v: keys (rotated and not) and values of the current, unfinished segment
            `[batch n head_index d_head]` with n < segment_len, or None.
        pos: tokens consumed so far; n_segments: completed segments.
    """

    M: Tensor | None = None
    z: Tensor | None = None
    k_rot: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    pos: int = 0
    n_segments: int = 0

    def detach(self) -> None:
        """Cut the autograd graph (call between chunks when training with truncated BPTT)."""
        for name in ("M", "z", "k_rot", "k", "v"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.detach())

    def nbytes(self) -> int:
        """Bytes held by the state's tensors."""
        return sum(t.numel() * t.element_size() for t in (self.M, self.z, self.k_rot, self.k,
                                                           self.v) if t is not None)


@register_attention("infini")
class InfiniAttention(VariantAttention):
    """Infini-attention: local softmax + gated compressive-memory read, segment by segment.

    Parameters beyond the base class: `beta [head_index]`, the gate logit of each head (Eq. 10;
    one scalar per head as in the paper). `attend` takes *unrotated* q, k (the memory must not see
    positions) and applies rotary itself, within each segment.
    """

    Options = InfiniOptions
    # The trainer gives these their own learning rate and no weight decay (a decayed beta
    # would be pulled to a 0.5 gate regardless of what the head learns).
    gate_parameter_names = ("beta",)
    supports_kv_cache = False  # refuses past_kv_cache: it would keep every past key
    stages = (
        Stage("attn_scores", "local q.k scores (rotary within the segment); -inf outside the "
              "query's segment and in the future", "pre"),
        Stage("local_pattern", "softmax of the local scores within the segment (A_dot weights)",
              "post", True),
        Stage("a_dot", "A_dot = local_pattern @ v, the local attention output (Eq. 6)", "post",
              shape=PER_TOKEN),
        Stage("mem_weights", "memory read weights over every token of previous segments: "
              "A_mem = mem_weights @ v (Eq. 7; rows sum to 1 under the linear rule)", "post"),
        Stage("a_mem", "A_mem = sigma(q) M / (sigma(q) z), the memory read (Eq. 7)", "post",
              shape=PER_TOKEN),
        Stage("memory", "memory M after each segment, the last possibly partial (Eq. 8/9); "
              "read-only: a hook that changes it raises ValueError (edit mem_weights, a_mem or "
              "gate)", "post", shape="batch segment head_index d_key d_value"),
        Stage("memory_z", "normaliser z = sum of sigma(k) after each segment (Eq. 8); "
              "read-only like memory", "post", shape="batch segment head_index d_key"),
        Stage("gate", "sigmoid(beta) per head, the weight of A_mem (Eq. 10)", "post",
              shape="batch head_index"),
        Stage("pattern", "effective weights over the whole context: (1-g) local_pattern + "
              "g mem_weights (g = 0 while the memory is empty); z = pattern @ v", "post"),
    )

    def __init__(self, cfg, layer: int):
        super().__init__(cfg, layer)
        self.beta = nn.Parameter(torch.full((cfg.n_heads,), float(self.opts.gate_init),
                                            dtype=cfg.dtype))

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        super().init_weights(generator)
        with torch.no_grad():
            self.beta.fill_(float(self.opts.gate_init))

    @property
    def gate(self) -> Float[Tensor, "head_index"]:  # noqa: F821 (jaxtyping axis)
        """sigmoid(beta) per head (memory dtype)."""
        return torch.sigmoid(self.beta.to(mem.memory_dtype(self.beta.dtype)))

    # -- forward -----------------------------------------------------------------------------
    def forward(self, x: Float[Tensor, "batch pos d_model"], allowed: Tensor | None,
                q_positions: Tensor | None, k_positions: Tensor | None,
                cache: InfiniLayerState | None = None) -> Float[Tensor, "batch pos d_model"]:
        """One-shot forward over `x`, or one streamed chunk when `cache` is an InfiniLayerState."""
        if cache is not None and not isinstance(cache, InfiniLayerState):
            raise ValueError("infini attention does not support past_kv_cache (it would keep every "
                             "past key); stream with "
                             "attnlens.hooked_models.streaming.InfiniStream, or call "
                             "generate(..., use_cache=False)")
        q, k, v = self.project_qkv(x)
        q, k = self.prepare_qk(q, k)
        k, v = self.expand_kv(k), self.expand_kv(v)  # GQA: the memory is kept per query head
        if cache is not None:
            z, ctx = self._stream(q, k, v, cache), None
        else:
            ctx = AttentionContext(x, allowed, q_positions, k_positions, None)
            z = self.attend(q, k, v, ctx)
        z = self.hook_z(z)
        return self.project_out(self.heads_to_output(z, ctx))

    def _rotate(self, q: Tensor, k: Tensor, within: Tensor) -> tuple[Tensor, Tensor]:
        if self.rotary is None:
            return q, k
        # GQA: rotate and hook the kv_heads keys (k[:, :, ::kv_group] undoes expand_kv exactly),
        # so hook_rot_k has hook_k's shape in every variant.
        # Positions within a segment are 0..N-1 (`pos % N` is never negative): passing that bound
        # spares the rotary table's range check a device sync, so a compiled step is one graph.
        top = self.opts.segment_len - 1
        top = top if top < self.rotary.cos.shape[0] else None
        k_rot = self.hook_rot_k(self.rotary(k[:, :, ::self.kv_group], within, top))
        return self.hook_rot_q(self.rotary(q, within, top)), self.expand_kv(k_rot)

    def _stages_observed(self) -> bool:
        return any(is_observed(hp)
                   for hp in (getattr(self, s.hook_name) for s in self.stages))

    def attend(self, q: Float[Tensor, "batch pos head_index d_head"],
               k: Float[Tensor, "batch pos head_index d_head"],
               v: Float[Tensor, "batch pos head_index d_head"],
               ctx: AttentionContext) -> Float[Tensor, "batch pos head_index d_head"]:
        """Return z (Eq. 10 per head) for a whole input; q, k unrotated.

        Materialises the whole-context maps only while a stage is hooked (see module docstring).
        """
        N = self.opts.segment_len
        valid = ctx.allowed[:, 0].diagonal(dim1=-2, dim2=-1)   # key j valid <=> allowed[j, j]
        pos = ctx.q_positions
        qr, kr = self._rotate(q, k, pos % N)
        if self._stages_observed():
            return self._attend_materialised(q, k, v, qr, kr, pos, valid, ctx.allowed)
        # The plain causal mask (no padding, no cache) has positions 0..T-1: aligned, no sync.
        return self._attend_segments(q, k, v, qr, kr, pos, valid, is_plain_causal(ctx.allowed))

    def _attend_segments(self, q, k, v, qr, kr, pos, valid, aligned: bool = False) -> Tensor:
        """The segment loop (`attnlens.kernels.infini.reference.segment_pass`) on a
        slot-per-position layout; `aligned` (position p of every row at index p, no padding) is
        checked when not given."""
        md, (b, T) = mem.memory_dtype(q.dtype), q.shape[:2]
        aligned = aligned or (bool(valid.all()) and torch.equal(
            pos, torch.arange(T, device=pos.device).expand(b, T)))
        tensors = [t.to(md) for t in (qr, kr, q, k, v)]
        if aligned:
            slot_valid = None
        else:   # real token of position p goes to slot p; padding is dropped
            bi, ti = valid.nonzero(as_tuple=True)
            pi = pos[bi, ti]
            L = int(pi.max()) + 1 if pi.numel() else 1
            tensors = [t.new_zeros(b, L, *t.shape[2:]).index_put((bi, pi), t[bi, ti])
                       for t in tensors]
            slot_valid = torch.zeros(b, L, dtype=torch.bool, device=q.device)
            slot_valid[bi, pi] = True
        out, _ = self._segment_pass(*tensors, slot_valid, self.opts.segment_len, self.gate,
                                    self.opts.update, self.cfg.attn_scale,
                                    self.opts.detach_every)
        if not aligned:
            out = out.new_zeros(b, T, *out.shape[2:]).index_put((bi, ti), out[bi, pi])
        return out.to(q.dtype)

    def _segment_pass(self, qr, kr, q, k, v, valid, *args):
        """`attnlens.kernels.infini.reference.segment_pass`, on the fused kernels
        (`attnlens.kernels.infini`) when `cfg.backend` allows it; only reached while no stage is
        hooked (see `attend`)."""
        if self.cfg.backend != "torch":
            from attnlens.kernels.dispatch import fused_backend_enabled

            if fused_backend_enabled(self.cfg.backend, q):
                from attnlens.kernels.infini.dispatch import fused_segment_pass

                # Local attention in the model's dtype (q, k, v came from it: no rounding).
                dtype = self.W_Q.dtype
                res = fused_segment_pass(*(t.to(dtype) for t in (qr, kr, q, k, v)), valid,
                                         *args)
                if res is not None:
                    return res
        return mem.segment_pass(qr, kr, q, k, v, valid, *args)

    def _attend_materialised(self, q, k, v, qr, kr, pos, valid, allowed) -> Tensor:
        """Every stage as a whole-context tensor; z = pattern @ v (+ live A_dot/A_mem edits)."""
        N, dtype, md = self.opts.segment_len, q.dtype, mem.memory_dtype(q.dtype)
        seg = pos // N
        real = allowed & valid[:, None, :, None]                          # real queries only
        local = real & (seg[:, :, None] == seg[:, None, :])[:, None]
        past = (real & (seg[:, None, :] < seg[:, :, None])[:, None])[:, 0]
        scores = torch.einsum("bqhd,bkhd->bhqk", qr.to(md), kr.to(md)) / self.cfg.attn_scale
        scores = self.hook_attn_scores(scores.masked_fill(~local, float("-inf")).to(dtype))
        local_pattern = self.hook_local_pattern(masked_softmax(scores, local))
        a_dot = torch.einsum("bhqk,bkhd->bqhd", local_pattern, v)
        a_dot_hooked = self.hook_a_dot(a_dot)

        n_seg = int(seg[valid].max()) + 1 if bool(valid.any()) else 1
        head_major = [t.to(md).transpose(1, 2) for t in (q, k, v)]
        sq, sk = mem.sigma(head_major[0]), mem.sigma(head_major[1]) * valid[:, None, :, None]
        W, nonempty, Ms, zs = mem.memory_read_weights(sq, sk, head_major[2], seg, past, n_seg,
                                                      self.opts.update, self.opts.detach_every)
        mem_weights = self.hook_mem_weights(W.to(dtype))
        a_mem = torch.einsum("bhqk,bkhd->bqhd", mem_weights, v)
        a_mem_hooked = self.hook_a_mem(a_mem)
        _read_only(self.hook_memory, Ms)
        _read_only(self.hook_memory_z, zs)

        gate = self.hook_gate(self.gate.to(dtype).expand(q.shape[0], -1))
        g = gate[:, :, None] * nonempty                                    # [batch head q]
        pattern = (1 - g[..., None]) * local_pattern + g[..., None] * mem_weights
        pattern = self.hook_pattern(pattern)
        z = self._pattern_times_v(pattern, v, seg)
        g = g.transpose(1, 2)[..., None]
        # Exactly zero unless a hook edited A_dot or A_mem; keeps those stages live.
        return z + g * (a_mem_hooked - a_mem) + (1 - g) * (a_dot_hooked - a_dot)

    def _pattern_times_v(self, pattern: Tensor, v: Tensor, seg: Tensor) -> Tensor:
        """pattern @ v; with truncated BPTT, values behind a detach point enter detached."""
        n = self.opts.detach_every
        if not n or not torch.is_grad_enabled():
            return torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        frozen = (seg[:, None, :] < (seg[:, :, None] // n) * n)[:, None]
        return (torch.einsum("bhqk,bkhd->bqhd", pattern.masked_fill(frozen, 0), v)
                + torch.einsum("bhqk,bkhd->bqhd", pattern.masked_fill(~frozen, 0), v.detach()))

    # -- streaming ---------------------------------------------------------------------------
    def _stream(self, q: Tensor, k: Tensor, v: Tensor, state: InfiniLayerState) -> Tensor:
        """Consume one chunk of any length; segments may start and end inside it.

        Keeps only the unfinished segment's keys/values and (M, z). Returns z for the chunk.
        """
        N, md, opts = self.opts.segment_len, mem.memory_dtype(q.dtype), self.opts
        b, m, H, d = q.shape
        spanning = [s.name for s in self.stages if s.name in WHOLE_CONTEXT_STAGES
                    and is_observed(getattr(self, s.hook_name))]
        if spanning:
            raise ValueError(
                f"layer {self.layer}: hooks on {spanning} cannot run while streaming: those "
                "stages span the whole context, which a stream never holds. Streaming fires "
                f"{list(STREAM_STAGES)} per segment piece (and the per-token hooks); read the "
                "memory with InfiniStream.memory(layer), or run the input in one forward")
        if state.M is None:
            state.M, state.z = mem.empty_memory(b, H, d, v.shape[-1], md, q.device)
        elif state.M.shape[0] != b:
            raise ValueError(f"stream batch size changed from {state.M.shape[0]} to {b}")
        within = (torch.arange(state.pos, state.pos + m, device=q.device) % N).expand(b, m)
        qr, kr = self._rotate(q, k, within)
        outs, i = [], 0
        while i < m:
            offset = state.pos % N
            sl = slice(i, i + min(N - offset, m - i))
            keys = [piece if old is None else torch.cat([old, piece], 1)
                    for old, piece in ((state.k_rot, kr[:, sl]), (state.k, k[:, sl]),
                                       (state.v, v[:, sl]))]
            k_rot, k_all, v_all = keys
            a_dot = mem.local_attention(qr[:, sl].to(md), k_rot.to(md), v_all.to(md), None,
                                        offset, self.cfg.attn_scale)
            a_mem = mem.retrieve(mem.sigma(q[:, sl].to(md)), state.M, state.z)
            a_dot = _fire(self.hook_a_dot, a_dot, q.dtype)
            a_mem = _fire(self.hook_a_mem, a_mem, q.dtype)
            nonempty = mem.memory_nonempty(state.z)
            gate = (self.hook_gate(self.gate.to(q.dtype).expand(b, -1)).to(md)
                    if is_observed(self.hook_gate) else self.gate)
            outs.append(mem.mix(a_mem, a_dot, gate, nonempty))
            state.pos += sl.stop - sl.start
            if state.pos % N == 0:      # segment complete: write it to memory, drop its keys
                state.M, state.z = mem.update(mem.sigma(k_all.to(md)), v_all.to(md), state.M,
                                              state.z, opts.update)
                state.n_segments += 1
                if opts.detach_every and state.n_segments % opts.detach_every == 0:
                    state.M, state.z = state.M.detach(), state.z.detach()
                state.k_rot = state.k = state.v = None
            else:
                state.k_rot, state.k, state.v = k_rot, k_all, v_all
            i = sl.stop
        return torch.cat(outs, 1).to(q.dtype)


# While streaming (`_stream`), `a_dot` and `a_mem` fire per segment piece `[batch piece
# head_index d_head]` and `gate` per piece `[batch head_index]`, edits taking effect as in a
# one-shot forward; the stages below span the whole context and refuse to stream while hooked.
STREAM_STAGES = ("a_dot", "a_mem", "gate")
WHOLE_CONTEXT_STAGES = ("attn_scores", "local_pattern", "mem_weights", "memory", "memory_z",
                        "pattern")


def _fire(point, x: Tensor, dtype: torch.dtype) -> Tensor:
    """`x` through hook `point` in the model's `dtype` (as a one-shot forward shows it), back
    in `x`'s dtype; untouched (no rounding) while nothing observes the point."""
    return point(x.to(dtype)).to(x.dtype) if is_observed(point) else x


def _read_only(point, record: Tensor) -> None:
    """Show `record` to the hooks of `point`; ValueError if one returns or leaves it changed.

    The layer never reads the record back (see the module docstring), so an edit would be
    ignored silently. Called on the materialising path only, where the copy is small beside the
    `[query, key]` maps.
    """
    kept = record.detach().clone()
    out = point(record)

    def same(t: Tensor) -> bool:
        t = t.detach()
        return t.shape == kept.shape and bool(((t == kept) | (t.isnan() & kept.isnan())).all())

    if not (same(record) and (out is record or same(out))):
        raise ValueError(f"{point.name or 'hook_memory'} is a read-only record of the compressive "
                         "memory: a hook changed it, and the layer would ignore the change (z "
                         "is computed from the read weights). Edit hook_mem_weights or hook_a_mem "
                         "instead, or set hook_gate to 0 to knock the memory out")


__all__ = ["InfiniAttention", "InfiniLayerState", "InfiniOptions"]
