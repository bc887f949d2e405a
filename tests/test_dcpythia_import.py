"""DCPythia-6.9B: a tiny checkpoint in the exact published layout converts and imports exactly.

The release (`Caiyun-AI/DCPythia-6.9B`) is three pickle shards `pytorch_model-0000i-of-00003.bin`
with `pytorch_model.bin.index.json`, fp16, tensor names of `pytorch/dcpythia/modeling_dcpythia.py`
(LayerNorms with biases, `wqkv`/`wo` biases, GELU MLP `w1`/`w2` with biases, the merged copies
`dw_m`/`qkw_m` and the identity `pre_proj.w`/`post_proj.w` buffers). The test writes that layout
at small shapes, checks that `from_dcformer` refuses it and points at `attnlens convert`, runs
the command, and compares the imported model with `naive_dcpythia`, an independent float64
re-implementation of the release's prefill forward from the raw tensors (parallel residual,
25% rotary written interleaved, window mask `col + w >= row` on even layers, fp16-minimum fill,
Compose as an explicit per-(t, s) head matrix I + W_q(t) + W_k(s)).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from dcformer_release_reference import (
    assert_matches_release,
    composed_probs,
    rms,
    rope_release,
)

from attnlens.cli import main as cli_main
from attnlens.hooked_models.converters.dcformer import dcformer_config, from_dcformer

# The published config.json (GitHub pytorch/dcpythia/config.json) at tiny shapes.
CONFIG = {
    "architectures": ["DCPythia"],
    "auto_map": {"AutoConfig": "configuration_dcpythia.DCPythiaConfig",
                 "AutoModelForCausalLM": "modeling_dcpythia.DCPythia"},
    "block_size": 32, "bos_token_id": 0, "dim": 64, "eos_token_id": 0, "head_dim": 16,
    "intermediate_size": 96, "is_training": False, "model_type": "dcpythia", "n_head": 4,
    "n_layer": 3, "n_local_heads": 4, "norm_eps": 1e-05, "q_chunk_size": 128,
    "query_wise": False, "rope_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.33.2", "use_dcmha": True,
    "use_gradient_checkpointing": False, "use_linear_bias": True,
    "use_parallel_residual": True, "use_qk_norm": True, "vocab_size": 50, "window_size": 3,
    "window_type": None,
}
PUBLISHED = {  # the real config.json's sizes
    **CONFIG, "block_size": 2048, "dim": 4096, "head_dim": 128, "intermediate_size": 16384,
    "n_head": 32, "n_layer": 32, "n_local_heads": 32, "vocab_size": 50257, "window_size": 256,
}


def release_state(cfg=CONFIG, seed: int = 0) -> dict[str, torch.Tensor]:
    """fp16 tensors with the release's names and shapes (G=1, K=4N, R=2)."""
    g = torch.Generator().manual_seed(seed)
    D, N, V, I = cfg["dim"], cfg["n_head"], cfg["vocab_size"], cfg["intermediate_size"]
    Dh, K = D // N, 4 * N

    def rnd(*shape, scale=0.15, base=0.0):
        return (base + scale * torch.randn(*shape, generator=g)).half()

    sd = {"tok_embeddings.weight": rnd(V, D, scale=1.0), "norm.weight": rnd(D, base=1.0),
          "norm.bias": rnd(D, scale=0.1), "output.weight": rnd(V, D, scale=0.3)}
    for i in range(cfg["n_layer"]):
        p = f"layers.{i}."
        a = p + "attention."
        sd |= {
            p + "attention_norm.weight": rnd(D, base=1.0), p + "attention_norm.bias": rnd(D),
            p + "ffn_norm.weight": rnd(D, base=1.0), p + "ffn_norm.bias": rnd(D),
            a + "wqkv.weight": rnd(3 * D, D, scale=0.3), a + "wqkv.bias": rnd(3 * D, scale=0.3),
            a + "wo.weight": rnd(D, D, scale=0.2), a + "wo.bias": rnd(D, scale=0.1),
            a + "q_norm.scale": rnd(Dh, scale=0.3, base=1.0),
            a + "k_norm.scale": rnd(Dh, scale=0.3, base=1.0),
            a + "dyn_w_proj.dw1": rnd(D, 1, 4, K, scale=0.3),
            a + "dyn_w_proj.qkw": rnd(1, 4, K, 4, N, scale=0.3),
            a + "dyn_w_proj.dd": rnd(D, 1, 4 * N, scale=0.3),
            a + "dyn_w_proj.pre_proj.w": torch.eye(N).expand(1, N, N).half(),
            a + "dyn_w_proj.post_proj.w": torch.eye(N).expand(1, N, N).half(),
            p + "feed_forward.w1.weight": rnd(I, D, scale=0.2), p + "feed_forward.w1.bias": rnd(I),
            p + "feed_forward.w2.weight": rnd(D, I, scale=0.2), p + "feed_forward.w2.bias": rnd(D),
        }
        sd[a + "dyn_w_proj.dw_m"] = torch.cat([sd[a + "dyn_w_proj.dw1"].reshape(D, -1),
                                               sd[a + "dyn_w_proj.dd"].squeeze(1)], -1)
        sd[a + "dyn_w_proj.qkw_m"] = sd[a + "dyn_w_proj.qkw"].reshape(4, K, -1).clone()
    return sd


def write_release(directory, state, cfg=CONFIG, n_shards: int = 3):
    """The published layout: pickle shards + pytorch_model.bin.index.json + config.json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    names = list(state)
    weight_map = {}
    for i in range(n_shards):
        file = f"pytorch_model-{i + 1:05d}-of-{n_shards:05d}.bin"
        part = {k: state[k] for k in names[i::n_shards]}
        torch.save(part, directory / file)
        weight_map |= dict.fromkeys(part, file)
    total = sum(t.numel() * t.element_size() for t in state.values())
    (directory / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return directory


# -- the independent reference -----------------------------------------------------------------
def _ln(x, w, b, eps):
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def naive_dcpythia(sd, cfg, idx):
    """Logits and per-layer composed probabilities of the release's prefill, in float64."""
    sd = {name: t.double() for name, t in sd.items()}
    D, N = cfg["dim"], cfg["n_head"]
    Dh, eps = D // N, cfg["norm_eps"]
    rd = int(Dh * cfg["rotary_pct"])
    B, T = idx.shape
    x = sd["tok_embeddings.weight"][idx]
    patterns = []
    for i in range(cfg["n_layer"]):
        p = f"layers.{i}."
        a = p + "attention."
        h = _ln(x, sd[p + "attention_norm.weight"], sd[p + "attention_norm.bias"], eps)
        q, k, v = (h @ sd[a + "wqkv.weight"].T + sd[a + "wqkv.bias"]).split(D, -1)
        q, k, v = (t.view(B, T, N, Dh) for t in (q, k, v))
        q = rope_release(rms(q, sd[a + "q_norm.scale"]), cfg["rope_base"], rd)
        k = rope_release(rms(k, sd[a + "k_norm.scale"]), cfg["rope_base"], rd)
        logits = torch.einsum("btnd,bsnd->bnts", q, k) / Dh ** 0.5
        probs = composed_probs(logits, h, sd, a, i, cfg["window_size"])
        patterns.append(probs)
        y = torch.einsum("bnts,bsnd->btnd", probs, v).reshape(B, T, D)
        attn = y @ sd[a + "wo.weight"].T + sd[a + "wo.bias"]
        f = p + "feed_forward."
        m = _ln(x, sd[p + "ffn_norm.weight"], sd[p + "ffn_norm.bias"], eps)
        mlp = F.gelu(m @ sd[f + "w1.weight"].T + sd[f + "w1.bias"]) @ sd[f + "w2.weight"].T \
            + sd[f + "w2.bias"]
        x = x + attn + mlp                               # use_parallel_residual
    x = _ln(x, sd["norm.weight"], sd["norm.bias"], eps)
    return x @ sd["output.weight"].T, patterns


# -- tests -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    sd = release_state()
    root = tmp_path_factory.mktemp("dcpythia")
    release = write_release(root / "release", sd)
    assert cli_main(["convert", str(release), str(root / "converted")]) == 0
    return sd, release, root / "converted"


def test_published_config_maps_to_a_pythia_body():
    cfg = dcformer_config(PUBLISHED)
    assert (cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_layers) == (4096, 32, 128, 32)
    assert cfg.rotary_dim == 32 and cfg.d_mlp == 16384 and cfg.n_ctx == 2048
    assert cfg.normalization_type == "LN" and cfg.act_fn == "gelu" and not cfg.gated_mlp
    assert cfg.parallel_attn_mlp and cfg.attn_cfg.qk_norm and cfg.attn_cfg.rank == 2
    assert cfg.attn_cfg.dw_hidden_dim == 128 and cfg.attn_cfg.window_size == 256
    assert [cfg.attn_cfg.layer_window(i) for i in range(4)] == [256, None, 256, None]
    defaults = {k: v for k, v in PUBLISHED.items()   # DCPythiaConfig's own defaults
                if k not in ("intermediate_size", "rotary_pct", "use_parallel_residual")}
    cfg = dcformer_config(defaults)
    assert cfg.d_mlp == 4 * 4096 and cfg.rotary_dim == 32 and cfg.parallel_attn_mlp


def test_release_pickles_are_refused_with_a_pointer_to_convert(converted):
    _, release, _ = converted
    for target in (release, release / "pytorch_model-00001-of-00003.bin"):
        with pytest.raises(ValueError, match="attnlens convert"):
            from_dcformer(target)


def test_converted_layout(converted):
    sd, _, out = converted
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "model-00001-of-00003.safetensors",
                     "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                     "model.safetensors.index.json"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(sd)


def test_forward_matches_naive_release(converted):
    sd, _, out = converted
    model = from_dcformer(out, dtype=torch.float64)
    assert model.cfg.attention == "dcmha" and model.cfg.metadata["model_type"] == "dcpythia"
    assert [b.attn.window for b in model.blocks] == [3, None, 3]
    idx = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    ref, patterns = naive_dcpythia(sd, CONFIG, idx)
    assert_matches_release(model, idx, ref, patterns)
    # the default dtype (float32) agrees within float32 rounding of O(1) logits
    torch.testing.assert_close(from_dcformer(out)(idx).double(), ref, atol=2e-4, rtol=0)


def test_split_biases_and_missing_tensors(converted, tmp_path):
    sd, _, _ = converted
    split = dict(sd)
    for i in range(CONFIG["n_layer"]):
        a = f"layers.{i}.attention."
        for kind in ("weight", "bias"):
            parts = split.pop(f"{a}wqkv.{kind}").split(CONFIG["dim"])
            for name, part in zip("qkv", parts, strict=True):
                split[f"{a}w{name}.{kind}"] = part.clone()
    src = write_release(tmp_path / "split", split, n_shards=2)
    cli_main(["convert", str(src), str(tmp_path / "split-st")])
    idx = torch.arange(9)[None]
    torch.testing.assert_close(from_dcformer(tmp_path / "split-st", dtype=torch.float64)(idx),
                               naive_dcpythia(sd, CONFIG, idx)[0], atol=1e-10, rtol=0)
    bad = {k: v for k, v in sd.items() if k not in ("layers.1.feed_forward.w2.bias", "norm.bias")}
    src = write_release(tmp_path / "bad", bad, n_shards=1)
    cli_main(["convert", str(src / "pytorch_model-00001-of-00001.bin"), str(tmp_path / "bad-st")])
    (tmp_path / "bad-st" / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(ValueError, match=r"dcpythia checkpoint .*missing tensors "
                                         r"\['norm.bias', 'layers.1.feed_forward.w2.bias'\]"):
        from_dcformer(tmp_path / "bad-st")
    no_bias = {k: v for k, v in sd.items() if not k.endswith(".bias") or "norm" in k}
    src = write_release(tmp_path / "nb", no_bias, {**CONFIG, "use_linear_bias": False}, 1)
    cli_main(["convert", str(src), str(tmp_path / "nb-st")])
    model = from_dcformer(tmp_path / "nb-st", dtype=torch.float64)
    assert not model.blocks[0].attn.b_Q.detach().any()
