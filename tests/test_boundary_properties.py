"""Property test of the public boundary (docs/design.md contract 9), with hypothesis.

Random configs (every registered variant, small sizes, option values drawn at run time from each
variant's `Options` dataclass fields, valid or not), shapes and token inputs either raise a
ValueError that names the problem, or give finite outputs that are causal and satisfy
z = pattern @ v exactly (float64). Options are read from the dataclasses when the test runs, so
the test follows variants and options as they change.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.hooked_models.attention import get_attention_class
from attnlens.hooked_models.attention.registry import available_variants
from attnlens.hooked_models.config import NORMALIZATION_TYPES, POSITIONAL_TYPES

EXACT = 1e-10  # float64: see tests/helpers.py
RAN = "ran the model"
VARIANTS = available_variants()
# A deterministic, fast CI: the same 10 examples per variant every run, no example database.
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _string_choices(options_cls, default: str) -> list[str]:
    """The string constants of the option's module that `default` belongs to (e.g. MTA's
    PAD_KEYS), so valid alternatives are drawn too, not only the default and nonsense."""
    found = {default}
    for value in vars(sys.modules[options_cls.__module__]).values():
        if isinstance(value, (tuple, list, frozenset, set)) and default in value \
                and all(isinstance(v, str) for v in value):
            found.update(value)
    return sorted(found)


def _field_values(options_cls, f: dataclasses.Field) -> st.SearchStrategy:
    """Values for one option field, from its annotation and default: valid and invalid."""
    default, kinds = _default(f), str(f.type)
    out = [st.just(default)]
    if "None" in kinds or default is None:
        out.append(st.none())
    if "bool" in kinds or isinstance(default, bool):
        out.append(st.booleans())
    elif "int" in kinds or isinstance(default, int):
        out.append(st.integers(-2, 12))
    if "float" in kinds or isinstance(default, float):
        out.append(st.floats(-3, 3) | st.sampled_from([0.0, math.nan, math.inf]))
    if "str" in kinds or isinstance(default, str):
        base = _string_choices(options_cls, default) if isinstance(default, str) else []
        out.append(st.sampled_from(base + ["all", "bogus", ""]))
    if "list" in kinds or isinstance(default, list):
        out.append(st.lists(st.integers(-1, 3), max_size=3))
    return st.one_of(out)


# At most one deliberate fault outside the options per example, so that about half the
# examples are valid and run the model.
FAULTS = ("n_key_value_heads", "attn_scale", "eps", "low_id", "high_id", "float_ids", "empty",
          "too_long")


@st.composite
def cases(draw, variant: str):
    options_cls = get_attention_class(variant).Options
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    # Change at most one option per example, to a valid or an invalid value.
    changed = draw(st.sets(st.sampled_from(sorted(fields)), max_size=1)) if fields else set()
    attn_cfg = {name: draw(_field_values(options_cls, fields[name])) for name in sorted(changed)}
    fault = draw(st.none() | st.sampled_from(FAULTS))
    n_heads = draw(st.sampled_from([1, 2, 4]))
    d_head = draw(st.sampled_from([2, 4]))
    kv_heads = draw(st.sampled_from([None] + [k for k in (1, 2, 4) if n_heads % k == 0]))
    cfg = dict(
        attention=variant, attn_cfg=attn_cfg, n_heads=n_heads, d_head=d_head,
        d_model=n_heads * d_head, n_layers=draw(st.integers(1, 2)),
        n_ctx=draw(st.integers(4, 12)), d_vocab=draw(st.integers(3, 12)),
        positional_embedding_type=draw(st.sampled_from(POSITIONAL_TYPES)),
        normalization_type=draw(st.sampled_from(NORMALIZATION_TYPES)),
        attn_only=draw(st.booleans()), dtype="float64", seed=draw(st.integers(0, 3)),
        n_key_value_heads=kv_heads, attn_scale=draw(st.sampled_from([None, 0.5, 3.0])), eps=1e-5,
    )
    if fault in ("n_key_value_heads", "attn_scale", "eps"):
        bad = {"n_key_value_heads": [0, -1, n_heads + 1], "attn_scale": [0.0, -1.0, math.nan],
               "eps": [0.0, -1e-5, math.inf]}[fault]
        cfg[fault] = draw(st.sampled_from(bad))
    batch = draw(st.integers(1, 2))
    pos = draw(st.integers(1, cfg["n_ctx"]))
    pos = {"empty": 0, "too_long": cfg["n_ctx"] + 1}.get(fault, pos)
    ids = draw(st.lists(st.integers(0, cfg["d_vocab"] - 1), min_size=batch * pos,
                        max_size=batch * pos))
    tokens = torch.tensor(ids, dtype=torch.long).reshape(batch, pos)
    if fault in ("low_id", "high_id"):
        tokens[draw(st.integers(0, batch - 1)), draw(st.integers(0, pos - 1))] = (
            -1 if fault == "low_id" else cfg["d_vocab"])
    if fault == "float_ids":
        tokens = tokens.double()
    return cfg, tokens, fault


# What a ValueError about each fault must name.
FAULT_WORDS = {"n_key_value_heads": "n_key_value_heads", "attn_scale": "attn_scale", "eps": "eps",
               "low_id": "token id -1", "high_id": "outside the vocabulary",
               "float_ids": "integer tensor", "empty": "empty", "too_long": "exceeds n_ctx"}


def check_case(cfg: dict, tokens: torch.Tensor, fault: str | None = None) -> str:
    """The property; returns what happened: "ran the model" or the (checked) ValueError."""
    try:
        model = HookedVariantTransformer(VariantConfig(**cfg)).eval()
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens)
    except ValueError as err:
        message = str(err)
        # It names the fault or an option this case set (the only changes from a valid config).
        words = list(cfg["attn_cfg"]) + ([FAULT_WORDS[fault]] if fault else [])
        assert any(word in message for word in words), (words, message)
        return f"ValueError: {message[:60]}"
    assert logits.shape == (*tokens.shape, cfg["d_vocab"])
    assert torch.isfinite(logits).all()
    for layer in range(model.cfg.n_layers):
        pattern, v, z = cache["pattern", layer], cache["v", layer], cache["z", layer]
        v = v.repeat_interleave(z.shape[2] // v.shape[2], dim=2)   # GQA: one copy per query head
        recon = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
        assert torch.isfinite(pattern).all() and torch.isfinite(z).all()
        torch.testing.assert_close(recon, z, atol=EXACT, rtol=0)
    seq = tokens.shape[1]
    if seq >= 2:
        t = seq // 2
        changed = tokens.clone()
        changed[:, t] = (changed[:, t] + 1) % cfg["d_vocab"]
        with torch.no_grad():
            other = model(changed)
        torch.testing.assert_close(other[:, :t], logits[:, :t], atol=EXACT, rtol=0)
        assert not torch.equal(other[:, t:], logits[:, t:])  # the change is seen from t on
    return RAN


@pytest.mark.parametrize("variant", VARIANTS)
@SETTINGS
@given(data=st.data())
def test_boundary_property(variant, data):
    cfg, tokens, fault = data.draw(cases(variant))
    note(f"fault={fault} cfg={cfg} tokens={tokens.tolist()} dtype={tokens.dtype}")
    outcome = check_case(cfg, tokens, fault)
    assert fault is None or outcome != RAN, f"fault {fault} was accepted"
    event(outcome)   # shown by --hypothesis-show-statistics


@pytest.mark.parametrize("variant", VARIANTS)
def test_default_options_run(variant):
    """The property is not vacuous: each variant's defaults at a valid shape run the model."""
    cfg = dict(attention=variant, attn_cfg={}, n_heads=2, d_head=4, d_model=8, n_layers=2,
               n_ctx=8, d_vocab=7, positional_embedding_type="rotary", normalization_type="LN",
               attn_only=False, dtype="float64", seed=0, n_key_value_heads=None,
               attn_scale=None, eps=1e-5)
    tokens = torch.arange(12).reshape(2, 6) % 7
    assert check_case(cfg, tokens) == RAN
