# %% [markdown]
# # Induction heads across variants
#
# Olsson et al.'s induction circuit, found with the same analyses in every attention variant:
# previous-token heads, induction heads, the composition between them, what ablation removes,
# and the phase change in which they form during training (a small model trained here).
#
# The models are the bundled `induction-*` toys: each variant trained on the same task (the
# second copy of `[BOS] r r`, `r` random letters), two attention-only layers of four heads.
# This notebook replaces the earlier "tour of the zoo".

# %%
import pandas as pd
import plotly.express as px
import torch

from hooked_models import zoo
from interp import circuits, heads, infini, plots

torch.set_grad_enabled(False)
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
from hooked_models.zoo.recipes import default_text

inf = models["infini"]
spec = infini.memory_specialisation(inf, inf.to_tokens(default_text()))
plots.memory_figure(spec)

# %% [markdown]
# ## The phase change
#
# Train a fresh two-layer MHA model on the same task with `hooked_models.trainer.fit`, which
# logs every evaluation to `metrics.jsonl`; the evaluation here is the best head's induction
# stripe score. The score jumps within a few dozen steps while the loss falls: the induction
# phase change. (About half a minute on a laptop CPU.)

# %%
import tempfile

from hooked_models import HookedVariantTransformer, VariantConfig
from hooked_models.trainer import TrainConfig, fit
from interp.induction_study import training_curve
from interp.tasks.induction import repeated_tokens, second_half_loss_mask

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
