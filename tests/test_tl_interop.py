"""TransformerLens's own tools, run unchanged on a HookedVariantTransformer."""

import pytest
import torch
from transformer_lens import ActivationCache, FactoredMatrix, patching
from transformer_lens.head_detector import detect_head
from transformer_lens.model_protocol import TransformerLensModel, TransformerLensModelWithWeights

from helpers import EXACT, random_tokens, tiny_model

ALPHABET = "abcdefghijklmnopqrstuvwxyz "


@pytest.fixture(scope="module")
def model():
    """float64, so TransformerLens's tools can be checked exactly against our activations."""
    return tiny_model(tokenizer_alphabet=ALPHABET, n_ctx=64, dtype="float64")


def test_protocols_and_cache_type(model):
    assert isinstance(model, TransformerLensModel)
    assert isinstance(model, TransformerLensModelWithWeights)
    _, cache = model.run_with_cache("abc")
    assert isinstance(cache, ActivationCache)
    assert isinstance(model.QK, FactoredMatrix) and isinstance(model.OV, FactoredMatrix)
    L, H, D = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    assert model.QK.shape == (L, H, D, D) and model.OV.shape == (L, H, D, D)
    torch.testing.assert_close(model.QK.AB[1, 2], model.W_Q[1, 2] @ model.W_K[1, 2].T, **EXACT)


def test_hook_names_and_shapes(model):
    tokens = random_tokens(model, batch=2, pos=9)
    _, cache = model.run_with_cache(tokens)
    B, T, H, dh, D = 2, 9, model.cfg.n_heads, model.cfg.d_head, model.cfg.d_model
    expect = {
        "hook_embed": (B, T, D), "hook_pos_embed": (B, T, D),
        "blocks.0.hook_resid_pre": (B, T, D), "blocks.0.hook_resid_mid": (B, T, D),
        "blocks.0.hook_resid_post": (B, T, D), "blocks.0.hook_attn_out": (B, T, D),
        "blocks.0.hook_mlp_out": (B, T, D), "blocks.0.ln1.hook_scale": (B, T, 1),
        "blocks.0.ln1.hook_normalized": (B, T, D), "ln_final.hook_scale": (B, T, 1),
        "blocks.1.attn.hook_q": (B, T, H, dh), "blocks.1.attn.hook_k": (B, T, H, dh),
        "blocks.1.attn.hook_v": (B, T, H, dh), "blocks.1.attn.hook_z": (B, T, H, dh),
        "blocks.1.attn.hook_attn_scores": (B, H, T, T), "blocks.1.attn.hook_pattern": (B, H, T, T),
        "blocks.0.mlp.hook_pre": (B, T, model.cfg.d_mlp),
    }
    for name, shape in expect.items():
        assert tuple(cache[name].shape) == shape, name
    scores = cache["attn_scores", 0]
    assert torch.isneginf(scores[0, 0, 0, 1:]).all() and torch.isfinite(scores[0, 0, 1, :2]).all()


def test_rotary_hooks():
    model = tiny_model(positional_embedding_type="rotary")
    _, cache = model.run_with_cache(random_tokens(model))
    assert "blocks.0.attn.hook_rot_q" in cache.keys() and "hook_pos_embed" not in cache.keys()


def test_detect_head_matches_manual_scores(model):
    text = "the cat sat on the mat and the cat sat"
    scores = detect_head(model, text, "previous_token_head")
    _, cache = model.run_with_cache(text)
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer][0]
        sub = pattern.diagonal(offset=-1, dim1=-2, dim2=-1).sum(-1)
        manual = sub / pattern.sum((-2, -1))
        torch.testing.assert_close(scores[layer], manual.to(scores.dtype), **EXACT)
    dup = detect_head(model, text, "duplicate_token_head")
    ind = detect_head(model, text, "induction_head")
    assert dup.shape == ind.shape == (model.cfg.n_layers, model.cfg.n_heads)
    assert ((dup >= 0) & (dup <= 1)).all() and ((ind >= 0) & (ind <= 1)).all()


def test_decompose_and_accumulated_resid(model):
    tokens = random_tokens(model, pos=10)
    _, cache = model.run_with_cache(tokens)
    parts, labels = cache.decompose_resid(return_labels=True)
    assert labels[:2] == ["embed", "pos_embed"] and labels[-1] == "1_mlp_out"
    torch.testing.assert_close(parts.sum(0), cache["resid_post", -1], **EXACT)
    accum = cache.accumulated_resid(incl_mid=True)
    torch.testing.assert_close(accum[-1], cache["resid_post", -1], **EXACT)
    torch.testing.assert_close(accum[0], cache["resid_pre", 0], **EXACT)


def test_stack_head_results_sum_to_attn_out(model):
    tokens = random_tokens(model, pos=8)
    _, cache = model.run_with_cache(tokens)
    stack, labels = cache.stack_head_results(layer=-1, return_labels=True)
    H = model.cfg.n_heads
    assert labels[:2] == ["L0H0", "L0H1"] and len(labels) == model.cfg.n_layers * H
    for layer in range(model.cfg.n_layers):
        heads_sum = stack[layer * H:(layer + 1) * H].sum(0)
        expected = cache["attn_out", layer] - model.blocks[layer].attn.b_O
        torch.testing.assert_close(heads_sum, expected, **EXACT)


def test_attn_result_hook_matches_stack():
    model = tiny_model(use_attn_result=True, dtype="float64")
    tokens = random_tokens(model, pos=8)
    _, cache = model.run_with_cache(tokens)
    result = cache["result", 0]
    assert result.shape == (2, 8, model.cfg.n_heads, model.cfg.d_model)
    torch.testing.assert_close(result.sum(-2) + model.blocks[0].attn.b_O, cache["attn_out", 0],
                               **EXACT)


def test_logit_attrs_sum_to_logits(model):
    tokens = random_tokens(model, batch=1, pos=8)
    logits, cache = model.run_with_cache(tokens)
    stack = cache.decompose_resid(apply_ln=False, pos_slice=-1)  # logit_attrs applies ln_final
    answer = tokens[:, 3]
    attrs = cache.logit_attrs(stack, tokens=answer, pos_slice=-1)
    # ln_final has w=1, b=0 at init, so the components' attributions add up to logit - b_U.
    expected = logits[0, -1, answer] - model.b_U[answer]
    torch.testing.assert_close(attrs.sum(0), expected, **EXACT)


def test_activation_patching_restores_clean(model):
    clean = random_tokens(model, batch=1, pos=8, seed=1)
    corrupt = clean.clone()
    corrupt[0, 2] = (corrupt[0, 2] + 5) % model.cfg.d_vocab
    clean_logits, clean_cache = model.run_with_cache(clean)
    target = int(clean[0, -1])

    def metric(logits):
        return logits[0, -1, target]

    result = patching.get_act_patch_resid_pre(model, corrupt, clean_cache, metric)
    assert result.shape == (model.cfg.n_layers, 8)
    # TransformerLens stores patching results in a float32 tensor whatever the model's dtype: the
    # float64 metric must equal it up to that rounding (1 float32 ulp, relative 1.2e-7).
    assert result.dtype == torch.float32
    ulp = dict(atol=0, rtol=2 ** -23)
    # Patching the clean residual at the corrupted position of layer 0 restores the clean run.
    torch.testing.assert_close(result[0, 2], metric(clean_logits).float(), **ulp)
    # Patching a position before the corruption changes nothing.
    corrupt_logits = model(corrupt)
    torch.testing.assert_close(result[0, 0], metric(corrupt_logits).float(), **ulp)


def test_hook_that_raises_leaves_no_hook(model):
    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(random_tokens(model), fwd_hooks=[("blocks.0.attn.hook_pattern", boom)])
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
    model.add_hook("hook_embed", boom)
    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_cache(random_tokens(model), names_filter="blocks.0.hook_resid_pre")
    # The caching hook is gone; only the hook the user added by hand remains.
    assert not model.hook_dict["blocks.0.hook_resid_pre"].fwd_hooks
    assert len(model.hook_dict["hook_embed"].fwd_hooks) == 1
    model.reset_hooks()
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_ablation_via_hooks_changes_output(model):
    tokens = random_tokens(model)

    def zero(x, hook):
        return torch.zeros_like(x)

    base = model(tokens)
    ablated = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_v", zero)])
    assert not torch.allclose(base, ablated)
    torch.testing.assert_close(model(tokens), base, **EXACT)
