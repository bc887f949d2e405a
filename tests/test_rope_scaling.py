"""Rotary frequency scaling (`cfg.rope_scaling`): "linear", "llama3" and "dynamic" NTK.

The frequencies are checked against a deliberately naive transcription of each rule (a Python
loop over frequencies in plain floats), the rotation against an explicit 2x2 rotation per pair,
the config field for validation and checkpoint round trips. Exactness against HuggingFace's
models is in tests/test_llama_import.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.hooked_models.rotary import Rotary, normalize_rope_scaling, rotary_inv_freq

LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 0.5, "high_freq_factor": 2.0,
          "original_max_position_embeddings": 16}
LINEAR = {"rope_type": "linear", "factor": 2.5}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}
ZOO_MHA = Path(__file__).resolve().parents[1] / "hooked_models" / "zoo" / "induction-mha"


def naive_inv_freq(dim: int, base: float, spec: dict | None, seq_len: int) -> list[float]:
    """One frequency at a time, straight from each method's description."""
    if spec is not None and spec["rope_type"] == "dynamic":
        original = spec["original_max_position_embeddings"]
        if seq_len > original:
            scale = spec["factor"] * seq_len / original - (spec["factor"] - 1)
            base = base * scale ** (dim / (dim - 2))
    out = []
    for i in range(dim // 2):
        f = base ** (-2 * i / dim)
        if spec is not None and spec["rope_type"] == "linear":
            f = f / spec["factor"]
        elif spec is not None and spec["rope_type"] == "llama3":
            old = spec["original_max_position_embeddings"]
            wavelength = 2 * math.pi / f
            if wavelength < old / spec["high_freq_factor"]:
                pass                                   # high frequency: kept
            elif wavelength > old / spec["low_freq_factor"]:
                f = f / spec["factor"]                 # low frequency: interpolated
            else:
                s = (old / wavelength - spec["low_freq_factor"]) / (
                    spec["high_freq_factor"] - spec["low_freq_factor"])
                f = (1 - s) * f / spec["factor"] + s * f
        out.append(f)
    return out


def naive_rotate(x: torch.Tensor, positions: list[int], inv: list[float]) -> torch.Tensor:
    """Rotate-half RoPE with an explicit 2x2 rotation of the pair (i, i + d/2) per position."""
    out = x.clone()
    half = len(inv)
    for p_idx, pos in enumerate(positions):
        for i, f in enumerate(inv):
            c, s = math.cos(pos * f), math.sin(pos * f)
            a, b = x[:, p_idx, :, i], x[:, p_idx, :, i + half]
            out[:, p_idx, :, i] = a * c - b * s
            out[:, p_idx, :, i + half] = b * c + a * s
    return out


@pytest.mark.parametrize("spec", [None, LINEAR, LLAMA3, DYNAMIC])
@pytest.mark.parametrize("seq_len", [10, 24])
def test_inv_freq_matches_naive_rules(spec, seq_len):
    ours = rotary_inv_freq(8, 100.0, normalize_rope_scaling(spec), seq_len=seq_len)
    expected = torch.tensor(naive_inv_freq(8, 100.0, spec, seq_len), dtype=torch.float64)
    torch.testing.assert_close(ours, expected, atol=0, rtol=1e-14)


def test_llama3_tiny_spec_exercises_all_three_bands():
    # wavelengths 2 pi / 100 ** (-i/4): 6.3 (< 16/2: kept), 19.9 (band), 62.8, 199 (> 16/0.5)
    plain = rotary_inv_freq(8, 100.0)
    scaled = rotary_inv_freq(8, 100.0, LLAMA3)
    ratio = plain / scaled
    assert ratio[0] == 1.0 and 1.0 < ratio[1] < 4.0
    torch.testing.assert_close(ratio[2:], torch.full((2,), 4.0, dtype=torch.float64))


@pytest.mark.parametrize("spec", [LINEAR, LLAMA3, DYNAMIC])
def test_rotary_module_rotates_with_scaled_frequencies(spec):
    torch.manual_seed(0)
    x = torch.randn(2, 24, 3, 10, dtype=torch.float64)
    positions = torch.arange(24)[None].expand(2, 24)
    rope = Rotary(d_head=10, rotary_dim=8, n_ctx=32, base=100.0, scaling=spec)
    ours = rope(x, positions)
    expected = naive_rotate(x[..., :8], list(range(24)), naive_inv_freq(8, 100.0, spec, 24))
    torch.testing.assert_close(ours[..., :8], expected, atol=1e-12, rtol=0)
    assert torch.equal(ours[..., 8:], x[..., 8:])          # unrotated dims pass through
    plain = Rotary(d_head=10, rotary_dim=8, n_ctx=32, base=100.0)(x, positions)
    assert (ours - plain).abs().max() > 1e-2                # the scaling matters here


def test_dynamic_is_plain_within_the_original_length_and_set_by_the_longest_position():
    torch.manual_seed(1)
    x = torch.randn(1, 16, 2, 8, dtype=torch.float64)
    dyn = Rotary(8, 8, 40, base=100.0, scaling=DYNAMIC)
    plain = Rotary(8, 8, 40, base=100.0)
    pos = torch.arange(16)[None]
    assert torch.equal(dyn(x, pos), plain(x, pos))
    # Positions 10..25 (a KV-cache step): length 26 sets the base for all of them.
    later = pos + 10
    base = 100.0 * (2.0 * 26 / 16 - 1.0) ** (8 / 6)
    torch.testing.assert_close(dyn(x, later), Rotary(8, 8, 40, base=base)(x, later),
                               atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="rotary position 40 exceeds"):
        dyn(x, pos + 25)


@pytest.mark.parametrize("spec, message", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
     "rope_type='yarn' is not supported yet"),
    ({"rope_type": "ntk"}, "rope_type='ntk' is not supported; choose one of"),
    ({"factor": 2.0}, "rope_type=None is not supported"),
    ({"rope_type": "linear"}, r"missing \['factor'\]"),
    ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0},
     r"unknown \['low_freq_factor'\]"),
    ({"rope_type": "linear", "factor": 0}, r"rope_scaling\['factor'\] must be a finite"),
    ({"rope_type": "linear", "factor": float("nan")}, r"rope_scaling\['factor'\]"),
    ({"rope_type": "linear", "factor": True}, r"rope_scaling\['factor'\]"),
    ({"rope_type": "linear", "factor": "2"}, r"rope_scaling\['factor'\]"),
    (LLAMA3 | {"original_max_position_embeddings": 8.5},
     r"rope_scaling\['original_max_position_embeddings'\] must be a positive int"),
    (LLAMA3 | {"high_freq_factor": 0.5}, "high_freq_factor'] must exceed low_freq_factor"),
    ({"rope_type": "linear", "type": "dynamic", "factor": 2.0}, "give one"),
    ("linear", "rope_scaling must be None or a dict"),
])
def test_bad_specs_are_refused_naming_the_field(spec, message):
    with pytest.raises(ValueError, match=message):
        VariantConfig(d_model=16, d_head=8, n_layers=1, n_ctx=8, positional_embedding_type="rotary",
                      rope_scaling=spec)


def test_config_canonical_form_aliases_and_positional_type():
    cfg = VariantConfig(d_model=16, d_head=8, n_layers=1, n_ctx=8,
                        positional_embedding_type="rotary",
                        rope_scaling={"type": "linear", "factor": 2})
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert VariantConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    default = VariantConfig(d_model=16, d_head=8, n_layers=1, n_ctx=8,
                            positional_embedding_type="rotary",
                            rope_scaling={"rope_type": "default"})
    assert default.rope_scaling is None
    with pytest.raises(ValueError, match="needs positional_embedding_type='rotary'"):
        VariantConfig(d_model=16, d_head=8, n_layers=1, n_ctx=8, rope_scaling=LINEAR)


def _tiny(spec, **extra):
    cfg = VariantConfig(d_model=32, d_head=8, n_heads=4, n_layers=2, n_ctx=32, d_vocab=40,
                        positional_embedding_type="rotary", rotary_base=100.0,
                        normalization_type="RMS", act_fn="silu", dtype=torch.float64, seed=0,
                        rope_scaling=spec, **extra)
    return HookedVariantTransformer(cfg).eval()


@pytest.mark.parametrize("spec", [LINEAR, LLAMA3])
def test_model_hook_rot_q_uses_the_scaled_frequencies(spec):
    model = _tiny(spec)
    tokens = torch.randint(0, 40, (1, 24), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    q = cache["blocks.1.attn.hook_q"]
    expected = naive_rotate(q, list(range(24)), naive_inv_freq(8, 100.0, spec, 24))
    torch.testing.assert_close(cache["blocks.1.attn.hook_rot_q"], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("spec", [LINEAR, LLAMA3, DYNAMIC])
def test_checkpoint_round_trip_keeps_the_scaling(spec, tmp_path):
    model = _tiny(spec)
    model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["rope_scaling"] == normalize_rope_scaling(spec)
    loaded = HookedVariantTransformer.from_pretrained(tmp_path / "m")
    assert loaded.cfg.rope_scaling == normalize_rope_scaling(spec)
    tokens = torch.arange(24)[None] % 40
    assert torch.equal(loaded(tokens), model(tokens))
    plain = _tiny(None)
    plain.load_state_dict(model.state_dict())
    assert (plain(tokens) - model(tokens)).abs().max() > 1e-6


def test_old_checkpoints_without_the_field_load_unchanged():
    assert "rope_scaling" not in json.loads((ZOO_MHA / "config.json").read_text())
    model = HookedVariantTransformer.from_pretrained(ZOO_MHA)
    assert model.cfg.positional_embedding_type == "rotary" and model.cfg.rope_scaling is None
    rope = model.blocks[0].attn.rotary
    plain = Rotary(model.cfg.d_head, model.cfg.rotary_dim, model.cfg.n_ctx, model.cfg.rotary_base)
    assert torch.equal(rope.cos, plain.cos) and torch.equal(rope.sin, plain.sin)
