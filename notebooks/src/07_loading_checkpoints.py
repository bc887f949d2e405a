# %% [markdown]
# # Loading real checkpoints
#
# attnlens imports published checkpoints from **local directories** (nothing is downloaded) and
# never unpickles anything. This notebook writes tiny random checkpoints in each published layout
# (as the tests do), loads them, checks them against HuggingFace `transformers`, and looks inside.
# The lines to run on the real models are given with each section; see also
# [docs/checkpoints.md](../docs/checkpoints.md).

# %%
import json
import tempfile
from pathlib import Path

import pandas as pd
import torch
import transformers
from safetensors.torch import save_file

from attnlens.hooked_models.converters.dcformer import from_dcformer
from attnlens.hooked_models.converters.hf import from_hf
from attnlens.hooked_models.converters.llama import from_llama

torch.manual_seed(0)
root = Path(tempfile.mkdtemp())
tokens = torch.randint(0, 100, (1, 16))


def perturbed(model):
    """Random weights everywhere (a fresh HF model has zero biases and unit norms)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def parity(hf, ours):
    """Largest logit difference and largest attention-pattern difference (layer 0)."""
    with torch.no_grad():
        out = hf(tokens, output_attentions=True)
        logits, cache = ours.run_with_cache(tokens)
    return {"max |logit diff|": (logits - out.logits).abs().max().item(),
            "max |pattern diff| (L0)": (cache["pattern", 0] - out.attentions[0]).abs().max().item()}


print("reference: transformers", transformers.__version__)

# %% [markdown]
# ## GPT-2 and Pythia (GPT-NeoX): `from_hf`
#
# On the real models, after `huggingface-cli download gpt2 --local-dir ~/models/gpt2`:
#
# ```python
# model = from_hf("~/models/gpt2")            # or ~/models/pythia-160m
# ```

# %%
small = dict(vocab_size=100, bos_token_id=0, eos_token_id=0)
gpt2 = perturbed(transformers.GPT2LMHeadModel(transformers.GPT2Config(
    n_layer=2, n_embd=64, n_head=4, n_positions=64, attn_implementation="eager", **small)))
gpt2.save_pretrained(root / "gpt2")
pythia = perturbed(transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256,
    max_position_embeddings=64, rotary_pct=0.25, attn_implementation="eager", **small)))
pythia.save_pretrained(root / "pythia")
print(sorted(p.name for p in (root / "gpt2").iterdir()))
models = {"gpt2": from_hf(root / "gpt2"), "pythia": from_hf(root / "pythia")}
pd.DataFrame({"gpt2": parity(gpt2, models["gpt2"]),
              "pythia": parity(pythia, models["pythia"])}).T

# %% [markdown]
# ## Llama, Mistral, Qwen2: `from_llama`
#
# Grouped-query attention, RMSNorm, SwiGLU and rotary scaling are mapped; `hook_k`/`hook_v` hold
# the key/value heads. On a real model: `from_llama("~/models/Qwen2-0.5B", n_ctx=4096)`.

# %%
llama = perturbed(transformers.LlamaForCausalLM(transformers.LlamaConfig(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, max_position_embeddings=64, attn_implementation="eager", **small)))
llama.save_pretrained(root / "llama")
models["llama"] = from_llama(root / "llama")
_, cache = models["llama"].run_with_cache(tokens)
print("hook_q", tuple(cache["q", 0].shape), "hook_k", tuple(cache["k", 0].shape), "(2 kv heads)")
pd.DataFrame({"llama": parity(llama, models["llama"])}).T

# %% [markdown]
# ### The parity, drawn
#
# Every logit of the three imports against the reference's (16 positions x 100 tokens each): the
# points lie on the diagonal, and each panel's title gives the largest difference.

# %%
from plotly.subplots import make_subplots  # noqa: E402
import plotly.graph_objects as go  # noqa: E402

references = {"gpt2": gpt2, "pythia": pythia, "llama": llama}
fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08, subplot_titles=[
    f"{name}: max |diff| {parity(hf, models[name])['max |logit diff|']:.1e}"
    for name, hf in references.items()])
for col, (name, hf) in enumerate(references.items(), start=1):
    with torch.no_grad():
        theirs = hf(tokens).logits.flatten()
        ours = models[name](tokens).flatten()
    low, high = float(theirs.min()), float(theirs.max())
    fig.add_trace(go.Scattergl(x=theirs, y=ours, mode="markers", name=name,
                               marker=dict(size=3, opacity=0.5)), row=1, col=col)
    fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", showlegend=False,
                             line=dict(color="#888", dash="dot")), row=1, col=col)
    fig.update_xaxes(title_text="transformers logit", row=1, col=col)
    fig.update_yaxes(title_text="attnlens logit" if col == 1 else None, row=1, col=col)
fig.update_layout(height=360, width=980, showlegend=False,
                  title="imported checkpoints reproduce the reference logits")
fig

# %% [markdown]
# ## DCFormer / DCPythia: `from_dcformer`
#
# The DCFormer release (`Caiyun-AI/DCFormer-2.8B`) ships a `config.json` and safetensors weights
# with its own tensor names; `from_dcformer` maps them onto a `dcmha` model. DCPythia-6.9B is
# published as pickled `.bin` files: convert them first, without unpickling code,
# with `attnlens convert ~/models/DCPythia-6.9B ~/models/DCPythia-6.9B-safetensors`, then
#
# ```python
# dc = from_dcformer("~/models/DCFormer-2.8B", dtype="bfloat16")
# ```
#
# Below, a two-layer checkpoint with the release's names and shapes (random weights).

# %%
config = {"architectures": ["DCFormer"], "model_type": "dcformer", "block_size": 32,
          "bos_token_id": 1, "eos_token_id": 2, "dim": 32, "head_dim": 80, "n_head": 4,
          "n_local_heads": 4, "n_layer": 2, "intermediate_size": 48, "norm_eps": 1e-6,
          "query_wise": False, "rope_base": 10000, "tie_word_embeddings": False,
          "use_dcmha": True, "use_qk_norm": True, "vocab_size": 50, "window_size": None,
          "window_type": None, "q_chunk_size": 128, "torch_dtype": "float16"}
D, N, V, I = 32, 4, 50, 48
Dh, K = D // N, 4 * N


def rnd(*shape, base=0.0):
    return base + 0.2 * torch.randn(*shape)


state = {"tok_embeddings.weight": rnd(V, D) * 5, "norm.weight": rnd(D, base=1.0),
         "output.weight": rnd(V, D)}
for i in range(2):
    p, a = f"layers.{i}.", f"layers.{i}.attention."
    state |= {p + "attention_norm.weight": rnd(D, base=1.0),
              p + "ffn_norm.weight": rnd(D, base=1.0),
              a + "wqkv.weight": rnd(3 * D, D), a + "wo.weight": rnd(D, D),
              a + "q_norm.scale": rnd(Dh, base=1.0), a + "k_norm.scale": rnd(Dh, base=1.0),
              a + "dyn_w_proj.dw1": rnd(D, 1, 4, K), a + "dyn_w_proj.qkw": rnd(1, 4, K, 4, N),
              a + "dyn_w_proj.dd": rnd(D, 1, 4 * N),
              p + "feed_forward.w1.weight": rnd(I, D), p + "feed_forward.w3.weight": rnd(I, D),
              p + "feed_forward.w2.weight": rnd(D, I)}
(root / "dcformer").mkdir()
(root / "dcformer" / "config.json").write_text(json.dumps(config))
save_file(state, str(root / "dcformer" / "model.safetensors"))
dc = from_dcformer(root / "dcformer")
print(dc.cfg.attention, dc.cfg.attn_cfg)

# %% [markdown]
# The imported model is an ordinary hooked model: the same stage catalogue, cache and analyses as
# the toys. Its dynamic composition weights are hooks too (`pre_qw1`, ..., shapes in
# [docs/hooks.md](../docs/hooks.md)).

# %%
_, cache = dc.run_with_cache(torch.randint(0, V, (1, 12)))
pd.DataFrame([{"hook": f"blocks.0.attn.hook_{s.name}", "softmax": s.softmax,
               "shape": tuple(cache[f"blocks.0.attn.hook_{s.name}"].shape)}
              for s in dc.stages(0)])

# %% [markdown]
# What a loaded DCFormer checkpoint looks like inside: every head's softmax (`probs`, rows sum to
# 1) and the effective pattern after the post-softmax Compose (`pattern`, what multiplies the
# values; signed, rows need not sum to 1). With random weights the maps are diffuse; the point
# is that the imported model's maps are there to read, stage by stage.

# %%
from attnlens.interp.tools.explore import explore_maps, find_map_stage  # noqa: E402
from attnlens.interp.plots.maps import head_grid_figure  # noqa: E402

dc_tokens = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(1))
for stage_name in ("probs", "pattern"):
    view = explore_maps(dc, dc_tokens, stage=stage_name, layer=0)
    head_grid_figure(view.grid, find_map_stage(dc, 0, stage_name), cell_px=90,
                     title=f"imported DCFormer: every head at hook_{stage_name}").show()

# %% [markdown]
# Pickled weights are refused with a pointer to the converter:

# %%
torch.save({"w": torch.zeros(1)}, root / "pytorch_model.bin")
try:
    from_dcformer(root / "pytorch_model.bin")
except ValueError as err:
    print("ValueError:", str(err).replace(str(root), "<tmp>"))
