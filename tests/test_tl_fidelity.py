"""TransformerLens's own tools give right numbers on every variant with the default config.

Per-head results (stack_head_results, get_full_resid_decomposition), logit lens, test_prompt and
generate, plus the input checks at the model boundary (docs/design.md contracts 1 and 9).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformer_lens.utilities import test_prompt as tl_test_prompt

from attnlens.hooked_models import VariantConfig
from attnlens.hooked_models.attention.registry import available_variants
from attnlens.hooked_models.tokenizers.vocab import CharTokenizer

from helpers import EXACT, random_tokens, tiny_model

VARIANTS = available_variants()
# Small segments so Infini's memory path is used at the test lengths; the rest is default.
SMALL = {"infini": {"segment_len": 4}}


def perturbed_model(attention: str, **overrides):
    """A float64 model whose every parameter is moved off its (often identity-like) init, so
    MTA's kernels, norm and gate, DCMHA's mixing etc. all change the result."""
    model = tiny_model(attention, dtype=torch.float64, attn_cfg=SMALL.get(attention), **overrides)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


@pytest.mark.parametrize("attention", VARIANTS)
def test_head_results_sum_to_attention_output(attention):
    model = perturbed_model(attention)
    assert not model.cfg.use_attn_result
    tokens = random_tokens(model, pos=10)
    logits, cache = model.run_with_cache(tokens)
    stack, labels = cache.stack_head_results(layer=-1, return_labels=True)
    H = model.cfg.n_heads
    assert len(labels) == model.cfg.n_layers * H
    for layer in range(model.cfg.n_layers):
        heads = stack[layer * H:(layer + 1) * H].sum(0) + model.blocks[layer].attn.b_O
        torch.testing.assert_close(heads, cache["attn_out", layer], **EXACT)
    # Observing the heads does not change what the model computes.
    torch.testing.assert_close(logits, model(tokens), **EXACT)


@pytest.mark.parametrize("attention", VARIANTS)
def test_full_resid_decomposition_sums_to_residual(attention):
    model = perturbed_model(attention)
    tokens = random_tokens(model, pos=10)
    _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers + 1):
        parts, labels = cache.get_full_resid_decomposition(layer, return_labels=True)
        target = cache["resid_post", layer - 1] if layer else cache["resid_pre", 0]
        assert parts.shape[0] == len(labels)
        torch.testing.assert_close(parts.sum(0), target, **EXACT)


def test_mta_head_results_survive_a_names_filter():
    """A cache of hook_z alone would let TL rebuild results as z @ W_O, wrong under MTA's norm
    and gate: selecting hook_z also selects hook_result on such layers."""
    model = perturbed_model("mta")
    tokens = random_tokens(model, pos=10)
    _, full = model.run_with_cache(tokens)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_z"))
    assert "blocks.1.attn.hook_result" in cache.cache_dict
    torch.testing.assert_close(cache.stack_head_results(), full.stack_head_results(), **EXACT)
    _, one = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_z"])
    assert sorted(one.cache_dict) == ["blocks.0.attn.hook_result", "blocks.0.attn.hook_z"]
    _, none = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_pre")
    assert list(none.cache_dict) == ["blocks.0.hook_resid_pre"]


def test_head_result_hook_is_on_the_data_path():
    """Zeroing one MTA head's result removes exactly that head's contribution."""
    model = perturbed_model("mta")
    tokens = random_tokens(model, pos=10)
    _, cache = model.run_with_cache(tokens)

    def drop_head_2(result, hook):
        result[:, :, 2] = 0
        return result

    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_result", drop_head_2)]):
        _, ablated = model.run_with_cache(tokens, names_filter="blocks.1.hook_attn_out")
    expected = cache["attn_out", 1] - cache["result", 1][:, :, 2]
    torch.testing.assert_close(ablated["attn_out", 1], expected, **EXACT)


def test_mha_keeps_transformer_lens_result_semantics():
    """Where z @ W_O is exact, hook_result stays off unless use_attn_result (no extra memory)."""
    _, cache = tiny_model("mha").run_with_cache(random_tokens(tiny_model("mha")))
    assert not any(name.endswith("hook_result") for name in cache.cache_dict)


@pytest.mark.parametrize("attention", ["mha", "mta"])
def test_logit_lens_matches_manual_readout(attention):
    model = perturbed_model(attention)
    tokens = random_tokens(model, pos=10)
    logits, cache = model.run_with_cache(tokens)
    resids = [cache["resid_pre", l] for l in range(model.cfg.n_layers)]
    resids.append(cache["resid_post", model.cfg.n_layers - 1])
    manual = torch.stack([model.unembed(model.ln_final(r)) for r in resids])

    accum, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    torch.testing.assert_close(model.unembed(accum), manual, **EXACT)

    lens = cache.logit_lens()
    assert lens.labels == labels
    torch.testing.assert_close(lens.values, manual[:, :, -1], **EXACT)
    torch.testing.assert_close(lens.values[-1], logits[:, -1], **EXACT)


def test_test_prompt_prints_ranks(capsys):
    model = tiny_model("mta", tokenizer_alphabet="abcdefgh ", d_vocab=50)
    tl_test_prompt("abcab", "c", model, top_k=3)
    out = capsys.readouterr().out
    assert "Tokenized prompt: ['<bos>', 'a', 'b', 'c', 'a', 'b']" in out
    assert "Tokenized answer: [' ', 'c']" in out
    assert "Ranks of the answer tokens" in out
    assert out.count("Top 2th token") == 2   # one top-k list per answer token
    top = [line.split("Token: |", 1)[1].rstrip("|") for line in out.splitlines()
           if line.startswith("Top ")]
    # Ids past the 10 characters of the tokenizer are model outputs without text: labelled.
    assert all(len(t) == 1 or t == "<bos>" or t.startswith("<unused:") for t in top), top


def test_single_ids_decode_like_hf():
    model = tiny_model("mha", tokenizer_alphabet="abc", d_vocab=8)
    tok = model.tokenizer
    assert isinstance(tok, CharTokenizer)
    assert tok.decode(torch.tensor(3)) == tok.decode(3) == tok.decode([3]) == "c"
    assert model.to_string(torch.tensor(2)) == model.to_string(2) == "b"
    assert model.to_string(torch.tensor([[0, 1], [2, 3]])) == ["<bos>a", "bc"]
    assert model.to_str_tokens(torch.tensor(1)) == ["a"]
    assert model.to_string([1, 6]) == "a<unused:6>"
    with pytest.raises(ValueError, match="token id 4 is outside the tokenizer vocabulary"):
        tok.decode(4)
    with pytest.raises(ValueError, match="token id 8 is outside"):
        model.to_string(8)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_infini_generate_falls_back_to_full_forwards(temperature):
    model = perturbed_model("infini")
    prompt = random_tokens(model, batch=2, pos=5)
    out = model.generate(prompt, max_new_tokens=7, temperature=temperature, seed=3)
    # Reference: re-run the whole sequence each step (no cache of any kind).
    gen = torch.Generator().manual_seed(3)
    expect = prompt
    for _ in range(7):
        last = model(expect)[:, -1]
        if temperature == 0:
            nxt = last.argmax(-1, keepdim=True)
        else:
            nxt = torch.multinomial(torch.softmax(last.float() / temperature, -1), 1,
                                    generator=gen)
        expect = torch.cat([expect, nxt], dim=1)
    assert out.shape == (2, 12)
    assert torch.equal(out, expect)
    assert torch.equal(model.generate(prompt, 7, use_cache=False, do_sample=False),
                       model.generate(prompt, 7, do_sample=False))


def test_empty_list_input_is_refused():
    model = tiny_model("mha", tokenizer_alphabet="abc")
    with pytest.raises(ValueError, match="empty list"):
        model([])
    with pytest.raises(ValueError, match="empty list"):
        model.padding_mask([])


@pytest.mark.parametrize("kwargs, needle", [
    (dict(max_new_tokens=-1), "max_new_tokens must be an int >= 0, got -1"),
    (dict(max_new_tokens=2.0), "max_new_tokens must be an int >= 0, got 2.0"),
    (dict(max_new_tokens=True), "max_new_tokens must be an int >= 0, got True"),
    (dict(max_new_tokens=2, temperature=-0.5), "temperature must be .*>= 0.*got -0.5"),
    (dict(max_new_tokens=2, temperature=math.nan), "temperature .* got nan"),
    (dict(max_new_tokens=2, temperature=math.inf), "temperature .* got inf"),
])
def test_generate_refuses_bad_arguments(kwargs, needle):
    model = tiny_model("mha")
    with pytest.raises(ValueError, match=needle):
        model.generate(random_tokens(model, batch=1, pos=3), **kwargs)


def test_generate_zero_new_tokens_returns_prompt():
    model = tiny_model("mha")
    prompt = random_tokens(model, batch=1, pos=3)
    assert torch.equal(model.generate(prompt, 0), prompt)


@pytest.mark.parametrize("field, value", [
    ("attn_scale", 0.0), ("attn_scale", -2.0), ("attn_scale", math.nan), ("attn_scale", math.inf),
    ("attn_scale", "8"), ("eps", -1e-5), ("eps", 0.0), ("eps", math.nan), ("eps", True),
])
def test_config_refuses_nonpositive_scales(field, value):
    base = dict(d_model=16, d_head=4, n_layers=1, n_ctx=8, d_vocab=10)
    with pytest.raises(ValueError, match=f"{field} must be a finite number > 0, got "
                                         f"{value!r}".replace("(", r"\(")):
        VariantConfig(**base, **{field: value})
    ok = VariantConfig(**base, attn_scale=1, eps=1e-6)   # ints and small positives pass
    assert ok.attn_scale == 1 and ok.eps == 1e-6
