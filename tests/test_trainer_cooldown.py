"""The warmup-stable-decay schedule (`cooldown`) and deciding it while a run is under way."""

from __future__ import annotations

import json

import pytest
import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.training.train_state import latest_checkpoint, read_train_state
from attnlens.training.trainer import TrainConfig, fit, lr_factor, resume_check_config


def tiny():
    return HookedVariantTransformer(VariantConfig(d_model=16, d_head=8, n_layers=2, n_ctx=12,
                                                  d_vocab=11, seed=0, dtype=torch.float64))


def sample(batch, gen):
    return torch.randint(0, 11, (batch, 12), generator=gen), None


def test_cooldown_decays_linearly_to_zero_over_the_last_steps():
    cfg = TrainConfig(steps=10, warmup=2, min_lr_ratio=1.0, cooldown=4)
    factors = [lr_factor(s, cfg) for s in range(10)]
    assert factors == pytest.approx([0.5, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2])
    assert "cooldown" not in TrainConfig(steps=3).to_dict()   # old runs resume unchanged
    with pytest.raises(ValueError, match="cooldown"):
        TrainConfig(steps=3, cooldown=-1)


def test_a_run_may_decide_its_cooldown_while_its_past_lr_is_unchanged():
    plain = json.loads(json.dumps(TrainConfig(steps=10, min_lr_ratio=1.0, warmup=2).to_dict()))
    cooled = TrainConfig(steps=10, min_lr_ratio=1.0, warmup=2, cooldown=4)
    assert resume_check_config(plain, cooled, 6) == plain       # steps 0-5: same lr
    assert resume_check_config(plain, cooled, 7) != plain       # step 6 has run at lr 1
    longer = TrainConfig(steps=14, min_lr_ratio=1.0, warmup=2, cooldown=4)
    assert resume_check_config(plain, longer, 9) == plain       # extending a constant lr run
    cosine = json.loads(json.dumps(TrainConfig(steps=10, warmup=2).to_dict()))
    assert resume_check_config(cosine, TrainConfig(steps=14, warmup=2), 5) != cosine
    other = TrainConfig(steps=10, min_lr_ratio=1.0, warmup=2, lr=0.5, cooldown=4)
    assert resume_check_config(plain, other, 3) != plain        # lr is not the future


def test_a_resumed_run_with_a_cooldown_equals_one_that_had_it_from_the_start(tmp_path):
    def cfg(**kw):
        return TrainConfig(steps=8, batch_size=4, lr=3e-3, warmup=2, min_lr_ratio=1.0,
                           progress=False, checkpoint_every=4, **kw)
    first = tiny()
    fit(first, sample, TrainConfig(**{**vars(cfg()), "steps": 4}), run_dir=tmp_path / "a")
    resumed = tiny()
    fit(resumed, sample, cfg(cooldown=3), run_dir=tmp_path / "a")
    state = read_train_state(latest_checkpoint(tmp_path / "a"))
    assert state["step"] == 8 and state["train_config"]["cooldown"] == 3
    whole = tiny()
    fit(whole, sample, cfg(cooldown=3), run_dir=tmp_path / "b")
    for (name, p), q in zip(resumed.state_dict().items(), whole.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="another train config"):
        fit(tiny(), sample, cfg(cooldown=6), run_dir=tmp_path / "a")
