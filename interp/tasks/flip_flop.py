"""Flip-Flop language modelling (Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop
Language Modeling"), as used in the CoPE paper (Golovneva et al. 2024, Table 2).

A sequence is `n_instructions` pairs `instruction bit`. Instructions are write `w`, read `r` and
ignore `i`, with P(i) = p_ignore and P(w) = P(r) = (1 - p_ignore) / 2; the first instruction is a
write and the last a read. Bits after w and i are uniform; the bit after r must repeat the most
recent write: these read bits are the answers. The standard FFLM splits (HF `synthseq/flipflop`):
train FFL(0.8), out-of-distribution dense FFL(0.1) and sparse FFL(0.98), 256 instructions.
Which OOD split the CoPE paper reports is not stated (most likely the sparse one).

Example:
    >>> batch = flip_flop_batch(2, n_instructions=6, split="dense", seed=0)
    >>> batch.tokens.shape, batch.texts[0].split()[0]
    (torch.Size([2, 13]), 'w')
"""

from __future__ import annotations

import random

from attnlens.interp.tasks._batch import BOS, PAD, TaskBatch, answer_error_rate, make_batch

VOCAB: tuple[str, ...] = (BOS, PAD, "w", "r", "i", "0", "1")
SPLITS = {"train": 0.8, "dense": 0.1, "sparse": 0.98}


def flip_flop_sequence(rng: random.Random, n_instructions: int = 256,
                       p_ignore: float = 0.8) -> list[tuple[str, bool]]:
    """One FFL(p_ignore) sequence as (word, is_answer) pairs; read bits are the answers."""
    p_write = (1.0 - p_ignore) / 2
    words: list[tuple[str, bool]] = []
    memory = None
    for step in range(n_instructions):
        if step == 0:
            op = "w"
        elif step == n_instructions - 1:
            op = "r"
        else:
            op = rng.choices("wri", weights=(p_write, p_write, p_ignore))[0]
        if op == "r":
            words += [("r", False), (memory, True)]
            continue
        bit = rng.choice("01")
        if op == "w":
            memory = bit
        words += [(op, False), (bit, False)]
    return words


def flip_flop_batch(batch: int, n_instructions: int = 256, split: str = "train",
                    p_ignore: float | None = None, seed: int | None = None) -> TaskBatch:
    """`batch` Flip-Flop sequences of `2 * n_instructions` tokens after BOS.

    Args:
        split: "train" (in-distribution, p_ignore 0.8), "dense" (0.1) or "sparse" (0.98).
        p_ignore: overrides the split's probability of the ignore instruction.
        seed: seeds Python's `random.Random`.

    Returns:
        A TaskBatch over `VOCAB`; answer_mask marks every read bit (score per="token").
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {sorted(SPLITS)}")
    p = SPLITS[split] if p_ignore is None else p_ignore
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p_ignore must be in [0, 1), got {p}")
    if n_instructions < 2 or batch < 1:
        raise ValueError(f"need n_instructions >= 2 and batch >= 1, got {n_instructions}, "
                         f"{batch}")
    rng = random.Random(seed)
    return make_batch([flip_flop_sequence(rng, n_instructions, p) for _ in range(batch)], VOCAB)


def flip_flop_error_rate(logits, batch: TaskBatch, per: str = "token") -> float:
    """Error on the read bits (teacher forced): per "token" (default) or per "sample"."""
    return answer_error_rate(logits, batch, per=per)
