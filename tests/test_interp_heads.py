"""Head detectors: TransformerLens agreement, any stage, a hand-built induction circuit, ablation.

`build_induction_model(variant)` wires a 2-layer attention-only model by hand: L0H0 is a
previous-token head writing the previous token into its own subspace, L1H0 an induction head
whose keys read that subspace (K-composition). Each variant is put in its MHA-equivalent setting
(identity MTA kernels without norm/gate, zero DCMHA dynamic weights, one Infini segment, zero
CoPE embeddings), so the known answers hold on every registered variant.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformer_lens.head_detector import detect_head

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig, available_variants
from attnlens.interp._common import map_stage_names
from attnlens.interp.tasks.induction import repeated_tokens
from attnlens.interp.tools import heads

from helpers import EXACT, random_tokens, tiny_model

V, N_CTX, DH = 100, 24, 100   # a large vocabulary: few repeats inside r
HALF = 8
NEUTRAL = {"mta": dict(group_norm=False, add_gating=False), "infini": dict(segment_len=N_CTX)}


def build_induction_model(variant: str = "mha", scale: float = 30.0,
                          dtype: str = "float32") -> HookedVariantTransformer:
    """Hand-built previous-token (L0H0) + induction (L1H0) pair; heads H1 are zero."""
    T, P, R = 0, V, V + N_CTX                      # token, position, previous-token subspaces
    cfg = VariantConfig(d_model=2 * V + N_CTX, d_head=DH, n_heads=2, n_layers=2, n_ctx=N_CTX,
                        d_vocab=V, attn_only=True, normalization_type=None, seed=0,
                        attention=variant, attn_cfg=NEUTRAL.get(variant), dtype=dtype)
    model = HookedVariantTransformer(cfg).eval()
    c = math.sqrt(scale * math.sqrt(DH))           # c^2 / sqrt(d_head) = scale
    with torch.no_grad():
        model.embed.W_E.zero_()
        model.embed.W_E[torch.arange(V), T + torch.arange(V)] = 1.0
        model.pos_embed.W_pos.zero_()
        model.pos_embed.W_pos[torch.arange(N_CTX), P + torch.arange(N_CTX)] = 1.0
        model.unembed.W_U.zero_()
        model.unembed.W_U[T + torch.arange(V), torch.arange(V)] = 1.0
        for b in model.blocks:
            for w in (b.attn.W_Q, b.attn.W_K, b.attn.W_V, b.attn.W_O):
                w.zero_()
            if hasattr(b.attn, "qkw"):          # DCMHA: no dynamic composition
                b.attn.qkw.zero_()
                b.attn.dd.zero_()
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        pos = torch.arange(N_CTX - 1)
        a0.W_Q[0, P + pos + 1, pos] = c             # query at i looks for key i - 1
        a0.W_K[0, P + pos, pos] = c
        a0.W_V[0, T + torch.arange(V), torch.arange(V)] = 1.0
        a0.W_O[0, torch.arange(V), R + torch.arange(V)] = 1.0    # writes the previous token
        a1.W_Q[0, T + torch.arange(V), torch.arange(V)] = c   # current token ...
        a1.W_K[0, R + torch.arange(V), torch.arange(V)] = c      # ... = key's previous token
        a1.W_V[0, T + torch.arange(V), torch.arange(V)] = 1.0
        a1.W_O[0, torch.arange(V), T + torch.arange(V)] = 1.0    # copies it
    return model


@pytest.fixture(scope="module", params=available_variants())
def built(request):
    return build_induction_model(request.param)


def test_hand_built_pair_scores_as_such(built):
    table = heads.induction_table(built, batch=4, half_len=HALF)
    assert table.loc["L0H0", "previous_token"] > 0.9   # query 0 has no previous token
    assert table.loc["L1H0", "induction_stripe"] > 0.9
    # prefix matching over the whole input: first-copy queries have no earlier match
    assert table.loc["L1H0", "induction"] > 0.4
    assert table["induction"].idxmax() == "L1H0"
    assert table["previous_token"].idxmax() == "L0H0"
    assert table["induction_stripe"].idxmax() == "L1H0"
    assert table.loc["L1H1", "induction_stripe"] < 0.3        # zero weights: uniform attention


def test_ablating_previous_token_head_lowers_induction(built):
    out = heads.induction_ablation(built, [(0, 0)], batch=4, half_len=HALF)
    assert list(out.index) == ["L1H0", "L1H1"]
    assert out.loc["L1H0", "before"] > 0.9 and out.loc["L1H0", "after"] < 0.3
    control = heads.induction_ablation(built, [(0, 1)], batch=4, half_len=HALF)
    assert abs(control.loc["L1H0", "delta"]) < 1e-4           # the zero head changes nothing
    mean = heads.induction_ablation(built, [(0, 0)], batch=4, half_len=HALF, how="mean",
                                    hook="v")
    assert mean.loc["L1H0", "after"] < 0.5


def test_induction_before_and_after_mta_convolution():
    """A post-softmax kernel that shifts attention one key left turns the induction head at
    `softmax` into a duplicate-token head at `pattern`: detectors see both stages."""
    model = build_induction_model("mta")
    attn = model.blocks[1].attn
    c_q, c_k = attn.mta_kernel_after_sm.shape[-2:]
    with torch.no_grad():
        attn.mta_kernel_after_sm[0].zero_()
        attn.mta_kernel_after_sm[0, 0, c_q - 1, (c_k - 1) // 2 + 1] = 1.0
    before = heads.induction_table(model, batch=4, half_len=HALF, stage="softmax")
    after = heads.induction_table(model, batch=4, half_len=HALF, stage="pattern")
    assert before.loc["L1H0", "induction_stripe"] > 0.9
    assert before.loc["L1H0", "induction"] > 5 * before.loc["L1H0", "duplicate_token"]
    assert after.loc["L1H0", "induction_stripe"] < 0.1
    assert after.loc["L1H0", "duplicate_token"] > 5 * after.loc["L1H0", "induction"]


def test_induction_tables_share_one_forward():
    """Both stages' tables from one forward, each equal to its own `detect_heads` + stripe."""
    model = build_induction_model("mta", dtype="float64")
    forwards = []
    handle = model.embed.register_forward_hook(lambda *a: forwards.append(1))
    tables = heads.induction_tables(model, ["softmax", "pattern"], batch=4, half_len=HALF)
    handle.remove()
    assert len(forwards) == 1 and set(tables) == {"softmax", "pattern"}
    tokens = repeated_tokens(4, HALF, V, seed=0)
    for stage, table in tables.items():
        alone = heads.detect_heads(model, tokens, stage=stage)
        assert table[list(heads.DETECTORS)].equals(alone[list(heads.DETECTORS)])
        maps = heads.stage_maps(model, tokens, stage)      # both stages come after softmax
        naive = []
        for m in maps.values():        # query i of the second copy, key i - HALF + 1
            for h in range(2):
                hits = [m[b, h, i, i - HALF + 1] for b in range(4)
                        for i in range(1 + HALF, 1 + 2 * HALF)]
                naive.append(float(sum(hits)) / len(hits))
        torch.testing.assert_close(torch.tensor(table["induction_stripe"].to_numpy()),
                                   torch.tensor(naive, dtype=torch.float64), **EXACT)


@pytest.mark.parametrize("variant", available_variants())
def test_detect_heads_agrees_with_transformer_lens(variant):
    model = tiny_model(variant, tokenizer_alphabet="abcdefghij ", n_ctx=64, dtype="float64")
    text = "abc dab cab abc eab dcab"
    table = heads.detect_heads(model, text)
    for name, tl_name in [("previous_token", "previous_token_head"),
                          ("duplicate_token", "duplicate_token_head"),
                          ("induction", "induction_head")]:
        ours = torch.tensor(table[name].to_numpy()).view(2, 4)
        theirs = detect_head(model, text, tl_name).to(ours.dtype)
        torch.testing.assert_close(ours, theirs, **EXACT)
    ours = heads.detect_heads(model, text, exclude_bos=True, exclude_current_token=True)
    theirs = detect_head(model, text, "previous_token_head", exclude_bos=True,
                         exclude_current_token=True)
    torch.testing.assert_close(torch.tensor(ours["previous_token"].to_numpy()).view(2, 4),
                               theirs.double(), **EXACT)


def test_pre_softmax_stage_scored_through_softmax():
    model = tiny_model("mha", dtype="float64")
    tokens = random_tokens(model, pos=12)
    a = heads.detect_heads(model, tokens, stage="attn_scores")
    b = heads.detect_heads(model, tokens, stage="pattern")
    cols = list(heads.DETECTORS)
    torch.testing.assert_close(torch.tensor(a[cols].to_numpy()), torch.tensor(b[cols].to_numpy()),
                               **EXACT)


@pytest.mark.parametrize("variant", available_variants())
def test_detectors_run_on_every_map_stage(variant):
    model = tiny_model(variant)
    tokens = repeated_tokens(2, 5, model.cfg.d_vocab, seed=0)
    for stage in map_stage_names(model):
        table = heads.detect_heads(model, tokens, stage=stage)
        assert len(table) == 4 * len(heads.stage_maps(model, tokens, stage))
        assert table[list(heads.DETECTORS)].abs().le(1 + 1e-6).all().all()


def test_bad_inputs_raise():
    model = tiny_model("mha")
    tokens = random_tokens(model, pos=6)
    with pytest.raises(ValueError, match="no layer"):
        heads.detect_heads(model, tokens, stage="nonexistent")
    with pytest.raises(ValueError, match="unknown detectors"):
        heads.detect_heads(model, tokens, detectors=["bogus"])
    with pytest.raises(ValueError, match="outside"):
        heads.ablation_hooks(model, [(5, 0)])
    with pytest.raises(ValueError, match="half_len"):
        heads.induction_table(model, half_len=40)


def test_ablation_at_a_map_stage_removes_borrowed_weights():
    """L0H1 borrows L0H0's previous-token weights through MTA's post-softmax head mixing and
    has the same OV: zeroing L0H0's z leaves induction intact, ablating its `softmax` map
    (before the mixing) removes it."""
    model = build_induction_model("mta")
    a0 = model.blocks[0].attn
    with torch.no_grad():
        a0.head_kernel.copy_(torch.tensor([[[1.0, 1.0], [0.0, 0.0]]]))
        a0.W_V[1].copy_(a0.W_V[0])
        a0.W_O[1].copy_(a0.W_O[0])
    by_z = heads.induction_ablation(model, [(0, 0)], batch=4, half_len=HALF, hook="z")
    by_map = heads.induction_ablation(model, [(0, 0)], batch=4, half_len=HALF, hook="softmax")
    assert by_z.loc["L1H0", "after"] > 0.9
    assert by_map.loc["L1H0", "after"] < 0.3
    with pytest.raises(ValueError, match="map stage"):
        heads.ablation_hooks(model, [(0, 0)], hook="normed")
