# %% [markdown]
# # attnlens quickstart
#
# Load a trained language model, run it on source code it never saw, cache its activations,
# look at its heads, then run TransformerLens's own tools on it (`detect_head`,
# `decompose_resid`, activation patching, the logit lens). The last part makes the same calls on
# a model of every attention variant.
#
# The models are the zoo's text language models (`hooked_models/zoo/text-*`, see
# [docs/zoo.md](../docs/zoo.md)): small transformers trained on two CPU cores on the source
# files of the Python standard library, read through a byte-level BPE tokenizer of 4,096
# tokens that ships with each checkpoint. `text-mha-l2` has two attention-only layers of four
# heads; `text-mha-l1` is its one-layer control. More variants are in training and appear here
# once they are in the zoo. Everything runs on a laptop CPU in seconds.

# %%
import pandas as pd
import plotly.express as px
import torch
from plotly.subplots import make_subplots

from attnlens.dashboards.store import default_prompt
from attnlens.hooked_models import zoo
from attnlens.interp.plots import SEQUENTIAL, scale_args
from attnlens.interp.plots.views import shown_text

torch.set_grad_enabled(False)  # analysis only: no gradients needed
text_models = {name: zoo.load(name) for name in zoo.available(kind="text-lm")}
pd.DataFrame({name: {"attention": m.cfg.attention, "layers": m.cfg.n_layers,
                     "heads": m.cfg.n_heads, "d_model": m.cfg.d_model, "n_ctx": m.cfg.n_ctx,
                     "parameters": m.card["parameters"], "tokens trained": m.card["tokens"],
                     "held-out loss": m.card["metrics"]["val_loss"]}
              for name, m in text_models.items()}).T

# %% [markdown]
# ## Held-out text and `run_with_cache`
#
# Every text model stores the validation windows its card was measured on: whole source files
# of the standard library that training never saw. The dashboard's default prompt
# (`attnlens serve`) is the first 480 tokens of the first one; so is ours.

# %%
name = "text-mha-l2"
model = text_models[name]
text = default_prompt(model, zoo.path(name))
tokens = model.to_tokens(text)                  # [BOS] + 480 tokens
print(text[:400], "...")

# %% [markdown]
# Every model is a `transformer_lens.HookedRootModule`: `run_with_cache` returns the logits and
# a TransformerLens `ActivationCache` holding every hook, with TransformerLens's names
# (`cache["pattern", 1]` is `blocks.1.attn.hook_pattern`).

# %%
logits, cache = model.run_with_cache(tokens)
loss = -logits[0, :-1].log_softmax(-1).gather(-1, tokens[0, 1:, None]).mean()
print("tokens", tuple(tokens.shape), "| logits", tuple(logits.shape), "| pattern",
      tuple(cache["pattern", 1].shape), "| z", tuple(cache["z", 1].shape), "|", len(cache),
      "hooks cached")
print(f"next-token loss on this file: {loss:.2f} nats")

# %% [markdown]
# ## Every head on a piece of code
#
# The attention pattern of each head on a few lines of the file (every head, one colour scale;
# spaces shown as ␣, line breaks as ↵). L0H0 puts about half of its weight on the previous
# token, and so, on this snippet, do L1H0 and L1H1 to a lesser degree; L1H3, the induction head
# of notebook 02, rests most of its weight on the first token (BOS) here, where nothing before
# repeats.

# %%
start, stop = 254, 279                          # "Usage: ... chunk = Chunk(file"
snippet = torch.cat([tokens[:, :1], tokens[:, start:stop]], dim=1)
labels = [f"{i}:{shown_text(s)}" for i, s in enumerate(model.to_str_tokens(snippet[0]))]
_, snippet_cache = model.run_with_cache(snippet)
maps = torch.cat([snippet_cache["pattern", layer][0] for layer in range(model.cfg.n_layers)])
fig = px.imshow(maps.numpy(), facet_col=0, facet_col_wrap=4, x=labels, y=labels,
                color_continuous_scale=SEQUENTIAL, zmin=0, zmax=1, width=1100, height=640,
                facet_row_spacing=0.12, facet_col_spacing=0.03,
                labels=dict(x="key", y="query", color="attention"),
                title=f"{name}: every head's pattern on held-out code")
heads_named = [f"L{layer}H{head}" for layer in range(model.cfg.n_layers)
               for head in range(model.cfg.n_heads)]
fig.for_each_annotation(lambda a: a.update(text=heads_named[int(a.text.split("=")[1])]))
fig.update_xaxes(tickfont_size=8, tickangle=-90).update_yaxes(tickfont_size=8)

# %% [markdown]
# ## TransformerLens's own tools, unchanged
#
# `detect_head` scores heads against TransformerLens's built-in patterns, here on the held-out
# file. L0H0 is the previous-token head, in layer 0 as in the textbook circuit, and L1H3 is the
# head that scores highest as an induction head, about ten times any other head (notebook 02
# measures it on repeated random tokens, the zoo's probe).

# %%
from transformer_lens import patching
from transformer_lens.head_detector import detect_head

pd.DataFrame({kind: detect_head(model, text, kind).flatten().tolist()
              for kind in ("previous_token_head", "duplicate_token_head", "induction_head")},
             index=heads_named).round(3)

# %% [markdown]
# `decompose_resid` splits the final residual stream into the embedding and each layer's
# attention output; they add up to it exactly:

# %%
parts, parts_labels = cache.decompose_resid(return_labels=True)
assert torch.allclose(parts.sum(0), cache["resid_post", -1], atol=1e-4)
parts_labels, tuple(parts.shape)

# %% [markdown]
# **Activation patching.** At the end of the snippet, `chunk = Chunk(file`, the model expects
# `)`. The bracket two tokens back is what tells it: replace `(` by ` the` and `)` becomes far
# less likely. Patching the clean residual stream back in, one layer and position at a time,
# shows where that information travels.

# %%
query = snippet.shape[1] - 1                      # the position of "file"
answer = tokens[0, stop]                          # ")"
the = model.to_tokens(" the", prepend_bos=False)[0, 0]


def metric(logits):
    return logits[0, query].log_softmax(-1)[answer]


corrupt = snippet.clone()
corrupt[0, query - 1] = the                       # "(" -> " the"
lo, hi = metric(model(corrupt)).item(), metric(model(snippet)).item()
print(f"log p({model.to_string(answer[None])!r}): clean {hi:.2f}, '(' replaced {lo:.2f}")
result = patching.get_act_patch_resid_pre(model, corrupt, snippet_cache, metric)
restored = (result - lo) / (hi - lo)
px.imshow(restored[:, -6:], x=labels[-6:], y=["resid_pre 0", "resid_pre 1"],
          labels=dict(x="position", color="restored"), color_continuous_scale=SEQUENTIAL,
          zmin=0, zmax=1, height=260, aspect="auto", text_auto=".2f",
          title="patching the clean resid_pre: fraction of log p(')') restored")

# %% [markdown]
# Before layer 1 the bracket is still only at its own position. Patching `resid_pre 1` there
# restores everything, and patching it at `file` restores almost nothing, so a layer-1 head
# moves the bracket. Patching each head's output (at every position) finds that head: L1H0, and
# partly L1H1. Both attend from `file` to `(`, the previous token, with most of their weight.
# Over the whole file L1H0 is a weaker previous-token head (0.16 by `detect_head` above); here
# it attends back one token.

# %%
by_head = patching.get_act_patch_attn_head_out_all_pos(model, corrupt, snippet_cache, metric)
pd.DataFrame({"restored": ((by_head - lo) / (hi - lo)).flatten().tolist(),
              "attention from 'file' to '('": torch.stack(
                  [snippet_cache["pattern", layer][0, :, query, query - 1]
                   for layer in range(model.cfg.n_layers)]).flatten().tolist()},
             index=heads_named).round(2)

# %% [markdown]
# **Logit lens.** Unembed the residual stream before each layer and at the end (through the
# final LayerNorm) and score the file's actual next tokens: the embeddings alone (a bigram
# model) are far behind, and each attention layer lowers the loss.

# %%
accum, names = cache.accumulated_resid(apply_ln=True, return_labels=True)
log_probs = (accum @ model.W_U + model.b_U).log_softmax(-1)[:, 0, :-1]   # [component pos vocab]
nxt = tokens[0, 1:]
lens_loss = -log_probs.gather(-1, nxt.expand(len(names), -1).unsqueeze(-1))[..., 0]
pd.DataFrame({"next-token loss (nats)": lens_loss.mean(1)}, index=names).round(2)

# %% [markdown]
# ## Every attention variant
#
# The same calls work on every variant. Each variant's 2-layer text model is used where the zoo
# has one; the others (still in training) are stood in for by the bundled `induction-*` toys:
# two attention-only layers of four heads trained to predict the second copy of a repeated run
# of random letters, whose default text is such a run.

# %%
def model_of(variant):
    """(name, model): the 2-layer text model of `variant` when the zoo has one, else its toy."""
    name = next(n for n in (f"text-{variant}-l2", f"induction-{variant}")
                if n in zoo.available())
    return name, zoo.load(name)


variants = {v: model_of(v) for v in ("mha", "mta", "cope", "dcmha", "infini")}
prompts = {v: m.to_tokens(default_prompt(m, zoo.path(n)))[:, :48]
           for v, (n, m) in variants.items()}
pd.DataFrame({v: {"model": n, "layers": m.cfg.n_layers, "heads": m.cfg.n_heads,
                  "vocabulary": m.cfg.d_vocab,
                  "prompt (start)": repr(m.to_string(prompts[v][0, 1:]))[:40]}
              for v, (n, m) in variants.items()}).T

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
for v, (_, m) in variants.items():
    _, c = m.run_with_cache(prompts[v])
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
              for v, (_, m) in variants.items() for s in m.stages(1)]
             ).set_index(["variant", "hook"])

# %% [markdown]
# ## One head at every stage
#
# Layer 1's strongest induction head of each variant (its highest induction-stripe score on
# repeated random tokens), drawn on the variant's prompt at each map stage of its catalogue
# (colour scales are per stage; masked entries are blank). In the toy models the induction
# stripe (each query attends to the token after the previous copy of itself) appears at the
# stage where the variant builds it.

# %%
from attnlens.interp.tools.heads import induction_table
from attnlens.interp.tools.layer_stages import layer_stage_maps


def head_at_every_stage(variant):
    n, m = variants[variant]
    table = induction_table(m, half_len=12)
    head = int(table[table.layer == 1]["induction_stripe"].idxmax()[-1])
    maps = layer_stage_maps(m, prompts[variant], layer=1)
    fig = make_subplots(rows=1, cols=len(maps), subplot_titles=[s.stage.name for s in maps],
                        horizontal_spacing=0.02)
    for i, s in enumerate(maps):
        z = s.values[0, head].float()
        z = torch.where(torch.isfinite(z), z, torch.nan)
        fig.add_heatmap(z=z.numpy(), row=1, col=i + 1, showscale=False,
                        **scale_args(z.numpy()))
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(title=f"{n}: L1H{head} at every map stage",
                      height=260, width=max(420, 190 * len(maps)), margin=dict(t=70, b=10))
    return fig


head_at_every_stage("mta")

# %%
head_at_every_stage("cope")

# %%
head_at_every_stage("dcmha")

# %%
head_at_every_stage("infini")
