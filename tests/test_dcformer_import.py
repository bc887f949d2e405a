"""`from_dcformer`: a tiny checkpoint in the released DCFormer-2.8B format loads exactly.

The checkpoint has the release's tensor names and layout (variants.md section 3.5) at small
shapes, including the ignored merged copies `dw_m`/`qkw_m` and identity `pre_proj.w` buffers.
`naive_dcformer` re-implements the release's prefill forward from those raw tensors: its
interleaving rotary, RMSNorm, SwiGLU, the window mask `col + w >= row`, the fp16-minimum fill,
and Compose as an explicit per-(t, s) matrix I + W_q(t) + W_k(s). Nothing is downloaded.
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
from safetensors.torch import save_file

from attnlens.hooked_models.converters.dcformer import from_dcformer

CONFIG = {
    "architectures": ["DCFormer"],
    "auto_map": {"AutoConfig": "configuration_dcformer.DCFormerConfig",
                 "AutoModelForCausalLM": "modeling_dcformer.DCFormer"},
    "block_size": 32, "bos_token_id": 1, "dim": 32, "eos_token_id": 2, "head_dim": 80,
    "intermediate_size": 48, "is_training": False, "model_type": "dcformer", "n_head": 4,
    "n_layer": 2, "n_local_heads": 4, "norm_eps": 1e-06, "q_chunk_size": 128,
    "query_wise": False, "rope_base": 10000, "tie_word_embeddings": False,
    "torch_dtype": "float16", "transformers_version": "4.33.2", "use_dcmha": True,
    "use_gradient_checkpointing": False, "use_qk_norm": True, "vocab_size": 50,
    "window_size": 3, "window_type": None,
}


def release_state(cfg=CONFIG, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors with the release's names and shapes (G=1, K=4N, R=2)."""
    g = torch.Generator().manual_seed(seed)
    D, N, V, I = cfg["dim"], cfg["n_head"], cfg["vocab_size"], cfg["intermediate_size"]
    Dh, K = D // N, 4 * N

    def rnd(*shape, scale=0.15, base=0.0):
        return base + scale * torch.randn(*shape, generator=g)

    sd = {"tok_embeddings.weight": rnd(V, D, scale=1.0), "norm.weight": rnd(D, base=1.0),
          "output.weight": rnd(V, D, scale=0.3)}
    for i in range(cfg["n_layer"]):
        p = f"layers.{i}."
        a = p + "attention."
        sd |= {
            p + "attention_norm.weight": rnd(D, base=1.0),
            p + "ffn_norm.weight": rnd(D, base=1.0),
            a + "wqkv.weight": rnd(3 * D, D, scale=0.5),
            a + "wo.weight": rnd(D, D, scale=0.3),
            a + "q_norm.scale": rnd(Dh, scale=0.3, base=1.0),
            a + "k_norm.scale": rnd(Dh, scale=0.3, base=1.0),
            a + "dyn_w_proj.dw1": rnd(D, 1, 4, K, scale=0.3),
            a + "dyn_w_proj.qkw": rnd(1, 4, K, 4, N, scale=0.3),
            a + "dyn_w_proj.dd": rnd(D, 1, 4 * N, scale=0.3),
            a + "dyn_w_proj.pre_proj.w": torch.eye(N).expand(1, N, N).clone(),
            a + "dyn_w_proj.post_proj.w": torch.eye(N).expand(1, N, N).clone(),
            p + "feed_forward.w1.weight": rnd(I, D, scale=0.3),
            p + "feed_forward.w3.weight": rnd(I, D, scale=0.3),
            p + "feed_forward.w2.weight": rnd(D, I, scale=0.3),
        }
        sd[a + "dyn_w_proj.dw_m"] = torch.cat([sd[a + "dyn_w_proj.dw1"].reshape(D, -1),
                                               sd[a + "dyn_w_proj.dd"].squeeze(1)], -1)
        sd[a + "dyn_w_proj.qkw_m"] = sd[a + "dyn_w_proj.qkw"].reshape(4, K, -1).clone()
    return sd


def write_checkpoint(directory, state, cfg=CONFIG):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return directory


# -- the independent reference -----------------------------------------------------------------
def naive_dcformer(sd, cfg, idx):
    """Logits and per-layer composed probabilities of the release's prefill forward, in float64
    (float32 rounding in the composition's cancellations reaches 4e-5 and varies by CPU)."""
    sd = {name: t.double() for name, t in sd.items()}
    D, N = cfg["dim"], cfg["n_head"]
    Dh, eps = D // N, cfg["norm_eps"]
    B, T = idx.shape
    x = sd["tok_embeddings.weight"][idx]
    patterns = []
    for i in range(cfg["n_layer"]):
        a = f"layers.{i}.attention."
        h = rms(x, sd[f"layers.{i}.attention_norm.weight"], eps)
        q, k, v = (h @ sd[a + "wqkv.weight"].T).split(D, -1)
        q, k, v = (t.view(B, T, N, Dh) for t in (q, k, v))
        q = rope_release(rms(q, sd[a + "q_norm.scale"]), cfg["rope_base"])
        k = rope_release(rms(k, sd[a + "k_norm.scale"]), cfg["rope_base"])
        logits = torch.einsum("btnd,bsnd->bnts", q, k) / Dh ** 0.5
        probs = composed_probs(logits, h, sd, a, i, cfg["window_size"])
        patterns.append(probs)
        y = torch.einsum("bnts,bsnd->btnd", probs, v).reshape(B, T, D)
        x = x + y @ sd[a + "wo.weight"].T
        f = f"layers.{i}.feed_forward."
        h = rms(x, sd[f"layers.{i}.ffn_norm.weight"], eps)
        x = x + (F.silu(h @ sd[f + "w1.weight"].T) * (h @ sd[f + "w3.weight"].T)) \
            @ sd[f + "w2.weight"].T
    return rms(x, sd["norm.weight"], eps) @ sd["output.weight"].T, patterns


# -- tests -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def released(tmp_path_factory):
    sd = release_state()
    return sd, write_checkpoint(tmp_path_factory.mktemp("dcformer") / "tiny", sd)


def test_forward_matches_naive_release(released):
    sd, path = released
    model = from_dcformer(path, dtype=torch.float64)
    assert model.cfg.attention == "dcmha" and model.cfg.normalization_type == "RMS"
    assert model.cfg.d_head == 8 and model.cfg.gated_mlp and model.cfg.act_fn == "silu"
    assert [b.attn.window for b in model.blocks] == [3, None]
    idx = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    ref, patterns = naive_dcformer(sd, CONFIG, idx)
    assert_matches_release(model, idx, ref, patterns)


def test_split_wq_wk_wv_and_sharded_index(released, tmp_path):
    sd, _ = released
    split = dict(sd)
    for i in range(CONFIG["n_layer"]):
        a = f"layers.{i}.attention."
        for name, part in zip("qkv", split.pop(a + "wqkv.weight").split(32), strict=True):
            split[f"{a}w{name}.weight"] = part.clone()
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    names = sorted(split)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: split[k].contiguous() for k in keys}, str(tmp_path / file))
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    idx = torch.arange(8)[None]
    torch.testing.assert_close(from_dcformer(tmp_path, dtype=torch.float64)(idx),
                               naive_dcformer(sd, CONFIG, idx)[0], atol=1e-10, rtol=0)
    single = tmp_path / "single"
    write_checkpoint(single, sd)
    torch.testing.assert_close(from_dcformer(single / "model.safetensors")(idx),
                               from_dcformer(single)(idx))


def test_pickle_weights_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    for target in (tmp_path, tmp_path / "pytorch_model.bin"):
        with pytest.raises(ValueError, match="pickle"):
            from_dcformer(target)
    with pytest.raises(ValueError, match="does not exist"):
        from_dcformer(tmp_path / "nowhere")


def test_mismatches_are_named(released, tmp_path):
    sd, _ = released
    bad = {k: v for k, v in sd.items() if k != "layers.1.attention.wo.weight"}
    bad["layers.0.attention.extra.weight"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"missing tensors \['layers.1.attention.wo.weight'\]"
                                         r".*layers.0.attention.extra.weight"):
        from_dcformer(write_checkpoint(tmp_path / "a", bad))
    sw = dict(sd)
    sw["layers.0.attention.dyn_w_proj.pre_proj.w"] = 2 * torch.eye(4)[None]
    with pytest.raises(ValueError, match="not the identity"):
        from_dcformer(write_checkpoint(tmp_path / "b", sw))
    with pytest.raises(ValueError, match="n_local_heads"):
        from_dcformer(write_checkpoint(tmp_path / "c", sd, {**CONFIG, "n_local_heads": 2}))
    with pytest.raises(ValueError, match="model_type"):
        from_dcformer(write_checkpoint(tmp_path / "d", sd, {**CONFIG, "model_type": "llama"}))


def test_query_wise_and_window_pattern_config(released, tmp_path):
    sd, _ = released
    cfg = {**CONFIG, "query_wise": True, "window_type": "LGLL", "n_layer": 2}
    model = from_dcformer(write_checkpoint(tmp_path, sd, cfg), dtype=torch.float64)
    assert model.cfg.attn_cfg.query_wise and model.cfg.attn_cfg.window_type == "LGLL"
    assert "blocks.0.attn.hook_pre_kw1" not in model.hook_dict
    # query-wise composition is the naive one with the key-side channels (1 and 3) zeroed
    zeroed = {k: v.clone() for k, v in sd.items()}
    for i in range(2):
        a = f"layers.{i}.attention.dyn_w_proj."
        zeroed[a + "qkw"][:, [1, 3]] = 0
        zeroed[a + "dd"][..., 4:8] = 0
        zeroed[a + "dd"][..., 12:] = 0
    idx = torch.arange(9)[None]
    torch.testing.assert_close(model(idx), naive_dcformer(zeroed, CONFIG, idx)[0],
                               atol=1e-10, rtol=0)
