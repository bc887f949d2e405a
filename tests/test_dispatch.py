"""Pay for what you look at (docs/design.md contract 5): the backend dispatch and `patterns_for`.

Runs the fused kernels on the Triton CPU interpreter (TRITON_INTERPRET=1, set by conftest).
"""

import pytest
import torch

from attnlens.kernels import _triton
from attnlens.kernels.dispatch import capture_fused_state, fused_backend_enabled, patterns_for

from helpers import random_tokens, tiny_model
from kernel_common import DEVICE, assert_same_loss_and_grads, spy, to_device

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not (_triton.available() and (_triton.interpreting()
                                                     or torch.cuda.is_available())),
                       reason="needs triton with a GPU or TRITON_INTERPRET=1"),
]

# Models live on DEVICE (the CPU under the interpreter, else the GPU): where the kernels run.
SMALL = dict(d_model=32, d_head=16, n_layers=2, n_ctx=32, positional_embedding_type="rotary",
             device=DEVICE)


def model(backend="triton", **overrides):
    return tiny_model("mha", backend=backend, **{**SMALL, **overrides})


@pytest.fixture
def calls(monkeypatch):
    """Counts per path: 'fused' kernel launches, 'torch' materialising attends and 'fast'
    (the CPU torch path with nothing observed: SDPA), per layer."""
    import attnlens.hooked_models.attention.mha.layer as mha
    import attnlens.kernels.flash_attention.dispatch as fd

    log = spy(monkeypatch, fd, "flash_attention", [], "fused")
    spy(monkeypatch, mha.MultiHeadAttention, "fast_attend", log,
        lambda self, *a, **kw: f"fast{self.layer}")
    return spy(monkeypatch, mha.MultiHeadAttention, "attend", log,
               lambda self, *a, **kw: f"torch{self.layer}")


def test_triton_backend_equals_torch_logits_and_gradients():
    tokens = random_tokens(model(), batch=2, pos=30)
    fused, ref = model("triton"), model("torch")
    loss_f = fused(tokens, return_type="loss")
    assert_same_loss_and_grads(loss_f, ref(tokens, return_type="loss"), fused, ref,
                               grad_atol=1e-5)


def test_fp16_model_close_to_torch():
    tokens = random_tokens(model(), batch=1, pos=20)
    fused = model("triton", dtype=torch.float16)
    ref = model("torch", dtype=torch.float16)
    with torch.no_grad():
        # fp16: logits ~1 after 2 layers of 1e-3-relative rounding (observed 3.7e-4)
        torch.testing.assert_close(fused(tokens).float(), ref(tokens).float(), atol=2e-2,
                                   rtol=2e-2)


def test_padding_and_kv_cache_decoding_match_torch():
    fused, ref = model("triton"), model("torch")
    with torch.no_grad():
        # left padding: the first query rows have no valid key (zeros on both paths)
        mask = to_device(torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10]))
        tokens = random_tokens(fused, batch=2, pos=10)
        torch.testing.assert_close(fused(tokens, attention_mask=mask),
                                   ref(tokens, attention_mask=mask), atol=1e-5, rtol=1e-5)
        prompt = random_tokens(fused, batch=1, pos=6)
        torch.testing.assert_close(fused.generate(prompt, 4, do_sample=False),
                                   ref.generate(prompt, 4, do_sample=False))


def test_no_hooks_runs_fused_everywhere(calls):
    m = model()
    m(random_tokens(m, batch=1, pos=8))
    assert calls == ["fused", "fused"]


def test_map_hook_switches_only_its_layer_and_detaching_switches_back(calls):
    m = model()
    tokens = random_tokens(m, batch=1, pos=8)
    seen = []
    m.add_hook("blocks.1.attn.hook_pattern", lambda t, hook: seen.append(t.shape))
    m(tokens)
    assert calls == ["fused", "torch1"] and seen == [(1, 4 // 2, 8, 8)]
    m.reset_hooks()
    calls.clear()
    m(tokens)
    assert calls == ["fused", "fused"]


def test_non_map_hooks_keep_the_fused_path(calls):
    m = model()
    tokens = random_tokens(m, batch=1, pos=8)
    names = ["blocks.0.attn.hook_q", "blocks.0.attn.hook_z", "blocks.1.attn.hook_rot_k",
             "blocks.1.hook_resid_post"]
    _, cache = m.run_with_cache(tokens, names_filter=names)
    assert calls == ["fused", "fused"]
    assert set(cache.keys()) == set(names)


def test_run_with_cache_asking_for_a_map_materialises_that_layer(calls):
    m = model()
    tokens = random_tokens(m, batch=1, pos=8)
    _, cache = m.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_attn_scores"])
    assert calls == ["torch0", "fused"]
    calls.clear()
    logits, cache = m.run_with_cache(tokens)                  # everything: both materialise
    assert calls == ["torch0", "torch1"]
    torch.testing.assert_close(logits, model("torch")(tokens), atol=1e-5, rtol=1e-5)
    calls.clear()
    m(tokens)                                                 # hooks are gone again
    assert calls == ["fused", "fused"]


def test_auto_backend_is_torch_on_cpu(calls):
    m = model("auto", device="cpu")         # a CPU model on any machine (auto is Triton on CUDA)
    m(random_tokens(m, batch=1, pos=8))
    assert calls == ["fast0", "fast1"]      # torch's SDPA: nothing is observed


def test_float64_falls_back_to_torch(calls):
    m = model(dtype=torch.float64)
    m(random_tokens(m, batch=1, pos=8))
    assert calls == ["fast0", "fast1"]
    calls.clear()
    m.run_with_cache(random_tokens(m, batch=1, pos=8))
    assert calls == ["torch0", "torch1"]


def test_triton_backend_without_interpreter_on_cpu_raises(monkeypatch):
    monkeypatch.setattr(_triton, "INTERPRET", False)
    m = model(device="cpu")                 # a CPU model on any machine (CUDA would run it)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        m(random_tokens(m, batch=1, pos=4))
    assert fused_backend_enabled("torch", torch.zeros(1)) is False
    assert fused_backend_enabled("auto", torch.zeros(1)) is False


def test_patterns_for_equals_the_materialised_pattern_without_a_materialising_pass(calls):
    m = model()
    tokens = random_tokens(m, batch=2, pos=12)
    rows = patterns_for(m, tokens, layers=[0, 1], heads=[1], queries=[0, 5, -1])
    assert "torch0" not in calls and "torch1" not in calls
    _, cache = model("torch").run_with_cache(tokens)
    for layer in (0, 1):
        expected = cache["pattern", layer][:, [1]][:, :, [0, 5, 11]]
        assert rows[layer].shape == (2, 1, 3, 12)
        torch.testing.assert_close(rows[layer], expected, atol=1e-6, rtol=1e-5)


def test_patterns_for_from_saved_state_and_with_padding():
    m = model()
    tokens = random_tokens(m, batch=2, pos=10)
    mask = to_device(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10]))
    states = capture_fused_state(m, tokens, layers=1, attention_mask=mask)
    assert m.blocks[1].attn.fused_state is None and not m.blocks[1].attn.keep_fused_state
    rows = patterns_for(m, states, heads=slice(None), queries=slice(0, 10, 3))
    _, cache = model("torch").run_with_cache(tokens, attention_mask=mask)
    torch.testing.assert_close(rows[1], cache["pattern", 1][:, :, 0:10:3], atol=1e-6, rtol=1e-5)


def test_patterns_for_falls_back_on_the_torch_backend(calls):
    m = model("torch")
    tokens = random_tokens(m, batch=1, pos=9)
    rows = patterns_for(m, tokens, layers=0, heads=0, queries=[3, 8])
    _, cache = m.run_with_cache(tokens)
    torch.testing.assert_close(rows[0], cache["pattern", 0][:, [0]][:, :, [3, 8]])


@pytest.mark.parametrize("kwargs, match", [
    (dict(layers=[5]), "layer"), (dict(heads=[9]), "heads"), (dict(queries=[100]), "queries"),
])
def test_patterns_for_bad_selection_raises(kwargs, match):
    m = model()
    with pytest.raises(ValueError, match=match):
        patterns_for(m, random_tokens(m, batch=1, pos=4), **kwargs)


# -- CoPE: the fused CoPE kernel on CoPE layers, the causal kernel on the others ---------------


def cope(backend, **attn_cfg):
    m = tiny_model("cope", backend=backend, attn_cfg=attn_cfg, **SMALL)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for block in m.blocks:
            if "pos_emb" in block.attn._parameters:
                block.attn.pos_emb.copy_(torch.randn(block.attn.pos_emb.shape, generator=g))
    return m


@pytest.fixture
def cope_calls(monkeypatch):
    import attnlens.kernels.cope.dispatch as cd
    import attnlens.kernels.flash_attention.dispatch as fd
    from attnlens.hooked_models import get_attention_class

    log = spy(monkeypatch, cd, "cope_attention", [], "cope")
    spy(monkeypatch, fd, "flash_attention", log, "flash")
    return spy(monkeypatch, get_attention_class("cope"), "attend", log,
               lambda self, *a, **kw: f"torch{self.layer}")




@pytest.mark.parametrize("attn_cfg", [dict(npos_max=6), dict(scaling="repo", every=2)],
                         ids=["saturating", "repo_every2"])
def test_cope_triton_equals_torch_logits_and_gradients(attn_cfg, cope_calls):
    fused, ref = cope("triton", **attn_cfg), cope("torch", **attn_cfg)
    tokens = random_tokens(fused, batch=2, pos=20)
    loss_f = fused(tokens, return_type="loss")
    assert cope_calls == (["cope", "cope"] if attn_cfg.get("every", 1) == 1
                          else ["flash", "cope"])
    assert_same_loss_and_grads(loss_f, ref(tokens, return_type="loss"), fused, ref,
                               grad_atol=2e-5)


def test_cope_map_hook_and_hooked_pos_table_take_the_torch_path(cope_calls):
    m = cope("triton")
    tokens = random_tokens(m, batch=1, pos=8)
    m.add_hook("blocks.0.attn.hook_positions", lambda t, hook: t)
    m(tokens)
    assert cope_calls == ["torch0", "cope"]
    m.reset_hooks()
    cope_calls.clear()
    m.add_hook("blocks.1.attn.hook_pos_table", lambda t, hook: t)   # not a map, but not fused
    m(tokens)
    assert cope_calls == ["cope", "torch1"]


# Every official option on the fused path (issue 16 item 3): sep-keys, val-gates (winning over
# sep-keys), CoPE+rel with and without --rel-pos-extend, and CoPE on every 2nd layer with
# relative logits on all (layer 0: relative logits only, still the CoPE kernel).
COPE_OPTIONS = {
    "sep_keys": dict(sep_keys=True, npos_max=6),
    "val_gates_win": dict(val_gates=True, sep_keys=True),
    "relative": dict(relative=True, rel_npos=5),
    "rel_extend_every2": dict(relative=True, rel_npos=5, rel_extend=True, every=2,
                              scaling="paper"),
}


def randomise_rel_emb(*models):
    for m in models:
        g = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for block in m.blocks:
                for name in ("rel_emb", "W_K_gate"):
                    if name in block.attn._parameters:
                        p = block.attn._parameters[name]
                        p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@pytest.mark.parametrize("name", list(COPE_OPTIONS))
def test_cope_options_take_the_fused_path_and_equal_torch(name, cope_calls):
    attn_cfg = COPE_OPTIONS[name]
    fused, ref = cope("triton", **attn_cfg), cope("torch", **attn_cfg)
    randomise_rel_emb(fused, ref)
    tokens = random_tokens(fused, batch=2, pos=14)
    mask = to_device(torch.tensor([[0, 0] + [1] * 12, [1] * 14]))   # padding-aware distances
    loss_f = fused(tokens, return_type="loss", attention_mask=mask)
    assert cope_calls == ["cope", "cope"]
    assert_same_loss_and_grads(loss_f, ref(tokens, return_type="loss", attention_mask=mask),
                               fused, ref, grad_atol=2e-5)
    rows = patterns_for(fused, tokens, layers=[0, 1], heads=[0], queries=[2, -1],
                        attention_mask=mask)
    with torch.no_grad():
        _, cache = ref.run_with_cache(tokens, attention_mask=mask)
    for layer in (0, 1):
        torch.testing.assert_close(rows[layer], cache["pattern", layer][:, [0]][:, :, [2, 13]],
                                   atol=1e-6, rtol=1e-5)


def test_cope_options_decode_with_a_kv_cache_like_torch(cope_calls):
    attn_cfg = dict(relative=True, rel_npos=4, rel_extend=True, sep_keys=True)
    fused, ref = cope("triton", **attn_cfg), cope("torch", **attn_cfg)
    randomise_rel_emb(fused, ref)
    prompt = random_tokens(fused, batch=1, pos=6)
    with torch.no_grad():
        out = fused.generate(prompt, 3, do_sample=False)
        assert set(cope_calls) == {"cope"}
        torch.testing.assert_close(out, ref.generate(prompt, 3, do_sample=False))


def test_cope_table_too_long_for_a_gpu_warns_once_and_falls_back(monkeypatch, cope_calls):
    import attnlens.kernels.cope.dispatch as cd

    monkeypatch.setattr(cd, "on_gpu", lambda: True)
    monkeypatch.setattr(cd, "MAX_NPOS", 4)
    monkeypatch.setattr(cd, "_WARNED", set())
    m = cope("triton", relative=True, rel_npos=5, npos_max=3)
    tokens = random_tokens(m, batch=1, pos=8)
    with pytest.warns(UserWarning, match="CoPE option rel_npos") as record:
        m(tokens)
        m(tokens)
    assert len(record) == 1
    assert cope_calls == ["torch0", "torch1"] * 2


def test_cope_patterns_for_and_padding_match_torch():
    fused, ref = cope("triton", npos_max=6), cope("torch", npos_max=6)
    tokens = random_tokens(fused, batch=2, pos=12)
    mask = to_device(torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 12]))
    rows = patterns_for(fused, tokens, layers=[0, 1], heads=[1], queries=[0, 6, -1],
                        attention_mask=mask)
    logits, cache = ref.run_with_cache(tokens, attention_mask=mask)
    with torch.no_grad():
        torch.testing.assert_close(fused(tokens, attention_mask=mask), logits, atol=1e-5,
                                   rtol=1e-5)
    for layer in (0, 1):
        torch.testing.assert_close(rows[layer], cache["pattern", layer][:, [1]][:, :, [0, 6, 11]],
                                   atol=1e-6, rtol=1e-5)


# -- Infini-attention: the unhooked segment pass on the fused kernels --------------------------


def infini(backend, update="linear", **overrides):
    m = tiny_model("infini", backend=backend, attn_cfg={"segment_len": 8, "update": update},
                   **{**SMALL, **overrides})
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for block in m.blocks:
            block.attn.beta.copy_(torch.randn(block.attn.beta.shape, generator=g))
    return m


@pytest.fixture
def infini_calls(monkeypatch):
    import attnlens.kernels.infini.dispatch as idp

    return spy(monkeypatch, idp, "infini_attention", [], "fused")


@pytest.mark.parametrize("update", ["linear", "delta"])
def test_infini_triton_equals_torch_logits_and_gradients(update, infini_calls):
    fused, ref = infini("triton", update), infini("torch", update)
    tokens = random_tokens(fused, batch=2, pos=21)
    loss_f = fused(tokens, return_type="loss")
    assert infini_calls == ["fused", "fused"]
    assert_same_loss_and_grads(loss_f, ref(tokens, return_type="loss"), fused, ref,
                               grad_atol=2e-5)


def test_infini_hooks_padding_and_auto(infini_calls):
    fused, ref = infini("triton"), infini("torch")
    tokens = random_tokens(fused, batch=2, pos=14)
    mask = to_device(torch.tensor([[0, 0, 0] + [1] * 11, [1] * 14]))
    with torch.no_grad():
        torch.testing.assert_close(fused(tokens, attention_mask=mask),
                                   ref(tokens, attention_mask=mask), atol=1e-5, rtol=1e-5)
        assert infini_calls == ["fused", "fused"]
        infini_calls.clear()
        fused.run_with_cache(tokens, names_filter=["blocks.1.attn.hook_gate"])
        assert infini_calls == ["fused"]           # layer 1 materialises its maps
        infini_calls.clear()
        infini("auto", device="cpu")(tokens)      # auto on a CPU model: torch (on CUDA: Triton)
        assert infini_calls == []
