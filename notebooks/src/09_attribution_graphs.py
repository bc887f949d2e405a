# %% [markdown]
# # Attribution graphs on every variant
#
# `attnlens.interp.attribution` builds attribution graphs (Ameisen et al. 2025, "Circuit Tracing") on
# any attnlens model with per-layer transcoders: the MLPs are replaced by the transcoders,
# attention patterns and norm scales are frozen at their values on the prompt, and the model
# that remains is linear in its sources (token embeddings, active features, error nodes). Every
# edge is then an exact direct effect. Because `hook_pattern` is always the *effective* pattern,
# one freezing rule covers MTA's convolved maps, DCMHA's composed ones, CoPE's and Infini's.
#
# The graph says what flowed through the attention heads. The QK attribution says *why* a head
# attended where it did: its pre-softmax score split over the same sources, through the query
# and through the key.
#
# This notebook uses the transcoders shipped with `text-mha-l4mlp` and `text-dcmha-l4mlp`
# (`python -m attnlens.lab.transcoders`; their cards give explained variance, L0 and the loss
# with each MLP replaced). Findings over 16 prompts with intervals are in
# [docs/attribution.md](../docs/attribution.md).

# %%
import json

import pandas as pd
import torch

from attnlens.lab.attribution_study import heads_from_card, induction_prompt
from attnlens.hooked_models import zoo
from attnlens.interp.attribution.contexts import feature_activations, top_contexts, transcoders_for
from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.prune import prune
from attnlens.interp.attribution.qk import attribute_qk, pattern_sources
from attnlens.interp.attribution.replacement import float64_copy
from attnlens.interp.plots.attribution_graph import graph_figure

torch.set_num_threads(1)
pd.set_option("display.width", 120)
card = json.loads((zoo.path("text-mha-l4mlp") / "transcoders" / "card.json").read_text())
pd.DataFrame(card["metrics"]["layers"]).T

# %% [markdown]
# ## 1. An induction prompt on `text-mha-l4mlp`
#
# Ten tokens drawn from the model's validation text, then the first nine again: the next token
# is the tenth by induction. The model is copied to float64, where the graph's identities hold
# to ~1e-12.

# %%
model = float64_copy(zoo.load("text-mha-l4mlp"))
transcoders = transcoders_for(zoo.path("text-mha-l4mlp"))
tokens = induction_prompt("text-mha-l4mlp", seed=20261204, bos=model.tokenizer.bos_token_id)
print(model.to_str_tokens(tokens[0]))
target = int(tokens[0, 10])
graph = attribute(model, transcoders, tokens, targets=[target])
pruned = prune(graph, node_threshold=0.8, edge_threshold=0.98)
graph.node_influence = pruned.node_influence
rows = [graph.logit_index(0)]
print(f"target {graph.logit_token_strings[0]!r}, p={float(graph.logit_probabilities[0]):.3f}; "
      f"{graph.n_features} active features, {int(pruned.node_mask[:graph.n_features].sum())} kept")
print("edges + bias - target value:",
      float(graph.adjacency[rows].sum() + graph.bias[rows] - graph.target_values[rows]))
print(f"error nodes' share of the direct effects on the target: {graph.error_share():.1%}")

# %%
graph_figure(graph, pruned, title="text-mha-l4mlp: induction prompt")

# %% [markdown]
# The most influential features, with their top contexts in the model's validation windows:

# %%
from attnlens.interp.attribution.contexts import context_windows  # noqa: E402

windows = context_windows(zoo.path("text-mha-l4mlp"))
influence = pruned.node_influence[:graph.n_features]
acts = {}
for i in influence.argsort(descending=True)[:4].tolist():
    layer, _, feature = graph.features[i].tolist()
    acts.setdefault(layer, feature_activations(model, transcoders[layer], windows))
    print(graph.node_label(i), f"influence {float(influence[i]):.3f}")
    for c in top_contexts(model, acts[layer], windows, feature, n=3):
        print(f"    {c.activation:6.2f}  {c.before!r} [[{c.token!r}]] {c.after!r}")

# %% [markdown]
# ## 2. Why did the induction head attend there?
#
# The card's induction heads and its previous-token head:

# %%
(induction, previous) = heads_from_card("text-mha-l4mlp")
print("induction heads", induction, "previous-token head", previous)
layer, head = induction[0]
query, key = tokens.shape[1] - 1, 10
qk = attribute_qk(model, transcoders, tokens, layer, head, query, key)
print(f"L{layer}H{head} score at (query {query}, key {key}): {qk.score:.3f}")
print(f"through the query: {float(qk.query_side.sum()):+.3f} + bias {qk.query_bias:+.3f}")
print(f"through the key:   {float(qk.key_side.sum()):+.3f} + bias {qk.key_bias:+.3f}")
pd.DataFrame({"query side": [f"{v:+.3f} {lbl}" for lbl, v in qk.top("query", 6)],
              "key side": [f"{v:+.3f} {lbl}" for lbl, v in qk.top("key", 6)]})

# %% [markdown]
# The key side is led by sources at position 9, the token *before* the key, which is the
# token the query holds: the previous-token signal. Taking the previous-token head out of the
# replacement model (its `hook_z` zeroed) shows how much of that signal it carries:

# %%
prev_layer, prev_head = previous


def zero_head(act, hook):
    act = act.clone()
    act[:, :, prev_head] = 0
    return act


without = attribute_qk(model, transcoders, tokens, layer, head, query, key,
                       extra_hooks=[(f"blocks.{prev_layer}.attn.hook_z", zero_head)])
at_prev = [i for i, lbl in enumerate(qk.labels) if "@9 " in lbl]
print(f"key-side signal from position 9: {float(qk.key_side[at_prev].sum()):+.3f} with "
      f"L{prev_layer}H{prev_head}, {float(without.key_side[at_prev].sum()):+.3f} without; "
      f"score {qk.score:.3f} -> {without.score:.3f}")

# %% [markdown]
# ## 3. DCMHA: the Compose hand-off
#
# In `text-dcmha-l4mlp` a head's effective pattern is its softmax plus what Compose mixes in
# from the other heads. `pattern_sources` splits a pattern entry exactly over the softmax
# entries it mixes; `phase="pre"` does the same for the composed pre-softmax score.

# %%
dc = float64_copy(zoo.load("text-dcmha-l4mlp"))
dc_tokens = induction_prompt("text-dcmha-l4mlp", seed=20261204, bos=dc.tokenizer.bos_token_id)
(dc_induction, dc_previous) = heads_from_card("text-dcmha-l4mlp")
rows = []
for layer, head in dc_induction:
    for phase in ("pre", "post"):
        split = pattern_sources(dc, dc_tokens, layer, head, dc_tokens.shape[1] - 1, 10,
                                phase=phase)
        by_head = pd.Series(split.contributions.numpy()).groupby(
            split.entries[:, 0].numpy()).sum()
        rows.append({"head": f"L{layer}H{head}", "phase": phase, "value": split.value,
                     **{f"from H{h}": v for h, v in by_head.items()}})
pd.DataFrame(rows).round(4)

# %% [markdown]
# ## 4. Graph JSON for circuit-tracer's and Neuronpedia's viewers
#
# `attnlens.interp.attribution.export.write_graph` writes the pruned graph in the JSON those viewers
# read (`attnlens graph MODEL "prompt" --out DIR` does the same from the command line).

# %%
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

from attnlens.interp.attribution.export import write_graph  # noqa: E402

with tempfile.TemporaryDirectory() as out:
    path = write_graph(graph, out, "mha-induction", node_mask=pruned.node_mask,
                       edge_mask=pruned.edge_mask, node_threshold=0.8)
    data = json.loads(Path(path).read_text())
print({k: (len(v) if isinstance(v, list) else type(v).__name__) for k, v in data.items()})
data["nodes"][0]
