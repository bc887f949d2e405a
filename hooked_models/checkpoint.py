"""Checkpoints: a directory with `config.json`, `model.safetensors` and optionally `card.json`.

Nothing is ever unpickled. Writes go to a temporary directory that is renamed into place, so a
crash never leaves a half-written checkpoint. Loading names every missing, unexpected or
mis-shaped tensor.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "card.json"


def save_checkpoint(model, directory, card: dict | None = None) -> Path:
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        (tmp / CONFIG_FILE).write_text(model.cfg.to_json())
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if card is not None:
            (tmp / CARD_FILE).write_text(json.dumps(card, indent=2, sort_keys=True))
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(directory, old)
            os.replace(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def read_config(directory):
    from hooked_models.config import VariantConfig

    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{directory} is not an attnlens checkpoint: no {CONFIG_FILE}")
    return VariantConfig.from_json(path.read_text())


def read_card(directory) -> dict | None:
    path = Path(directory) / CARD_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def check_state_dict(model, state: dict) -> None:
    """ValueError naming missing, unexpected and mis-shaped keys (nothing is loaded partially)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
              for k in sorted(set(state) & set(expected)) if state[k].shape != expected[k].shape]
    problems = []
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if shapes:
        problems.append("shape mismatches " + "; ".join(shapes))
    if problems:
        raise ValueError("checkpoint does not match the model: " + " | ".join(problems))


def load_checkpoint(cls, directory, device: str | None = None, tokenizer=None):
    directory = Path(directory)
    cfg = read_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise ValueError(f"{directory} has no {WEIGHTS_FILE}")
    if device is not None:
        cfg.device = device
    model = cls(cfg, tokenizer=tokenizer)
    state = load_file(str(weights), device="cpu")
    check_state_dict(model, state)
    model.load_state_dict(state, strict=True)
    model.card = read_card(directory)
    return model
