# %% [markdown]
# # attnlens quickstart
#
# Load a trained model of each attention variant, cache its activations, read its stage
# catalogue, look at one head at every stage, then run TransformerLens's own tools on it
# (`detect_head`, `decompose_resid`, activation patching, the logit lens).
#
# The models are the bundled `induction-*` toys (`hooked_models/zoo/`): two attention-only
# layers of four heads, trained to predict the second copy of a repeated run of random letters.
# Everything here runs on a laptop CPU in seconds.

# %%
import pandas as pd
import plotly.express as px
import torch
from plotly.subplots import make_subplots

from hooked_models import zoo

torch.set_grad_enabled(False)  # analysis only: no gradients needed
models = {name.removeprefix("induction-"): zoo.load(name)
          for name in zoo.available(kind="induction")}
pd.DataFrame({v: {"attention": m.cfg.attention, "layers": m.cfg.n_layers,
                  "heads": m.cfg.n_heads, "d_model": m.cfg.d_model, **m.card["metrics"]}
              for v, m in models.items()}).T

# %% [markdown]
# ## `run_with_cache`
#
# Every model is a `transformer_lens.HookedRootModule`: `run_with_cache` returns the logits and
# a TransformerLens `ActivationCache` holding every hook, with TransformerLens's names
# (`cache["pattern", 1]` is `blocks.1.attn.hook_pattern`).

# %%
text = "kqzwxrnbmfhdp" * 2
model = models["mha"]
logits, cache = model.run_with_cache(text)
print(model.to_str_tokens(text)[:8], "...")
print("logits", tuple(logits.shape), "| pattern", tuple(cache["pattern", 1].shape),
      "| z", tuple(cache["z", 1].shape), "|", len(cache), "hooks cached")

# %% [markdown]
# ## The effective pattern
#
# Whatever the variant, `hook_pattern` is exactly the matrix that multiplies the values:
# `z[q, h] = sum_k pattern[h, q, k] v[k, h]`. For MTA and DCMHA it is the map after the
# post-softmax mixing (rows need not sum to 1); for Infini-attention it spans the whole context
# (the local softmax weighted by 1 - gate plus the memory's read weights weighted by the gate).
# So one detector, one circuit tool and one figure serve every variant. Checked here on all five:

# %%
rows = {}
for v, m in models.items():
    _, c = m.run_with_cache(text)
    for layer in range(m.cfg.n_layers):
        z = torch.einsum("bhqk,bkhd->bqhd", c["pattern", layer], c["v", layer])
        rows[(v, layer)] = {"max |pattern @ v - z|": (z - c["z", layer]).abs().max().item(),
                            "row sums (min..max)": "{:.2f}..{:.2f}".format(
                                *c["pattern", layer].sum(-1).aminmax())}
pd.DataFrame(rows).T

# %% [markdown]
# ## The stage catalogue
#
# Each variant declares, in one place, the ordered map stages of its attention: the hook, whether
# it is before or after the softmax, whether its rows are probability distributions. The
# analyses, the dashboard and [docs/hooks.md](../docs/hooks.md) all read it.

# %%
pd.DataFrame([{"variant": v, "hook": f"blocks.1.attn.hook_{s.name}", "softmax": s.softmax,
               "rows sum to 1": s.row_stochastic, "map": s.is_map, "description": s.description}
              for v, m in models.items() for s in m.stages(1)]).set_index(["variant", "hook"])

# %% [markdown]
# ## One head at every stage
#
# Layer 1's strongest induction head of each variant, drawn at each map stage of its catalogue
# (colour scales are per stage; masked entries are blank). The induction stripe (each query
# attends to the token after the previous copy of itself) appears at the stage where the variant
# builds it.

# %%
from interp.heads import induction_table
from interp.layer_stages import layer_stage_maps
from interp.plots import SEQUENTIAL, scale_args

tokens = models["mha"].to_tokens(text)


def head_at_every_stage(variant):
    m = models[variant]
    table = induction_table(m, half_len=12)
    head = int(table[table.layer == 1]["induction_stripe"].idxmax()[-1])
    maps = layer_stage_maps(m, tokens, layer=1)
    fig = make_subplots(rows=1, cols=len(maps), subplot_titles=[s.stage.name for s in maps],
                        horizontal_spacing=0.02)
    for i, s in enumerate(maps):
        z = s.values[0, head].float()
        z = torch.where(torch.isfinite(z), z, torch.nan)
        fig.add_heatmap(z=z.numpy(), row=1, col=i + 1, showscale=False,
                        **scale_args(z.numpy()))
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title=f"{variant}: L1H{head} at every map stage",
                      height=260, width=max(420, 190 * len(maps)), margin=dict(t=70, b=10))
    return fig


head_at_every_stage("mta")

# %%
head_at_every_stage("cope")

# %%
head_at_every_stage("dcmha")

# %%
head_at_every_stage("infini")

# %% [markdown]
# ## TransformerLens's own tools, unchanged
#
# `detect_head` scores heads against TransformerLens's built-in patterns:

# %%
from transformer_lens import patching
from transformer_lens.head_detector import detect_head

pd.DataFrame({kind: detect_head(model, text, kind).flatten().tolist()
              for kind in ("previous_token_head", "duplicate_token_head", "induction_head")},
             index=[f"L{l}H{h}" for l in range(2) for h in range(4)]).round(3)

# %% [markdown]
# `decompose_resid` splits the final residual stream into the embedding and each layer's
# attention output; they add up to it exactly:

# %%
parts, labels = cache.decompose_resid(return_labels=True)
assert torch.allclose(parts.sum(0), cache["resid_post", -1], atol=1e-5)
labels, tuple(parts.shape)

# %% [markdown]
# **Activation patching.** Position 17 is the second copy of position 4, so the model should
# predict letter 5 there. Corrupt one letter of the first copy and see what breaks, then patch
# the clean residual stream back in, one layer and position at a time, to see where the needed
# information lives.

# %%
clean = model.to_tokens(text)
query = 4 + 13                                    # the second copy of position 4
answer = clean[0, query + 1]                      # = the letter at position 5
_, clean_cache = model.run_with_cache(clean)


def metric(logits):
    return logits[0, query].log_softmax(-1)[answer]


def corrupted(pos):
    tokens = clean.clone()
    tokens[0, pos] = (tokens[0, pos] % 26) + 1    # a different letter
    return tokens


{f"corrupt position {pos}": round(metric(model(corrupted(pos))).item(), 3) for pos in (3, 4, 5)}

# %% [markdown]
# Only the copied letter (position 5) matters: changing the letter that the second copy should
# match (position 4) leaves the prediction intact, so this model finds the copy by its relative
# position (rotary) at least as much as by content. Patching shows the copied letter is read at
# position 5, from either layer's residual stream:

# %%
corrupt = corrupted(5)
lo, hi = metric(model(corrupt)).item(), metric(model(clean)).item()
result = patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)
restored = (result - lo) / (hi - lo)
px.imshow(restored, labels=dict(x="position", y="layer (resid_pre)", color="restored"),
          title="patching the clean resid_pre: fraction of log p(answer) restored",
          color_continuous_scale=SEQUENTIAL, zmin=0, zmax=1, height=260, aspect="auto"
          ).update_yaxes(tickvals=[0, 1])

# %% [markdown]
# **Logit lens.** Unembed the residual stream after each layer (through the final LayerNorm):
# the probability of the right next letter on the second copy appears only after layer 1, where
# the induction heads write it.

# %%
accum, names = cache.accumulated_resid(apply_ln=True, return_labels=True)
probs = (accum @ model.W_U + model.b_U).softmax(-1)[:, 0]      # [component pos vocab]
nxt = clean[0, 1:]
p_next = probs[:, :-1].gather(-1, nxt.expand(len(names), -1).unsqueeze(-1))[..., 0]
pd.DataFrame({"first copy": p_next[:, :13].mean(1), "second copy": p_next[:, 13:].mean(1)},
             index=names).round(3)
