"""Config round trips, tokenizer, bad inputs (ValueError naming the problem), decoding parity."""

import json

import pytest
import torch

from attnlens.hooked_models import CharTokenizer, HookedVariantTransformer, VariantConfig

from helpers import EXACT, decode_stepwise, random_tokens, tiny_cfg, tiny_model


def test_config_json_round_trip():
    cfg = tiny_cfg(positional_embedding_type="rotary", rotary_dim=4, normalization_type="RMS",
                   dtype="float64", metadata={"task": "x"})
    again = VariantConfig.from_json(cfg.to_json())
    assert again == cfg and again.dtype == torch.float64 and again.rotary_dim == 4
    assert json.loads(cfg.to_json())["attention"] == "mha"


@pytest.mark.parametrize("field,value,needle", [
    ("attention", "flash", "unknown attention variant 'flash'"),
    ("positional_embedding_type", "alibi", "positional_embedding_type='alibi'"),
    ("normalization_type", "BN", "normalization_type='BN'"),
    ("backend", "cuda", "backend='cuda'"),
    ("d_model", 0, "d_model must be a positive int"),
    ("act_fn", "swish9", "act_fn='swish9'"),
])
def test_config_errors(field, value, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        tiny_cfg(**{field: value})


def test_config_unknown_field_and_options():
    with pytest.raises(ValueError, match="unknown VariantConfig fields"):
        VariantConfig.from_dict({**tiny_cfg().to_dict(), "n_expertz": 3})
    with pytest.raises(ValueError, match="unknown options"):
        tiny_cfg(attn_cfg={"kernel": 3})


def test_char_tokenizer():
    model = tiny_model(tokenizer_alphabet="abc ")
    toks = model.to_tokens("ab c")
    assert toks.tolist() == [[0, 1, 2, 4, 3]]
    assert model.to_string(toks[0]) == "<bos>ab c"
    assert model.to_str_tokens("ab") == ["<bos>", "a", "b"]
    assert model.to_single_token("c") == 3
    with pytest.raises(ValueError, match="'z' is not in the tokenizer alphabet"):
        model.to_tokens("az")
    with pytest.raises(ValueError, match="not one"):
        model.to_single_token("ab")
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("aa")
    batch = model.to_tokens(["a", "abc"])
    assert batch.shape == (2, 4)
    assert model.padding_mask(["a", "abc"]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_no_tokenizer_error():
    with pytest.raises(ValueError, match="no tokenizer"):
        tiny_model().to_tokens("abc")


@pytest.mark.parametrize("bad,needle", [
    (torch.tensor([[1, 50]]), "token id 50 is outside the vocabulary"),
    (torch.tensor([[-1, 2]]), "token id -1 is outside the vocabulary"),
    (torch.zeros(1, 40, dtype=torch.long), "exceeds n_ctx=32"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "must be \\[batch, pos\\]"),
    (torch.zeros(1, 3), "integer tensor"),
    (torch.zeros(0, 3, dtype=torch.long), "empty input"),
    ([1, 2], "must be a string"),
])
def test_bad_tokens(bad, needle):
    model = tiny_model()
    with pytest.raises(ValueError, match=needle):
        model(bad)


def test_bad_hook_names_and_return_type():
    model = tiny_model()
    tokens = random_tokens(model)
    with pytest.raises(ValueError, match="unknown hook name 'blocks.0.attn.hook_patern'"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: x)])
    with pytest.raises(ValueError, match="unknown hook name"):
        model.run_with_cache(tokens, names_filter=["blocks.9.hook_resid_pre"])
    with pytest.raises(ValueError, match="unknown hook name"):
        model.add_hook("nope", lambda x, hook: x)
    with pytest.raises(ValueError, match="return_type"):
        model(tokens, return_type="probs")
    with pytest.raises(ValueError, match="has no stage 'conv'"):
        model.stage_hook_name(0, "conv")


def test_loss_keeps_float64_and_upcasts_half():
    model = tiny_model(dtype="float64")
    tokens = random_tokens(model)
    logits, loss = model(tokens, return_type="both")
    assert loss.dtype == torch.float64
    manual = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50),
                                               tokens[:, 1:].flatten())
    torch.testing.assert_close(loss, manual, atol=1e-12, rtol=0)
    half = model.loss_fn(logits.half(), tokens)
    assert half.dtype == torch.float32


def test_return_types():
    model = tiny_model()
    tokens = random_tokens(model)
    logits, loss = model(tokens, return_type="both")
    assert model(tokens, return_type=None) is None
    torch.testing.assert_close(model(tokens, return_type="loss"), loss, atol=0, rtol=0)
    per_tok = model(tokens, return_type="loss", loss_per_token=True)
    assert per_tok.shape == (2, 11)
    flat = logits[:, :-1].reshape(-1, 50)
    manual = torch.nn.functional.cross_entropy(flat, tokens[:, 1:].flatten())
    # a float32 mean of 22 log-probabilities of size ~4: rounding well below 1e-5
    torch.testing.assert_close(loss, manual, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pos_type", ["standard", "rotary"])
def test_incremental_decoding_parity(pos_type):
    model = tiny_model(positional_embedding_type=pos_type, dtype="float64")
    tokens = random_tokens(model, batch=2, pos=10)
    stepwise, _ = decode_stepwise(model, tokens, prefix=4)
    torch.testing.assert_close(stepwise, model(tokens), **EXACT)
    gen_cached = model.generate(tokens[:, :5], max_new_tokens=6, do_sample=False)
    gen_plain = model.generate(tokens[:, :5], max_new_tokens=6, use_cache=False,
                                do_sample=False)
    assert torch.equal(gen_cached, gen_plain)


@pytest.mark.parametrize("pos_type", ["standard", "rotary"])
def test_left_padding_matches_unpadded(pos_type):
    model = tiny_model(positional_embedding_type=pos_type, dtype="float64")
    tokens = random_tokens(model, batch=1, pos=6)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), tokens], 1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    out = model(padded, attention_mask=mask)[:, 3:]
    torch.testing.assert_close(out, model(tokens), **EXACT)
    _, cache = model.run_with_cache(padded, attention_mask=mask)
    assert not torch.isnan(cache["pattern", 0]).any()
    assert (cache["pattern", 0][:, :, :3] == 0).all()  # fully masked rows are zeros, not NaN


def test_seeded_init_is_reproducible():
    a, b = tiny_model(), tiny_model()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    c = HookedVariantTransformer(tiny_cfg(seed=1))
    assert not torch.equal(a.W_Q, c.W_Q)
