"""The counting task of the CoPE paper (Golovneva et al. 2024, arXiv 2405.18719, Table 3).

Re-implements the semantics of the official generator (facebookresearch/RAM,
projects/cope/scripts/count_data_gen.py): a program of 3..`max_steps` statements over `n_vars`
variables (a, b, ...), each drawn with weights set 1 (`x = 0 ;`), pass 50 (`pass;`) and
increment 7 (`x ++;`, only on a variable already set and while its value stays <= 10); then the
query `print x` for a variable that was set, and the answer, x's current value. Tokens are the
whitespace-separated words, as the official word tokenizer splits them.

The batch format and its metric, `answer_error_rate`, live in `attnlens.interp.tasks._batch` (shared
with flip-flop and selective copy).

Example:
    >>> batch = counting_batch(2, n_vars=3, max_steps=8, seed=0)
    >>> batch.tokens.shape[0], batch.answer_mask.sum().item()
    (2, 2)
    >>> batch.texts[0].split()[-3] == "print"
    True
"""

from __future__ import annotations

import random
import string

from attnlens.interp.tasks._batch import BOS, PAD, TaskBatch, make_batch

MAX_VAL = 10
OP_WEIGHTS = {"set": 1, "pass": 50, "increment": 7}
VARIABLES = string.ascii_lowercase
VOCAB: tuple[str, ...] = (BOS, PAD, "=", ";", "++;", "pass;", "print",
                          *(str(n) for n in range(MAX_VAL + 1)), *VARIABLES)


class _Retry(Exception):
    """A draw that the official generator rejects and redraws (GenerationFail)."""


def _statement(rng: random.Random, names: str, state: dict[str, int]) -> list[str]:
    op = rng.choices(list(OP_WEIGHTS), weights=list(OP_WEIGHTS.values()))[0]
    if op == "set":
        var = rng.choice(names)
        state[var] = 0
        return [var, "=", "0", ";"]
    if op == "pass":
        return ["pass;"]
    if not state:
        raise _Retry
    var = rng.choice(sorted(state))
    if state[var] + 1 > MAX_VAL:
        raise _Retry
    state[var] += 1
    return [var, "++;"]


def counting_program(rng: random.Random, n_vars: int = 3, max_steps: int = 512,
                     min_steps: int = 3) -> tuple[list[str], str, int]:
    """One program: (context words, queried variable, its value at the end)."""
    for _ in range(1000):
        names, state, words = VARIABLES[:n_vars], {}, []
        try:
            for _ in range(rng.randint(min_steps, max_steps)):
                for _ in range(100):
                    try:
                        words += _statement(rng, names, state)
                        break
                    except _Retry:
                        continue
                else:
                    raise _Retry
            if not state:  # nothing was ever set: print has no variable to ask about
                raise _Retry
        except _Retry:
            continue
        var = rng.choice(sorted(state))
        return words, var, state[var]
    raise RuntimeError("could not draw a counting program in 1000 tries")


def counting_batch(batch: int, n_vars: int = 3, max_steps: int = 512, min_steps: int = 3,
                   seed: int | None = None) -> TaskBatch:
    """`batch` counting samples: `<bos> program print x value`, the value being the answer.

    Args:
        n_vars: number of variables (the paper reports 1, 3 and 5).
        max_steps / min_steps: statements per program are uniform in [min_steps, max_steps]
            (official: 3..512).
        seed: seeds Python's `random.Random` for reproducible batches.

    Returns:
        A TaskBatch over `VOCAB`; answer_mask marks the one value token per sample.
    """
    if not 1 <= n_vars <= len(VARIABLES):
        raise ValueError(f"n_vars must be in [1, {len(VARIABLES)}], got {n_vars}")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    rng = random.Random(seed)
    samples = []
    for _ in range(batch):
        words, var, value = counting_program(rng, n_vars, max_steps, min_steps)
        samples.append([(w, False) for w in words + ["print", var]] + [(str(value), True)])
    return make_batch(samples, VOCAB)
