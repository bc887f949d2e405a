# %% [markdown]
# # Induction heads: the text models, and the toy models that have them
#
# Olsson et al.'s induction circuit (a previous-token head feeding a head that attends to the
# token after the earlier copy of the current one, and so continues a repeat) looked for with
# the same analyses in every model: first in the zoo's text language models, then in the toy
# models of every attention variant, where it is there to see: previous-token heads, induction
# heads, the composition between them, what ablation removes, and the phase change in which
# they form during training (a small model trained here).
#
# The text models (`hooked_models/zoo/text-*`, [docs/zoo.md](../docs/zoo.md)) were trained on
# two CPU cores on the Python standard library's source files; their cards hold the numbers of
# the probe used below. The toy models (`induction-*`) were trained on the second copy of
# `[BOS] r r`, `r` random letters; both kinds have two attention-only layers of four heads.

# %%
import json

import pandas as pd
import plotly.express as px
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.circuits import qk_ov as circuits
from attnlens.interp.tools import heads
from attnlens.interp.variants import infini
from attnlens.interp import plots
from attnlens.interp.tools.text_eval import induction_probe, load_eval_tokens, text_repeat_probe
from attnlens.lab.text_studies import (COPY_RATIO_THRESHOLD, INDUCTION_THRESHOLD, forms_induction,
                                     has_induction_head)

torch.set_grad_enabled(False)
text = {name: zoo.load(name) for name in zoo.available(kind="text-lm")}


def card_row(m):
    metrics = m.card["metrics"]
    best = max(metrics["head_table"], key=lambda h: h["induction_stripe"])
    mix = m.card.get("data_mix") or "natural text"
    return {"layers": m.cfg.n_layers, "tokens trained": m.card["tokens"],
            "data": mix if isinstance(mix, str) else f"repeated-span mix {json.dumps(mix)}",
            "corpus": ("standard library + packages" if m.card.get("extra_corpus")
                       else "standard library"),
            "best induction score": metrics["induction_score"], "best head": best["label"],
            "second/first copy loss": metrics["copy_loss_ratio"],
            "held-out text read twice": metrics["text_copy_ratio"],
            "meets the zoo's bar": forms_induction(metrics)}


pd.DataFrame({name: card_row(m) for name, m in text.items()}).T

# %% [markdown]
# ## The 2-layer text model has an induction head
#
# The zoo's bar for an induction head (issue 26): on `[BOS] r r` (`r` 150 random token ids, a
# seed that training never used) the best head puts at least 0.3 of its attention on the
# induction stripe, and the second copy's loss is below half the first's. **`text-mha-l2` meets
# the first half and misses the second**: its head L1H3 scores about 0.37, and it predicts the
# second copy of random ids better than the first, but only by a third (ratio about 0.68);
# held-out code read twice is about 40% easier the second time. Its one-layer control, which
# cannot compose two heads, has neither. The head formed in a phase change during training
# (below) and is fed by a previous-token head in layer 0, L0H0, as in the textbook circuit.
# The first `text-mha-l2`, trained on 512-token contexts from the start, had formed none by the
# same 41M tokens; the zoo now trains on 256-token contexts first ([docs/zoo.md](../docs/zoo.md)
# has the calibration). **`text-mta-l2` meets the whole bar** (second copy 0.26x the first)
# with a head in layer 0 (below). Where a variant's `pattern` is not a distribution over keys
# (MTA, DCMHA, Infini), the probe also scores the last stage that is one (`softmax`, `probs`,
# `local_pattern`), and either score may clear the first half of the bar: MTA's post-softmax
# head mixing scales each head's map (by about 0.2-0.3 here), a scale its group RMSNorm undoes.
# Measured again here with the card's probe:

# %%
probes = {name: induction_probe(m) | text_repeat_probe(m, load_eval_tokens(zoo.path(name)))
          for name, m in text.items()}
for name, p in probes.items():
    verdict = ("meets the bar" if forms_induction(p) else "an induction head, copy-ratio bar "
               "missed" if has_induction_head(p) else "no induction head")
    extra = [f", {k.removeprefix('induction_score_')} stage {v:.3f}" for k, v in p.items()
             if k.startswith("induction_score_")]
    print(f"{name}: {verdict}: best induction score {p['induction_score']:.3f}"
          f"{''.join(extra)} (bar {INDUCTION_THRESHOLD}), second/first copy loss "
          f"{p['copy_loss_ratio']:.2f} "
          f"(bar < {COPY_RATIO_THRESHOLD}), held-out text read twice "
          f"{p['text_copy_ratio']:.2f}")

# %% [markdown]
# `text-infini-l2` fails the bar, yet its layer-1 head L1H3 is an induction head: its local
# attention sees only its own 128-token segment, and the probe's earlier copy lies 150 tokens
# back, in an earlier segment, where only the compressive memory can reach it. The same probe
# at shorter copy distances tells the two apart (score / second-over-first copy loss):

# %%
distances = (20, 50, 100, 150, 200)
by_distance = {name: {d: induction_probe(m, half=d) for d in distances}
               for name, m in text.items() if m.cfg.n_layers > 1}
pd.DataFrame({name: {f"|r| = {d}": f"{p['induction_score']:.2f} / {p['copy_loss_ratio']:.2f}"
                     for d, p in row.items()} for name, row in by_distance.items()}).T

# %% [markdown]
# Inside a segment (|r| = 20, 50) the Infini model copies, if less well than MHA; once the copy
# crosses a segment boundary it stops copying (ratio near 1): its memory does not serve
# induction. MHA's head weakens with distance too, but it reaches across the whole context.
# docs/zoo.md's copy-distance study has the figure.

# %% [markdown]
# Beside the toy MHA model, which has the circuit, on the same scores (the toy is probed with
# 15 random letters repeated, its own vocabulary):

# %%
toy = zoo.load("induction-mha")
tables = {name: p["table"] for name, p in probes.items()}
tables["induction-mha (toy)"] = heads.induction_table(toy, half_len=15)
scores = pd.concat({n: t[["previous_token", "induction_stripe"]] for n, t in tables.items()},
                   names=["model", "head"]).reset_index()
px.bar(scores.melt(id_vars=["model", "head"], var_name="score"), x="head", y="value",
       color="score", barmode="group", facet_col="model", facet_col_wrap=4, height=560,
       range_y=[0, 1], title="previous-token and induction-stripe scores of every head "
       "(pattern stage)").for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))

# %% [markdown]
# The maps themselves: each model's best-scoring head on its probe, `[BOS] r r`, read where its
# map is a distribution over keys (MTA's `softmax`, DCMHA's `probs`, Infini's `local_pattern`,
# else `pattern`: `text_eval.distribution_stage`). The induction heads draw the stripe one
# position right of the diagonal of the earlier copy. `text-mha-l2`'s is fainter than the
# toy's: on this probe about half of L1H3's weight is on the stripe, a sixth on BOS and the rest
# spread over the context. `text-mta-l2`'s head is in layer 0 (next section).

# %%
from plotly.subplots import make_subplots

from attnlens.interp.plots import SEQUENTIAL
from attnlens.interp.tasks.induction import repeated_tokens
from attnlens.interp.tools.text_eval import distribution_stage

half = 30
shown = {**{n: m for n, m in text.items() if m.cfg.n_layers > 1}, "induction-mha (toy)": toy}
cols = 3
rows = -(-len(shown) // cols)
fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(shown), horizontal_spacing=0.06,
                    vertical_spacing=0.08)
best_head = {}
for i, (n, m) in enumerate(shown.items()):
    probe = repeated_tokens(1, half if m is not toy else 15, m.cfg.d_vocab, seed=1)
    t = tables[n]
    best = t["induction_stripe"].idxmax()
    layer, head = int(t.loc[best, "layer"]), int(t.loc[best, "head"])
    best_head[n] = (layer, head)
    stage = distribution_stage(m) or "pattern"
    _, c = m.run_with_cache(probe)
    fig.add_heatmap(z=c[f"blocks.{layer}.attn.hook_{stage}"][0, head].numpy(),
                    row=i // cols + 1, col=i % cols + 1, zmin=0, zmax=1,
                    colorscale=SEQUENTIAL, showscale=i == 0)
    fig.layout.annotations[i].text = f"{n}: {best} ({stage})"
fig.update_yaxes(autorange="reversed", title_text="query").update_xaxes(title_text="key")
fig.update_layout(height=330 * rows, width=1000, title="each model's best-scoring head on the "
                  "induction stripe, on [BOS] r r")

# %% [markdown]
# What the induction head writes is the token it attends to: its OV circuit copies. Read
# through the embedding and unembedding (`W_E W_V W_O W_U`, the direct path, without the
# LayerNorms), each token's own logit is compared with every other token's, for every head in
# the layer of each 2-layer text model's best induction head: the share of the vocabulary
# whose own logit is the highest, and in the top ten. In `text-mha-l2` the induction head L1H3
# ranks the attended token first for two thirds of the vocabulary; the other layer-1 heads
# almost never do.

# %%
def copying(m, layer):
    rows = {}
    for h in range(m.cfg.n_heads):
        full = m.W_E @ m.W_V[layer, h] @ m.W_O[layer, h] @ m.W_U     # [token in, token out]
        rank = (full > full.diagonal()[:, None]).sum(-1)                # 0: its own is top
        rows[f"L{layer}H{h}"] = {"own token top-1": (rank == 0).float().mean().item(),
                                 "own token top-10": (rank < 10).float().mean().item()}
    return pd.DataFrame(rows).T


pd.concat({n: copying(m, best_head[n][0]) for n, m in text.items() if m.cfg.n_layers > 1},
          names=["model", "head"]).round(3)

# %% [markdown]
# ## MTA: an induction head in one layer
#
# `text-mta-l2`'s best induction head, L0H3, sits in layer 0, where no earlier head can tell it
# which token came before each key. Its pre-softmax key-query kernel does: the kernel adds the
# scores of neighbouring (query, key) pairs to each entry, and L0H3's puts almost all its
# weight on the diagonal that ends at (current query, *previous* key), so entry (i, j) scores
# how well token j-1 (and j-2, ...) match token i (and i-1, ...): attention to the token after
# an earlier occurrence. `attnlens.interp.variants.mta.kernel_table` calls that class "induction". Rows: query
# offset (0 = current), columns: key offset (0 = same key):

# %%
from attnlens.interp.variants.mta import kernel_table, plain_kernel

mta = text["text-mta-l2"]
kernel = mta.blocks[0].attn.mta_kernel.detach()[3, 0]
c_q, c_k = kernel.shape
px.imshow(kernel.numpy(), x=[str(b - (c_k - 1) // 2) for b in range(c_k)],
          y=[str(a - (c_q - 1)) for a in range(c_q)], color_continuous_scale="RdBu_r",
          color_continuous_midpoint=0.0, text_auto=".2f", height=330,
          labels=dict(x="key offset", y="query offset"),
          title="text-mta-l2 L0H3: pre-softmax key-query kernel")

# %%
kernel_table(mta).query("layer == 0 and phase == 'pre'")[
    ["head_label", "class", "identity_share", "induction_share"]].round(2)

# %% [markdown]
# Switch that one kernel to the identity (`plain_kernel`: every other weight unchanged) and the
# copying is gone; the same switch on any other layer-0 head changes little:

# %%
windows = load_eval_tokens(zoo.path("text-mta-l2"))
switched = {}
for h in range(mta.cfg.n_heads):
    with plain_kernel(mta, 0, h):
        p = induction_probe(mta) | text_repeat_probe(mta, windows)
    switched[f"L0H{h} kernel off"] = p
switched = {"trained": probes["text-mta-l2"], **switched}
pd.DataFrame({k: {"softmax stripe (best head)": p["induction_score_softmax"],
                  "second/first copy loss": p["copy_loss_ratio"],
                  "held-out text read twice": p["text_copy_ratio"]}
              for k, p in switched.items()}).T.round(3)

# %% [markdown]
# Its post-softmax head mixing then hands L0H3's map to the other layer-0 heads, which read
# their own values: `attnlens circuit text-mta-l2 --task induction` finds those within-layer
# edges (docs/circuit_discovery.md), which a search over the standard graph, without
# head-to-head edges, cannot see.

# %% [markdown]
# ## During training
#
# Each text model's training log records the probe every 250 steps. Olsson et al.'s phase
# change is a jump of the induction score (and a drop of the second-copy loss) within a short
# stretch of training: in `text-mha-l2` the score leaves the floor at about 14M tokens and
# passes 0.3 by 25M, while the 1-layer controls stay at the floor. (Its first 6,250 steps, to
# 25.6M tokens, are on 256-token contexts and are probed with halves of 127 tokens, the rest
# with halves of 150. The phase change of the toy model, trained here, is at the end of this
# notebook.)

# %%
logs = pd.concat([pd.read_json(zoo.path(n) / "metrics.jsonl", lines=True).assign(model=n)
                  for n in text], ignore_index=True).dropna(subset=["induction_score"])
fig = px.line(logs, x="tokens", y="induction_score", color="model", markers=True, height=330,
              range_y=[0, 1], title="best induction score on the probe during training")
fig.add_hline(y=INDUCTION_THRESHOLD, line_dash="dot", annotation_text="the zoo's bar")

# %% [markdown]
# # The circuit in the toy models
#
# The bundled `induction-*` toys, one per attention variant, trained on the same task (the
# second copy of `[BOS] r r`, `r` random letters), do have it. This part looks at it in each
# variant.

# %%
models = {name.removeprefix("induction-"): zoo.load(name)
          for name in zoo.available(kind="induction")}
pd.DataFrame({v: m.card["metrics"] for v, m in models.items()}).T

# %% [markdown]
# ## Previous-token and induction heads
#
# `heads.induction_table` runs the probe `[BOS] r r` (here 15 random letters, repeated) and
# scores every head: `previous_token` (attention on the previous position), `induction_stripe`
# (attention on the token after the earlier copy of the current one). Every variant's map is
# scored at its effective `pattern`, the weights that multiply the values.

# %%
tables = {v: heads.induction_table(m, half_len=15) for v, m in models.items()}
best = pd.DataFrame({v: {"best previous-token head": t["previous_token"].idxmax(),
                         "its score": t["previous_token"].max(),
                         "best induction head": t["induction_stripe"].idxmax(),
                         "its stripe score": t["induction_stripe"].max()}
                     for v, t in tables.items()}).T
best

# %%
scores = pd.concat({v: t[["previous_token", "induction_stripe"]] for v, t in tables.items()},
                   names=["variant", "head"]).reset_index()
px.bar(scores.melt(id_vars=["variant", "head"], var_name="score"), x="head", y="value",
       color="score", barmode="group", facet_col="variant", facet_col_wrap=5, height=330,
       title="previous-token and induction-stripe scores of every head (pattern stage)",
       ).update_yaxes(matches=None, showticklabels=True)

# %% [markdown]
# MHA, DCMHA and Infini-attention build the textbook two-layer circuit (a previous-token head in
# layer 0 feeding induction heads in layer 1; DCMHA's composed `pattern` is not row-stochastic,
# hence scores above 1). The CoPE model solves the task (see its accuracy above) without a sharp
# stripe in these scores: its positions are counted by gates, not given (notebook 4 looks
# inside). MTA needs no previous-token head: its key-query
# convolution lets a layer-0 head compare the previous key with the query, so layer 0 already
# attends along the stripe. Scored at the softmax output, before the post-softmax convolution
# and head mixing:

# %%
heads.induction_table(models["mta"], half_len=15, stage="softmax")[["layer", "induction_stripe"]]

# %% [markdown]
# ## Composition scores
#
# K-composition (Elhage et al.): how much a layer-1 head's keys read what a layer-0 head wrote,
# `||W_QK^T W_OV|| / (||W_QK|| ||W_OV||)`, centred on the score of random matrices of the same
# shape. In MHA the previous-token head's row stands out.

# %%
comp = circuits.composition_table(models["mha"], modes=["K"], n_baseline=100)
plots.composition_figure(comp, "K")

# %%
comp.sort_values("z", ascending=False).head(4)[["source", "dest", "score", "baseline", "z"]]

# %% [markdown]
# ## Ablation
#
# Knock out the best layer-0 previous-token head (zero its `z`) and measure the layer-1
# induction stripe again: in MHA induction collapses.

# %%
mha = models["mha"]
prev = int(tables["mha"].query("layer == 0")["previous_token"].idxmax()[-1])
ablated = heads.induction_ablation(mha, [(0, prev)], half_len=15)
plots.ablation_figure(ablated)

# %% [markdown]
# In DCMHA zeroing a head's output is not enough: other heads read its attention *weights*
# through the post-softmax Compose. Ablating its weights before the Compose (stage `probs`)
# removes the stripe (composed `pattern` rows need not sum to 1, hence values above 1).

# %%
dc = models["dcmha"]
t = heads.induction_table(dc, half_len=15, stage="probs")
prev = int(t[t.layer == 0]["previous_token"].idxmax()[-1])
by_z = heads.induction_ablation(dc, [(0, prev)], half_len=15)
by_probs = heads.induction_ablation(dc, [(0, prev)], half_len=15, hook="probs", stage="probs")
cols = ["before", "after", "delta"]
pd.concat({"zero z (scored on pattern)": by_z[cols],
           "zero probs (scored on probs)": by_probs[cols]}, axis=1).round(3)

# %% [markdown]
# Infini-attention with 16-token segments: most of the second copy lies in later segments, so
# the layer-1 heads learn to read the compressive memory (gate near 1).

# %%
from attnlens.hooked_models.zoo.recipes import default_text

inf = models["infini"]
spec = infini.memory_specialisation(inf, inf.to_tokens(default_text()))
plots.memory_figure(spec)

# %% [markdown]
# ## The phase change
#
# Train a fresh two-layer MHA model on the same task with `attnlens.training.trainer.fit`, which
# logs every evaluation to `metrics.jsonl`; the evaluation here is the best head's induction
# stripe score. The score jumps within a few dozen steps while the loss falls: the induction
# phase change. (About half a minute on a laptop CPU.)

# %%
import tempfile

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.training.trainer import TrainConfig, fit
from attnlens.interp.tools.induction_study import training_curve
from attnlens.interp.tasks.induction import repeated_tokens, second_half_loss_mask

torch.set_grad_enabled(True)


def sample(batch, gen):
    """[BOS] r r with 6..10 random letters and the loss mask of the second copy."""
    n = int(torch.randint(6, 11, (1,), generator=gen))
    return repeated_tokens(batch, n, 27, generator=gen), second_half_loss_mask(batch, n)


def evaluate(model):
    return {"induction_score": heads.induction_table(model, half_len=10)["induction_stripe"].max()}


cfg = VariantConfig(d_model=64, d_head=16, n_layers=2, n_ctx=21, d_vocab=27, attn_only=True,
                    attention="mha", positional_embedding_type="rotary", seed=0)
STEPS, LR = 500, 3e-3
run_dir = tempfile.mkdtemp()
student = HookedVariantTransformer(cfg)
losses = fit(student, sample, TrainConfig(steps=STEPS, batch_size=32, lr=LR, warmup=10,
                                          eval_every=20, progress=False),
             run_dir=run_dir, evaluate=evaluate)
curve = training_curve(run_dir)
curve.tail(3)

# %%
train = pd.DataFrame({"step": range(1, len(losses) + 1), "train_loss": losses})
train["train_loss"] = train["train_loss"].rolling(10, min_periods=1).mean()
fig = px.line(train, x="step", y="train_loss", title="the induction phase change", height=380)
fig.data[0].update(name="train loss", showlegend=True)
fig.add_scatter(x=curve["step"], y=curve["induction_score"], name="induction score",
                yaxis="y2", mode="lines+markers")
fig.update_layout(yaxis=dict(title="train loss (nats, 10-step mean)"),
                  yaxis2=dict(title="best induction stripe", overlaying="y", side="right",
                              range=[0, 1], tickvals=[0, 0.25, 0.5, 0.75, 1]),
                  legend=dict(x=0.6, y=0.9))
