"""Shared batch format of the word-level toy tasks (counting, flip-flop, selective copy).

A task sample is a list of (word, is_answer) pairs; `make_batch` encodes samples with BOS first
and right padding, and `answer_error_rate` scores teacher-forced predictions on the answers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BOS, PAD = "<bos>", "<pad>"


@dataclass
class TaskBatch:
    """A batch of a toy task, right-padded.

    Attributes:
        tokens: `[batch pos]` int64 ids into `vocab`, starting with BOS (id 0).
        answer_mask: `[batch pos]` bool, True at the tokens a model is scored on.
        attention_mask: `[batch pos]` int64, 1 for real tokens, 0 for padding.
        texts: the samples as space-separated words (without BOS and padding).
        vocab: the id -> word table (a model needs d_vocab >= len(vocab)).
    """

    tokens: Tensor
    answer_mask: Tensor
    attention_mask: Tensor
    texts: list[str]
    vocab: tuple[str, ...]

    def decode(self, row: int) -> list[str]:
        """The words of sample `row`, padding dropped."""
        ids = self.tokens[row][self.attention_mask[row].bool()]
        return [self.vocab[i] for i in ids.tolist()]


def make_batch(samples: list[list[tuple[str, bool]]], vocab: tuple[str, ...]) -> TaskBatch:
    """Encode samples given as (word, is_answer) lists: BOS first, right padding with <pad>."""
    index = {w: i for i, w in enumerate(vocab)}
    length = 1 + max(len(s) for s in samples)
    tokens = torch.full((len(samples), length), index[PAD], dtype=torch.long)
    answer = torch.zeros(len(samples), length, dtype=torch.bool)
    attention = torch.zeros(len(samples), length, dtype=torch.long)
    for row, sample in enumerate(samples):
        tokens[row, 0] = index[BOS]
        tokens[row, 1:len(sample) + 1] = torch.tensor([index[w] for w, _ in sample])
        answer[row, 1:len(sample) + 1] = torch.tensor([a for _, a in sample])
        attention[row, :len(sample) + 1] = 1
    texts = [" ".join(w for w, _ in s) for s in samples]
    return TaskBatch(tokens, answer, attention, texts, vocab)


def answer_error_rate(logits: Tensor, batch: TaskBatch, per: str = "sample") -> float:
    """Teacher-forced answer error: token t counts as predicted by argmax(logits[:, t-1]).

    Args:
        logits: `[batch pos d_vocab]` from a forward pass on `batch.tokens`.
        batch: the TaskBatch the logits belong to.
        per: "sample" (fraction of samples with any wrong answer token) or "token" (fraction
            of wrong answer tokens).

    Returns:
        The error rate in [0, 1].
    """
    if logits.ndim != 3 or logits.shape[:2] != batch.tokens.shape:
        raise ValueError(f"logits must be [batch, pos, d_vocab] matching tokens "
                         f"{tuple(batch.tokens.shape)}, got {tuple(logits.shape)}")
    if per not in ("sample", "token"):
        raise ValueError(f"per={per!r}; choose 'sample' or 'token'")
    mask = batch.answer_mask[:, 1:].to(logits.device)
    wrong = (logits[:, :-1].argmax(-1) != batch.tokens[:, 1:].to(logits.device)) & mask
    if per == "token":
        return (wrong.sum() / mask.sum().clamp(min=1)).item()
    scored = mask.any(1)
    return (wrong.any(1)[scored].float().mean()).item() if scored.any() else 0.0
