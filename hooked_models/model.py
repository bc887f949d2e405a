"""`HookedVariantTransformer`: a TransformerLens `HookedRootModule` for every attention variant.

Example:
    >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
    >>> cfg = VariantConfig(d_model=32, d_head=8, n_layers=2, n_ctx=64, d_vocab=100,
    ...                     tokenizer_alphabet="abcdefgh", seed=0)
    >>> model = HookedVariantTransformer(cfg)
    >>> logits, cache = model.run_with_cache("abcabc")
    >>> cache["pattern", 1].shape
    torch.Size([1, 4, 7, 7])
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule
from transformer_lens.hook_points import HookPoint

from attnlens.hooked_models.attention import LayerCache, Stage
from attnlens.hooked_models.attention.base import mark_plain_causal
from attnlens.hooked_models.attention.pattern_heads import PatternHeads, select_pattern_heads
from attnlens.hooked_models.components import Embed, PosEmbed, TransformerBlock, Unembed, make_norm
from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.devices import check_device
from attnlens.hooked_models.generation import GenerationMixin
from attnlens.hooked_models.interop import InteropMixin
from attnlens.hooked_models.sizing import check_sizes
from attnlens.hooked_models.text_io import TokenizationMixin
from attnlens.hooked_models.tokenizers.vocab import CharTokenizer

ReturnType = Literal["logits", "loss", "both", None]


class KVCache:
    """Incremental-decoding state: one `LayerCache` per layer plus the padding mask so far."""

    def __init__(self, n_layers: int):
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.mask: Tensor | None = None

    @property
    def length(self) -> int:
        return self.layers[0].length


class HookedVariantTransformer(TokenizationMixin, GenerationMixin, InteropMixin, HookedRootModule):
    """Embed -> [pos embed] -> blocks (variant attention + optional MLP) -> final norm -> unembed.

    Hook names and shapes are TransformerLens's; each variant adds its stages under
    `blocks.{l}.attn.hook_<stage>` (see `stages(layer)`). `hook_pattern` is always the effective
    pattern: `z[b, q, h] = sum_k pattern[b, h, q, k] v[b, k, h]`.
    """

    def __init__(self, cfg: VariantConfig | dict, tokenizer=None):
        super().__init__()
        if isinstance(cfg, dict):
            cfg = VariantConfig.from_dict(cfg)
        if not isinstance(cfg, VariantConfig):
            raise ValueError(f"cfg must be a VariantConfig or dict, got {type(cfg).__name__}")
        check_device(cfg.device)   # a clear ValueError, not torch's bare AssertionError, later
        if torch.device(cfg.device or "cpu").type == "cpu":
            # A model too large for this machine is refused before anything is allocated,
            # naming the size field (a config alone may describe any model: importers,
            # placement plans and meta-device builds use configs of models this CPU cannot hold).
            check_sizes(cfg)
        self._cfg = cfg
        if tokenizer is None and cfg.tokenizer_alphabet is not None:
            tokenizer = CharTokenizer(cfg.tokenizer_alphabet)
        self.tokenizer = tokenizer
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        if cfg.positional_embedding_type == "standard":
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(TransformerBlock(cfg, layer) for layer in range(cfg.n_layers))
        for block in self.blocks:  # cross-layer sharing seam (e.g. CoPE's shared embeddings)
            block.attn.link_layers([b.attn for b in self.blocks])
        self.ln_final = make_norm(cfg)
        self.unembed = Unembed(cfg)
        self.init_weights()
        self.setup()
        self._restore_forks()
        self.to(cfg.device)

    @property
    def cfg(self) -> VariantConfig:
        return self._cfg

    @property
    def tokenizer(self):
        return self.__dict__.get("_tokenizer")

    @tokenizer.setter
    def tokenizer(self, tokenizer) -> None:
        # TransformerLens's evals and utilities prepend `tokenizer.bos_token_id` whenever
        # cfg.default_prepend_bos is set: without a tokenizer (or a BOS) the default is off,
        # and it comes back on when one with a BOS is attached.
        self.__dict__["_tokenizer"] = tokenizer
        has_bos = getattr(tokenizer, "bos_token_id", None) is not None
        auto_off = self.__dict__.get("_bos_default_off", False)
        if not has_bos and self.cfg.default_prepend_bos:
            self.cfg.default_prepend_bos = False
            self.__dict__["_bos_default_off"] = True
        elif has_bos and auto_off:
            self.cfg.default_prepend_bos = True
            self.__dict__["_bos_default_off"] = False

    def init_weights(self) -> None:
        """N(0, initializer_range) for embeddings and matrices (seeded by cfg.seed)."""
        gen = None
        if self.cfg.seed is not None:
            gen = torch.Generator().manual_seed(self.cfg.seed)
        std = self.cfg.initializer_range
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim >= 2 and ".attn." not in name:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)
            for block in self.blocks:
                block.attn.init_weights(gen)

    def _apply(self, fn, recurse=True):
        # to(), half(), float(), double(), bfloat16(), cuda() and cpu() all end here: keep the
        # config (saved as config.json) in step with where the weights live and their dtype.
        out = super()._apply(fn, recurse)
        self.cfg.device = str(self.W_E.device)
        self.cfg.dtype = self.W_E.dtype
        return out

    # -- forward ---------------------------------------------------------------------------
    def forward(
        self,
        input: str | list[str] | Tensor,
        return_type: ReturnType = "logits",
        attention_mask: Tensor | None = None,
        past_kv_cache: KVCache | None = None,
        loss_per_token: bool = False,
        *,
        prepend_bos: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        tokens: Tensor | None = None,
        shortformer_pos_embed: Tensor | None = None,
        pattern_heads: PatternHeads = None,
    ):
        """Run the model on text or `[batch pos]` token ids (TransformerLens's arguments).

        Args:
            input: a string, a list of strings (padded, see `padding_side`), token ids, or with
                `start_at_layer` the residual stream `[batch pos d_model]` entering that block.
            return_type: "logits", "loss" (mean next-token cross-entropy), "both" or None.
            attention_mask: `[batch pos]` 1 for real tokens, 0 for padding (also for the past
                tokens when `past_kv_cache` is given).
            past_kv_cache: a `KVCache`; the input continues the cached sequence.
            loss_per_token: return the `[batch pos-1]` losses instead of their mean.
            prepend_bos: for text input (default `cfg.default_prepend_bos`).
            padding_side: "right" (default) or "left", for a list of strings.
            start_at_layer: run blocks from this one on, `input` being their residual input.
            stop_at_layer: run blocks before this one (negative counts from the end) and return
                the residual stream `[batch pos d_model]` there, whatever `return_type`.
            tokens: the token ids, for a loss when `input` is a residual (`start_at_layer`).
            shortformer_pos_embed: only None (no variant uses shortformer positions).
            pattern_heads: `{layer: head or [heads]}` (or heads for every layer): those layers'
                `hook_pattern` carries only these heads, `[batch len(heads) query_pos
                key_pos]`, and on the fused path costs only their maps, recomputed exactly
                from the kernel's log-sum-exp (`attention/pattern_heads.py`). Passed through
                by `run_with_cache` and `run_with_hooks`.

        Example:
            >>> resid = model(tokens, stop_at_layer=1)                 # doctest: +SKIP
            >>> logits = model(resid, start_at_layer=1)                # doctest: +SKIP
        """
        if return_type not in ("logits", "loss", "both", None):
            raise ValueError(f"return_type={return_type!r}; "
                             "choose 'logits', 'loss', 'both' or None")
        if shortformer_pos_embed is not None:
            raise ValueError("shortformer_pos_embed must be None: no attnlens model uses "
                             "shortformer positions")
        n_layers = self.cfg.n_layers
        start = self._layer_index("start_at_layer", start_at_layer, 0)
        stop = self._layer_index("stop_at_layer", stop_at_layer, n_layers)
        if start > stop:
            raise ValueError(f"start_at_layer={start_at_layer} is after "
                             f"stop_at_layer={stop_at_layer}")
        if start_at_layer is not None:
            resid = self._check_resid(input)
            if tokens is not None:
                tokens = self._check_tokens(tokens)
            batch, n_new = resid.shape[:2]
        else:
            if isinstance(input, (str, list)):
                input, text_mask = self.tokenize_padded(input, prepend_bos, padding_side)
                if attention_mask is None:
                    attention_mask = text_mask
            elif padding_side is not None:
                raise ValueError("padding_side applies to text input; token ids carry their "
                                 "padding in attention_mask")
            tokens = self._check_tokens(input)
            batch, n_new = tokens.shape
        offset = 0 if past_kv_cache is None else past_kv_cache.length
        if offset + n_new > self.cfg.n_ctx:
            raise ValueError(f"sequence length {offset + n_new} exceeds n_ctx={self.cfg.n_ctx}")
        device = self.W_E.device
        full_mask = self._full_mask(attention_mask, past_kv_cache, batch, offset + n_new)
        allowed, q_pos, k_pos = self._masks(batch, n_new, offset, full_mask, device)

        with self.client_observation(), select_pattern_heads(self, pattern_heads):
            if start_at_layer is None:
                resid = self.hook_embed(self.embed(tokens))
                if self.cfg.positional_embedding_type == "standard":
                    resid = resid + self.hook_pos_embed(self.pos_embed(q_pos))
            for layer in range(start, stop):
                layer_cache = None if past_kv_cache is None else past_kv_cache.layers[layer]
                resid = self.blocks[layer](resid, allowed, q_pos, k_pos, layer_cache)
            if stop_at_layer is not None:
                return resid
            if return_type is None:
                return None
            logits = self.unembed(self.ln_final(resid))
        if return_type == "logits":
            return logits
        if tokens is None:
            raise ValueError(f"return_type={return_type!r} with start_at_layer needs tokens=")
        loss = self.loss_fn(logits, tokens, attention_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def _layer_index(self, name: str, value, default: int) -> int:
        """`value` as a block index in [0, n_layers] (negative counts from the end)."""
        n = self.cfg.n_layers
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not -n <= value <= n:
            raise ValueError(f"{name} must be an int in [{-n}, {n}], got {value!r}")
        return value % n if value < 0 else value

    def _check_resid(self, resid) -> Tensor:
        if not isinstance(resid, Tensor) or resid.ndim != 3 \
                or resid.shape[-1] != self.cfg.d_model or not resid.dtype.is_floating_point:
            raise ValueError(f"with start_at_layer, input must be the residual stream, a float "
                             f"tensor [batch, pos, d_model={self.cfg.d_model}], got "
                             f"{getattr(resid, 'shape', type(resid).__name__)}")
        return resid.to(self.W_E.device)

    def tokenize_padded(self, text: str | list[str], prepend_bos: bool | None = None,
                        padding_side: Literal["left", "right"] | None = None
                        ) -> tuple[Tensor, Tensor | None]:
        """`(tokens, attention_mask)` of a string (mask None) or a list of strings, padded on
        `padding_side` ("right" by default, as `to_tokens`)."""
        if padding_side not in (None, "left", "right"):
            raise ValueError(f"padding_side must be 'left', 'right' or None, "
                             f"got {padding_side!r}")
        if isinstance(text, list) and not all(isinstance(t, str) for t in text):
            raise ValueError("input must be a string, a list of strings or a tensor of token ids; "
                             "got a list with non-string items")
        if isinstance(text, list) and not text:
            raise ValueError("input is an empty list; pass at least one string")
        tokens = self.to_tokens(text, prepend_bos=prepend_bos)
        if isinstance(text, str):
            return tokens, None
        mask = self.padding_mask(text, prepend_bos=prepend_bos)
        if padding_side == "left":  # shift each row's real tokens to the end
            lengths = mask.sum(-1)
            width = tokens.shape[1]
            idx = (torch.arange(width, device=tokens.device)[None] - (width - lengths)[:, None])
            real = idx >= 0
            tokens = tokens.gather(1, idx.clamp(min=0)).masked_fill(~real, self._pad_id())
            mask = real.long()
        return tokens, mask

    def _check_tokens(self, tokens) -> Tensor:
        if not isinstance(tokens, Tensor):
            raise ValueError(f"input must be a string, list of strings or tensor of token ids, "
                             f"got {type(tokens).__name__}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise ValueError(f"token ids must be an integer tensor, got dtype {tokens.dtype}")
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2:
            raise ValueError(f"token ids must be [batch, pos] or [pos], got shape "
                             f"{tuple(tokens.shape)}")
        if tokens.numel() == 0:
            raise ValueError(f"empty input: token ids of shape {tuple(tokens.shape)}")
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.cfg.d_vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.cfg.d_vocab})")
        return tokens.to(self.W_E.device).long()

    def _full_mask(self, attention_mask, cache, batch, total) -> Tensor | None:
        if attention_mask is not None:
            attention_mask = torch.as_tensor(attention_mask, device=self.W_E.device)
            if attention_mask.shape[0] != batch or attention_mask.ndim != 2:
                raise ValueError(f"attention_mask must be [batch={batch}, pos], got "
                                 f"{tuple(attention_mask.shape)}")
        if cache is None:
            full = attention_mask
        else:
            n_new = total - cache.length
            if attention_mask is not None and attention_mask.shape[1] == total:
                full = attention_mask
            else:
                new = attention_mask if attention_mask is not None else (
                    torch.ones(batch, n_new, dtype=torch.long, device=self.W_E.device))
                full = new if cache.mask is None else torch.cat([cache.mask, new], dim=1)
            cache.mask = full
        if full is not None and full.shape[1] != total:
            raise ValueError(f"attention_mask covers {full.shape[1]} positions, expected {total}")
        return full

    @staticmethod
    def _masks(batch: int, n_new: int, offset: int, mask: Tensor | None, device):
        """Causal & padding mask `[batch 1 q k]` and padding-aware positions."""
        total = offset + n_new
        q_idx = torch.arange(offset, total, device=device)
        k_idx = torch.arange(total, device=device)
        allowed = (k_idx[None, :] <= q_idx[:, None])[None, None].expand(batch, 1, n_new, total)
        if mask is None:
            if offset == 0:
                mark_plain_causal(allowed)
            positions = k_idx[None].expand(batch, total)
        else:
            mask = mask.bool()
            allowed = allowed & mask[:, None, None, :]
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        return allowed, positions[:, offset:], positions

    def loss_fn(self, logits: Tensor, tokens: Tensor, attention_mask: Tensor | None = None,
                per_token: bool = False) -> Tensor:
        """Next-token cross-entropy; padded targets are excluded from the mean."""
        if tokens.shape[1] < 2:
            raise ValueError("a loss needs at least two positions")
        logits = logits[:, :-1]
        if logits.dtype in (torch.float16, torch.bfloat16):   # upcast low precision, keep float64
            logits = logits.float()
        log_probs = F.log_softmax(logits, dim=-1)
        losses = -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        if per_token:
            return losses
        if attention_mask is None:
            return losses.mean()
        # A target counts when it and the position predicting it are real tokens (with left
        # padding the first real token is otherwise "predicted" from a pad).
        keep = (attention_mask[:, 1:] * attention_mask[:, :-1]).to(losses.dtype)
        return (losses * keep).sum() / keep.sum().clamp(min=1)

    # -- hooks -----------------------------------------------------------------------------
    def _check_hook_name(self, name) -> None:
        self._refuse_switched_off(name)
        if isinstance(name, str) and name not in self.hook_dict:
            near = [n for n in self.hook_dict if n.endswith(name.split(".")[-1])][:5]
            raise ValueError(f"unknown hook name {name!r}" +
                             (f"; similar: {near}" if near else "; see model.hook_dict"))

    def _enable_hook(self, name, hook, dir="fwd"):
        self._check_hook_name(name)
        return super()._enable_hook(name, hook, dir)

    def add_hook(self, name, hook, dir="fwd", is_permanent=False, level=None, prepend=False):
        self._check_hook_name(name)
        return super().add_hook(name, hook, dir, is_permanent, level, prepend)

    def run_with_cache(self, *model_args, names_filter=None, return_cache_object: bool = True,
                       remove_batch_dim: bool = False, **kwargs):
        """Like TransformerLens: returns `(output, ActivationCache)`; unknown names raise."""
        names = [names_filter] if isinstance(names_filter, str) else names_filter
        if isinstance(names, (list, tuple)):
            for n in names:
                self._check_hook_name(n)
        names_filter = self._with_head_results(names)
        out, cache = super().run_with_cache(*model_args, names_filter=names_filter,
                                            remove_batch_dim=remove_batch_dim, **kwargs)
        if return_cache_object:
            cache = ActivationCache(cache, self, has_batch_dim=not remove_batch_dim)
        return out, cache

    def _with_head_results(self, names):
        """`names` (None, a list or a predicate), also selecting `attn.hook_result` wherever it
        selects `attn.hook_z` of a layer whose head result is not hook_z @ W_O (MTA's norm and
        gate): TransformerLens's stack_head_results would otherwise rebuild it wrongly."""
        if names is None:
            return None
        select = names.__contains__ if isinstance(names, (list, tuple)) else names
        z_of = {f"blocks.{b.layer}.attn.hook_result": f"blocks.{b.layer}.attn.hook_z"
                for b in self.blocks if b.attn.transforms_heads()}
        if not z_of:
            return names
        return lambda name: bool(select(name)) or (name in z_of and bool(select(z_of[name])))

    def stages(self, layer: int = 0) -> tuple[Stage, ...]:
        """The ordered stage catalogue of `layer`'s attention (docs/design.md contract 3)."""
        return self.blocks[layer].attn.stages

    def stage_hook_name(self, layer: int, stage: str | Stage) -> str:
        name = stage.name if isinstance(stage, Stage) else stage
        names = [s.name for s in self.stages(layer)]
        if name not in names:
            raise ValueError(f"layer {layer} ({self.cfg.attention}) has no stage {name!r}; "
                             f"stages: {names}")
        return f"blocks.{layer}.attn.hook_{name}"

    # -- weights (stacked over layers, TransformerLens layout) ------------------------------
    def _stack(self, attr: str) -> Tensor:
        # Under GQA, `attn.W_K`/`W_V`/`b_K`/`b_V` are already the per-query-head (expanded)
        # views, so every stacked weight has n_heads heads and QK/OV pair heads correctly.
        return torch.stack([getattr(b.attn, attr) for b in self.blocks])

    W_Q = property(lambda self: self._stack("W_Q"), doc="[n_layers n_heads d_model d_head]")
    W_K = property(lambda self: self._stack("W_K"), doc="[n_layers n_heads d_model d_head]")
    W_V = property(lambda self: self._stack("W_V"), doc="[n_layers n_heads d_model d_head]")
    W_O = property(lambda self: self._stack("W_O"), doc="[n_layers n_heads d_head d_model]")
    b_Q = property(lambda self: self._stack("b_Q"))
    b_K = property(lambda self: self._stack("b_K"))
    b_V = property(lambda self: self._stack("b_V"))
    b_O = property(lambda self: self._stack("b_O"))

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self.unembed.W_U

    @property
    def b_U(self) -> Float[Tensor, "d_vocab"]:  # noqa: F821 (jaxtyping axis)
        return self.unembed.b_U

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        if not hasattr(self, "pos_embed"):
            raise ValueError(f"positional_embedding_type={self.cfg.positional_embedding_type!r} "
                             "has no W_pos")
        return self.pos_embed.W_pos

    @property
    def QK(self) -> FactoredMatrix:
        """`[n_layers n_heads d_model d_model]`: W_Q W_K^T per head (right-multiplied)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """`[n_layers n_heads d_model d_model]`: W_V W_O per head (right-multiplied)."""
        return FactoredMatrix(self.W_V, self.W_O)

    def tokens_to_residual_directions(self, tokens) -> Tensor:
        """The unembedding columns (residual directions) of `tokens`."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = torch.as_tensor(tokens, device=self.W_U.device)
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.d_vocab):
            raise ValueError(f"token ids must lie in [0, {self.cfg.d_vocab})")
        return self.W_U[:, tokens].movedim(0, -1)

    def accumulated_bias(
        self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True,
    ) -> Float[Tensor, "d_model"]:  # noqa: F821 (jaxtyping axis)
        """Sum of the attention b_O (and MLP b_out) biases written before `layer`."""
        total = torch.zeros(self.cfg.d_model, device=self.W_E.device, dtype=self.W_E.dtype)
        for i in range(layer):
            total = total + self.blocks[i].attn.b_O
            if include_mlp_biases and hasattr(self.blocks[i], "mlp"):
                total = total + self.blocks[i].mlp.b_out
        if mlp_input:
            total = total + self.blocks[layer].attn.b_O
        return total

    # -- checkpoints -----------------------------------------------------------------------
    def save_pretrained(self, directory, card: dict | None = None, weights_dtype=None) -> None:
        """Write `config.json` + `model.safetensors` (+ `card.json`, + `tokenizer.json` for a
        trained tokenizer), each atomically, touching no other file in `directory`;
        `weights_dtype=torch.float16` halves the file. A path that is a plain file raises."""
        from attnlens.hooked_models.checkpoint import save_checkpoint

        save_checkpoint(self, directory, card=card, weights_dtype=weights_dtype)

    @classmethod
    def from_pretrained(cls, directory, device: str | None = None,
                        tokenizer=None) -> "HookedVariantTransformer":
        """Load a directory written by `save_pretrained` (safetensors only, never pickle), in
        eval mode; a corrupt file raises ValueError naming it (a corrupt card.json warns)."""
        from attnlens.hooked_models.checkpoint import load_checkpoint

        return load_checkpoint(cls, directory, device=device, tokenizer=tokenizer)


__all__ = ["HookedVariantTransformer", "KVCache"]
