"""Infini-attention's passkey retrieval at our scale (Munkhdalai et al. 2024, section 4.2).

The paper fine-tunes a 1B model on 5K-token passkey prompts (segments of 2K) and retrieves the
key at up to 1M tokens, at every depth. Here a 2-layer Infini-attention model (linear + delta
memory, segments of `SEGMENT_LEN` tokens) is trained from scratch at one length, `TRAIN_LENGTH`
word-level tokens (`interp.tasks.passkey.PasskeyTokenizer`, digits one token each, as the
paper's tokenizer), so the key usually sits several segments before the question and must come
back through the compressive memory. It is then evaluated, streaming, at 1x, 2x, 4x, 8x and 16x
that length and at depths 0, 0.25, 0.5, 0.75, 1: a length x depth grid of token accuracy (the
paper's metric). The gates' specialisation (memory vs local heads, paper Fig. 3) is measured on
the trained model with `interp.infini.memory_specialisation`.

    python -m interp.zoo.paper train infini-passkey-s0 --resume
    python -m interp.zoo.paper eval infini-passkey-s0 --write
"""

from __future__ import annotations

import pandas as pd
import torch

from interp.infini import memory_specialisation
from interp.tasks.passkey import PasskeyTokenizer, evaluate_passkey, passkey_task
from interp.zoo.paper._registry import Recipe
from interp.zoo.paper._training import train_recipe

TOKENIZER = PasskeyTokenizer()
TRAIN_LENGTH = 160          # word-level tokens; 68 are prompt, 92 filler
SEGMENT_LEN = 32            # 5 segments per training prompt
FACTORS = (1, 2, 4, 8, 16)  # evaluation lengths, in multiples of TRAIN_LENGTH
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
EVAL_N, EVAL_SEED = 16, 4321  # 80 key tokens per cell: one flipped token moves it 0.0125
PHENOMENON = "infini-passkey"
SEEDS = (0, 1)

CONFIG = dict(d_model=64, d_head=16, n_heads=4, n_layers=2, d_mlp=256, n_ctx=TRAIN_LENGTH,
              d_vocab=TOKENIZER.vocab_size, attention="infini",
              positional_embedding_type="rotary",
              attn_cfg={"segment_len": SEGMENT_LEN, "update": "delta"})
# gate_lr: the HF blog's fix for gates that never leave 0.5 (variants.md section 4.5, item 4).
TRAIN = dict(steps=3000, batch_size=32, lr=3e-3, gate_lr=1e-2, warmup=100, checkpoint_every=250)
TASK_ARGS = dict(length=TRAIN_LENGTH, answer_weight=5.0)
TASK = (f"passkey retrieval (paper App. B prompt, word-level tokens, 5-digit key), trained at "
        f"{TRAIN_LENGTH} tokens with {SEGMENT_LEN}-token segments; evaluated at "
        f"{'/'.join(map(str, FACTORS))}x that length, depths {'/'.join(map(str, DEPTHS))}")
CLAIMS = {PHENOMENON: "Table 3: a 1B Infini-Transformer (linear + delta) fine-tuned on 5K-token "
                      "passkey prompts: 100% token accuracy at start/middle/end up to 1M tokens; "
                      "Fig. 3: gates split into memory specialists, local specialists, mixers."}

# Our reading of the shipped run (written after it; the numbers are in the card).
NOTES = {PHENOMENON: (
    "Partly reproduced. In distribution the model retrieves the key perfectly at every depth, "
    "so the compressive memory does carry it across segments (the training loss fell in a "
    "late phase change near step 2300). Beyond the training length only the key in the last "
    "segment (depth 1, read by local attention) survives (0.84-0.95); keys read from memory "
    "drop to about 0.4-0.5 at 2-4x and about 0.2-0.3 at 8-16x (chance 0.1), i.e. retrieval "
    "degrades with the number of compressions, as the HF blog reported for its own "
    "reproduction, unlike the paper's 1M-token result. No gate reached specialisation: after "
    "3000 steps at gate lr 0.01 all eight gates stay within 0.40-0.75 (mixers and two "
    "intermediate layer-0 heads), so Fig. 3's memory/local split is not reproduced either. "
    "Differences: the paper pre-trains a 1B model on 4K-token text for 30K steps before "
    "fine-tuning at 5K tokens with 2K segments; ours is trained from scratch with d_head 16, "
    "so each head's ELU+1 memory separates few keys and its normaliser z grows with every "
    "filler token. Only seed 0 is trained (about 45 CPU minutes).")}


def _recipe(seed: int) -> Recipe:
    return Recipe(name=f"{PHENOMENON}-s{seed}", phenomenon=PHENOMENON, variant="infini",
                  task=TASK, seed=seed, config=CONFIG, train=TRAIN, task_args=TASK_ARGS,
                  module="infini")


RECIPES: dict[str, Recipe] = {r.name: r for r in map(_recipe, SEEDS)}


def sampler(recipe: Recipe):
    """`sample(batch, gen) -> (tokens, loss weights)`: one random depth per batch.

    Every next-token target counts (the filler teaches the prompt's shape, the key line's
    second copy teaches in-segment copying); the answer's digits weigh `answer_weight`.
    """
    length, weight = recipe.task_args["length"], float(recipe.task_args["answer_weight"])

    def sample(batch: int, gen: torch.Generator):
        depth = float(torch.rand((), generator=gen))
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        b = passkey_task(batch, length, depth, TOKENIZER, seed=seed)
        mask = 1.0 + (weight - 1.0) * b.answer_mask[:, 1:].float()
        return b.tokens, mask

    return sample


def train(recipe: Recipe, out_dir, resume: bool = True) -> None:
    """Train `recipe` (resumable run under out/paper-zoo/<name>/) and save it into `out_dir`."""
    train_recipe(recipe, out_dir, sampler(recipe), resume=resume)


def grid(model, n: int = EVAL_N, seed: int = EVAL_SEED) -> pd.DataFrame:
    """The length x depth table of token and exact accuracy (columns as `evaluate_passkey`)."""
    lengths = [f * model.cfg.n_ctx for f in FACTORS]
    return evaluate_passkey(model, lengths, DEPTHS, n=n, seed=seed, tokenizer=TOKENIZER)


def gate_table(model, n: int = 8, seed: int = EVAL_SEED) -> pd.DataFrame:
    """Per-head gate, class and memory contribution on `n` training-length prompts (depth 0)."""
    batch = passkey_task(n, model.cfg.n_ctx, 0.0, TOKENIZER, seed=seed)
    with torch.no_grad():
        return memory_specialisation(model, batch.tokens)


@torch.no_grad()
def evaluate(model, recipe: Recipe) -> dict[str, float]:
    """Deterministic metrics: accuracy per (length factor, depth), per factor, and the gates.

    Keys: `acc_x{f}_d{depth}` (token accuracy), `acc_x{f}` and `exact_x{f}` (mean over
    depths), `gate_L{l}H{h}` (sigmoid(beta)), `memory_ratio_L{l}H{h}`, and the counts
    `heads_memory`, `heads_local`, `heads_mixer`, `heads_intermediate`.
    """
    torch.manual_seed(0)
    table = grid(model)
    out: dict[str, float] = {}
    for f in FACTORS:
        rows = table[table.length == f * model.cfg.n_ctx]
        for _, r in rows.iterrows():
            out[f"acc_x{f}_d{r.depth:.2f}"] = round(float(r.token_accuracy), 4)
        out[f"acc_x{f}"] = round(float(rows.token_accuracy.mean()), 4)
        out[f"exact_x{f}"] = round(float(rows.exact_accuracy.mean()), 4)
    gates = gate_table(model)
    for label, r in gates.iterrows():
        out[f"gate_{label}"] = round(float(r.gate), 4)
        out[f"memory_ratio_{label}"] = round(float(r.memory_ratio), 4)
    for key, cls in (("memory", "memory specialist"), ("local", "local specialist"),
                     ("mixer", "mixer"), ("intermediate", "intermediate")):
        out[f"heads_{key}"] = float((gates["class"] == cls).sum())
    return out


def _grid_markdown(cards: list[dict]) -> str:
    lines = ["| length | " + " | ".join(f"depth {d:g}" for d in DEPTHS) + " | mean |",
             "|---" * (len(DEPTHS) + 2) + "|"]
    for f in FACTORS:
        cells = []
        for d in DEPTHS:
            vals = [c["metrics"][f"acc_x{f}_d{d:.2f}"] for c in cards]
            cells.append(" / ".join(f"{v:.2f}" for v in vals))
        means = " / ".join(f"{c['metrics'][f'acc_x{f}']:.2f}" for c in cards)
        lines.append(f"| {f}x ({f * TRAIN_LENGTH}) | " + " | ".join(cells) + f" | {means} |")
    return "\n".join(lines)


def _mean(cards: list[dict], key: str) -> float:
    return sum(c["metrics"][key] for c in cards) / len(cards)


def grid_figure(cards: list[dict]):
    """Plotly heatmap of the token accuracy (mean over the cards' seeds), length x depth."""
    import plotly.graph_objects as go

    z = [[_mean(cards, f"acc_x{f}_d{d:.2f}") for d in DEPTHS] for f in FACTORS]
    fig = go.Figure(go.Heatmap(z=z, x=[f"{d:g}" for d in DEPTHS],
                               y=[f"{f}x ({f * TRAIN_LENGTH})" for f in FACTORS],
                               zmin=0, zmax=1, colorscale="Viridis", text=z,
                               texttemplate="%{text:.2f}", colorbar=dict(title="accuracy")))
    fig.update_layout(title=f"Passkey token accuracy, trained at {TRAIN_LENGTH} tokens "
                            f"(Infini, {SEGMENT_LEN}-token segments)",
                      xaxis_title="depth of the key", yaxis_title="length", width=640,
                      height=420)
    return fig


def _gate_markdown(cards: list[dict]) -> str:
    labels = sorted(k.removeprefix("gate_") for k in cards[0]["metrics"] if k.startswith("gate_"))
    lines = ["| head | gate sigmoid(beta) | memory share \\|g A_mem\\| / \\|A\\| |",
             "|---|---|---|"]
    for label in labels:
        gates = " / ".join(f"{c['metrics'][f'gate_{label}']:.2f}" for c in cards)
        ratios = " / ".join(f"{c['metrics'][f'memory_ratio_{label}']:.2f}" for c in cards)
        lines.append(f"| {label} | {gates} | {ratios} |")
    return "\n".join(lines)


def report_section(cards: list[dict], figure_dir=None) -> str:
    """Markdown for docs/reproduction.md: our length x depth grid and gates, from the cards,
    with a verdict against the paper (Table 3: 100% up to 1M tokens). With `figure_dir`, the
    grid is also drawn (`report.save_png`)."""
    cards = [c for c in cards if c.get("metrics")]
    if not cards:
        return "No evaluated Infini-attention passkey model yet."
    seeds = ", ".join(str(c.get("seed")) for c in cards)
    in_dist = [c["metrics"]["acc_x1"] for c in cards]
    far = [c["metrics"][f"acc_x{FACTORS[-1]}"] for c in cards]
    if min(far) >= 0.9:
        verdict = "**reproduces** the paper's length generalisation"
    elif max(far) < 0.5:
        verdict = "does **not** reproduce the paper's length generalisation"
    else:
        verdict = "reproduces the paper's length generalisation **only partly**"
    head_text = "; ".join(
        f"seed {c.get('seed')}: {int(c['metrics']['heads_memory'])} memory, "
        f"{int(c['metrics']['heads_local'])} local, {int(c['metrics']['heads_mixer'])} mixer, "
        f"{int(c['metrics']['heads_intermediate'])} intermediate heads" for c in cards)
    figure = ""
    if figure_dir is not None:
        from interp.zoo.paper.report import save_png

        figure = "\n\n" + save_png(grid_figure(cards), "infini_passkey_grid", figure_dir)
    return (
        f"2-layer, 4-head Infini-attention models (d_model 64, d_head 16, linear + delta "
        f"memory, {SEGMENT_LEN}-token segments) trained from scratch at {TRAIN_LENGTH} tokens "
        f"(seeds {seeds}); evaluated streaming at up to {FACTORS[-1]}x that length. Token "
        f"accuracy on the 5 key digits, {EVAL_N} prompts per cell (seeds separated by /; "
        f"chance 0.1):\n\n{_grid_markdown(cards)}{figure}\n\n"
        f"In distribution (1x) the key comes back with token accuracy "
        f"{min(in_dist):.2f}-{max(in_dist):.2f}; at {FACTORS[-1]}x the training length it is "
        f"{min(far):.2f}-{max(far):.2f}: at our scale this {verdict}. Gates (sigmoid(beta), "
        f"memory >= 0.8, local <= 0.2, mixer 0.35-0.65): {head_text}.\n\n"
        f"{_gate_markdown(cards)}")


findings = report_section


__all__ = ["CLAIMS", "CONFIG", "NOTES", "RECIPES", "TRAIN", "evaluate", "findings", "gate_table",
           "grid", "grid_figure", "report_section", "sampler", "train"]
