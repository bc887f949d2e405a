"""Placement across devices: the plan (fake devices and sizes) and a CPU run of a split model.

The plan is checked against brute force over every contiguous split. The split runs use the
device list ["cpu", "cpu"]: the data paths are exactly those of a multi-GPU split (every block's
pre-hook moves its inputs, the logits return to the embedding's device), which a spy on the
mover confirms, and every output, cached activation, hook edit, loss and cached decode step
equals the unsplit model's bit for bit.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import attnlens.hooked_models.placement as placement
from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.hooked_models.placement import (
    apply_placement,
    placement_of,
    plan_placement,
    remove_placement,
    unit_sizes,
)

from helpers import decode_stepwise

SIZES = {"embed": 50, "blocks.0": 10, "blocks.1": 30, "blocks.2": 20, "blocks.3": 25,
         "blocks.4": 5, "unembed": 60}


def brute_force(sizes, caps):
    """Best max(load/cap) over every split into len(caps) contiguous non-empty runs."""
    w, n, k = list(sizes.values()), len(sizes), len(caps)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(w[bounds[d]:bounds[d + 1]]) / caps[d] for d in range(k)))
    return best


def loads(plan, devices, sizes=SIZES):
    return [sum(s for u, s in sizes.items() if plan[u] == d) for d in devices]


@pytest.mark.parametrize("caps", [None, [300, 300, 300], [300, 100, 100], [50, 200, 200, 100]])
def test_plan_is_contiguous_ordered_and_optimal(caps):
    devices = [f"cuda:{i}" for i in range(len(caps or [1, 1, 1]))]
    plan = plan_placement(SIZES, devices, caps)
    assert list(plan) == list(SIZES)
    assert plan["embed"] == devices[0] and plan["unembed"] == devices[-1]
    order = [devices.index(plan[u]) for u in SIZES]
    assert order == sorted(order) and set(order) == set(range(len(devices)))
    relative = [load / c for load, c in zip(loads(plan, devices), caps or [1] * len(devices),
                                            strict=True)]
    assert max(relative) == pytest.approx(brute_force(SIZES, caps or [1] * len(devices)))


def test_capacities_by_device_and_refusals():
    plan = plan_placement(SIZES, ["cuda:0", "cuda:1"], {"cuda:0": 120, "cuda:1": 100})
    assert loads(plan, ["cuda:0", "cuda:1"]) == [110, 90]
    with pytest.raises(ValueError, match=r"does not fit: cuda:\d would hold"):
        plan_placement(SIZES, ["cuda:0", "cuda:1"], [100, 90])
    with pytest.raises(ValueError, match="8 devices but only 7 units"):
        plan_placement(SIZES, [f"cuda:{i}" for i in range(8)])
    with pytest.raises(ValueError, match="at least one device"):
        plan_placement(SIZES, [])
    with pytest.raises(ValueError, match="no entry for devices"):
        plan_placement(SIZES, ["cuda:0", "cuda:1"], {"cuda:0": 1})
    with pytest.raises(ValueError, match="must be positive"):
        plan_placement(SIZES, ["cuda:0"], [0])


def tiny(attention="mha", positional="standard", **kw):
    cfg = VariantConfig(d_model=32, d_head=8, n_heads=4, n_layers=4, n_ctx=24, d_vocab=40,
                        attention=attention, positional_embedding_type=positional, seed=0,
                        dtype="float64", **kw)
    return HookedVariantTransformer(cfg)


def test_model_plan_covers_every_module():
    model = tiny()
    sizes = unit_sizes(model)
    assert list(sizes) == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "unembed"]
    assert sum(sizes.values()) == sum(p.numel() * 8 for p in model.parameters())
    plan = plan_placement(model, ["cuda:0", "cuda:1", "cuda:2"])
    assert plan["embed"] == plan["pos_embed"] == "cuda:0"
    assert plan["ln_final"] == plan["unembed"] == "cuda:2"
    assert all(any(n == m or n.startswith(m + ".") for m in plan)
               for n, _ in model.named_parameters())


@pytest.mark.parametrize("attention, positional, extra", [
    ("mha", "standard", {}),
    ("mha", "rotary", {"n_key_value_heads": 2}),
    ("dcmha", "rotary", {"attn_cfg": {"window_size": 3}}),
    ("mta", "rotary", {}),
    ("cope", "none", {}),
])
def test_split_model_equals_unsplit(attention, positional, extra, monkeypatch):
    whole = tiny(attention, positional, **extra)
    split = tiny(attention, positional, **extra)
    moves = []
    real = placement._inputs_to_own_device

    def spy(module, args, kwargs):
        moves.append(type(module).__name__)
        return real(module, args, kwargs)

    monkeypatch.setattr(placement, "_inputs_to_own_device", spy)
    plan = plan_placement(split, ["cpu", "cpu"])
    assert plan["blocks.0"] == "cpu"
    apply_placement(split, plan)
    tokens = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    assert torch.equal(split(tokens), whole(tokens))
    # each block, then ln_final and unembed moved their inputs (args + kwargs)
    assert moves == ["TransformerBlock"] * 4 + [type(split.ln_final).__name__, "Unembed"]
    _, cache = split.run_with_cache(tokens)
    _, ref = whole.run_with_cache(tokens)
    assert sorted(cache.keys()) == sorted(ref.keys())
    for name in ref.keys():
        assert torch.equal(cache[name], ref[name]), name
    assert torch.equal(split(tokens, return_type="loss"), whole(tokens, return_type="loss"))

    def ablate(z, hook):
        z[:, :, 1] = 0.0
        return z

    hooks = [("blocks.2.attn.hook_z", ablate)]
    assert torch.equal(split.run_with_hooks(tokens, fwd_hooks=hooks),
                       whole.run_with_hooks(tokens, fwd_hooks=hooks))
    if all(b.attn.supports_kv_cache for b in whole.blocks):
        got, _ = decode_stepwise(split, tokens, prefix=5)
        want, _ = decode_stepwise(whole, tokens, prefix=5)
        assert torch.equal(got, want)
    assert torch.equal(split.generate(tokens[:1, :4], 5, do_sample=False),
                       whole.generate(tokens[:1, :4], 5, do_sample=False))


def test_map_checks_and_removal():
    model = tiny()
    with pytest.raises(ValueError, match="unknown modules"):
        apply_placement(model, {"embed": "cpu", "blocks.9": "cpu"})
    with pytest.raises(ValueError, match=r"parameters \[.blocks.1.ln1.w.*without a device"):
        apply_placement(model, {"embed": "cpu", "pos_embed": "cpu", "blocks.0": "cpu",
                                "ln_final": "cpu", "unembed": "cpu"})
    with pytest.raises(ValueError, match="whole model"):
        apply_placement(model, {"": "cpu"})
    apply_placement(model, plan_placement(model, ["cpu", "cpu", "cpu"]))
    assert placement_of(model) == dict.fromkeys(
        ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "unembed"], "cpu")
    assert model._placement_handles
    remove_placement(model, "cpu")
    assert not hasattr(model, "_placement_handles")
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_shared_layers_must_stay_together():
    model = tiny("cope", "none", attn_cfg={"shared": True})
    plan = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "cpu", "blocks.2": "cpu",
            "blocks.3": "cuda:1", "ln_final": "cpu", "unembed": "cpu"}
    with pytest.raises(ValueError, match=r"layers 3 and 0 share parameters"):
        apply_placement(model, plan)
