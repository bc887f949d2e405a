"""The training loop: schedule, parameter groups, exact resume, metrics log, no pickle."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.training.train_state import LATEST_FILE, OPTIMIZER_FILE, STATE_FILE
from attnlens.training.trainer import (
    TrainConfig,
    fit,
    gate_parameter_names,
    lr_factor,
    param_groups,
    train,
)


def tiny(attention="mha", **kw):
    cfg = VariantConfig(d_model=16, d_head=8, n_layers=2, n_ctx=12, d_vocab=11,
                        attention=attention, seed=0, dtype=torch.float64, **kw)
    return HookedVariantTransformer(cfg)


def sample(batch, gen):
    return torch.randint(0, 11, (batch, 12), generator=gen), None


def run(run_dir, steps, **kw):
    model = tiny()
    cfg = TrainConfig(steps=steps, batch_size=4, lr=3e-3, warmup=2, progress=False, **kw)
    return model, fit(model, sample, cfg, run_dir=run_dir,
                      evaluate=lambda m: {"val_loss": 1.0})


def test_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(steps=10, warmup=4, min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg) for s in range(10)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(factors[3:], factors[4:], strict=False))
    assert lr_factor(10, cfg) == pytest.approx(0.1)
    assert factors[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 6)))


def test_param_groups_exempt_norms_biases_embeddings_and_give_gates_their_lr():
    model = tiny("infini", attn_cfg={"segment_len": 4})
    assert gate_parameter_names(model) == {"blocks.0.attn.beta", "blocks.1.attn.beta"}
    groups = {g["name"]: g for g in param_groups(model, TrainConfig(steps=1, lr=1e-3,
                                                                    gate_lr=5e-2))}
    names = {id(p): n for n, p in model.named_parameters()}
    by_group = {k: {names[id(p)] for p in g["params"]} for k, g in groups.items()}
    assert by_group["gates"] == {"blocks.0.attn.beta", "blocks.1.attn.beta"}
    assert groups["gates"]["lr"] == 5e-2 and groups["gates"]["weight_decay"] == 0.0
    assert {"embed.W_E", "blocks.0.ln1.w", "blocks.0.attn.b_Q", "unembed.b_U"} <= \
        by_group["no_decay"]
    assert {"blocks.0.attn.W_Q", "unembed.W_U"} <= by_group["decay"]
    assert groups["no_decay"]["weight_decay"] == 0.0 and groups["decay"]["weight_decay"] > 0
    assert sum(len(v) for v in by_group.values()) == len(list(model.parameters()))


def test_resumed_run_reproduces_the_uninterrupted_losses_exactly(tmp_path):
    full_model, full = run(tmp_path / "full", steps=8, checkpoint_every=3)
    # The same run, interrupted after step 3's checkpoint (steps=8 schedule, killed at 3) ...
    cut = tmp_path / "cut"
    model = tiny()
    cfg = TrainConfig(steps=8, batch_size=4, lr=3e-3, warmup=2, progress=False,
                      checkpoint_every=3)
    calls = {"n": 0}

    def dying_sample(batch, gen):
        calls["n"] += 1
        if calls["n"] > 4:  # dies during step 5, after the step-3 checkpoint
            raise KeyboardInterrupt
        return sample(batch, gen)

    with pytest.raises(KeyboardInterrupt):
        fit(model, dying_sample, cfg, run_dir=cut, evaluate=lambda m: {"val_loss": 1.0})
    assert (cut / LATEST_FILE).read_text() == "step-0000003"
    # ... then resumed by a fresh process-like call: same losses, bit for bit.
    resumed_model = tiny()
    resumed = fit(resumed_model, sample, cfg, run_dir=cut, evaluate=lambda m: {"val_loss": 1.0})
    assert len(resumed) == 5
    assert resumed == full[3:]
    resumed_state = resumed_model.state_dict()
    for name, a in full_model.state_dict().items():
        b = resumed_state[name]
        assert torch.equal(a, b), name
    log = [json.loads(x) for x in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 9))  # the step-4 line was rewound
    full_log = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text()
                .splitlines()]
    assert [r["train_loss"] for r in log] == [r["train_loss"] for r in full_log]
    assert [r["tokens"] for r in log] == [48 * s for s in range(1, 9)]
    assert log[-1]["val_loss"] == 1.0 and "val_loss" not in log[0]


def test_checkpoint_holds_no_pickle_and_only_the_latest_step(tmp_path):
    run(tmp_path, steps=4, checkpoint_every=2)
    steps = sorted(p.name for p in tmp_path.glob("step-*"))
    assert steps == ["step-0000004"]
    ckpt = tmp_path / steps[0]
    assert {p.name for p in ckpt.iterdir()} == {"config.json", "model.safetensors", "card.json",
                                                OPTIMIZER_FILE, STATE_FILE}
    meta = json.loads((ckpt / STATE_FILE).read_text())
    assert meta["step"] == 4 and meta["tokens"] == 4 * 4 * 12
    # A finished run resumes to nothing more.
    model = tiny()
    again = fit(model, sample, TrainConfig(steps=4, batch_size=4, lr=3e-3, warmup=2,
                                           progress=False, checkpoint_every=2), run_dir=tmp_path)
    assert again == []


def test_resume_refuses_another_train_config(tmp_path):
    run(tmp_path, steps=2)
    with pytest.raises(ValueError, match="another train config.*lr"):
        fit(tiny(), sample, TrainConfig(steps=2, batch_size=4, lr=1e-2, warmup=2,
                                        progress=False), run_dir=tmp_path)


def test_legacy_train_api_still_learns():
    model = tiny()
    losses = train(model, sample, steps=30, batch_size=8, lr=1e-2, warmup=2, progress=False)
    assert len(losses) == 30 and not model.training
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5


@pytest.mark.parametrize("bad", [dict(steps=0), dict(steps=2, warmup=-1),
                                 dict(steps=2, min_lr_ratio=2.0), dict(steps=2, lr=0.0)])
def test_bad_train_config_raises(bad):
    with pytest.raises(ValueError):
        TrainConfig(**bad)


def test_checkpoint_every_needs_a_run_dir():
    with pytest.raises(ValueError, match="run_dir"):
        fit(tiny(), sample, TrainConfig(steps=2, checkpoint_every=1, progress=False))


def _killed_after_step_two(run_dir, cfg):
    calls = {"n": 0}

    def dying_sample(batch, gen):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return sample(batch, gen)

    with pytest.raises(KeyboardInterrupt):
        fit(tiny(), dying_sample, cfg, run_dir=run_dir)


def test_a_checkpoint_without_timing_starts_the_count_at_its_step(tmp_path):
    """Runs begun before timing was kept: the count starts at the resumed step and says so."""
    cfg = TrainConfig(steps=4, batch_size=4, lr=3e-3, warmup=2, progress=False,
                      checkpoint_every=2)
    _killed_after_step_two(tmp_path, cfg)
    state_path = tmp_path / "step-0000002" / STATE_FILE
    meta = json.loads(state_path.read_text())
    assert meta.pop("timing")["from_step"] == 0
    state_path.write_text(json.dumps(meta))
    fit(tiny(), sample, cfg, run_dir=tmp_path)
    timing = json.loads((tmp_path / "step-0000004" / STATE_FILE).read_text())["timing"]
    assert timing["from_step"] == 2 and timing["wall_s"] > 0


def test_resumed_timing_adds_to_the_checkpointed_count(tmp_path):
    cfg = TrainConfig(steps=6, batch_size=4, lr=3e-3, warmup=2, progress=False,
                      checkpoint_every=2)
    _killed_after_step_two(tmp_path, cfg)
    at2 = json.loads((tmp_path / "step-0000002" / STATE_FILE).read_text())["timing"]
    fit(tiny(), sample, cfg, run_dir=tmp_path)
    at6 = json.loads((tmp_path / "step-0000006" / STATE_FILE).read_text())["timing"]
    assert at6["from_step"] == 0
    assert at6["wall_s"] > at2["wall_s"] and at6["cpu_s"] >= at2["cpu_s"]
