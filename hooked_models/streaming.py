"""Streaming for Infini-attention models: consume an unbounded token stream in constant memory.

`InfiniStream(model)` wraps a `HookedVariantTransformer` with `attention="infini"`. Each `feed`
runs a chunk of any length through the model and returns its logits; every layer carries only
its compressive memory (M, z) and the keys/values of the unfinished segment, so memory does not
grow with the stream. Feeding a sequence in any chunking gives the same logits as a one-shot
forward over it (same segment boundaries, same arithmetic). The stream is not limited by n_ctx.

Hooks: the per-token hooks (embed, resid, q/k/v, rot_q/rot_k, z, attn_out, mlp) fire for every
chunk, and the attention stages `a_dot`, `a_mem` (`[batch piece head_index d_head]`) and `gate`
(`[batch head_index]`) for every segment piece of it, so a hook that edits them (the memory
knock-out: `a_mem` or `gate` to 0) acts as in a one-shot forward. The stages that span the whole
context (`pattern`, `mem_weights`, `memory`, ...) cannot fire on a stream: `feed` raises
ValueError while one is hooked. Inspect the memory with `stream.memory(layer)`.

Example:
    >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
    >>> cfg = VariantConfig(d_model=32, d_head=8, n_layers=2, n_ctx=64, d_vocab=50, seed=0,
    ...                     attention="infini", positional_embedding_type="rotary",
    ...                     attn_cfg={"segment_len": 16})
    >>> stream = InfiniStream(HookedVariantTransformer(cfg))
    >>> stream.feed(torch.arange(40)[None] % 50).shape      # 2.5 segments, beyond nothing
    torch.Size([1, 40, 50])
    >>> stream.feed(torch.zeros(1, 1000, dtype=torch.long)).shape   # 1040 tokens > n_ctx
    torch.Size([1, 1000, 50])
    >>> stream.n_tokens, stream.memory(0)[0].shape
    (1040, torch.Size([1, 4, 8, 8]))
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlens.hooked_models.attention.infini.layer import InfiniAttention, InfiniLayerState


class InfiniStream:
    """Stateful, constant-memory incremental forward of an Infini-attention model.

    Args:
        model: a `HookedVariantTransformer` whose every layer is "infini" attention, with
            `positional_embedding_type` "rotary" or "none" (learned absolute positions end at
            n_ctx); with rotary, `segment_len` must not exceed n_ctx (the rotary table).
        grad: keep the autograd graph (for training with truncated BPTT: call `detach()`
            between chunks). Default False: chunks run under `torch.no_grad()`.
    """

    def __init__(self, model, grad: bool = False):
        cfg = model.cfg
        if not all(isinstance(b.attn, InfiniAttention) for b in model.blocks):
            raise ValueError(f"InfiniStream needs attention='infini', got {cfg.attention!r}")
        if cfg.positional_embedding_type == "standard":
            raise ValueError("InfiniStream needs positional_embedding_type 'rotary' or 'none': "
                             "learned absolute positions ('standard') stop at n_ctx="
                             f"{cfg.n_ctx}")
        seg = cfg.attn_cfg.segment_len
        if cfg.positional_embedding_type == "rotary" and seg > cfg.n_ctx:
            raise ValueError(f"segment_len={seg} exceeds n_ctx={cfg.n_ctx}, the size of the "
                             "rotary table used for within-segment positions")
        self.model = model
        self.grad = grad
        self.reset()

    def reset(self) -> None:
        """Forget everything: empty memories, position 0."""
        self.states = [InfiniLayerState() for _ in self.model.blocks]
        self._last_logits: Tensor | None = None

    @property
    def n_tokens(self) -> int:
        """Tokens consumed so far."""
        return self.states[0].pos

    @property
    def segment_len(self) -> int:
        return self.model.cfg.attn_cfg.segment_len

    def feed(self, tokens: Tensor | str) -> Tensor:
        """Run the next chunk; returns its logits `[batch chunk d_vocab]`.

        `tokens` are `[batch chunk]` (or `[chunk]`) ids, or text (a BOS is prepended only to the
        first chunk when the model's config asks for one). The batch size is fixed by the first
        chunk.
        """
        model = self.model
        if isinstance(tokens, str):
            first = self.n_tokens == 0 and model.cfg.default_prepend_bos
            tokens = model.to_tokens(tokens, prepend_bos=first)
        tokens = model._check_tokens(tokens)
        with torch.set_grad_enabled(self.grad and torch.is_grad_enabled()):
            resid = model.hook_embed(model.embed(tokens))
            for block, state in zip(model.blocks, self.states, strict=True):
                resid = block(resid, None, None, None, state)
            logits = model.unembed(model.ln_final(resid))
        self._last_logits = logits[:, -1].detach()
        return logits

    def memory(self, layer: int) -> tuple[Tensor, Tensor]:
        """`(M, z)` of `layer` after the last completed segment: `[batch head d_key d_value]`,
        `[batch head d_key]` (zeros before the first segment completes)."""
        state = self.states[layer]
        if state.M is None:
            raise ValueError("nothing has been fed yet")
        return state.M, state.z

    def detach(self) -> None:
        """Cut the autograd graph held by the state (truncated BPTT between chunks)."""
        for state in self.states:
            state.detach()

    def state_bytes(self) -> int:
        """Bytes held by the streaming state: bounded by layers x (memory + one segment)."""
        return sum(state.nbytes() for state in self.states)

    @torch.no_grad()
    def generate(self, max_new_tokens: int, prompt: Tensor | str | None = None,
                 temperature: float = 0.0, seed: int | None = None) -> Tensor:
        """Feed `prompt` (if any), then greedily (or by sampling) extend the stream.

        Returns the `[batch max_new_tokens]` generated ids, which are fed back into the stream.
        """
        if prompt is not None:
            self.feed(prompt)
        if self._last_logits is None:
            raise ValueError("generate needs a prompt or a previous feed")
        logits = self._last_logits
        gen = torch.Generator(device=logits.device).manual_seed(seed) if seed is not None else None
        out = []
        for _ in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                probs = torch.softmax(logits.float() / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=gen)
            out.append(nxt)
            logits = self.feed(nxt)[:, -1]
        return torch.cat(out, dim=1)


__all__ = ["InfiniStream"]
