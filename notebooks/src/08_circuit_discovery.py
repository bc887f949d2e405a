# %% [markdown]
# # Circuit discovery
#
# `attnlens.interp.circuits.discovery` scores every edge of a model's computational graph by edge
# attribution patching (first order) or EAP-IG. It keeps the top edges that connect the input
# to the logits and measures the circuit's faithfulness with every other edge patched to the
# corrupted run. The graph has the usual residual edges, plus within-layer edges where heads mix
# their maps (MTA head mixing, DCMHA Compose) and Infini's memory reads.
#
# This notebook runs it on five bundled models:
#
# 1. the induction circuit of `induction-mha`;
# 2. MTA's find-the-block (`mta-findblock-last-mta-s0`);
# 3. DCMHA's conjunction lookup (`dcmha-conjunction-dcmha-s0`): its Compose edges are in the
#    circuit, but the model has not learned the conjunction itself;
# 4. the induction circuit of `text-mha-l2`, a language model trained on source code;
# 5. the one-layer induction circuit of `text-mta-l2`, which runs through head mixing: the
#    edges that a graph without head-to-head edges cannot draw.
#
# The full tables are in [docs/circuit_discovery.md](../docs/circuit_discovery.md).

# %%
import pandas as pd
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.circuits.discovery import (
    circuit_figure,
    conjunction_task_pair,
    discover,
    find_block_task,
    induction_heads,
    induction_task,
    recovery,
)
from attnlens.interp.circuits.discovery.extract import circuit_metric, faithfulness_curve, reference_record

torch.set_num_threads(1)
pd.set_option("display.width", 120)
print("torch", torch.__version__)

# %% [markdown]
# ## 1. The induction circuit
#
# The clean prompts are `[BOS] r r` and the corrupted ones `[BOS] r' r`. The metric is the mean
# log-probability of the next token over the second copy. EAP-IG with 5 steps scores every edge.
# The pruned top-20 circuit should contain the previous-token head -> induction head
# K-composition edge.

# %%
model = zoo.load("induction-mha")
task = induction_task(model, n_prompts=16, half_len=8, seed=0)
found = discover(model, task, method="eap-ig", steps=5, top_k=20)
heads = induction_heads(model, task)
rec = recovery(found.graph, found.scores, found.circuit, heads)
print(found.graph.summary())
print({k: round(v, 3) if isinstance(v, float) else v for k, v in found.faithfulness.items()})
print("previous-token heads:", heads["previous_token"], "| K-composition edges in the circuit:",
      rec["k_composition"])
found.top_edges(8)

# %%
circuit_figure(found.graph, found.scores, found.circuit)

# %% [markdown]
# ## 2. Find the block (MTA)
#
# The clean prompts are held-out find-the-block samples with the answer appended. The corrupted
# prompts replace the target block's letters by letters outside the query, so no block matches
# the query. The metric is the log-probability of the answer (the target block's last letter).
#
# Nearly all of the behaviour runs through one layer-0 head, L0H1: its keys, its values, and its
# output to the logits. This model was trained as in the paper, with the key-query convolution
# only and no head mixing. Its graph therefore has no within-layer edges: the convolution is
# inside the head node.

# %%
mta = zoo.load("mta-findblock-last-mta-s0")
fb = find_block_task(mta, n_prompts=16, seed=0)
fb_found = discover(mta, fb, method="eap-ig", steps=5, top_k=10)
print(fb.description)
print(fb_found.graph.summary())
print({k: round(v, 3) if isinstance(v, float) else v for k, v in fb_found.faithfulness.items()})
fb_found.top_edges(10)

# %%
faithfulness_curve(mta, fb_found.graph, fb_found.scores, fb.clean, fb.corrupted, fb.metric,
                   sizes=(1, 2, 3, 5, 10)).round(3)

# %% [markdown]
# ## 3. Conjunction (DCMHA) and its Compose edges
#
# Two corruptions of the same lookups:
#
# - **attribute**: one of the target record's two conjoined attributes (colour or shape) is
#   replaced by one no record uses;
# - **value**: the target record's value is replaced by one absent from the prompt.
#
# The shipped model scores below 1/3, the ceiling of adding single-attribute matches. It barely
# reacts to the attribute corruption, so there is no conjunction circuit to find. It does react
# to the value corruption: it copies a value from the context. The circuit for that behaviour
# holds Compose edges.

# %%
dc = zoo.load("dcmha-conjunction-dcmha-s0")
rows = []
for corrupt in ("attribute", "value"):
    t = conjunction_task_pair(dc, n_prompts=16, seed=0, corrupt=corrupt)
    with torch.no_grad():
        rows.append({"corruption": corrupt, "metric clean": float(t.metric(dc(t.clean))),
                     "metric corrupted": float(t.metric(dc(t.corrupted)))})
pd.DataFrame(rows).round(3)

# %%
conj = conjunction_task_pair(dc, n_prompts=16, seed=0, corrupt="value")
dc_found = discover(dc, conj, method="eap-ig", steps=5, top_k=20)
compose = [e.name for e in dc_found.circuit if e.kind == "mix"]
ref = reference_record(dc, dc_found.graph, conj.corrupted)
faith = dc_found.faithfulness
without = circuit_metric(dc, dc_found.graph, [e for e in dc_found.circuit if e.kind != "mix"],
                         conj.clean, conj.metric, ref)
print(f"faithfulness of the top-20 circuit: {faith['faithfulness']:.3f}")
print(f"Compose edges in it ({len(compose)}):", ", ".join(compose))
print(f"faithfulness without them: "
      f"{(without - faith['ablated']) / (faith['clean'] - faith['ablated']):.3f}")
dc_found.top_edges(10)

# %%
circuit_figure(dc_found.graph, dc_found.scores, dc_found.circuit)

# %% [markdown]
# ## 4. The induction circuit of a text language model
#
# `text-mha-l2` is the zoo's 2-layer attention-only MHA trained on the Python standard library's
# source code (41M tokens, [docs/zoo.md](../docs/zoo.md)). The same search as in part 1, with
# 20 random ids of its 4,096-token vocabulary repeated: the previous-token head -> induction
# head K-composition edge ranks near the top of all 81 edges, and the induction head writes to
# the logits. This model copies random ids only partly (the log-prob of the second copy is far
# below 0), so it is not saturated, and first-order attribution patching already gives a
# faithful circuit here, unlike on the toys.

# %%
lm = zoo.load("text-mha-l2")
lm_task = induction_task(lm, n_prompts=32, half_len=20, seed=0)
lm_heads = induction_heads(lm, lm_task)
rows = {}
for method in ("eap-ig", "attribution"):
    f = discover(lm, lm_task, method=method, steps=10, top_k=20)
    r = recovery(f.graph, f.scores, f.circuit, lm_heads)
    rows[method] = {"faithfulness": f.faithfulness["faithfulness"],
                    "K-composition edges": " ".join(r["k_composition"]) or "-",
                    "rank of the best one": r["best_k_composition_rank"],
                    "induction -> logits": " ".join(r["induction_to_logits"]) or "-"}
    if method == "eap-ig":
        lm_found = f
print("previous-token heads:", lm_heads["previous_token"], "| induction heads:",
      lm_heads["induction"])
pd.DataFrame(rows).T.round(3)

# %%
circuit_figure(lm_found.graph, lm_found.scores, lm_found.circuit)

# %% [markdown]
# ## 5. An induction head in one layer, lent to other heads by head mixing (MTA)
#
# `text-mta-l2` is the MTA model of the same recipe. The search finds no previous-token head:
# the shift that MHA buys with a second layer is in L0H3's pre-softmax key-query kernel, which
# scores the current query against the key *before* each key, so layer 0 already attends to the
# token after an earlier occurrence of the current one (`attnlens.interp.variants.mta.kernel_table` calls that
# kernel class "induction"). `recovery` counts such a layer-0 induction head -> logits as a
# circuit of its own (`one_layer`). The post-softmax head mixing then hands L0H3's map to other
# heads of layer 0: those within-layer edges are in the circuit, and the circuit without them
# keeps much less of the gap.

# %%
from attnlens.interp.variants.mta import plain_kernel  # noqa: E402

mta_lm = zoo.load("text-mta-l2")
mta_task = induction_task(mta_lm, n_prompts=32, half_len=20, seed=0)
mta_heads = induction_heads(mta_lm, mta_task)
mta_found = discover(mta_lm, mta_task, method="eap-ig", steps=10, top_k=20)
mta_rec = recovery(mta_found.graph, mta_found.scores, mta_found.circuit, mta_heads)
faith = mta_found.faithfulness
ref = reference_record(mta_lm, mta_found.graph, mta_task.corrupted)
residual_only = [e for e in mta_found.circuit if e.kind != "mix"]
without = circuit_metric(mta_lm, mta_found.graph, residual_only, mta_task.clean,
                         mta_task.metric, ref)
print("previous-token heads:", mta_heads["previous_token"] or "none", "| induction heads:",
      mta_heads["induction"], "| layer-0 induction heads -> logits:", mta_rec["one_layer"])
print(f"metric clean {faith['clean']:.3f}, corrupted {faith['ablated']:.3f}; "
      f"top-20 faithfulness {faith['faithfulness']:.3f}")
print("head-mixing edges in it:", ", ".join(e.name for e in mta_found.circuit if e.kind == "mix"))
print(f"faithfulness without them: "
      f"{(without - faith['ablated']) / (faith['clean'] - faith['ablated']):.3f}")
mta_found.top_edges(10)

# %% [markdown]
# The kernel is the mechanism: switch L0H3's pre-softmax kernel to the identity
# (`plain_kernel`, every other weight unchanged) and the model no longer copies: the clean
# metric falls most of the way to the corrupted one (what is left, about 1.5 nats, the other
# heads still recover).

# %%
with torch.no_grad():
    with plain_kernel(mta_lm, 0, 3):
        switched = float(mta_task.metric(mta_lm(mta_task.clean)))
    trained = float(mta_task.metric(mta_lm(mta_task.clean)))
print(f"log-prob of the second copy: trained {trained:.3f}, L0H3 kernel switched off "
      f"{switched:.3f}, corrupted {faith['ablated']:.3f}")

# %%
circuit_figure(mta_found.graph, mta_found.scores, mta_found.circuit)

# %% [markdown]
# ## From a sweep
#
# The `circuit` analysis of `attnlens sweep` writes each prompt shard's edge scores with their
# mean and their sum over the shard's prompts. The merged mean is the score on all prompts at
# once. Its corruption is drawn from each prompt's own tokens, so sharding does not change it.
# Here the analysis is run directly on one batch:

# %%
from attnlens.interp.circuits.discovery.prompt_scores import prompt_edge_scores  # noqa: E402
from attnlens.interp.tasks.induction import repeated_tokens  # noqa: E402

tokens = repeated_tokens(8, 8, model.cfg.d_vocab, seed=1)
table = prompt_edge_scores(model, tokens, corrupt="first_half", steps=5)
table.reindex(table.score.abs().sort_values(ascending=False).index).head(6).round(3)
