"""The paper tasks of the zoo as circuit-discovery tasks: MTA's find-the-block and DCMHA's
two-attribute conjunction (prompts, corruptions and metrics).

- `find_block_task`: clean prompts are find-the-block samples of the task the model was trained
  on (`attnlens.interp.tasks.find_block.CPU_TASK`, its answer variant read from the checkpoint's
  recipe), with the answer appended (teacher forcing). The corrupted prompt replaces the target
  block's letters by distinct letters that are none of the query's, so no block matches the query
  any more; everything else (the other blocks, the query, the answer tokens) is kept. Metric: mean
  log-probability of the clean answer token(s).
- `conjunction_task_pair`: clean prompts are `attnlens.interp.tasks.conjunction` lookups. Two
  corruptions: "attribute" (the conjunction) changes one attribute of the target record (its
  colour on even prompts, its shape on odd ones) to one no record uses, so the record keeps one
  match with the query like the distractors do, and no record has both; "value" replaces the
  target record's value by a value absent from the prompt (what a model that copies a value from
  the context without finding the record responds to). Metric: the log-probability of the
  target's value at the answer position, or ("logit_diff") its logit minus the mean logit of
  the distractor pairs' values (0 when single-attribute matches are only added: they tie).

Example:
    >>> from attnlens.hooked_models import zoo
    >>> model = zoo.load("mta-findblock-last-mta-s0")
    >>> task = find_block_task(model, n_prompts=4, seed=0)
    >>> task.clean.shape == task.corrupted.shape, bool((task.clean != task.corrupted).any())
    (True, True)
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from attnlens.interp._common import check_int
from attnlens.interp.circuits.discovery.induction import Task
from attnlens.interp.circuits.discovery.metrics import logprob_metric
from attnlens.interp.tasks.conjunction import conjunction_task
from attnlens.interp.tasks.find_block import CPU_TASK, VARIANTS, FindBlockTask

FIND_BLOCK_VARIANTS = {v.lower(): v for v in VARIANTS}


def model_variant(model) -> str:
    """The find-the-block answer variant ("First", "Last" or "All") from the checkpoint's
    recipe name (`mta-findblock-<variant>-...`); ValueError when the model carries none."""
    recipe = str(model.cfg.metadata.get("recipe", ""))
    prefix = "mta-findblock-"       # the zoo's recipe names (attnlens.lab.paper.mta)
    answer = recipe.removeprefix(prefix).split("-")[0]
    if recipe.startswith(prefix) and answer in FIND_BLOCK_VARIANTS:
        return FIND_BLOCK_VARIANTS[answer]
    raise ValueError(f"cannot read the find-the-block variant from the model's recipe "
                     f"{recipe!r}; pass variant= ('First', 'Last' or 'All')")


def find_block_task(model, n_prompts: int = 32, seed: int = 0, variant: str | None = None,
                    task_args: dict | None = None) -> Task:
    """Clean find-the-block prompts (+ answer) vs the same with the target block's letters
    replaced by letters outside the query; `task_args` default to the zoo's `CPU_TASK`."""
    check_int("n_prompts", n_prompts)
    variant = variant or model_variant(model)
    task = FindBlockTask(**{**CPU_TASK, **(task_args or {}), "variant": variant})
    if task.n_tokens > model.cfg.n_ctx:
        raise ValueError(f"the task needs {task.n_tokens} positions, more than "
                         f"n_ctx={model.cfg.n_ctx}")
    samples = task.generate(n_prompts, seed=seed)
    batch = task.to_tokens(samples)
    tok = task.tokenizer()
    rng = random.Random(seed + 1)
    corrupted = batch.tokens.clone()
    for row, s in enumerate(samples):
        others = [c for c in task.alphabet if c not in s.query]
        taken = set(s.blocks)
        while True:
            block = "".join(rng.sample(others, task.block_length))
            if block not in taken:
                break
        start = 1 + sum(len(b) + 1 for b in s.blocks[:s.target_index])
        corrupted[row, start:start + task.block_length] = torch.tensor(tok.encode(block))
    positions = range(batch.answer_start - 1, batch.tokens.shape[1] - 1)
    device = model.W_E.device
    return Task(batch.tokens.to(device), corrupted.to(device),
                logprob_metric(batch.tokens, positions), 0,
                f"find the block ({variant}): {n_prompts} prompts of {task.n_blocks} blocks of "
                f"{task.block_length} letters out of {task.vocab_size} (seed {seed}); corrupted: "
                f"the target block's letters replaced by letters outside the query; metric: "
                f"mean log-prob of the answer")


def _free(used: set[int], n: int, rng: random.Random) -> int:
    free = [i for i in range(n) if i not in used]
    return rng.choice(free)


CORRUPTIONS = ("attribute", "value")


def conjunction_task_pair(model, n_prompts: int = 32, seed: int = 0, corrupt: str = "attribute",
                          metric: str = "logprob", **task_kwargs) -> Task:
    """Clean conjunction lookups vs corrupted ones: `corrupt="attribute"` replaces one
    attribute of the target record (colour on even prompts, shape on odd ones) by one no record
    uses, "value" its value by one absent from the prompt. `metric` is "logprob" (of the
    target value at the answer's position) or "logit_diff" (target value - mean
    distractor-pair value). The answer token stays the clean one in both."""
    check_int("n_prompts", n_prompts)
    if corrupt not in CORRUPTIONS:
        raise ValueError(f"corrupt={corrupt!r}; choose one of {list(CORRUPTIONS)}")
    if metric not in ("logit_diff", "logprob"):
        raise ValueError(f"metric={metric!r}; choose 'logit_diff' or 'logprob'")
    batch = conjunction_task(n_prompts, seed=seed, **task_kwargs)
    vocab = batch.vocab
    if batch.tokens.shape[1] > model.cfg.n_ctx or len(vocab) > model.cfg.d_vocab:
        raise ValueError(f"the task needs {batch.tokens.shape[1]} positions and {len(vocab)} "
                         f"words; the model has n_ctx={model.cfg.n_ctx}, "
                         f"d_vocab={model.cfg.d_vocab}")
    pools = [[i for i, w in enumerate(vocab) if w.startswith(p)] for p in "csv"]
    rng = random.Random(seed + 1)
    tokens = batch.tokens
    corrupted = tokens.clone()
    n_rec = (tokens.shape[1] - 5) // 3
    pairs = []
    for row in range(n_prompts):
        rec = tokens[row, 1:1 + 3 * n_rec].view(n_rec, 3)
        c, s = int(tokens[row, -3]), int(tokens[row, -2])
        t = int(batch.target_record[row])
        attr = 2 if corrupt == "value" else row % 2
        pool = pools[attr]
        used = {pool.index(int(x)) for x in tokens[row, 1:] if int(x) in pool}
        corrupted[row, 1 + 3 * t + attr] = pool[_free(used, len(pool), rng)]
        pairs.append([int(rec[r, 2]) for r in range(n_rec) if r != t
                      and (int(rec[r, 0]) == c) != (int(rec[r, 1]) == s)])
    answer = tokens[:, -1]
    position = tokens.shape[1] - 2
    if metric == "logprob":
        fn = logprob_metric(tokens, [position])
        text = "log-prob of the target's value"
    else:
        distract = torch.tensor(pairs)

        def fn(logits: Tensor) -> Tensor:
            row = logits[:, position]
            a = row.gather(-1, answer[:, None].to(row.device))[:, 0]
            b = row.gather(-1, distract.to(row.device)).mean(-1)
            return (a - b).mean()
        text = "logit of the target's value - mean logit of the distractor pairs' values"
    device = model.W_E.device
    return Task(tokens.to(device), corrupted.to(device), fn, 0,
                f"conjunction: {n_prompts} lookups (seed {seed}); corrupted: the target "
                f"record's " + ("value replaced by one absent from the prompt"
                                if corrupt == "value" else "colour (even prompts) or shape "
                                "(odd) replaced by an unused one") + f"; metric: {text}")


__all__ = ["CORRUPTIONS", "conjunction_task_pair", "find_block_task", "model_variant"]
