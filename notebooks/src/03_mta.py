# %% [markdown]
# # Multi-Token Attention: what the kernels and head mixing learned
#
# The paper-task models of MTA's "find the block" task (`hooked_models/zoo/mta-findblock-*`,
# trained by `python -m attnlens.lab.paper train NAME`): 8 blocks of 3 letters, then a 2-letter
# query; the answer is the first letter of the block that contains both query letters. One
# attention head must find a block by *two* letters at once, which a single query-key dot
# product cannot do; MTA's key-query convolution can. Same task, MHA and MTA, three seeds.

# %%
import pandas as pd
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.variants import mta
from attnlens.interp import plots
from attnlens.interp.tools import stage_change
from attnlens.lab.paper._registry import get_recipe
from attnlens.lab.paper.mta import target_block_attention, task_of

torch.set_grad_enabled(False)
names = [n for n in zoo.available(kind="paper-task") if n.startswith("mta-findblock-")]
cards = pd.DataFrame([{"model": n, **zoo.load(n).card["metrics"]} for n in names])
cards.set_index("model")

# %% [markdown]
# The error column (held-out prompts answered wrongly) is the paper's comparison: with the same
# budget, the MTA models solve every variant of the task and the MHA models do not.

# %% [markdown]
# ## Which head finds the target block?
#
# Attention mass on the target block's letters at the position that predicts the answer, per head
# (read from the effective `pattern`), against what a head spreading evenly would put there
# (`uniform_mass`, about 0.08 here). An MTA head in layer 0 concentrates on the target block;
# no MHA head does.

# %%
mta_name, mha_name = "mta-findblock-first-mta-s0", "mta-findblock-first-mha-s0"
model, baseline = zoo.load(mta_name), zoo.load(mha_name)
recipe = get_recipe(mta_name)
masses = pd.concat({"mta": target_block_attention(model, recipe),
                    "mha": target_block_attention(baseline, get_recipe(mha_name))},
                   names=["model"]).reset_index(level=0)
masses.pivot_table(index="head_label", columns="model", values="target_mass").round(3)

# %% [markdown]
# ## The key-query kernels
#
# Each MTA head convolves its score map with a learned `[c_q, c_k]` kernel (Eq. 5 before the
# softmax, Eq. 6 after it). `attnlens.interp.variants.mta.kernel_table` classifies each kernel by where its energy
# sits: on the centre (identity: the head behaves like MHA), along the diagonal (it adds the
# scores of neighbouring query-key pairs: the two-letter match), or elsewhere ("mixed"). The
# heads that find the block are the ones whose kernels moved away from the identity.

# %%
table = mta.kernel_table(model)
table[["head_label", "phase", "class", "identity_share", "diagonal_share"]].round(3)

# %%
kernels = mta.key_query_kernels(model)
layer, phase = next(iter(kernels))
plots.kernel_figure(kernels[(layer, phase)],
                    table.query("layer == @layer and phase == @phase")["class"].tolist(),
                    title=f"layer {layer} {phase}-softmax key-query kernels",
                    key_centre=mta.kernel_centre(model, layer, kernels[(layer, phase)].shape[-1])
                    ).update_layout(height=320)

# %% [markdown]
# ## How each stage changes the map
#
# Jensen-Shannon divergence between consecutive stages of layer 0's catalogue, per head (scores
# are compared as softmax distributions): which step of MTA (convolution, head mixing) reshapes
# each head's attention.

# %%
task = task_of(recipe)
batch = task.to_tokens(task.generate(16, seed=0))
changes = stage_change.catalogue_changes(model, batch.tokens)
plots.stage_change_figure(changes)
