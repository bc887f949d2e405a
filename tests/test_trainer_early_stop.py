"""Early stopping on a held-out metric (issue 24): `TrainConfig(early_stop_patience=...)`."""

from __future__ import annotations

import json

import pytest
import torch

from attnlens.training.trainer import METRICS_FILE, TrainConfig, fit

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
    timed = ("tokens_per_s", "tokens_per_cpu_s")
    assert log(tmp_path / "resumed") == [
        {k: v for k, v in r.items() if k not in timed} | {k: r2[k] for k in timed}
        for r, r2 in zip(log(tmp_path / "full"), log(tmp_path / "resumed"), strict=True)]


def test_early_stopping_needs_an_evaluation():
    with pytest.raises(ValueError, match="early_stop_patience needs"):
        fit(tiny_model(), sample, config(eval_every=0, checkpoint_every=0))


def test_off_by_default_keeps_old_run_configs():
    assert "early_stop_patience" not in TrainConfig(steps=3).to_dict()
    assert TrainConfig(steps=3, early_stop_patience=2).to_dict()["early_stop_metric"] == \
        "val_loss"


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_keep_best_leaves_the_weights_of_the_best_evaluation(tmp_path):
    """With early_stop_keep_best the model fit leaves is the one of the best evaluation (the
    weights the evaluation saw), not the last; a finished run, run again, leaves them too."""
    seen = []

    def evaluate(model) -> dict:        # records the weights each evaluation saw
        seen.append(_weights(model))
        return held_out_loss(model)

    cfg = config(early_stop_keep_best=True)
    model = tiny_model()
    fit(model, sample, cfg, run_dir=tmp_path / "run", evaluate=evaluate)
    records = log(tmp_path / "run")
    evals = [r for r in records if "val_loss" in r]
    assert len(evals) == len(seen)
    at = min(range(len(evals)), key=lambda i: (evals[i]["val_loss"], i))   # the first best
    assert evals[at]["step"] < records[-1]["step"]                        # it did stop later
    kept = json.loads((tmp_path / "run" / "best" / "best.json").read_text())
    assert kept == {"step": evals[at]["step"], "value": evals[at]["val_loss"]}
    want = seen[at]
    assert all(torch.equal(_weights(model)[k], want[k]) for k in want)
    assert not all(torch.equal(seen[-1][k], want[k]) for k in want)       # the last differs
    again = tiny_model()
    assert fit(again, sample, cfg, run_dir=tmp_path / "run", evaluate=held_out_loss) == []
    assert all(torch.equal(_weights(again)[k], want[k]) for k in want)
    # without a run directory the best weights are kept in memory: the same run, same model
    seen.clear()
    mem = tiny_model()
    fit(mem, sample, config(early_stop_keep_best=True, checkpoint_every=0), evaluate=evaluate)
    assert all(torch.equal(_weights(mem)[k], want[k]) for k in want)
    # without the option the model is the last one
    last = tiny_model()
    fit(last, sample, config(), run_dir=tmp_path / "last", evaluate=held_out_loss)
    assert all(torch.equal(_weights(last)[k], seen[-1][k]) for k in want)


def test_keep_best_is_recorded_only_when_on():
    assert "early_stop_keep_best" not in TrainConfig(steps=3, early_stop_patience=2).to_dict()
    assert "early_stop_keep_best" not in TrainConfig(steps=3, early_stop_keep_best=True).to_dict()
    assert TrainConfig(steps=3, early_stop_patience=2,
                       early_stop_keep_best=True).to_dict()["early_stop_keep_best"] is True


def test_keep_best_survives_an_interruption(tmp_path):
    cfg = config(early_stop_keep_best=True)
    whole = tiny_model()
    fit(whole, sample, cfg, run_dir=tmp_path / "whole", evaluate=held_out_loss)
    calls = []

    def interrupted(batch, gen):
        calls.append(batch)
        if len(calls) == 12:   # after the step-10 checkpoint
            raise KeyboardInterrupt
        return sample(batch, gen)

    with pytest.raises(KeyboardInterrupt):
        fit(tiny_model(), interrupted, cfg, run_dir=tmp_path / "split", evaluate=held_out_loss)
    split = tiny_model()
    fit(split, sample, cfg, run_dir=tmp_path / "split", evaluate=held_out_loss)
    assert (json.loads((tmp_path / "split" / "best" / "best.json").read_text())
            == json.loads((tmp_path / "whole" / "best" / "best.json").read_text()))
    want = _weights(whole)
    assert all(torch.equal(_weights(split)[k], want[k]) for k in want)
