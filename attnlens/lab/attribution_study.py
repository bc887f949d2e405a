"""Attribution graphs on the shipped MLP text models: does the graph find the induction path?

    python -m attnlens.lab.attribution_study            # -> docs/figures/attribution/*.csv
    python -m attnlens.lab.attribution_study --counting # the CoPE counting model

For each model with shipped transcoders and each of `N_PROMPTS` prompts (seeds `EVAL_SEED + i`,
a seed no training used): `[BOS] r_0 .. r_{L-1} r_0 .. r_{L-2}` with `r` drawn from the tokens
of the model's validation windows, so the next token is `r_{L-1}` by induction. The query is the
last position (token `r_{L-2}`), the key the position after its first occurrence (token
`r_{L-1}`).

Per prompt (`induction.csv`, one row per model x prompt x induction head):
- the graph on the target `r_{L-1}`: its probability, the error nodes' share of the direct
  effects on its logit, and the shares of features and embeddings;
- the induction head's QK attribution at (query, key): the share of |key-side| attribution at
  the key's previous position (the token that matches the query: the previous-token path), at
  the key itself, and of |query-side| attribution at the query position; the signed key-side
  contribution of the previous position, beside the same for a control key two tokens later
  (whose previous token does not match); then the share of that previous-position signal that
  the card's previous-token head carries (the key-side attribution again with that head taken
  out of the replacement model, its `hook_z` zeroed);
- DCMHA: the share of the induction head's effective pattern at (query, key) that its
  post-softmax Compose takes from *other* heads' softmax maps, and the share of its pre-softmax
  composed score that comes from other heads' raw scores (the hand-off).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.attribution.contexts import transcoders_for
from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.prune import prune
from attnlens.interp.attribution.qk import attribute_qk, pattern_sources
from attnlens.interp.attribution.replacement import clean_run, float64_copy
from attnlens.lab.transcoders import TEXT_MODELS, eval_windows, transcoder_dir

EVAL_SEED = 20261204
N_PROMPTS = 16
HALF = 10
OUT = Path(__file__).resolve().parents[2] / "docs" / "figures" / "attribution"


def heads_from_card(name: str) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """(the two strongest induction heads, the strongest previous-token head) of the card."""
    card = json.loads((zoo.path(name) / "card.json").read_text())
    table = card["metrics"]["head_table"]
    induction = sorted(table, key=lambda r: -r["induction_stripe"])[:2]
    previous = max(table, key=lambda r: r["previous_token"])
    return ([(r["layer"], r["head"]) for r in induction], (previous["layer"], previous["head"]))


def induction_prompt(name: str, seed: int, bos: int) -> torch.Tensor:
    pool = eval_windows(name).flatten()
    pool = pool[pool != bos]
    g = torch.Generator().manual_seed(seed)
    r = pool[torch.randperm(len(pool), generator=g)[:HALF]]
    while len(set(r.tolist())) < HALF:   # distinct tokens: one earlier occurrence each
        r = pool[torch.randperm(len(pool), generator=g)[:HALF]]
    return torch.cat([torch.tensor([bos]), r, r[:-1]])[None]


def _share(values: torch.Tensor, mask: torch.Tensor) -> float:
    total = values.abs().sum()
    return float(values[mask].abs().sum() / total) if total > 0 else float("nan")


def _position_mask(qk, n_layers: int, n_pos: int, position: int) -> torch.Tensor:
    feats = qk.features[:, 1] == position
    errors = torch.zeros(n_layers, n_pos, dtype=torch.bool)
    errors[:, position] = True
    embed = torch.arange(n_pos) == position
    return torch.cat([feats, errors.flatten(), embed])


def study_model(name: str, n_prompts: int = N_PROMPTS, progress: bool = True) -> pd.DataFrame:
    model = float64_copy(zoo.load(name))
    transcoders = transcoders_for(zoo.path(name))
    induction, (prev_layer, prev_head) = heads_from_card(name)
    bos = model.tokenizer.bos_token_id
    rows = []
    seeds = range(EVAL_SEED, EVAL_SEED + n_prompts)
    if progress:
        from tqdm.auto import tqdm
        seeds = tqdm(seeds, desc=name, unit="prompt")
    for seed in seeds:
        tokens = induction_prompt(name, seed, bos)
        n = tokens.shape[1]
        query, key = n - 1, HALF
        target = int(tokens[0, key])
        graph = attribute(model, transcoders, tokens, targets=[target], batch_size=128)
        row_logit = graph.adjacency[graph.logit_index(0)]
        total = row_logit.abs().sum()
        n_f, n_e = graph.n_features, graph.n_errors
        run = clean_run(model, transcoders, tokens)
        base = dict(model=name, seed=seed, n_tokens=n, target=graph.logit_token_strings[0],
                    target_prob=float(graph.logit_probabilities[0]),
                    error_share=graph.error_share(),
                    feature_share=float(row_logit[:n_f].abs().sum() / total),
                    embedding_share=float(row_logit[n_f + n_e:n_f + n_e + n].abs().sum() / total))
        for layer, head in induction:
            qk = attribute_qk(model, transcoders, None, layer, head, query, key, run=run)

            def zero_prev(act, hook):
                act = act.clone()
                act[:, :, prev_head] = 0
                return act

            without = attribute_qk(model, transcoders, None, layer, head, query, key, run=run,
                                   extra_hooks=[(f"blocks.{prev_layer}.attn.hook_z", zero_prev)])
            prev_mask = _position_mask(qk, model.cfg.n_layers, n, key - 1)
            # control: a key two tokens later, whose previous token does not match the query
            control = attribute_qk(model, transcoders, None, layer, head, query, key + 2,
                                   run=run)
            control_mask = _position_mask(qk, model.cfg.n_layers, n, key + 1)
            prev_key = qk.key_side[prev_mask].abs().sum()
            prev_key_without = without.key_side[prev_mask].abs().sum()
            row = dict(base, head=f"L{layer}H{head}", score=qk.score,
                       control_score=control.score,
                       key_prev_contribution=float(qk.key_side[prev_mask].sum()),
                       control_key_prev_contribution=float(control.key_side[control_mask].sum()),
                       key_prev_share=_share(qk.key_side, prev_mask),
                       key_self_share=_share(qk.key_side,
                                             _position_mask(qk, model.cfg.n_layers, n, key)),
                       query_self_share=_share(qk.query_side,
                                               _position_mask(qk, model.cfg.n_layers, n, query)),
                       prev_head=f"L{prev_layer}H{prev_head}",
                       prev_signal_via_prev_head=float(1 - prev_key_without / prev_key)
                       if prev_key > 0 else float("nan"),
                       score_without_prev_head=without.score)
            if model.cfg.attention == "dcmha":
                for phase in ("pre", "post"):
                    split = pattern_sources(model, tokens, layer, head, query, key, phase=phase)
                    other = split.entries[:, 0] != head
                    row[f"compose_{phase}_other_heads_share"] = _share(split.contributions,
                                                                       other)
            rows.append(row)
    return pd.DataFrame(rows)


COUNTING_MODEL = "cope-counting-3var-cope-long-s0"
N_COUNTING = 12


def counting_prompts(name: str, n: int) -> list[tuple[torch.Tensor, list[str]]]:
    """`n` in-distribution programs of the counting task from the card's evaluation seed (never
    a training seed), without padding: (tokens [1 pos], words)."""
    from attnlens.lab.transcoders import _paper_batch

    card = json.loads((zoo.path(name) / "card.json").read_text())
    batch = _paper_batch(name, int(card["eval_seed"]), batch=n)
    out = []
    for row in range(n):
        length = int(batch.attention_mask[row].sum())
        out.append((batch.tokens[row:row + 1, :length], batch.decode(row)))
    return out


def relevant_positions(words: list[str]) -> tuple[list[int], int]:
    """Positions of the queried variable's increments since its last reset (what the answer
    counts), and the answer."""
    var = words[-2]
    last_reset = max(i for i in range(len(words) - 3) if words[i] == var and words[i + 1] == "=")
    incs = [i for i in range(last_reset, len(words) - 3)
            if words[i] == var and words[i + 1] == "++;"]
    return [p for i in incs for p in (i, i + 1)], int(words[-1])


def study_counting(name: str = COUNTING_MODEL, n_prompts: int = N_COUNTING,
                   progress: bool = True) -> pd.DataFrame:
    """The counting model's graphs on its answers: how much of the answer's direct effects and
    of the pruned graph's influence sits on the tokens it must count (the queried variable's
    increments since its last reset), against their share of the prompt."""
    model = float64_copy(zoo.load(name))
    transcoders = transcoders_for(zoo.path(name))
    rows = []
    prompts = counting_prompts(name, n_prompts)
    if progress:
        from tqdm.auto import tqdm
        prompts = tqdm(prompts, desc=name, unit="prompt")
    for tokens, words in prompts:
        prompt, answer_word = tokens[:, :-1], words[-1]
        relevant, answer = relevant_positions(words)
        target = int(tokens[0, -1])
        graph = attribute(model, transcoders, prompt, targets=[target], batch_size=128)
        pruned = prune(graph)
        n = graph.n_pos
        pos_of = torch.cat([graph.features[:, 1], torch.arange(graph.n_errors) % n,
                            torch.arange(n), torch.full((graph.n_logits,), n - 1)])
        is_rel = torch.isin(pos_of, torch.tensor(relevant, dtype=torch.long))
        row_logit = graph.adjacency[graph.logit_index(0)].abs()
        influence = pruned.node_influence.clone()
        influence[graph.n_nodes - graph.n_logits:] = 0
        rows.append(dict(model=name, n_tokens=n, answer=answer, answer_word=answer_word,
                         n_counted=len(relevant) // 2,
                         target_prob=float(graph.logit_probabilities[0]),
                         error_share=graph.error_share(),
                         counted_token_fraction=len(relevant) / n,
                         counted_direct_share=float(row_logit[is_rel].sum() / row_logit.sum()),
                         counted_influence_share=float(influence[is_rel].sum()
                                                       / influence.sum())))
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Mean and 95% bootstrap interval (over prompts) of each measure, per model x head."""
    rng = np.random.default_rng(seed)
    measures = [c for c in df.columns if c.endswith("share") or c.endswith("score")
                or c.endswith("contribution") or c.endswith("fraction")
                or c in ("target_prob", "prev_signal_via_prev_head")]
    out = []
    if "head" not in df.columns:
        df = df.assign(head="")
    for (model, head), group in df.groupby(["model", "head"], sort=False):
        for m in measures:
            values = group[m].dropna().to_numpy()
            if len(values) == 0:
                continue
            boots = rng.choice(values, (n_boot, len(values))).mean(1)
            out.append(dict(model=model, head=head, measure=m, mean=values.mean(),
                            low=np.quantile(boots, 0.025), high=np.quantile(boots, 0.975),
                            n=len(values)))
    return pd.DataFrame(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlens.lab.attribution_study",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=None,
                        help="default: every text MLP model with shipped transcoders")
    parser.add_argument("--prompts", type=int, default=N_PROMPTS)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--counting", action="store_true",
                        help=f"the counting study of {COUNTING_MODEL} instead")
    args = parser.parse_args(argv)
    if args.counting:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        df = study_counting(n_prompts=args.prompts if args.prompts != N_PROMPTS
                            else N_COUNTING)
        df.to_csv(out / "counting.csv", index=False, float_format="%.6g")
        summary = summarize(df)
        summary.to_csv(out / "counting_summary.csv", index=False, float_format="%.4g")
        print(summary.to_string(index=False))
        return 0
    names = args.models or [m for m in TEXT_MODELS
                            if (transcoder_dir(m) / "transcoders.safetensors").is_file()]
    df = pd.concat([study_model(name, args.prompts) for name in names], ignore_index=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "induction.csv"
    if path.is_file():   # other models' rows are kept; these models' are replaced
        old = pd.read_csv(path)
        df = pd.concat([old[~old.model.isin(names)], df], ignore_index=True)
        order = {m: i for i, m in enumerate(TEXT_MODELS)}
        df = df.sort_values("model", key=lambda c: c.map(order), kind="stable")
    df.to_csv(path, index=False, float_format="%.6g")
    summary = summarize(df)
    summary.to_csv(out / "induction_summary.csv", index=False, float_format="%.4g")
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
