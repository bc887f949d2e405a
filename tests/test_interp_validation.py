"""Analyses at the boundary: non-finite weights and activations, bad arguments, and exactly when
the head detectors agree with TransformerLens's `detect_head`.

Before these checks a NaN turned into plausible numbers ("no change" in `stage_change`, a gate
class in `gate_values`) or a bare linear-algebra error, and `induction_table(half_len=0)`
silently used the default.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformer_lens.head_detector import detect_head

from attnlens.hooked_models import available_variants
from attnlens.interp.circuits import composed
from attnlens.interp.circuits import qk_ov as circuits
from attnlens.interp.tools import analyze, diversity, gating, heads
from attnlens.interp.tools import stage_change as change
from attnlens.interp.tools.layer_stages import layer_stage_maps
from attnlens.interp.variants import cope, infini, mta

from helpers import random_tokens, tiny_model

TOKENS = dict(pos=10)

# (analysis, variant that has what it reads); each reads layer 1's attention or its activations
ANALYSES = {
    "detect_heads": ("mha", lambda m, t: heads.detect_heads(m, t)),
    "induction_table": ("mha", lambda m, t: heads.induction_table(m, batch=2, half_len=4)),
    "stage_maps": ("mha", lambda m, t: heads.stage_maps(m, t, "attn_scores")),
    "ablation_hooks_mean": ("mha", lambda m, t: heads.ablation_hooks(m, [(1, 0)], "mean",
                                                                     "pattern", tokens=t)),
    "stage_change": ("mta", lambda m, t: change.stage_change(m, t, "attn_scores", "pattern")),
    "catalogue_changes": ("cope", lambda m, t: change.catalogue_changes(m, t)),
    "layer_stage_maps": ("dcmha", lambda m, t: layer_stage_maps(m, t, 1)),
    "gate_values": ("mta", lambda m, t: gating.gate_values(m, t)),
    "memory_specialisation": ("infini", lambda m, t: infini.memory_specialisation(m, t)),
    "gate_openers": ("cope", lambda m, t: cope.gate_openers(m, t)),
    "counted_units": ("cope", lambda m, t: cope.counted_units(m, t)),
    "positional_attention": ("cope", lambda m, t: cope.positional_attention(m, t, 1)),
    "mixing_at": ("dcmha", lambda m, t: composed.mixing_at(m, t, 1, 5, 2)),
    "composed_circuits_at": ("dcmha", lambda m, t: composed.composed_circuits_at(m, t, 1, 5, 2)),
    "borrowing_table": ("dcmha", lambda m, t: composed.borrowing_table(m, t, 1, max_pairs=8)),
    "mixing_pairs": ("mta", lambda m, t: composed.mixing_pairs(m, 1)),
    "composed_qk": ("mta", lambda m, t: composed.composed_qk(m)),
    "composed_ov": ("dcmha", lambda m, t: composed.composed_ov(m, 1)),
    "qk_circuit": ("mha", lambda m, t: circuits.qk_circuit(m, 1, 0)),
    "full_ov_circuit": ("mha", lambda m, t: circuits.full_ov_circuit(m, 1)),
    "copying_scores": ("mha", lambda m, t: circuits.copying_scores(m)),
    "composition_scores": ("mha", lambda m, t: circuits.composition_scores(m, "V")),
    "composition_table": ("dcmha", lambda m, t: circuits.composition_table(m, n_baseline=4)),
    "circuit_gram": ("mha", lambda m, t: diversity.circuit_gram(m, 1, "ov")),
    "head_diversity": ("mta", lambda m, t: diversity.head_diversity(m, composed=True)),
    "head_spectra": ("mha", lambda m, t: diversity.head_spectra(m, 1, "ov")),
    "kernel_table": ("mta", lambda m, t: mta.kernel_table(m)),
}
READS_CACHE = {"detect_heads", "induction_table", "stage_maps", "ablation_hooks_mean",
               "stage_change", "catalogue_changes", "layer_stage_maps", "gate_values",
               "memory_specialisation", "gate_openers", "counted_units", "positional_attention",
               "mixing_at", "composed_circuits_at", "borrowing_table"}


def _model(variant: str):
    cfg = {"infini": {"segment_len": 4}}.get(variant)     # memory is non-empty after 4 tokens
    return tiny_model(variant, attn_cfg=cfg)


@pytest.mark.parametrize("name", list(ANALYSES))
def test_clean_model_runs(name):
    """Control: the checks do not refuse finite models (pre-softmax -inf masks included)."""
    variant, run = ANALYSES[name]
    model = _model(variant)
    run(model, random_tokens(model, **TOKENS))


@pytest.mark.parametrize("name", list(ANALYSES))
def test_nan_weight_is_named(name):
    variant, run = ANALYSES[name]
    model = _model(variant)
    with torch.no_grad():
        model.blocks[1].attn.W_V[0, 0, :3] = float("nan")
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.W_V has 3 non-finite values \(NaN\)"):
        run(model, random_tokens(model, **TOKENS))


@pytest.mark.parametrize("name", sorted(READS_CACHE))
def test_nan_activation_is_named_by_its_hook(name):
    variant, run = ANALYSES[name]
    model = _model(variant)

    def poison(x, hook):
        x = x.clone()
        x[0, 3, 0] = float("nan")      # one feature of one token entering layer 1
        return x

    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", poison)]):
        with pytest.raises(ValueError,
                           match=r"blocks\.1\.[\w.]*hook_\w+ has \d+ non-finite values \(NaN"):
            run(model, random_tokens(model, **TOKENS))


def test_nan_inf_in_given_tensors():
    with pytest.raises(ValueError, match=r"pattern has 1 non-finite values \(NaN\)"):
        heads.previous_token_scores(torch.tensor([[[[1.0, 0.0], [float("nan"), 0.5]]]]))
    with pytest.raises(ValueError, match=r"gram has 2 non-finite values \(\+inf, -inf\)"):
        diversity.captured_variance(torch.tensor([[math.inf, 0.0], [0.0, -math.inf]]))
    with pytest.raises(ValueError, match="kernel has 1 non-finite"):
        mta.classify_kernel(torch.tensor([[0.0, math.nan, 0.0]]), centre=1)
    with pytest.raises(ValueError, match="mean gate nan is not finite"):
        gating.classify_gate(float("nan"), signed=False)
    model = tiny_model("mha")
    fm = circuits.ov_circuit(model)
    A = fm.A.clone()
    A[0, 0, 0, 0] = math.nan
    with pytest.raises(ValueError, match=r"ov\.A has 1 non-finite"):
        circuits.copying_scores(model, ov=type(fm)(A, fm.B))


# (call, the argument its message must name); every call is otherwise valid
BAD_ARGUMENTS = [
    (lambda m, t: heads.induction_table(m, half_len=0), "half_len=0"),
    (lambda m, t: heads.induction_table(m, half_len=-3), "half_len=-3"),
    (lambda m, t: heads.induction_table(m, half_len=2.5), "half_len=2.5"),
    (lambda m, t: heads.induction_table(m, batch=0), "batch=0"),
    (lambda m, t: heads.induction_table(m, seed=-1), "seed=-1"),
    (lambda m, t: heads.induction_ablation(m, [(0, 0)], half_len=0), "half_len=0"),
    (lambda m, t: heads.induction_ablation(m, [(0, 0)], batch=True), "batch=True"),
    (lambda m, t: heads.repeated_induction_scores(torch.zeros(1, 2, 9, 9), 0), "half_len=0"),
    (lambda m, t: heads.repeated_induction_scores(torch.zeros(1, 2, 9, 9), 8), "half_len=8"),
    (lambda m, t: heads.previous_token_detection(0), "n=0"),
    (lambda m, t: circuits.composition_baseline(32, 8, n_samples=1), "n_samples=1"),
    (lambda m, t: circuits.composition_baseline(0, 8), "d_model=0"),
    (lambda m, t: circuits.composition_baseline(32, 8, mode="X"), "mode='X'"),
    (lambda m, t: circuits.composition_table(m, n_baseline=0), "n_baseline=0"),
    (lambda m, t: circuits.composition_table(m, modes=["Z"]), "modes"),
    (lambda m, t: diversity.head_diversity(m, n_baseline=-1), "n_baseline=-1"),
    (lambda m, t: diversity.head_spectra(m, 0, "vo"), "circuit='vo'"),
    (lambda m, t: diversity.k_at(torch.ones(3), 0.0), "threshold=0.0"),
    (lambda m, t: diversity.k_at(torch.ones(3), 1.5), "threshold=1.5"),
    (lambda m, t: diversity.max_k(0), "n_heads=0"),
    (lambda m, t: diversity.diversity_summary(
        diversity.head_diversity(m, n_baseline=0), thresholds=[math.nan]), "threshold=nan"),
    (lambda m, t: gating.classify_gate(0.5, False, low=-0.1), "low=-0.1"),
    (lambda m, t: gating.classify_gate(0.5, False, high=1.2), "high=1.2"),
    (lambda m, t: gating.classify_gate(0.5, False, low=0.9, high=0.8), "low=0.9"),
    (lambda m, t: gating.classify_gate(0.5, False, band=0.6), "band=0.6"),
    (lambda m, t: gating.classify_gate(0.5, True, signed_threshold=0), "signed_threshold=0"),
    (lambda m, t: gating.gate_values(m, t, high=math.nan), "high=nan"),
    (lambda m, t: infini.memory_specialisation(m, t, low=2), "low=2"),
    (lambda m, t: infini.set_gates(m, 1.5), "values=1.5"),
    (lambda m, t: infini.set_gates(m, 0.5, layer=7), "layer 7"),
    (lambda m, t: cope.gate_openers(m, t, top=0), "top=0"),
    (lambda m, t: cope.counted_units(m, t, threshold=1.5), "threshold=1.5"),
    (lambda m, t: composed.mixing_pairs(m, 0, phase="mid"), "phase='mid'"),
    (lambda m, t: composed.mixing_pairs(m, 0, tol=-1.0), "tol=-1.0"),
    (lambda m, t: composed.borrowing_table(m, t, 0, max_pairs=0), "max_pairs=0"),
    (lambda m, t: composed.borrowing_table(m, t, 0, phase="both"), "phase='both'"),
    (lambda m, t: mta.classify_kernel(torch.eye(3), 1, share=0), "share=0"),
    (lambda m, t: mta.kernel_table(m, share=1.5), "share=1.5"),
    (lambda m, t: analyze.probe_tokens(m, half_len=0), "half_len=0"),
    (lambda m, t: analyze.probe_tokens(m, batch=0), "batch=0"),
    (lambda m, t: analyze.probe_tokens(m, half_len=16), "half_len=16"),
]


@pytest.mark.parametrize("call,named", BAD_ARGUMENTS, ids=[n for _, n in BAD_ARGUMENTS])
def test_bad_argument_is_named(call, named):
    model = tiny_model("mha")
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(".", r"\.")):
        call(model, random_tokens(model, **TOKENS))


def test_explicit_half_len_is_used_not_the_default():
    model = tiny_model("mha")
    table = heads.induction_table(model, batch=2, half_len=1)    # [BOS] a a
    maps = heads.stage_maps(model, torch.tensor([[0, 5, 5]]))
    assert len(table) == 8 and maps[0].shape[-1] == 3
    assert analyze.probe_tokens(model, batch=2, half_len=1)[1] == 1


# --- agreement with TransformerLens's detect_head (docs/analyses.md, interp/tools/heads.py)
# ---------

ALPHABET = "abcdefghij "
DISTINCT_NEIGHBOURS = "abc dab cab abc eab dcab"     # no token equals the one before it
ADJACENT_REPEATS = "aab bba caab dd"
DETECTORS = {"previous_token": "previous_token_head", "duplicate_token": "duplicate_token_head",
             "induction": "induction_head"}
# each variant where its hook_pattern is row-stochastic: MTA and DCMHA in their MHA-equivalent
# settings (identity kernels are the default; no dynamic weights), Infini in one segment
ROW_STOCHASTIC = {"infini": {"segment_len": 64}}


def _f64(variant: str, attn_cfg=None):
    model = tiny_model(variant, tokenizer_alphabet=ALPHABET, n_ctx=64, dtype=torch.float64,
                       attn_cfg=attn_cfg)
    if variant == "dcmha":
        with torch.no_grad():
            for b in model.blocks:
                b.attn.qkw.zero_()
                b.attn.dd.zero_()
    return model


def _ours(model, text, detector, **kw) -> torch.Tensor:
    table = heads.detect_heads(model, text, detectors=[detector], **kw)
    return torch.tensor(table[detector].to_numpy()).view(model.cfg.n_layers, model.cfg.n_heads)


def _patterns(model, text) -> torch.Tensor:
    """`[layer head q k]` hook_pattern of one prompt."""
    _, cache = model.run_with_cache(model.to_tokens(text))
    return torch.stack([cache["pattern", layer][0] for layer in range(model.cfg.n_layers)])


@pytest.mark.parametrize("variant", available_variants())
@pytest.mark.parametrize("exclude_bos,exclude_current", [(False, False), (True, False),
                                                         (False, True), (True, True)])
def test_agrees_with_tl_on_row_stochastic_patterns(variant, exclude_bos, exclude_current):
    model = _f64(variant, ROW_STOCHASTIC.get(variant))
    pattern = _patterns(model, DISTINCT_NEIGHBOURS)
    assert pattern.min() >= 0                                      # the documented condition
    torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern[..., 0]),
                               atol=1e-12, rtol=0)
    kw = dict(exclude_bos=exclude_bos, exclude_current_token=exclude_current)
    for ours_name, tl_name in DETECTORS.items():
        theirs = detect_head(model, DISTINCT_NEIGHBOURS, tl_name, **kw)
        torch.testing.assert_close(_ours(model, DISTINCT_NEIGHBOURS, ours_name, **kw), theirs,
                                   atol=1e-12, rtol=0)


def test_adjacent_repeats_tl_counts_the_current_token_as_induction():
    model = _f64("mha")
    tokens = model.to_tokens(ADJACENT_REPEATS)[0]
    pattern = _patterns(model, ADJACENT_REPEATS)                   # rows sum to 1
    T = tokens.shape[0]
    repeat_q = (tokens[1:] == tokens[:-1]).nonzero()[:, 0] + 1     # token q == token q - 1
    assert len(repeat_q) == 4
    ours = _ours(model, ADJACENT_REPEATS, "induction")
    theirs = detect_head(model, ADJACENT_REPEATS, "induction_head")
    # TL's pattern adds exactly the diagonal entries of those queries; its denominator is T
    self_mass = pattern[:, :, repeat_q, repeat_q].sum(-1)
    torch.testing.assert_close(theirs - ours, self_mass / T, atol=1e-12, rtol=0)
    assert (theirs - ours).min() > 1e-3                             # a real disagreement
    for name in ("previous_token", "duplicate_token"):
        torch.testing.assert_close(_ours(model, ADJACENT_REPEATS, name),
                                   detect_head(model, ADJACENT_REPEATS, DETECTORS[name]),
                                   atol=1e-12, rtol=0)
    # without the current token the two induction patterns are the same
    torch.testing.assert_close(
        _ours(model, ADJACENT_REPEATS, "induction", exclude_current_token=True),
        detect_head(model, ADJACENT_REPEATS, "induction_head", exclude_current_token=True),
        atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant", ["mta", "dcmha"])
def test_signed_patterns_differ_by_the_denominator(variant):
    """TL divides by sum(p), we by sum(|p|): ours * sum|p| == TL * sum p, and they differ."""
    model = _f64(variant)
    with torch.no_grad():
        if variant == "mta":   # a post-softmax difference filter over neighbouring keys
            kernel = model.blocks[1].attn.mta_kernel_after_sm
            c_q, c_k = kernel.shape[-2:]
            centre = mta.kernel_centre(model, 1, c_k)
            kernel[:, 0, c_q - 1, centre - 1] = -1.5
        else:                  # strong dynamic composition gives signed composed weights
            model.blocks[1].attn.qkw.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    text = DISTINCT_NEIGHBOURS
    pattern = _patterns(model, text)[1]                            # [head q k]
    assert pattern.min() < -1e-3
    ours = _ours(model, text, "previous_token")[1]
    theirs = detect_head(model, text, "previous_token_head")[1]
    signed, absolute = pattern.sum((-2, -1)), pattern.abs().sum((-2, -1))
    torch.testing.assert_close(ours * absolute, theirs * signed, atol=1e-10, rtol=1e-10)
    assert (ours - theirs).abs().max() > 1e-3
