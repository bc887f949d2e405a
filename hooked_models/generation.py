"""`generate` with TransformerLens's arguments, mixed into `HookedVariantTransformer`.

Like TransformerLens, the default is to sample (`do_sample=True`, `temperature=1.0`); pass
`do_sample=False` (or `temperature=0`) for greedy decoding, and `seed=` (ours) for a
reproducible draw. A string prompt returns a string, a list of strings a list of strings
(batched, left-padded), token ids return token ids; `return_type` overrides.

Example:
    >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
    >>> model = HookedVariantTransformer(VariantConfig(d_model=32, d_head=8, n_layers=1,
    ...     n_ctx=32, d_vocab=12, tokenizer_alphabet="abcde", seed=0))
    >>> text = model.generate("abcab", 3, do_sample=False, verbose=False)
    >>> len(text)
    8
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from tqdm.auto import tqdm

RETURN_TYPES = ("input", "str", "tokens")


def _check(name: str, ok: bool, allowed: str, value) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def sample_next(logits: Tensor, tokens: Tensor, *, do_sample: bool, temperature: float,
                top_k: int | None, top_p: float | None, freq_penalty: float,
                repetition_penalty: float, generator: torch.Generator | None) -> Tensor:
    """`[batch 1]` next ids from the last-position `logits` `[batch d_vocab]`.

    TransformerLens's `sample_logits` semantics (repetition penalty on logits of seen tokens,
    then temperature, frequency penalty, top-k or top-p), drawn with `generator`.
    """
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if repetition_penalty != 1.0:
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, tokens, True)
        penalised = torch.where(logits > 0, logits / repetition_penalty,
                                logits * repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    if not do_sample or temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if freq_penalty > 0:
        counts = torch.zeros_like(logits).scatter_add_(1, tokens, torch.ones_like(
            tokens, dtype=logits.dtype))
        logits = logits - freq_penalty * counts
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    elif top_p is not None:
        order = logits.argsort(-1, descending=True)
        probs = torch.softmax(logits.gather(-1, order), -1)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it included).
        drop_sorted = probs.cumsum(-1) - probs >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(logits.float(), -1)
    return torch.multinomial(probs, 1, generator=generator)


class GenerationMixin:
    @torch.no_grad()
    def generate(self, input: str | list[str] | Tensor = "", max_new_tokens: int = 10,
                 stop_at_eos: bool = True, eos_token_id: int | list[int] | None = None,
                 do_sample: bool = True, top_k: int | None = None, top_p: float | None = None,
                 temperature: float = 1.0, freq_penalty: float = 0.0,
                 repetition_penalty: float = 1.0, use_past_kv_cache: bool = True,
                 prepend_bos: bool | None = None, padding_side: str | None = None,
                 return_type: str = "input", verbose: bool = True, *,
                 attention_mask: Tensor | None = None, seed: int | None = None,
                 use_cache: bool | None = None):
        """Continue `input` by `max_new_tokens` tokens (TransformerLens's signature).

        Args:
            input: a string, a list of strings (left-padded so every row ends at its last real
                token) or `[batch pos]` token ids (`attention_mask` marks their padding).
            stop_at_eos / eos_token_id: a row stops (and is padded with EOS) once it emits EOS;
                EOS is `eos_token_id`, else the tokenizer's; with neither (the character
                tokenizer has no EOS) nothing stops early.
            do_sample: sample (default, as TransformerLens); False: greedy (argmax).
            top_k / top_p / temperature / freq_penalty / repetition_penalty: as
                TransformerLens's `sample_logits` (temperature 0 is greedy).
            use_past_kv_cache: incremental decoding with a `KVCache` (`use_cache` is the older
                name); variants that keep no KV cache (Infini-attention) re-run the prefix.
            prepend_bos: for string input (default `cfg.default_prepend_bos`).
            padding_side: None or "left" for a list of strings (generation always left-pads).
            return_type: "input" (the type of `input`), "str" or "tokens".
            verbose: a progress bar over the new tokens.
            seed: seeds the sampling (ours; TransformerLens uses the global RNG).

        Returns:
            A string, a list of strings or `[batch pos+new]` ids; strings leave out the BOS
            and padding that tokenization added.
        """
        _check("max_new_tokens", isinstance(max_new_tokens, int) and not isinstance(
            max_new_tokens, bool) and max_new_tokens >= 0, "an int >= 0", max_new_tokens)
        _check("temperature", _is_number(temperature) and temperature >= 0,
               "a finite number >= 0 (0: greedy)", temperature)
        _check("top_k", top_k is None or (isinstance(top_k, int) and not isinstance(top_k, bool)
                                          and top_k > 0), "None or an int > 0", top_k)
        _check("top_p", top_p is None or (_is_number(top_p) and 0 < top_p <= 1),
               "None or in (0, 1]", top_p)
        _check("freq_penalty", _is_number(freq_penalty) and freq_penalty >= 0,
               "a finite number >= 0", freq_penalty)
        _check("repetition_penalty", _is_number(repetition_penalty) and repetition_penalty > 0,
               "a finite number > 0", repetition_penalty)
        _check("return_type", return_type in RETURN_TYPES, f"one of {RETURN_TYPES}", return_type)
        _check("padding_side", padding_side in (None, "left"),
               "None or 'left' (generation left-pads batched prompts so every row ends at its "
               "last real token)", padding_side)
        if use_cache is not None:
            use_past_kv_cache = use_cache
        if isinstance(input, str) or isinstance(input, list):
            if attention_mask is not None:
                raise ValueError("attention_mask is for token-id input; text is masked itself")
            tokens, mask = self.tokenize_padded(input, prepend_bos=prepend_bos,
                                                padding_side="left")
            input_type = "str" if isinstance(input, str) else "list"
        else:
            tokens, mask = self._check_tokens(input), attention_mask
            if mask is not None:
                mask = torch.as_tensor(mask, device=tokens.device).long()
                if mask.shape != tokens.shape:
                    raise ValueError(f"attention_mask shape {tuple(mask.shape)} does not match "
                                     f"the prompt's {tuple(tokens.shape)}")
            input_type = "tokens"
        stops = self._stop_ids(stop_at_eos, eos_token_id)
        gen = torch.Generator(device=tokens.device).manual_seed(seed) if seed is not None else None
        from attnlens.hooked_models.model import KVCache  # model.py imports this module

        use_past_kv_cache = use_past_kv_cache and all(b.attn.supports_kv_cache
                                                      for b in self.blocks)
        cache = KVCache(self.cfg.n_layers) if use_past_kv_cache else None
        prompt_len = tokens.shape[1]
        finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        step_in, step_mask = tokens, mask
        for _ in tqdm(range(max_new_tokens), disable=not verbose):
            if cache is not None:
                logits = self(step_in, attention_mask=step_mask, past_kv_cache=cache)[:, -1]
            else:
                logits = self(tokens, attention_mask=mask)[:, -1]
            nxt = sample_next(logits, tokens, do_sample=do_sample, temperature=temperature,
                              top_k=top_k, top_p=top_p, freq_penalty=freq_penalty,
                              repetition_penalty=repetition_penalty, generator=gen)
            if stops:
                nxt = torch.where(finished[:, None], torch.full_like(nxt, stops[0]), nxt)
                finished |= torch.isin(nxt[:, 0], torch.tensor(stops, device=nxt.device))
            tokens = torch.cat([tokens, nxt], dim=1)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            step_in, step_mask = nxt, None
            if stops and bool(finished.all()):
                break
        if return_type == "tokens" or (return_type == "input" and input_type == "tokens"):
            return tokens
        texts = self._generated_texts(tokens, mask, prompt_len, input_type, prepend_bos)
        return texts[0] if input_type == "str" else texts

    def _stop_ids(self, stop_at_eos: bool, eos_token_id) -> list[int]:
        if not stop_at_eos:
            return []
        if eos_token_id is None:
            eos_token_id = getattr(self.tokenizer, "eos_token_id", None)
        if eos_token_id is None:
            return []
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < self.cfg.d_vocab:
                raise ValueError(f"eos_token_id {i!r} is outside the vocabulary "
                                 f"[0, {self.cfg.d_vocab})")
        return ids

    def _generated_texts(self, tokens: Tensor, mask: Tensor | None, prompt_len: int,
                         input_type: str, prepend_bos: bool | None) -> list[str]:
        """Each row's text without the padding and the BOS that tokenization added."""
        if prepend_bos is None:
            prepend_bos = self.cfg.default_prepend_bos
        skip_bos = input_type in ("str", "list") and prepend_bos
        texts = []
        for b, row in enumerate(tokens):
            start = 0 if mask is None else int((mask[b, :prompt_len] == 0).sum())
            ids = row[start + int(skip_bos):]
            texts.append(self.to_string(ids) if len(ids) else "")
        return texts


__all__ = ["GenerationMixin", "sample_next"]
