"""MTA's phenomenon (Golovneva et al. 2025, Sec. 2, Table 1): find the block, MTA vs MHA.

Scaled down for a CPU (`interp.tasks.find_block.CPU_TASK`): 8 blocks of 3 distinct letters out
of 12, a 2-letter query; the paper uses ~52 blocks of 5 out of 26 letters. Both models have
2 layers, 2 heads, d_model 64, RoPE, RMSNorm and a SwiGLU MLP (the paper: 4 layers, d_model
256); MTA adds the paper's pre-softmax key-query convolution, c_q = L = 2, c_k = 2N - 1 = 5, in
every layer. Three seeds per setting, as the paper reports variance across seeds.
Metric: the fraction of held-out prompts whose answer is not reproduced exactly.

    python -m interp.zoo.paper train "mta-findblock-first-*" --resume
"""

from __future__ import annotations

import torch

from interp.tasks.find_block import CPU_TASK, FindBlockTask, answer_error_rate
from interp.zoo.paper._registry import Recipe
from interp.zoo.paper._training import train_recipe

EVAL_SEED = 98765
EVAL_SAMPLES = 1024
SEEDS = (0, 1, 2)
VARIANTS = ("First", "Last", "All")
CLAIMS = {
    "mta-findblock": "Find the block, error (%) mean +- sd over 3 seeds, Table 1 (N=5, L=2, "
                     "4 layers, d 256, 100K steps): Transformer 51.6 +- 43.1 (All), 78.2 +- 1.5 "
                     "(First), 1.3 +- 0.4 (Last); MTA 0.1 +- 0.1, 0.0 +- 0.0, 0.0 +- 0.0. The "
                     "baseline is bimodal across seeds (it either fails or solves the task).",
}

# Our reading of the shipped numbers (written after the runs; the report prints it verbatim).
NOTES = {
    "mta-findblock": "Reproduced for First and Last, and more sharply than in the paper: MTA "
                     "answers every held-out prompt (0.0% on all 3 seeds of each), while MHA "
                     "fails on every seed (64-68%). At our scale (2 layers, d 64, 1000 steps) "
                     "MHA never finds the block, not even for Last, which the paper's 4-layer "
                     "MHA solves (1.3%); the paper's seed-to-seed bimodality does not appear "
                     "because no MHA seed succeeds. All (writing the whole block) needs longer: "
                     "at 1000 steps MTA was still at 81% error, so All runs 3000 steps; then "
                     "MTA reaches 0.0 / 6.6 / 0.0% on the three seeds and MHA stays at "
                     "91.8 / 97.2 / 95.8%. "
                     "What MTA learned, by `interp.mta` and the effective pattern: for First "
                     "and Last, in layer 0 both heads' key-query kernels are box filters, the "
                     "same on the three seeds: "
                     "equal weights on both query rows (the two query letters) and on three "
                     "neighbouring keys, with one negative tap just outside. For First the box "
                     "covers keys j..j+2, so the key at a block's first letter collects the "
                     "matches of the whole block; for Last it covers j-2..j, so the block's last "
                     "letter collects them: exactly the letter the answer asks for. Such "
                     "kernels fall outside the identity/diagonal/priming classes of "
                     "`kernel_table` (they are 'mixed'); the figures show them. At the position "
                     "that predicts the answer, a layer-0 MTA head puts 0.8-0.96 of its "
                     "attention on the target block's letters, against 0.09 for a uniform head; "
                     "no head of the seed-0 MHA models exceeds 0.09. The All model found "
                     "another solution, not analysed further yet: its block-finding head is in "
                     "layer 1 (L1H0, 0.77 on the target), with a kernel dominated by one "
                     "negative tap (current query, previous key).",
}


def task_of(recipe: Recipe) -> FindBlockTask:
    return FindBlockTask(**recipe.task_args)


def _model_config(task: FindBlockTask, attention: str) -> dict:
    tok = task.tokenizer()
    config = dict(d_model=64, d_head=32, n_heads=2, n_layers=2, d_mlp=192, n_ctx=task.n_tokens,
                  d_vocab=tok.vocab_size, attention=attention,
                  positional_embedding_type="rotary", normalization_type="RMS", act_fn="silu",
                  gated_mlp=True, tokenizer_alphabet=tok.alphabet)
    if attention == "mta":
        config["attn_cfg"] = task.mta_options()
    return config


# "All" writes the whole block (3 tokens) and needs longer: at 1000 steps MTA was still at
# 81% error with a falling loss, so it gets 3000.
STEPS = {"First": 1000, "Last": 1000, "All": 3000}


def _recipe(variant: str, attention: str, seed: int) -> Recipe:
    steps = STEPS[variant]
    task_args = {**CPU_TASK, "variant": variant}
    task = FindBlockTask(**task_args)
    return Recipe(
        name=f"mta-findblock-{variant.lower()}-{attention}-s{seed}", phenomenon="mta-findblock",
        variant=attention, seed=seed, config=_model_config(task, attention),
        task=f"find the block ({variant}): {task.n_blocks} blocks of {task.block_length} "
             f"distinct letters out of {task.vocab_size}, {task.query_length}-letter query, "
             f"answer = the {'block' if variant == 'All' else variant.lower() + ' letter'}",
        train=dict(steps=steps, batch_size=32, lr=3e-3, warmup=100, weight_decay=0.01),
        task_args=task_args, module="mta")


RECIPES: dict[str, Recipe] = {
    r.name: r for r in (_recipe(v, a, s) for v in VARIANTS for a in ("mta", "mha")
                        for s in SEEDS)
}


def sampler(recipe: Recipe):
    task = task_of(recipe)

    def sample(batch: int, gen: torch.Generator):
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        b = task.batch(batch, seed)
        return b.tokens, b.loss_mask
    return sample


def train(recipe: Recipe, out_dir, resume: bool = True) -> None:
    train_recipe(recipe, out_dir, sampler(recipe), resume=resume)


@torch.no_grad()
def evaluate(model, recipe: Recipe) -> dict[str, float]:
    """`error`: fraction of 1024 distinct held-out prompts answered wrongly (teacher forced,
    equal to greedy decoding); `answer_loss`: mean cross-entropy on the answer tokens."""
    from interp.tasks.find_block import answer_loss

    task = task_of(recipe)
    batch = task.to_tokens(task.generate(EVAL_SAMPLES, seed=EVAL_SEED))
    return {"error": round(answer_error_rate(model, batch), 4),
            "answer_loss": round(float(answer_loss(model, batch)), 4)}


def target_mask(samples, n_pos: int) -> torch.Tensor:
    """`[batch pos]` 1.0 at the target block's letters of each sample (tokens are BOS + text)."""
    mask = torch.zeros(len(samples), n_pos)
    for row, s in enumerate(samples):
        start = 1 + sum(len(b) + 1 for b in s.blocks[:s.target_index])
        mask[row, start:start + len(s.target)] = 1.0
    return mask


@torch.no_grad()
def target_block_attention(model, recipe: Recipe, n: int = 128, seed: int = EVAL_SEED):
    """Mean attention mass each head puts on the target block's letters, read from the
    effective pattern at the position that predicts the first answer token.

    Returns a DataFrame with `head_label`, `layer`, `head`, `target_mass` and `uniform_mass`
    (what a head spreading evenly over the prompt would put there).
    """
    import pandas as pd

    from interp._common import head_label

    task = task_of(recipe)
    samples = task.generate(n, seed=seed)
    batch = task.to_tokens(samples)
    q = batch.answer_start - 1
    mask = target_mask(samples, batch.tokens.shape[1])
    _, cache = model.run_with_cache(batch.tokens,
                                    names_filter=lambda name: name.endswith("hook_pattern"))
    rows = []
    for layer in range(model.cfg.n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][:, :, q]   # [batch head key]
        mass = (pattern * mask[:, None]).sum(-1).mean(0)
        for h, m in enumerate(mass.tolist()):
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "target_mass": m,
                         "uniform_mass": float((mask.sum(1) / (q + 1)).mean())})
    return pd.DataFrame(rows)


def report_section(cards: list[dict], figure_dir) -> str:
    """Mean +- std error over seeds per (answer variant, attention), per-seed errors, and what
    the MTA kernels of the seed-0 models learned (interp.mta.kernel_table + kernel figure)."""
    import plotly.graph_objects as go

    from hooked_models.zoo import load
    from interp.mta import kernel_centre, kernel_table, key_query_kernels
    from interp.plots import kernel_figure
    from interp.zoo.paper.report import markdown_table, mean_std, pct, save_png

    groups: dict[tuple[str, str], list[dict]] = {}
    for c in sorted(cards, key=lambda c: c["recipe"]):
        groups.setdefault((c["task_args"]["variant"], c["variant"]), []).append(c)
    rows, fig = [], go.Figure()
    for (variant, attention), cs in sorted(groups.items(), key=lambda kv: (
            VARIANTS.index(kv[0][0]), kv[0][1] != "mta")):
        errors = [c["metrics"]["error"] for c in cs]
        m, s = mean_std(errors)
        rows.append([variant, attention, len(cs), cs[0]["steps"], f"{pct(m)} +- {pct(s)}",
                     ", ".join(pct(e) for e in errors)])
        fig.add_trace(go.Box(y=[100 * e for e in errors], name=f"{variant} {attention}",
                             boxpoints="all", jitter=0.3))
    fig.update_layout(title="find the block: error per seed", yaxis_title="error (%)",
                      showlegend=False, width=800, height=400)
    parts = [markdown_table(["answer", "attention", "seeds", "steps", "error mean +- std (%)",
                             "error per seed (%)"], rows),
             "", save_png(fig, "mta-findblock-errors", figure_dir)]
    attention_rows = []
    for c in sorted(cards, key=lambda c: c["recipe"]):
        if c["seed"] == 0:
            table = target_block_attention(load(c["recipe"]), RECIPES[c["recipe"]])
            attention_rows.append([c["recipe"], pct(c["metrics"]["error"]),
                                   *(f"{m:.2f}" for m in table.target_mass)])
    if attention_rows:
        labels = list(table.head_label)
        parts += ["", "**Where the answer position looks** (seed 0; effective pattern at the "
                      "position that predicts the answer, mean mass on the target block's "
                      f"letters; a head spread evenly over the prompt would put "
                      f"{table.uniform_mass[0]:.2f} there):", "",
                  markdown_table(["model", "error (%)", *labels], attention_rows)]
    for c in sorted(cards, key=lambda c: c["recipe"]):
        if c["variant"] != "mta" or c["seed"] != 0:
            continue
        model = load(c["recipe"])
        table = kernel_table(model)
        counts = table.groupby("class").size().to_dict()
        parts += ["", f"**What the MTA kernels of `{c['recipe']}` learned** "
                      f"(`interp.mta.kernel_table`): "
                      + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + " heads. "
                      "Per head, the share of the kernel's energy on the diagonal (sequence "
                      "matching), on the current tap (identity) and on the same-key column:",
                  "", markdown_table(["head", "class", "identity", "diagonal", "same key"],
                                     [[r.head_label, r["class"], f"{r.identity_share:.2f}",
                                       f"{r.diagonal_share:.2f}", f"{r.priming_share:.2f}"]
                                      for _, r in table.iterrows()])]
        for (layer, phase), kernels in key_query_kernels(model).items():
            classes = list(table[(table.layer == layer) & (table.phase == phase)]["class"])
            c_q, c_k = kernels.shape[-2:]
            centre = kernel_centre(model, layer, c_k)
            fig = kernel_figure(kernels.float(), classes,
                                title=f"{c['recipe']}: layer {layer} {phase}-softmax "
                                      "key-query kernels")
            fig.update_xaxes(tickvals=list(range(c_k)), title_text="key",
                             ticktext=[f"j{b - centre:+d}" if b != centre else "j"
                                       for b in range(c_k)])
            fig.update_yaxes(tickvals=list(range(c_q)), title_text="query",
                             ticktext=[f"i{a - c_q + 1:+d}" if a != c_q - 1 else "i"
                                       for a in range(c_q)])
            fig.update_layout(width=800, height=320)
            parts += ["", save_png(fig, f"{c['recipe']}-L{layer}-kernels", figure_dir)]
    return "\n".join(parts)
