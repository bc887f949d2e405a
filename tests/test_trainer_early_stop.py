"""Early stopping on a held-out metric (issue 24): `TrainConfig(early_stop_patience=...)`."""

from __future__ import annotations

import json

import pytest
import torch

from hooked_models.trainer import METRICS_FILE, TrainConfig, fit

from helpers import tiny_model

TOKENS = torch.randint(0, 50, (64, 12), generator=torch.Generator().manual_seed(5))
HELD_OUT = torch.randint(0, 50, (8, 12), generator=torch.Generator().manual_seed(6))


def sample(batch, gen):
    return TOKENS[torch.randint(0, len(TOKENS), (batch,), generator=gen)], None


def held_out_loss(model) -> dict:
    # Rounded to 0.1 so the metric plateaus within a few evaluations.
    return {"val_loss": round(float(model(HELD_OUT, return_type="loss")), 1)}


def config(**kw) -> TrainConfig:
    base = dict(steps=200, batch_size=8, lr=3e-3, warmup=1, eval_every=5, checkpoint_every=5,
                early_stop_patience=2, progress=False)
    return TrainConfig(**{**base, **kw})


def log(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def test_stops_after_patience_evaluations_without_improvement(tmp_path):
    losses = fit(tiny_model(), sample, config(), run_dir=tmp_path / "run",
                 evaluate=held_out_loss)
    records = log(tmp_path / "run")
    evals = [r for r in records if "val_loss" in r]
    assert len(losses) < 200 and records[-1].get("early_stop") is True
    best = min(r["val_loss"] for r in evals[:-2])
    assert all(r["val_loss"] >= best for r in evals[-2:])       # two evals without a new best
    # ... and never two in a row before: the run stopped at the first evaluation it could
    values = [r["val_loss"] for r in evals]
    first_stop = next(i for i in range(2, len(values))
                      if min(values[i - 1:i + 1]) >= min(values[:i - 1]))
    assert first_stop == len(values) - 1
    # a stopped run, run again, does nothing more
    assert fit(tiny_model(), sample, config(), run_dir=tmp_path / "run",
               evaluate=held_out_loss) == []


def test_an_interrupted_run_stops_where_the_unbroken_run_stops(tmp_path):
    full = fit(tiny_model(), sample, config(), run_dir=tmp_path / "full", evaluate=held_out_loss)
    calls = []

    def interrupted(batch, gen):
        calls.append(batch)
        if len(calls) == 8:   # after the step-5 checkpoint
            raise KeyboardInterrupt
        return sample(batch, gen)

    with pytest.raises(KeyboardInterrupt):
        fit(tiny_model(), interrupted, config(), run_dir=tmp_path / "resumed",
            evaluate=held_out_loss)
    rest = fit(tiny_model(), sample, config(), run_dir=tmp_path / "resumed",
               evaluate=held_out_loss)
    assert rest == full[5:]
    assert log(tmp_path / "resumed") == [
        {k: v for k, v in r.items() if k != "tokens_per_s"} | {"tokens_per_s": r2["tokens_per_s"]}
        for r, r2 in zip(log(tmp_path / "full"), log(tmp_path / "resumed"), strict=True)]


def test_early_stopping_needs_an_evaluation():
    with pytest.raises(ValueError, match="early_stop_patience needs"):
        fit(tiny_model(), sample, config(eval_every=0, checkpoint_every=0))


def test_off_by_default_keeps_old_run_configs():
    assert "early_stop_patience" not in TrainConfig(steps=3).to_dict()
    assert TrainConfig(steps=3, early_stop_patience=2).to_dict()["early_stop_metric"] == \
        "val_loss"
