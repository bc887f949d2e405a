"""Official defaults and option names of MTA and CoPE (facebookresearch/RAM, projects/mta and
projects/cope): placement, scaling, MTA's per-dimension gate, CoPE's rel_pos_extend and
sep-keys + val-gates, aliases, and the messages for unknown options. Exactness in float64."""

import json
import math

import pytest
import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig, zoo
from attnlens.hooked_models.attention.cope import CoPEOptions
from attnlens.hooked_models.attention.mta import MTAOptions

from helpers import EXACT, assert_causal, assert_pattern_identity, random_tokens, tiny_cfg


def randomized(model, seed=0, scale=0.3):
    """Move every non-base attention parameter (kernels, gates, position tables) off its init."""
    g = torch.Generator().manual_seed(seed)
    base = {"W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".attn." in name and name.split(".")[-1] not in base:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)
    return model.eval()


def model_for(attention, attn_cfg, **overrides):
    overrides.setdefault("dtype", "float64")
    return randomized(HookedVariantTransformer(tiny_cfg(attention, attn_cfg=attn_cfg,
                                                        **overrides)))


# -- MTA: placement -------------------------------------------------------------------------
def test_mta_default_convolves_every_layer_and_paper_is_every_fourth_from_two():
    assert MTAOptions().conv_layers(24) == list(range(24))          # official: mta_layers None
    assert MTAOptions(mta_layers="all").conv_layers(8) == list(range(8))
    assert MTAOptions(mta_layers="paper").conv_layers(24) == [2, 6, 10, 14, 18, 22]
    model = HookedVariantTransformer(tiny_cfg("mta", n_layers=8, attn_cfg={}))
    assert all(b.attn.mta_kernel is not None for b in model.blocks)
    paper = HookedVariantTransformer(tiny_cfg("mta", n_layers=8, attn_cfg={"mta_layers": "paper"}))
    assert [b.attn.mta_kernel is not None for b in paper.blocks] == [
        False, False, True, False, False, False, True, False]
    assert all(b.attn.head_kernel is not None for b in paper.blocks)   # mixing: every layer
    with pytest.raises(ValueError, match="'paper'.*n_layers=2"):
        tiny_cfg("mta", attn_cfg={"mta_layers": "paper"})


# -- MTA: a kernel size of None switches its convolution off -----------------------------------
@pytest.mark.parametrize("pair", [("query_kernel_size", "key_kernel_size"),
                                  ("after_sm_query_kernel_size", "after_sm_key_kernel_size")])
@pytest.mark.parametrize("none_side", [0, 1])
def test_mta_one_kernel_size_none_is_off(pair, none_side):
    given = {pair[none_side]: None, pair[1 - none_side]: 5}
    off = model_for("mta", given)
    both = model_for("mta", {pair[0]: None, pair[1]: None})
    assert getattr(off.cfg.attn_cfg, pair[0]) is None and getattr(off.cfg.attn_cfg, pair[1]) is None
    assert sorted(off.state_dict()) == sorted(both.state_dict())
    tokens = random_tokens(off)
    torch.testing.assert_close(off(tokens), both(tokens), **EXACT)


# -- MTA: official linear-head aliases --------------------------------------------------------
@pytest.mark.parametrize("alias, field", [("pre_sm_linear_head", "pre_sm_head_kernel_size"),
                                          ("post_sm_linear_head", "head_kernel_size")])
def test_mta_linear_head_aliases(alias, field):
    assert getattr(tiny_cfg("mta", attn_cfg={alias: True}).attn_cfg, field) == "all"
    assert getattr(tiny_cfg("mta", attn_cfg={alias: False}).attn_cfg, field) is None
    kept = tiny_cfg("mta", attn_cfg={alias: False, field: 2})       # a head conv, not linear
    assert getattr(kept.attn_cfg, field) == 2
    assert alias not in json.loads(kept.to_json())["attn_cfg"]        # stored as our field
    for bad in ({alias: True, field: 2}, {alias: False, field: "all"}):
        with pytest.raises(ValueError, match=f"{alias}.*{field}.*conflict"):
            tiny_cfg("mta", attn_cfg=bad)
    with pytest.raises(ValueError, match=f"{alias} must be a bool"):
        tiny_cfg("mta", attn_cfg={alias: 1})


# -- MTA: the per-dimension gate (official gate_1d=False) -------------------------------------
def naive_head_outputs(z, attn):
    """Loops over position, head and dimension: RMSNorm over d_head, then the sigmoid gate."""
    o = attn.opts
    w_norm, W, b = (t.detach().double() for t in (attn.subln_w, attn.W_gate, attn.b_gate))
    batch, T, H, d = z.shape
    out = torch.zeros_like(z)
    for n in range(batch):
        for p in range(T):
            for h in range(H):
                vec = z[n, p, h]
                rms = math.sqrt(sum(float(x) ** 2 for x in vec) / d + o.norm_eps)
                normed = [vec[i] / rms * w_norm[i] for i in range(d)]
                for j in range(d):
                    if o.gate_1d:
                        logit = sum(normed[i] * W[i] for i in range(d)) + b[0]
                    else:
                        logit = sum(normed[i] * W[i, j] for i in range(d)) + b[j]
                    out[n, p, h, j] = normed[j] / (1 + math.exp(-float(logit)))
    return out


@pytest.mark.parametrize("gate_1d", [True, False])
def test_mta_gate_matches_naive_loops(gate_1d):
    model = model_for("mta", {"gate_1d": gate_1d, "query_kernel_size": 2, "key_kernel_size": 3,
                              "after_sm_query_kernel_size": 2, "after_sm_key_kernel_size": 3})
    attn = model.blocks[0].attn
    d = model.cfg.d_head
    assert attn.W_gate.shape == ((d,) if gate_1d else (d, d))
    assert attn.b_gate.shape == ((1,) if gate_1d else (d,))
    gate_stage = next(s for s in model.stages(0) if s.name == "gate")
    assert gate_stage.shape == ("batch pos head_index" if gate_1d else
                                "batch pos head_index d_head")
    tokens = random_tokens(model, pos=6)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        attn = model.blocks[layer].attn
        want = naive_head_outputs(cache["z", layer], attn)
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_head_out"], want, **EXACT)
        attn_out = torch.einsum("bphd,hdm->bpm", want, attn.W_O.double()) + attn.b_O.double()
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_attn_out"], attn_out, **EXACT)
    gate = cache["blocks.0.attn.hook_gate"]
    assert gate.shape == tokens.shape + ((4,) if gate_1d else (4, d))
    if not gate_1d:   # the gates do differ across dimensions: not a scalar gate in disguise
        assert (gate.amax(-1) - gate.amin(-1)).min() > 1e-3


def test_mta_per_dim_gate_properties_and_checkpoint(tmp_path):
    model = model_for("mta", {"gate_1d": False, "query_kernel_size": 2, "key_kernel_size": 3})
    tokens = random_tokens(model, pos=10)
    assert assert_causal(model, tokens, t=6) > 20
    assert_pattern_identity(model, tokens)
    model.save_pretrained(tmp_path / "m")
    again = HookedVariantTransformer.from_pretrained(tmp_path / "m")
    assert again.cfg.attn_cfg.gate_1d is False
    torch.testing.assert_close(again(tokens), model(tokens), **EXACT)


# -- CoPE: official default scaling and aliases -----------------------------------------------
def test_cope_default_is_official_repo_scaling_and_nodiv_is_paper():
    assert CoPEOptions().scaling == "repo"
    assert tiny_cfg("cope", attn_cfg={"cope_nodiv": True}).attn_cfg.scaling == "paper"
    assert tiny_cfg("cope", attn_cfg={"cope_nodiv": False}).attn_cfg.scaling == "repo"
    with pytest.raises(ValueError, match="cope_nodiv=True.*conflicts with scaling='repo'"):
        tiny_cfg("cope", attn_cfg={"cope_nodiv": True, "scaling": "repo"})


def test_cope_official_aliases_map_onto_fields():
    official = dict(cope_sep_key=True, cope_npos=9, cope_layers=2, cope_shared=True,
                    rel_pos_max=5, rel_pos_extend=True, pos_emb="cope+rel")
    opts = tiny_cfg("cope", attn_cfg=official).attn_cfg
    assert (opts.sep_keys, opts.npos_max, opts.every, opts.shared) == (True, 9, 2, True)
    assert (opts.relative, opts.rel_npos, opts.rel_extend) == (True, 5, True)
    assert tiny_cfg("cope", attn_cfg={"cope_val_gates": True}).attn_cfg.val_gates is True
    assert tiny_cfg("cope", attn_cfg={"pos_emb": "cope"}).attn_cfg.relative is False
    with pytest.raises(ValueError, match="pos_emb='rope'"):
        tiny_cfg("cope", attn_cfg={"pos_emb": "rope"})
    with pytest.raises(ValueError, match="cope_shared must be a bool"):
        tiny_cfg("cope", attn_cfg={"cope_shared": "yes"})


# -- CoPE: rel_pos_extend and sep_keys + val_gates, against naive loops -----------------------
def naive_cope(q, k, v, e, gate_k, r, scaling, npos, extend):
    """One head, loops over query i and key j: official ContextPosSelfAttn with relative
    positions (RelPosEmb; `extend`: distances >= rel_npos use the farthest embedding)."""
    T, d = q.shape
    out = torch.zeros_like(v)
    for i in range(T):
        logits = []
        for j in range(i + 1):
            p = min(sum(1 / (1 + math.exp(-float(q[i] @ gate_k[t]) / math.sqrt(d)))
                        for t in range(j, i + 1)), npos - 1)
            lo, hi = math.floor(p), math.ceil(p)
            pos = (p - lo) * (q[i] @ e[:, hi]) + (1 - p + lo) * (q[i] @ e[:, lo])
            content = q[i] @ k[j]
            dist = i - j
            if r is not None and (dist < r.shape[1] or extend):
                content = content + q[i] @ r[:, min(dist, r.shape[1] - 1)]
            logits.append((content + pos) / math.sqrt(d) if scaling == "repo"
                          else content / math.sqrt(d) + pos)
        weights = torch.softmax(torch.stack(logits), 0)
        for j in range(i + 1):
            out[i] += weights[j] * v[j]
    return out


COPE_CASES = {
    "rel_extend_repo": dict(relative=True, rel_npos=3, rel_extend=True),
    "rel_extend_paper": dict(relative=True, rel_npos=3, rel_extend=True, scaling="paper"),
    "sep_keys_val_gates": dict(sep_keys=True, val_gates=True, npos_max=4),
}


@pytest.mark.parametrize("name", list(COPE_CASES))
def test_cope_options_match_naive_loops(name):
    opts = COPE_CASES[name]
    model = model_for("cope", opts, n_layers=1, attn_only=True, n_ctx=16)
    attn = model.blocks[0].attn
    tokens = random_tokens(model, batch=1, pos=7, seed=3)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    q, k, v, z = (cache[n, 0][0] for n in ("q", "k", "v", "z"))
    gate_k = v if opts.get("val_gates") else k
    r = attn.R.detach() if opts.get("relative") else None
    for h in range(model.cfg.n_heads):
        want = naive_cope(q[:, h], k[:, h], v[:, h], attn.E.detach(), gate_k[:, h], r,
                          attn.opts.scaling, attn.npos_max, attn.opts.rel_extend)
        torch.testing.assert_close(z[:, h], want, **EXACT)


def test_rel_extend_changes_only_far_keys_and_keeps_properties():
    ext = model_for("cope", dict(relative=True, rel_npos=3, rel_extend=True), n_ctx=16)
    plain = model_for("cope", dict(relative=True, rel_npos=3), n_ctx=16)
    plain.load_state_dict(ext.state_dict())
    tokens = random_tokens(ext, pos=10)
    with torch.no_grad():
        _, c_ext = ext.run_with_cache(tokens)
        _, c_plain = plain.run_with_cache(tokens)
    rel_e, rel_p = c_ext["blocks.0.attn.hook_rel_logits"], c_plain["blocks.0.attn.hook_rel_logits"]
    dist = torch.arange(10)[:, None] - torch.arange(10)[None, :]
    near = (dist >= 0) & (dist < 3)
    torch.testing.assert_close(rel_e[..., near], rel_p[..., near], **EXACT)
    far = dist >= 3
    assert rel_p[..., far].abs().max() == 0 and rel_e[..., far].abs().min() > 0
    for i, j in far.nonzero().tolist():   # a far key reads the farthest embedding r[2]
        torch.testing.assert_close(rel_e[..., i, j], rel_e[..., i, i - 2], **EXACT)
    assert assert_causal(ext, tokens, t=6) > 20
    assert_pattern_identity(ext, tokens)
    with pytest.raises(ValueError, match="rel_extend=True.*needs relative=True"):
        tiny_cfg("cope", attn_cfg=dict(rel_extend=True))


def test_sep_keys_with_val_gates_is_val_gates():
    both = model_for("cope", dict(sep_keys=True, val_gates=True))
    val = model_for("cope", dict(val_gates=True))
    assert not any("W_K_gate" in n for n in both.state_dict())     # nothing built and unread
    assert sorted(both.state_dict()) == sorted(val.state_dict())
    val.load_state_dict(both.state_dict())
    tokens = random_tokens(both, pos=10)
    torch.testing.assert_close(both(tokens), val(tokens), **EXACT)
    assert assert_causal(both, tokens, t=6) > 20
    assert_pattern_identity(both, tokens)


# -- unknown options: unsupported or misspelled -----------------------------------------------
@pytest.mark.parametrize("attention, name, match", [
    ("mta", "curse_norm", "'curse_norm' is an official option that attnlens does not support"),
    ("mta", "use_mta", "'use_mta' is an official option that attnlens does not support"),
    ("mta", "querry_kernel_size", "did you mean 'query_kernel_size'"),
    ("mta", "pre_sm_linear_heads", "did you mean 'pre_sm_linear_head'"),
    ("mta", "gate1d", "did you mean 'gate_1d'"),
    ("mta", "zzz", "'zzz' is not an option"),
    ("cope", "cope_nodv", "did you mean 'cope_nodiv'"),
    ("cope", "scalng", "did you mean 'scaling'"),
])
def test_unknown_option_says_unsupported_or_misspelled(attention, name, match):
    with pytest.raises(ValueError, match="unknown options") as info:
        tiny_cfg(attention, attn_cfg={name: 1})
    assert match in str(info.value)


# -- shipped zoo models keep their behaviour ---------------------------------------------------
def test_zoo_models_keep_their_trained_options():
    cope, mta = zoo.load("induction-cope"), zoo.load("induction-mta")
    assert all(b.attn.opts.scaling == "paper" for b in cope.blocks)   # stored explicitly
    assert all(b.attn.mta_kernel is not None for b in mta.blocks)      # 2 layers: all, as before
    assert mta.cfg.attn_cfg.gate_1d and mta.blocks[0].attn.W_gate.shape == (16,)
    again = VariantConfig.from_json(cope.cfg.to_json())
    assert again.attn_cfg.scaling == "paper"
