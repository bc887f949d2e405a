"""TransformerLens's arguments and switches on every variant (issue 21, docs/design.md contract 9):
forward's stop/start_at_layer, prepend_bos, padding_side; generate's TransformerLens signature;
the set_use_* switches TransformerLens's patching calls; default_prepend_bos without a
tokenizer; test_prompt and evals with the character tokenizers."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import evals, patching
from transformer_lens.head_detector import detect_head
from transformer_lens.utilities import test_prompt as tl_test_prompt

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig, available_variants
from attnlens.interp.tools.ecosystem import row_stochastic_stage, stage_cache
from attnlens.interp.tools.evals import induction_loss

from helpers import EXACT, random_tokens, tiny_model

VARIANTS = available_variants()
SMALL = {"infini": {"segment_len": 4}}
ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def perturbed(attention: str, **overrides):
    """float64, parameters moved off their identity-like init so every variant differs."""
    model = tiny_model(attention, dtype=torch.float64, attn_cfg=SMALL.get(attention), **overrides)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


# -- forward -----------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", VARIANTS)
def test_stop_and_start_at_layer_split_the_forward(attention):
    model = perturbed(attention)
    tokens = random_tokens(model, pos=10)
    logits, cache = model.run_with_cache(tokens)
    resid = model(tokens, stop_at_layer=1)
    torch.testing.assert_close(resid, cache["resid_post", 0], **EXACT)
    torch.testing.assert_close(model(resid, start_at_layer=1), logits, **EXACT)
    torch.testing.assert_close(model(tokens, stop_at_layer=-1), resid, **EXACT)
    torch.testing.assert_close(model(tokens, stop_at_layer=0), cache["resid_pre", 0], **EXACT)
    loss = model(resid, start_at_layer=1, tokens=tokens, return_type="loss")
    torch.testing.assert_close(loss, model(tokens, return_type="loss"), **EXACT)
    # SAELens's activation store: run_with_cache with stop_at_layer and prepend_bos
    _, short = model.run_with_cache(tokens, names_filter="blocks.0.hook_resid_post",
                                    stop_at_layer=1, prepend_bos=False)
    torch.testing.assert_close(short["blocks.0.hook_resid_post"], resid, **EXACT)


def test_forward_argument_errors():
    model = tiny_model("mha", tokenizer_alphabet=ALPHABET)
    tokens = random_tokens(model)
    with pytest.raises(ValueError, match=r"stop_at_layer must be an int in \[-2, 2\], got 3"):
        model(tokens, stop_at_layer=3)
    with pytest.raises(ValueError, match="start_at_layer=2 is after stop_at_layer=1"):
        model(tokens, start_at_layer=2, stop_at_layer=1)
    with pytest.raises(ValueError, match="residual stream"):
        model(tokens, start_at_layer=1)
    with pytest.raises(ValueError, match="shortformer"):
        model(tokens, shortformer_pos_embed=torch.zeros(1))
    with pytest.raises(ValueError, match="needs tokens="):
        model(model(tokens, stop_at_layer=1), start_at_layer=1, return_type="loss")
    with pytest.raises(ValueError, match="padding_side"):
        model(["ab", "c"], padding_side="middle")
    with pytest.raises(ValueError, match="padding_side applies to text"):
        model(tokens, padding_side="left")


@pytest.mark.parametrize("attention", VARIANTS)
def test_prepend_bos_and_left_padding(attention):
    model = perturbed(attention, tokenizer_alphabet=ALPHABET)
    no_bos = model("abcab", prepend_bos=False)
    torch.testing.assert_close(no_bos, model(model.to_tokens("abcab", prepend_bos=False)), **EXACT)
    assert no_bos.shape[1] == 5 and model("abcab").shape[1] == 6
    left = model(["abcab", "xy"], padding_side="left")
    right = model(["abcab", "xy"])
    torch.testing.assert_close(left[0], right[0], **EXACT)
    torch.testing.assert_close(left[1, -3:], right[1, :3], **EXACT)   # "<bos>xy" at the end
    torch.testing.assert_close(left[1, -3:], model("xy")[0], **EXACT)
    loss_l = model(["abcab", "xy"], padding_side="left", return_type="loss")
    torch.testing.assert_close(loss_l, model(["abcab", "xy"], return_type="loss"), **EXACT)


# -- generate ----------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", VARIANTS)
def test_generate_list_of_strings_equals_each_prompt(attention):
    """Issue 20 item 3: a list of prompts generates, each row as its prompt alone."""
    model = perturbed(attention, tokenizer_alphabet=ALPHABET)
    out = model.generate(["abcab", "xyzxy", "ab"], 3, do_sample=False, verbose=False)
    assert isinstance(out, list) and len(out) == 3
    for prompt, text in zip(["abcab", "xyzxy", "ab"], out, strict=True):
        alone = model.generate(prompt, 3, do_sample=False, verbose=False)
        assert isinstance(alone, str) and alone.startswith(prompt)
        assert text == alone
    tokens = model.generate(["abcab", "xy"], 2, do_sample=False, return_type="tokens",
                            verbose=False)
    assert tokens.shape == (2, 8)   # left-padded: BOS + 5 + 2 new


def test_generate_defaults_to_sampling_like_transformer_lens():
    model = perturbed("mha", tokenizer_alphabet=ALPHABET)
    prompt = random_tokens(model, batch=1, pos=4)
    draws = {tuple(model.generate(prompt, 6, seed=s, verbose=False)[0].tolist())
             for s in range(6)}
    assert len(draws) > 1                      # do_sample=True by default
    greedy = model.generate(prompt, 6, do_sample=False, verbose=False)
    assert torch.equal(greedy, model.generate(prompt, 6, temperature=0, verbose=False))
    assert torch.equal(model.generate(prompt, 6, seed=3, verbose=False),
                       model.generate(prompt, 6, seed=3, verbose=False))
    assert torch.equal(greedy, model.generate(prompt, 6, top_k=1, seed=0, verbose=False))
    assert torch.equal(greedy, model.generate(prompt, 6, top_p=1e-9, seed=0, verbose=False))


def test_generate_top_k_top_p_and_penalties_restrict_the_draw():
    model = perturbed("mta", tokenizer_alphabet=ALPHABET)
    prompt = random_tokens(model, batch=1, pos=4)
    with torch.no_grad():
        top3 = set(model(prompt)[0, -1].topk(3).indices.tolist())
    firsts = {int(model.generate(prompt, 1, top_k=3, seed=s, temperature=5.0,
                                 verbose=False)[0, -1]) for s in range(30)}
    assert firsts <= top3 and len(firsts) > 1
    out = model.generate(prompt, 8, freq_penalty=100.0, seed=0, verbose=False)[0, 4:]
    assert len(set(out.tolist())) == 8           # a huge frequency penalty never repeats
    out = model.generate(prompt, 4, repetition_penalty=2.0, do_sample=False, verbose=False)
    assert out.shape == (1, 8)


def test_generate_stops_at_eos():
    model = perturbed("cope", tokenizer_alphabet=ALPHABET)
    prompt = random_tokens(model, batch=2, pos=4)
    greedy = model.generate(prompt, 6, do_sample=False, stop_at_eos=False, verbose=False)
    eos = int(greedy[0, 5])                      # the second token row 0 generates
    out = model.generate(prompt, 6, do_sample=False, eos_token_id=eos, verbose=False)
    first = int((greedy[0, 4:] == eos).nonzero()[0])
    assert torch.equal(out[0, :4 + first + 1], greedy[0, :4 + first + 1])
    assert (out[0, 4 + first:] == eos).all()     # finished rows are padded with EOS
    with pytest.raises(ValueError, match="eos_token_id 99 is outside"):
        model.generate(prompt, 2, eos_token_id=99, verbose=False)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(top_k=0), "top_k must be None or an int > 0"),
    (dict(top_p=1.5), r"top_p must be None or in \(0, 1\]"),
    (dict(freq_penalty=-1.0), "freq_penalty must be a finite number >= 0"),
    (dict(return_type="logits"), "return_type must be one of"),
    (dict(padding_side="right"), "padding_side must be None or 'left'"),
])
def test_generate_refuses_bad_transformer_lens_arguments(kwargs, needle):
    model = tiny_model("mha", tokenizer_alphabet=ALPHABET)
    with pytest.raises(ValueError, match=needle):
        model.generate("abc", 2, verbose=False, **kwargs)


# -- set_use_* ---------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", VARIANTS)
def test_split_qkv_input_is_exact_and_per_head(attention):
    model = perturbed(attention)
    tokens = random_tokens(model, pos=8)
    clean = model(tokens)
    with pytest.raises(ValueError, match=r"set_use_split_qkv_input\(True\)"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_q_input",
                                                 lambda x, hook: x)])
    model.set_use_split_qkv_input(True)
    try:
        _, cache = model.run_with_cache(tokens)
        H, D = model.cfg.n_heads, model.cfg.d_model
        assert cache["blocks.1.attn.hook_q_input"].shape == (2, 8, H, D)
        torch.testing.assert_close(cache["blocks.1.attn.hook_k_input"][:, :, 2],
                                   cache["resid_pre", 1], **EXACT)
        torch.testing.assert_close(model(tokens), clean, **EXACT)

        def nudge_head_2(x, hook):   # not a constant: ln1 would remove it
            x = x.clone()
            x[:, :, 2] += torch.linspace(-1, 1, D, dtype=x.dtype)
            return x

        with model.hooks(fwd_hooks=[("blocks.1.attn.hook_q_input", nudge_head_2)]):
            _, edited = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_q")
        q0 = cache["q", 1]
        q1 = edited["blocks.1.attn.hook_q"]
        changed = (q1 - q0).abs().amax(dim=(0, 1, 3))
        assert changed[2] > 1e-3 and changed[[0, 1, 3]].max() < 1e-12
    finally:
        model.set_use_split_qkv_input(False)
    torch.testing.assert_close(model(tokens), clean, **EXACT)


@pytest.mark.parametrize("attention", ["mha", "cope", "dcmha", "infini"])
def test_direct_path_patching_runs_and_matches_a_manual_edge(attention):
    model = perturbed(attention).eval()
    clean_tokens = random_tokens(model, batch=1, pos=8, seed=1)
    corrupt = clean_tokens.clone()
    corrupt[0, 2] = (corrupt[0, 2] + 1) % model.cfg.d_vocab
    _, clean_cache = model.run_with_cache(clean_tokens)
    _, corrupt_cache = model.run_with_cache(corrupt)

    def metric(logits):
        return logits[0, -1, 0]

    result = patching.get_act_patch_direct_path(model, corrupt, clean_cache, corrupt_cache,
                                                metric, src_layer=0, src_head=1, verbose=False)
    assert result.shape == (2, 4) and (result[0] == 0).all()
    assert not model.cfg.use_split_qkv_input          # the caller's flags are restored
    # head (1, 3)'s query reads source head (0, 1)'s clean write, nothing else changes
    delta = (clean_cache["z", 0][:, :, 1] - corrupt_cache["z", 0][:, :, 1]) @ model.W_O[0, 1]
    model.set_use_split_qkv_input(True)
    try:
        def add(x, hook):
            x = x.clone()
            x[:, :, 3] += delta
            return x

        manual = model.run_with_hooks(corrupt, fwd_hooks=[("blocks.1.attn.hook_q_input", add)])
    finally:
        model.set_use_split_qkv_input(False)
    torch.testing.assert_close(result[1, 3], metric(manual).to(result.dtype), **EXACT)


def test_attn_in_hook_mlp_in_and_attn_result_switches():
    model = perturbed("dcmha")
    tokens = random_tokens(model, pos=6)
    clean = model(tokens)
    model.set_use_attn_in(True)
    with pytest.raises(ValueError, match="mutually exclusive"):
        model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    model.set_use_attn_result(True)
    try:
        logits, cache = model.run_with_cache(tokens)
        torch.testing.assert_close(logits, clean, **EXACT)
        torch.testing.assert_close(cache["blocks.0.attn.hook_attn_in"][:, :, 0],
                                   cache["resid_pre", 0], **EXACT)
        torch.testing.assert_close(cache["blocks.1.hook_mlp_in"], cache["resid_mid", 1], **EXACT)
        torch.testing.assert_close(cache["blocks.1.attn.hook_result"].sum(-2)
                                   + model.blocks[1].attn.b_O, cache["attn_out", 1], **EXACT)
        zero_mlp = model.run_with_hooks(tokens, fwd_hooks=[(
            "blocks.1.hook_mlp_in", lambda x, hook: torch.zeros_like(x))])
        assert (zero_mlp - clean).abs().max() > 1e-6
    finally:
        model.set_use_attn_in(False)
        model.set_use_hook_mlp_in(False)
        model.set_use_attn_result(False)
    torch.testing.assert_close(model(tokens), clean, **EXACT)
    with pytest.raises(NotImplementedError, match="ungroup_grouped_query_attention"):
        model.set_ungroup_grouped_query_attention(True)
    model.set_ungroup_grouped_query_attention(False)


def test_split_qkv_input_under_gqa_has_kv_heads():
    model = perturbed("mha", n_key_value_heads=2)
    tokens = random_tokens(model, pos=6)
    clean = model(tokens)
    model.set_use_split_qkv_input(True)
    try:
        logits, cache = model.run_with_cache(tokens)
        assert cache["blocks.0.attn.hook_k_input"].shape[2] == 2
        assert cache["blocks.0.attn.hook_q_input"].shape[2] == 4
        torch.testing.assert_close(logits, clean, **EXACT)
    finally:
        model.set_use_split_qkv_input(False)


# -- tokenizer-less models, test_prompt, evals, detectors --------------------------------------
def test_models_without_tokenizer_do_not_prepend_bos():
    model = tiny_model("mha")
    assert model.tokenizer is None and model.cfg.default_prepend_bos is False
    model.tokenizer = HookedVariantTransformer(
        VariantConfig(d_model=8, d_head=4, n_layers=1, n_ctx=8, d_vocab=30,
                      tokenizer_alphabet=ALPHABET)).tokenizer
    assert model.cfg.default_prepend_bos is True       # a tokenizer with a BOS turns it back on
    with_tok = tiny_model("mha", tokenizer_alphabet=ALPHABET)
    assert with_tok.cfg.default_prepend_bos is True


def test_transformer_lens_evals_run_without_a_tokenizer():
    model = tiny_model("mha", d_vocab=20000, n_ctx=64)
    torch.manual_seed(0)
    tl = evals.induction_loss(model, batch_size=2, subseq_len=16, device="cpu")
    torch.manual_seed(0)
    ours = induction_loss(model, batch_size=2, subseq_len=16)
    torch.testing.assert_close(ours, tl)


@pytest.mark.parametrize("attention", VARIANTS)
def test_interp_induction_loss_on_small_vocabularies(attention):
    model = tiny_model(attention, tokenizer_alphabet=ALPHABET, attn_cfg=SMALL.get(attention))
    loss = induction_loss(model, batch_size=2, subseq_len=8, seed=0)
    assert torch.isfinite(loss) and 0 < float(loss) < 10
    with pytest.raises(ValueError, match="token range"):
        induction_loss(model, low=0, high=1000)


def test_test_prompt_with_an_alphabet_without_space(capsys):
    model = tiny_model("mta", tokenizer_alphabet="abcdefgh", d_vocab=12)
    tl_test_prompt("abcab", "c", model, top_k=3)
    out = capsys.readouterr().out
    assert "Tokenized answer: ['c']" in out and "Ranks of the answer tokens" in out
    assert model.to_tokens(" ab", prepend_bos=False).tolist() == [[1, 2]]


@pytest.mark.parametrize("attention", VARIANTS)
def test_detect_head_on_a_row_stochastic_stage_stays_in_unit_range(attention):
    model = perturbed(attention, tokenizer_alphabet=ALPHABET)
    text = "abcdefgabcdefg"
    for layer in range(model.cfg.n_layers):
        stage = row_stochastic_stage(model, layer)
        assert next(s for s in model.stages(layer) if s.name == stage).row_stochastic
    cache = stage_cache(model, text, remove_batch_dim=True)
    scores = detect_head(model, text, "previous_token_head", cache=cache)
    assert ((scores >= -1e-9) & (scores <= 1 + 1e-9)).all(), scores
