"""Selective copy (Gu & Dao 2023, Mamba), as used in the CoPE paper (Golovneva et al. 2024,
Table 2): copy the non-blank tokens in order and drop the blanks (`DBBCFBFBE -> DCFFE`).

A sample is `n_data` symbols scattered at random positions among `n_blanks` blanks `.`, then the
separator `|` and the symbols again in order: those copies are the answers. Blank counts per
split follow a secondary, unverified account of the CoPE set-up: in-distribution 256,
out-of-distribution dense 128 and sparse 512.

Example:
    >>> batch = selective_copy_batch(1, n_data=3, n_blanks=4, seed=0)
    >>> words = batch.decode(0)[1:]
    >>> [w for w in words[:7] if w != "."] == words[8:]
    True
"""

from __future__ import annotations

import random
import string

from attnlens.interp.tasks._batch import BOS, PAD, TaskBatch, answer_error_rate, make_batch

BLANK, SEPARATOR = ".", "|"
SYMBOLS = string.ascii_uppercase
VOCAB: tuple[str, ...] = (BOS, PAD, BLANK, SEPARATOR, *SYMBOLS)
SPLITS = {"train": 256, "dense": 128, "sparse": 512}


def selective_copy_sequence(rng: random.Random, n_data: int = 16, n_blanks: int = 256,
                            n_symbols: int = 16) -> list[tuple[str, bool]]:
    """One sample as (word, is_answer) pairs: scattered symbols, `|`, the symbols in order."""
    data = [rng.choice(SYMBOLS[:n_symbols]) for _ in range(n_data)]
    slots = set(rng.sample(range(n_data + n_blanks), n_data))
    stream, it = [], iter(data)
    for pos in range(n_data + n_blanks):
        stream.append(next(it) if pos in slots else BLANK)
    return [(w, False) for w in stream] + [(SEPARATOR, False)] + [(w, True) for w in data]


def selective_copy_batch(batch: int, n_data: int = 16, split: str = "train",
                         n_blanks: int | None = None, n_symbols: int = 16,
                         seed: int | None = None) -> TaskBatch:
    """`batch` selective-copy samples of `2 * n_data + n_blanks + 1` tokens after BOS.

    Args:
        n_data: symbols to copy per sample.
        split: "train" (256 blanks), "dense" (128) or "sparse" (512).
        n_blanks: overrides the split's number of blanks.
        n_symbols: symbols are drawn uniformly from the first n_symbols capital letters.
        seed: seeds Python's `random.Random`.

    Returns:
        A TaskBatch over `VOCAB`; answer_mask marks the copied symbols after `|`.
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {sorted(SPLITS)}")
    blanks = SPLITS[split] if n_blanks is None else n_blanks
    if n_data < 1 or blanks < 0 or batch < 1:
        raise ValueError(f"need n_data >= 1, n_blanks >= 0, batch >= 1; got {n_data}, "
                         f"{blanks}, {batch}")
    if not 1 <= n_symbols <= len(SYMBOLS):
        raise ValueError(f"n_symbols must be in [1, {len(SYMBOLS)}], got {n_symbols}")
    rng = random.Random(seed)
    samples = [selective_copy_sequence(rng, n_data, blanks, n_symbols) for _ in range(batch)]
    return make_batch(samples, VOCAB)


def selective_copy_error_rate(logits, batch: TaskBatch, per: str = "token") -> float:
    """Error on the copied symbols (teacher forced): per "token" (default) or per "sample"."""
    return answer_error_rate(logits, batch, per=per)
