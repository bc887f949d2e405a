"""Issue 20's defects, one test (or a few) per item: each failed before its fix."""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.tools import gating

from helpers import random_tokens, tiny_cfg, tiny_model


# -- item 1: an MTA model without gating lists no gate stage ------------------------------------
def test_mta_without_gating_lists_no_gate_stage_and_gate_analyses_run(tmp_path):
    model = zoo.load("mta-findblock-first-mta-s0")
    assert not model.cfg.attn_cfg.add_gating
    for layer in range(model.cfg.n_layers):
        assert "gate" not in [s.name for s in model.stages(layer)]
    table = gating.gate_values(model, torch.randint(1, 13, (2, 20)))
    assert len(table) == 0 and "class" in table.columns
    # every stage of the catalogue fires (what interp, the dashboard and the docs rely on)
    gated = tiny_model("mta", attn_cfg={"add_gating": False, "group_norm": False})
    _, cache = gated.run_with_cache(random_tokens(gated))
    for layer in range(2):
        for s in gated.stages(layer):
            assert f"blocks.{layer}.attn.hook_{s.name}" in cache, s.name
    assert "gate" in [s.name for s in tiny_model("mta").stages(0)]


def test_gating_analysis_and_sweep_on_an_mta_model_without_gates(tmp_path):
    from attnlens.interp.sweep import run_sweep
    from attnlens.interp.tools.analyze import run_analyses

    model = tiny_model("mta", attn_cfg={"add_gating": False}, dtype="float64")
    manifest = run_analyses(model, ["gating"], tmp_path / "out", batch=2, half_len=4,
                            png=False, progress=False)
    assert manifest["notes"]["gating"] == ["no per-head gate stage in this model's catalogue"]
    model.save_pretrained(tmp_path / "mta")
    spec = {"models": [str(tmp_path / "mta")],
            "prompts": [{"name": "rep", "task": "induction", "count": 3, "seed": 0,
                         "args": {"half_len": 4}}],
            "analyses": ["gates"], "shard_size": 3}
    result = run_sweep(spec, out=tmp_path / "sweep", progress=False, figures=False)
    assert len(result.of("gates")) == 0


# -- item 10: a full official MTATransformerArgs dict builds the linear post-softmax mixing -----
OFFICIAL_MTA_DEFAULTS = dict(
    use_mta=True, query_kernel_size=1, key_kernel_size=1, pad_key="both", mta_layers=None,
    after_sm_query_kernel_size=None, after_sm_key_kernel_size=None, init_method="identity",
    head_kernel_size=None, group_norm=False, layer_norm_rescale=False, curse_norm=False,
    pre_sm_linear_head=False, post_sm_linear_head=False, add_gating=False, gate_1d=True)


@pytest.mark.parametrize("alias, field, param", [
    ("post_sm_linear_head", "head_kernel_size", "head_kernel"),
    ("pre_sm_linear_head", "pre_sm_head_kernel_size", "pre_sm_head_kernel")])
def test_official_args_with_a_linear_head_build_it(alias, field, param):
    cfg = tiny_cfg("mta", attn_cfg={**OFFICIAL_MTA_DEFAULTS, alias: True})
    assert getattr(cfg.attn_cfg, field) == "all"
    attn = tiny_model("mta", attn_cfg={**OFFICIAL_MTA_DEFAULTS, alias: True}).blocks[0].attn
    assert getattr(attn, param).shape == (1, 4, 4)          # one linear mixing of all 4 heads
    with pytest.raises(ValueError, match="linear head beside a head convolution"):
        tiny_cfg("mta", attn_cfg={**OFFICIAL_MTA_DEFAULTS, alias: True, field: 2})
    plain = tiny_cfg("mta", attn_cfg=OFFICIAL_MTA_DEFAULTS).attn_cfg
    assert plain.head_kernel_size is None and plain.query_kernel_size == 1
    for name, value in (("use_mta", False), ("curse_norm", True)):
        with pytest.raises(ValueError, match=f"only {name}={not value} is accepted"):
            tiny_cfg("mta", attn_cfg={**OFFICIAL_MTA_DEFAULTS, name: value})


# -- item 2: analyze takes zoo names and names a missing path -----------------------------------
def test_analyze_takes_a_zoo_name_and_names_a_missing_path(tmp_path, capsys):
    from attnlens.cli import main

    assert main(["analyze", "induction-dcmha", "--analysis", "circuits", "--out",
                 str(tmp_path / "o"), "--no-png"]) == 0
    assert (tmp_path / "o" / "manifest.json").is_file()
    with pytest.raises(SystemExit) as info:
        main(["analyze", "no/such/dir", "--out", str(tmp_path / "p")])
    message = str(info.value.code)
    assert "'no/such/dir' is neither an existing checkpoint directory nor a bundled model" in (
        message) and "induction-mha" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="is not a checkpoint directory.*no config.json"):
        main(["analyze", str(tmp_path / "empty"), "--out", str(tmp_path / "q")])


# -- item 12: serve checks its port before saying where it runs ---------------------------------
def test_serve_refuses_a_taken_port_before_announcing_it(monkeypatch, capsys):
    import socket

    from attnlens import cli

    def must_not_run(*args, **kwargs):
        raise AssertionError("serve went on with a taken port")

    monkeypatch.setattr(cli, "build_store", must_not_run)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(SystemExit) as info:
            cli.main(["serve", "--port", str(port)])
    message = str(info.value.code)
    assert f"cannot listen on 127.0.0.1:{port}" in message and "--port" in message
    assert "dashboard on" not in capsys.readouterr().out
    cli.check_port("127.0.0.1", port)      # free again: no error


# -- item 8: CUDA asked for where there is none: a ValueError that says so ----------------------
def test_cuda_without_cuda_says_cuda_is_not_available(monkeypatch):
    from attnlens.hooked_models import HookedVariantTransformer
    from attnlens.hooked_models.devices import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device='cuda': CUDA is not available"):
        zoo.load("induction-mha", device="cuda")
    with pytest.raises(ValueError, match="device='cuda:1': CUDA is not available"):
        HookedVariantTransformer(tiny_cfg(device="cuda:1"))
    with pytest.raises(ValueError, match="device='gpu0' is not a device name"):
        check_device("gpu0")
    check_device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"device='cuda:3': there are 1 CUDA device\(s\)"):
        check_device("cuda:3")


# -- item 4: to_string's text reads back with to_tokens -----------------------------------------
def test_to_string_round_trips_through_to_tokens():
    m = tiny_model(tokenizer_alphabet="abc<os>")       # even with "<bos>"'s characters in it
    tokens = m.to_tokens("abc")[0]
    assert m.to_string(tokens) == "<bos>abc"
    assert torch.equal(m.to_tokens(m.to_string(tokens), prepend_bos=False)[0], tokens)
    assert m.to_tokens(m.to_string(tokens))[0].tolist() == [0] + tokens.tolist()   # TL's rule
    ids = torch.tensor([[0, 3, 1, 49, 0, 2], [1, 9, 12, 0, 0, 4]])   # 9..49: beyond the alphabet
    assert torch.equal(m.to_tokens(m.to_string(ids), prepend_bos=False), ids)
    assert m.to_str_tokens(ids[1]) == ["a", "<unused:9>", "<unused:12>", "<bos>", "<bos>", "<"]


# -- item 5: Infini's memory records refuse edits instead of ignoring them ----------------------
@pytest.mark.parametrize("stage", ["memory", "memory_z"])
def test_infini_memory_edits_are_refused_not_ignored(stage):
    model = tiny_model("infini", attn_cfg={"segment_len": 4}, positional_embedding_type="rotary")
    tokens = random_tokens(model, pos=12)
    base = model(tokens)
    name = f"blocks.1.attn.hook_{stage}"
    for edit in (lambda x, hook: torch.zeros_like(x), lambda x, hook: x.zero_(),
                 lambda x, hook: x[:, :1]):
        with pytest.raises(ValueError, match=f"{name} is a read-only record"):
            model.run_with_hooks(tokens, fwd_hooks=[(name, edit)])
    for look in (lambda x, hook: None, lambda x, hook: x.clone(), lambda x, hook: x):
        out = model.run_with_hooks(tokens, fwd_hooks=[(name, look)])
        torch.testing.assert_close(out, base, atol=1e-5, rtol=0)
    _, cache = model.run_with_cache(tokens)
    assert cache[name].shape[1] == 3                                # one record per segment
    text = (__import__("pathlib").Path(__file__).parents[1] / "docs" / "hooks.md").read_text()
    assert text.count("read-only") >= 2


# -- item 7: sizes the machine cannot hold are refused, naming the field -------------------------
@pytest.mark.parametrize("sizes, field", [
    (dict(n_ctx=2**31), "n_ctx=2147483648"),                              # W_pos
    (dict(n_ctx=2**63), "n_ctx=9223372036854775808"),                     # beyond int64
    (dict(n_ctx=2**31, attention="cope", positional_embedding_type="none"), "n_ctx=2147483648"),
    (dict(n_ctx=2**63, attention="cope", positional_embedding_type="none"),
     "n_ctx=9223372036854775808"),
    (dict(n_ctx=2**31, attention="mta", positional_embedding_type="rotary"), "n_ctx=2147483648"),
    (dict(d_vocab=2**36), "d_vocab=68719476736"),
    (dict(d_mlp=2**36), "d_mlp=68719476736"),
    (dict(n_heads=2**30), "n_heads=1073741824"),
    (dict(d_model=2**20, d_head=2**16, n_heads=4), "d_model=1048576"),
])
def test_sizes_beyond_the_machine_are_refused_naming_the_field(monkeypatch, sizes, field):
    from attnlens.hooked_models import HookedVariantTransformer, VariantConfig, sizing

    monkeypatch.setattr(sizing, "physical_memory", lambda: 8 * 2**30)
    base = dict(d_model=64, d_head=16, n_layers=2, n_ctx=128)
    big = VariantConfig(**{**base, **sizes})      # a config may describe any model...
    with pytest.raises(ValueError, match=f"{field}.*more than this machine's 8.0 GiB"):
        HookedVariantTransformer(big)             # ...building it on this CPU is refused
    HookedVariantTransformer(VariantConfig(**base))                      # small: accepted
    HookedVariantTransformer(VariantConfig(**{**base, "n_ctx": 2**16,
                                              "positional_embedding_type": "rotary"}))
