"""Edge scores on any batch of prompts, with a corruption drawn from each prompt alone: what
`attnlens sweep`'s `circuit` analysis runs on every prompt shard.

A prompt's corruption depends only on its own tokens and `seed` (a generator seeded by a hash of
both), never on the other prompts of its batch, so splitting a prompt set into shards changes no
corrupted prompt. The metric is a batch mean and each prompt's forward is independent of the
others', so an edge's score on a batch is the mean of its per-prompt scores: the prompt-weighted
mean of the shards' scores is the score on all prompts at once.

Corruptions (positions after the first token, which is BOS for the sweep's tasks):

- "first_half": tokens 1 .. h of a prompt of length 1 + 2h (`[BOS] r r` -> `[BOS] r' r`, the
  induction task), metric: mean log-probability of the next token over the second half
  (positions h + 1 .. 2h - 1), as `induction_task`;
- "all": every token after the first, metric: mean log-probability of the next token at every
  position.

Example:
    >>> table = prompt_edge_scores(model, tokens, corrupt="first_half")   # doctest: +SKIP
    >>> table.columns.tolist()[:4]                                       # doctest: +SKIP
    ['edge', 'edge_kind', 'src', 'dst']
"""

from __future__ import annotations

import zlib

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import check_int
from attnlens.interp.circuits.discovery.graph import build_graph
from attnlens.interp.circuits.discovery.metrics import logprob_metric
from attnlens.interp.circuits.discovery.scoring import attribution_patching, eap_ig

CORRUPTIONS = ("first_half", "all")


def corrupt_prompts(tokens: Tensor, d_vocab: int, corrupt: str = "first_half", seed: int = 0,
                    low: int = 1) -> tuple[Tensor, range]:
    """Corrupted copies of `tokens` `[batch pos]` (random ids in [low, d_vocab), each row from
    a generator seeded by its own tokens and `seed`) and the positions the metric reads."""
    if corrupt not in CORRUPTIONS:
        raise ValueError(f"corrupt={corrupt!r}; choose one of {list(CORRUPTIONS)}")
    n_pos = tokens.shape[1]
    if corrupt == "first_half":
        if n_pos < 5 or (n_pos - 1) % 2:
            raise ValueError(f"corrupt='first_half' needs prompts of length 1 + 2h with "
                             f"h >= 2 ([BOS] r r), got length {n_pos}")
        half = (n_pos - 1) // 2
        span, positions = slice(1, 1 + half), range(1 + half, 2 * half)
    else:
        if n_pos < 2:
            raise ValueError(f"corrupt='all' needs prompts of >= 2 tokens, got {n_pos}")
        span, positions = slice(1, n_pos), range(0, n_pos - 1)
    out = tokens.clone()
    width = span.stop - span.start
    for row in range(tokens.shape[0]):
        body = tokens[row].cpu().to(torch.int64).numpy().tobytes()
        gen = torch.Generator().manual_seed(zlib.crc32(body) * 1_000_003 + seed)
        out[row, span] = torch.randint(low, d_vocab, (width,), generator=gen).to(out)
    return out, positions


def prompt_edge_scores(model, tokens: Tensor, corrupt: str = "first_half", method: str = "eap-ig",
                       steps: int = 5, seed: int = 0) -> pd.DataFrame:
    """Every edge's score on `tokens` (clean) against `corrupt_prompts(tokens)`: columns edge,
    edge_kind, src, dst, score (mean over the prompts), score_sum (score x prompts), and the
    metric's clean and corrupted values (batch means) repeated on every row."""
    if method not in ("eap-ig", "attribution"):
        raise ValueError(f"method={method!r}; choose 'eap-ig' or 'attribution'")
    check_int("steps", steps)
    corrupted, positions = corrupt_prompts(tokens, model.cfg.d_vocab, corrupt, seed)
    metric = logprob_metric(tokens, positions)
    graph = build_graph(model)
    with torch.enable_grad():
        if method == "eap-ig":
            table = eap_ig(model, graph, tokens, corrupted, metric, steps)
        else:
            table = attribution_patching(model, graph, tokens, corrupted, metric)
    with torch.no_grad():
        clean_value = float(metric(model(tokens)))
        corrupted_value = float(metric(model(corrupted)))
    n = tokens.shape[0]
    return pd.DataFrame({"edge": table.edge, "edge_kind": table.kind, "src": table.src,
                         "dst": table.dst, "score": table.score.astype(float),
                         "score_sum": table.score.astype(float) * n,
                         "metric_clean": clean_value, "metric_corrupted": corrupted_value})
