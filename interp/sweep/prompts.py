"""Prompt sources of a sweep: task generators (with a seed and a count) and text files.

A source turns (model, seed, count, args) into `count` 1-D token-id tensors; a shard takes the
slice [start, stop) of that list, so a prompt's tokens do not depend on how the set is sharded.
Task sources strip their right padding (prompts of one set may differ in length; the shard
runner groups equal lengths). The generators are those of `attnlens.interp.tasks`; nothing is
sampled here that the task modules do not sample themselves.

Example:
    >>> prompts = make_prompts(model, {"task": "induction", "seed": 0, "count": 4,
    ...                                "args": {"half_len": 8}})      # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from attnlens.interp.tasks import counting, flip_flop, selective_copy
from attnlens.interp.tasks.induction import repeated_tokens


def _induction(model, count: int, seed: int, half_len: int | None = None,
               bos: int | None = 0) -> list[Tensor]:
    half = max(2, min(32, (model.cfg.n_ctx - 1) // 2)) if half_len is None else half_len
    toks = repeated_tokens(count, half, model.cfg.d_vocab, bos=bos, seed=seed)
    return list(toks.unbind(0))


def _unpad(batch) -> list[Tensor]:
    pairs = zip(batch.tokens, batch.attention_mask, strict=True)
    return [row[mask.bool()].clone() for row, mask in pairs]


def _word_task(generator: Callable) -> Callable:
    def make(model, count: int, seed: int, **kw) -> list[Tensor]:
        batch = generator(count, seed=seed, **kw)
        if len(batch.vocab) > model.cfg.d_vocab:
            raise ValueError(f"the task's vocabulary has {len(batch.vocab)} words; the model's "
                             f"d_vocab is {model.cfg.d_vocab}")
        return _unpad(batch)
    make.__wrapped__ = generator   # signature of the arguments a spec may pass
    return make


# task name -> fn(model, count, seed, **args) -> list of 1-D token tensors
TASKS: dict[str, Callable[..., list[Tensor]]] = {
    "induction": _induction,
    "counting": _word_task(counting.counting_batch),
    "flip_flop": _word_task(flip_flop.flip_flop_batch),
    "selective_copy": _word_task(selective_copy.selective_copy_batch),
}


def read_lines(path: str | Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file (one prompt per line, trailing newline dropped)."""
    text = Path(path).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def _text(model, path: str, count: int | None) -> list[Tensor]:
    if getattr(model, "tokenizer", None) is None:
        raise ValueError(f"prompts from {path!r} need a model with a tokenizer; this "
                         f"{model.cfg.attention!r} model has none")
    lines = read_lines(path)
    if count is not None:
        lines = lines[:count]
    return [model.to_tokens(line)[0].cpu() for line in lines]


def make_prompts(model, source: dict) -> list[Tensor]:
    """All prompts of a prompt-set entry (a validated spec dict) for `model`, on the CPU.

    Raises ValueError when a prompt does not fit the model's context.
    """
    if "file" in source:
        prompts = _text(model, source["file"], source.get("count"))
    else:
        prompts = TASKS[source["task"]](model, source["count"], source["seed"],
                                        **source.get("args", {}))
    for i, p in enumerate(prompts):
        if p.numel() > model.cfg.n_ctx:
            raise ValueError(f"prompt set {source['name']!r}: prompt {i} has {p.numel()} "
                             f"tokens; the model's n_ctx is {model.cfg.n_ctx}")
        if p.numel() == 0:
            raise ValueError(f"prompt set {source['name']!r}: prompt {i} is empty")
    return [p.to(torch.long) for p in prompts]
