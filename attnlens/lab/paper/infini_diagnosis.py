"""Why the passkey comes back from Infini-attention's memory less and less often beyond the
training length (issue 48 item 5), measured on the shipped `infini-passkey-long-s*` models.

For each model, length factor and depth whose key lies outside the question's segment (depths
0-0.75), on the first `n` prompts of the cards' own evaluation cells (seed `EVAL_SEED`, never
a training or validation seed), it records per prompt whether the key came back and, per
layer and head, how much of the memory read at the answer positions comes from the key's digit
tokens (`attnlens.interp.variants.infini.memory_source_share`): `share` (what the model reads),
`share_no_erosion` (the same if the delta rule had not eroded the key since it was written)
and `contrast` (how strongly the query singles the key's tokens out against any other stored
token). The CSV feeds docs/reproduction.md's diagnosis section
(`attnlens.reports.reproduction.infini`).

    python -m attnlens.lab.paper.infini_diagnosis              # 32 prompts per cell (all)
    python -m attnlens.lab.paper.infini_diagnosis --n 4 --factors 1 8 --out /tmp/diag.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.tasks.passkey import KEY_LINE, cell_seed, passkey_task, predict
from attnlens.interp.variants.infini import memory_source_share
from attnlens.lab.paper.infini import DEPTHS, EVAL_SEED, FACTORS, LONG_SEEDS, TOKENIZER

MODELS = tuple(f"infini-passkey-long-s{seed}" for seed in LONG_SEEDS)
DIAGNOSIS_DEPTHS = (0.0, 0.25, 0.5, 0.75)      # the key outside the question's segment
CSV = Path(__file__).resolve().parents[3] / "docs" / "figures" / "reproduction" / \
    "infini-passkey-diagnosis.csv"
N_PROMPTS = 32         # every prompt of the cards' cells


def _positions(batch, segment_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(queries, sources): the positions that predict the key's digits, and the key's digit
    tokens in the key line (both mentions) that lie in earlier segments than the queries."""
    mask = batch.answer_mask
    queries = torch.stack([row.nonzero().flatten() - 1 for row in mask])
    digits = torch.tensor(TOKENIZER.encode("0123456789"))
    sources = []
    for i, start in enumerate(batch.key_pos.tolist()):
        width = len(TOKENIZER.encode(KEY_LINE.format(key=batch.keys[i])))
        line = batch.tokens[i, start:start + width]       # " The pass key is D D D D D. ..."
        pos = torch.isin(line, digits).nonzero().flatten() + start
        pos = pos[pos // segment_len < int(queries[i].min()) // segment_len]
        sources.append(pos)
    n = min(len(p) for p in sources)
    if n == 0:
        raise ValueError(f"depth {batch.depth}: the key lies in the question's segment")
    return queries, torch.stack([p[:n] for p in sources])


def diagnose(model, name: str, factor: int, depth: float, n: int = N_PROMPTS) -> pd.DataFrame:
    """One row per (layer, head, prompt) of one evaluation cell (see the module docstring)."""
    length = factor * model.cfg.n_ctx
    batch = passkey_task(n, length, depth, TOKENIZER,
                         seed=cell_seed(EVAL_SEED, FACTORS.index(factor), DEPTHS.index(depth)))
    pred = predict(model, batch)
    right = pred == batch.tokens[:, 1:]
    answer = batch.answer_mask[:, 1:]
    token_acc = (right & answer).sum(1) / answer.sum(1)
    exact = (right | ~answer).all(1)
    queries, sources = _positions(batch, model.cfg.attn_cfg.segment_len)
    table = memory_source_share(model, batch.tokens, queries, sources)
    table.insert(0, "depth", depth)
    table.insert(0, "length", length)
    table.insert(0, "factor", factor)
    table.insert(0, "model", name)
    table["key_tokens"] = sources.shape[1]
    example = torch.tensor(table.example.tolist())
    table["token_accuracy"] = token_acc[example].double().numpy()
    table["exact"] = exact[example].numpy()
    return table


def run(models=MODELS, factors=FACTORS, depths=DIAGNOSIS_DEPTHS, n: int = N_PROMPTS,
        progress: bool = True) -> pd.DataFrame:
    cells = [(m, f, d) for m in models for f in factors for d in depths]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(cells), unit="cell", file=sys.stderr)
    frames, loaded = [], {}
    with torch.no_grad():
        for name, factor, depth in cells:
            if name not in loaded:
                loaded = {name: zoo.load(name).double()}
            frames.append(diagnose(loaded[name], name, factor, depth, n))
            if bar is not None:
                bar.set_postfix_str(f"{name} {factor}x d{depth}", refresh=False)
                bar.update()
    if bar is not None:
        bar.close()
    return pd.concat(frames, ignore_index=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m attnlens.lab.paper.infini_diagnosis",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=N_PROMPTS, help="prompts per cell (<= 32)")
    p.add_argument("--factors", type=int, nargs="+", default=list(FACTORS), choices=FACTORS)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--out", type=Path, default=CSV)
    args = p.parse_args(argv)
    if not 1 <= args.n <= 32:
        p.error(f"--n {args.n}: the cards' cells hold 32 prompts; choose 1-32")
    table = run(args.models, args.factors, n=args.n)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(f"wrote {len(table)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
