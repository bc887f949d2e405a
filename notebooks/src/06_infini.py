# %% [markdown]
# # Infini-attention: memory reads, gates, and streaming a long passkey prompt
#
# Infini-attention splits the input into segments. Inside a segment a head attends as usual
# (`a_dot`); across segments it reads a compressive memory `M` (a d_key x d_value matrix per head,
# updated after every segment) with its query (`a_mem`), and mixes the two with a learned
# per-head gate `g = sigmoid(beta)`: `A = g a_mem + (1 - g) a_dot` (stages `hook_a_mem`,
# `hook_gate`; `hook_mem_weights` is the memory read written out as weights on the earlier
# segments' keys). The memory never grows, so a model can stream inputs of any length.
#
# The model is the paper-task model `hooked_models/zoo/infini-passkey-s0` (2 layers, 4 heads,
# d_head 16, 32-token segments, linear + delta memory), trained from scratch on passkey prompts
# of 160 word-level tokens (`python -m attnlens.lab.paper train infini-passkey-s0`): a 5-digit key
# hidden in filler text, asked for at the end.

# %%
import pandas as pd
import plotly.graph_objects as go
import torch

from attnlens.hooked_models import zoo
from attnlens.hooked_models.streaming import InfiniStream
from attnlens.interp.variants import infini
from attnlens.interp import plots
from attnlens.interp.tasks.passkey import passkey_accuracy, passkey_task, predict
from attnlens.lab.paper import infini as infini_paper
from attnlens.lab.paper.infini import DEPTHS, FACTORS, TOKENIZER

torch.set_grad_enabled(False)
model = zoo.load("infini-passkey-s0")
metrics, n_ctx = model.card["metrics"], model.cfg.n_ctx
grid = pd.DataFrame([{"length": f"{f}x ({f * n_ctx})", "depth": d,
                      "accuracy": metrics[f"acc_x{f}_d{d:.2f}"]}
                     for f in FACTORS for d in DEPTHS])
grid.pivot_table(index="length", columns="depth", values="accuracy", sort=False)

# %% [markdown]
# Token accuracy on the key's 5 digits (chance 0.1) from the card, by length (multiples of the
# training length) and depth (0: the key right after the introduction, 1: right before the
# question). In distribution the key comes back from every depth, so the memory does carry it
# across segments. Beyond the training length, the key in the last segment (depth 1, within
# local attention's reach) survives best and keys that must come through the memory degrade:
# the paper's length generalisation (1B parameters, 1M tokens) does not reproduce at our scale.
# docs/reproduction.md has the full reading.
#
# ## Gates: memory heads, local heads, mixers
#
# `infini.memory_specialisation` classifies each head's gate as in the paper's Fig. 3 (memory
# specialist g >= 0.8, local specialist g <= 0.2, mixer near 0.5) and measures how much of the
# head's output comes from the memory, `|g a_mem| / |A|`, on tokens that have a memory.

# %%
prompts = passkey_task(8, n_ctx, depth=0.0, tokenizer=TOKENIZER, seed=1)
gates = infini.memory_specialisation(model, prompts.tokens)
gates[["gate", "class", "memory_ratio", "local_ratio"]].round(3)

# %%
plots.memory_figure(gates).update_layout(height=380)

# %% [markdown]
# ## Does the memory read the key?
#
# At the positions that predict the key's digits, the memory read weights (`mem_weights`, one
# weight per earlier-segment key) of each head: the share of the memory read that falls on the
# key line's tokens (`The pass key is NNNNN . Remember it . NNNNN is the pass key .`), against
# the share those tokens have among all the memory's keys (what a read blind to content gives).
# The key is at depth 0 here, several segments before the question, so only the memory can
# bring it back.

# %%
_, cache = model.run_with_cache(prompts.tokens,
                                names_filter=lambda n: n.endswith("hook_mem_weights"))
key_line = len(TOKENIZER.encode("The pass key is 12345 . Remember it . 12345 is the pass key ."))
answer_rows = prompts.answer_mask[:, 1:]             # position t predicts token t + 1
rows = []
for layer in range(model.cfg.n_layers):
    w = cache[f"blocks.{layer}.attn.hook_mem_weights"].double().abs()   # [batch head q k]
    for b, t in answer_rows.nonzero().tolist():
        start = int(prompts.key_pos[b])
        on_key = torch.zeros(w.shape[-1], dtype=torch.bool)
        on_key[start:start + key_line] = True
        row_w = w[b, :, t]                                               # [head key]
        in_memory = row_w.sum(0) > 0
        for h in range(w.shape[1]):
            rows.append({"head": f"L{layer}H{h}",
                         "read share on key line": float(row_w[h, on_key].sum()
                                                         / row_w[h].sum().clamp(min=1e-12)),
                         "key line share of memory": float(on_key[in_memory].double().mean())})
reads = pd.DataFrame(rows).groupby("head").mean()
reads.assign(ratio=reads.iloc[:, 0] / reads.iloc[:, 1]).round(3)

# %% [markdown]
# A ratio above 1 means the head's memory read at the answer leans towards the key line. The
# gate decides how much of that read reaches the output. A causal check with
# `infini.set_gates`: shut every gate (g = 0: local attention only, the memory unread) and
# measure accuracy with the key at depth 0 (only reachable through the memory) and at depth 1
# (next to the question, mostly within local reach).

# %%
rows = []
for depth in (0.0, 1.0):
    batch = passkey_task(16, n_ctx, depth=depth, tokenizer=TOKENIZER, seed=2)
    trained = zoo.load("infini-passkey-s0")
    local_only = zoo.load("infini-passkey-s0")
    infini.set_gates(local_only, 0.0)
    rows.append({"depth": depth,
                 "trained gates": passkey_accuracy(trained(batch.tokens), batch),
                 "gates shut (no memory)": passkey_accuracy(local_only(batch.tokens), batch)})
pd.DataFrame(rows).set_index("depth").round(3)

# %% [markdown]
# ## Streaming a long input
#
# `attnlens.hooked_models.streaming.InfiniStream` runs the model chunk by chunk with a fixed-size state
# (each layer's memory `M`, its normaliser `z`, and the current segment), so an input far longer
# than the training length never needs a longer attention map. Here a prompt 8x the training
# length, key at depth 0: we feed it one segment at a time and watch each layer's memory grow
# (the Frobenius norm of `M` and the sum of `z`, averaged over heads) while the state stays the
# same size.

# %%
long = passkey_task(1, 8 * n_ctx, depth=0.0, tokenizer=TOKENIZER, seed=3)
stream = InfiniStream(model)
seg = stream.segment_len
trace, logits = [], []
for start in range(0, long.tokens.shape[1], seg):
    logits.append(stream.feed(long.tokens[:, start:start + seg]))
    row = {"tokens fed": stream.n_tokens, "state bytes": stream.state_bytes()}
    for layer in range(model.cfg.n_layers):
        M, z = stream.memory(layer)
        row[f"|M| L{layer}"] = float(M[0].double().norm(dim=(-2, -1)).mean())
        row[f"sum z L{layer}"] = float(z[0].double().sum(-1).mean())
    trace.append(row)
trace = pd.DataFrame(trace)
key_segment = int(long.key_pos[0]) // seg
print(f"{long.tokens.shape[1]} tokens in {len(trace)} segments of {seg}; key in segment "
      f"{key_segment}; state size min/max: {trace['state bytes'].min()} / "
      f"{trace['state bytes'].max()} bytes")
trace.iloc[sorted({0, key_segment + 1, len(trace) // 4, len(trace) // 2, len(trace) - 1})
           ].round(2)

# %%
fig = go.Figure()
for layer in range(model.cfg.n_layers):
    fig.add_trace(go.Scatter(x=trace["tokens fed"], y=trace[f"|M| L{layer}"],
                             name=f"|M| layer {layer}", mode="lines"))
fig.add_vline(x=(key_segment + 1) * seg, line_dash="dot",
              annotation_text="key written to memory")
fig.update_layout(title="Memory norm while streaming a prompt of 8x the training length",
                  xaxis_title="tokens fed", yaxis_title="mean |M| over heads (Frobenius)",
                  height=360)

# %% [markdown]
# The memory keeps growing with every segment of filler while the key is written once: the
# state's size is fixed, but the key's share of what the memory holds shrinks as the input
# gets longer, which fits the accuracy falling with length in the grid above.
#
# Did the key survive? The stream's teacher-forced predictions at the key's digits (the same
# numbers `attnlens.interp.tasks.passkey.predict` gives, which streams any input longer than n_ctx):

# %%
pred = torch.cat(logits, dim=1)[:, :-1].argmax(-1)
digits = long.answer_mask[0, 1:]
print(f"key {long.keys[0]}; predicted {TOKENIZER.decode(pred[0, digits])!r}; "
      f"token accuracy {passkey_accuracy(pred, long):.2f}")
assert torch.equal(pred, predict(model, long, chunk=seg))
batch = passkey_task(16, 8 * n_ctx, depth=0.0, tokenizer=TOKENIZER, seed=4)
print(f"16 more prompts at 8x, depth 0: token accuracy "
      f"{passkey_accuracy(predict(model, batch), batch):.2f} (chance 0.10)")

# %% [markdown]
# ## Trained until the memory carries the key: `infini-passkey-long-s0`
#
# The model above was trained for 1000 steps at 160 tokens. Issue 24 trained the same shape on
# a curriculum of 160, 320 and 640-token prompts (5 to 20 segments, keys far outside the last
# segment) until the loss on the key's digits of held-out prompts stopped improving
# (`python -m attnlens.lab.paper train infini-passkey-long-s0`; it stopped early at step 8,750,
# about 1 CPU-hour). This notebook looks at seed 0, so its numbers are one model's, not
# intervals; docs/reproduction.md pools every seed with intervals. The card's grid, from the
# eval command on held-out prompts (eval seed 60613579): exact-key accuracy (all 5 digits
# right) by length and depth, and the same prompts with every layer's memory read zeroed.

# %%
long_model = zoo.load("infini-passkey-long-s0")
lm, train_len = long_model.card["metrics"], long_model.cfg.n_ctx
exact = pd.DataFrame([{"length": f"{f}x ({f * train_len})", "depth": d,
                       "exact key": lm[f"exact_x{f}_d{d:.2f}"]} for f in FACTORS for d in DEPTHS]
                     + [{"length": f"{f}x, memory read zeroed", "depth": d,
                         "exact key": lm[f"ko_exact_x{f}_d{d:.2f}"]} for f in FACTORS
                        for d in DEPTHS])
exact.pivot_table(index="length", columns="depth", values="exact key", sort=False)

# %% [markdown]
# Within the training length every key comes back whole from every depth, and zeroing the
# memory read takes that to 0 at every length: the key travels through the memory, not
# through local attention. The memory keeps working at twice the training length and then fades (about 0.7 at
# 4x, 0.2 at 8x, 0 at 16x): the paper's retrieval at 1M tokens does not reproduce in this
# 2-layer, d_model-64 model. Its gates now include a memory specialist:

# %%
long_prompts = passkey_task(8, train_len, depth=0.0, tokenizer=TOKENIZER, seed=5)
long_gates = infini.memory_specialisation(long_model, long_prompts.tokens)
long_gates[["gate", "class", "memory_ratio"]].round(3)

# %% [markdown]
# Streamed with constant state: 16 prompts at 4x the training length (2,560 tokens, 80
# segments), key at depth 0, through `predict` (which streams through `InfiniStream`), the
# memory on and off:

# %%
far = passkey_task(16, 4 * train_len, depth=0.0, tokenizer=TOKENIZER, seed=6)
with_memory = passkey_accuracy(predict(long_model, far), far, exact=True)
with long_model.hooks(fwd_hooks=infini.memory_knockout_hooks(long_model)):
    without = passkey_accuracy(predict(long_model, far), far, exact=True)
print(f"exact key at 4x, depth 0: {with_memory:.2f} with the memory, {without:.2f} with "
      f"its read zeroed (16 prompts, seed 6)")
