"""A release's training log: every evaluation row kept, the per-step training rows thinned."""

import json

import pytest

from attnlens.training.train_state import thin_metrics


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _steps(path):
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def test_keeps_evaluations_first_last_and_every_nth(tmp_path):
    rows = [{"step": s, "tokens": 8 * s, "lr": 1e-3, "train_loss": 5.0 - s / 100}
            for s in range(1, 38)]
    rows[6]["val_loss"] = 4.2          # an evaluation at step 7, off the thinning grid
    _write(tmp_path / "full.jsonl", rows)
    info = thin_metrics(tmp_path / "full.jsonl", tmp_path / "thin.jsonl", 10)
    assert _steps(tmp_path / "thin.jsonl") == [1, 7, 10, 20, 30, 37]
    assert info["every"] == 10
    kept = [json.loads(x) for x in (tmp_path / "thin.jsonl").read_text().splitlines()]
    assert kept[1] == rows[6]          # rows are copied unchanged
    assert _steps(tmp_path / "full.jsonl") == list(range(1, 38))   # the source is untouched


def test_in_place_and_bad_input(tmp_path):
    path = tmp_path / "m.jsonl"
    _write(path, [{"step": s, "train_loss": 1.0} for s in range(1, 6)])
    thin_metrics(path, path, 2)
    assert _steps(path) == [1, 2, 4, 5]
    with pytest.raises(ValueError, match="every must be >= 1"):
        thin_metrics(path, path, 0)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl is empty"):
        thin_metrics(tmp_path / "empty.jsonl", tmp_path / "x.jsonl", 10)
