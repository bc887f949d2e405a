"""Properties of the baseline "mha" model: causality and the effective-pattern identity."""

import pytest
import torch

from helpers import EXACT, assert_causal, assert_pattern_identity, random_tokens, tiny_model


@pytest.mark.parametrize("pos_type", ["standard", "rotary", "none"])
@pytest.mark.parametrize("norm", ["LN", "RMS", None])
def test_causal_and_pattern_identity(pos_type, norm):
    model = tiny_model(positional_embedding_type=pos_type, normalization_type=norm,
                       dtype="float64")
    tokens = random_tokens(model)
    assert assert_causal(model, tokens, t=7) > 10
    assert_pattern_identity(model, tokens)


def test_naive_attention_matches():
    """A loop over positions implementing softmax(q.k/sqrt(d)) v agrees with the model's z."""
    model = tiny_model(n_layers=1, attn_only=True, dtype="float64")
    tokens = random_tokens(model, batch=1, pos=6)
    _, cache = model.run_with_cache(tokens)
    attn = model.blocks[0].attn
    x = cache["blocks.0.ln1.hook_normalized"][0]
    T, H = x.shape[0], model.cfg.n_heads
    for h in range(H):
        q = x @ attn.W_Q[h] + attn.b_Q[h]
        k = x @ attn.W_K[h] + attn.b_K[h]
        v = x @ attn.W_V[h] + attn.b_V[h]
        for i in range(T):
            s = torch.stack([q[i] @ k[j] / model.cfg.d_head**0.5 for j in range(i + 1)])
            w = torch.softmax(s, 0)
            z = sum(w[j] * v[j] for j in range(i + 1))
            torch.testing.assert_close(cache["z", 0][0, i, h], z, **EXACT)
