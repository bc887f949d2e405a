"""Bundled toy models: small checkpoints trained here (by `interp.zoo`), one per variant.

Each lives in `hooked_models/zoo/<name>/` as `config.json` + `model.safetensors` + `card.json`
(task, training command, metrics written by `python -m interp.zoo.evaluate`).

Example:
    >>> from hooked_models.zoo import available, load
    >>> model = load("induction-mha")                    # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

ZOO_DIR = Path(__file__).parent


def available(kind: str | None = None) -> list[str]:
    """Names of the bundled checkpoints (directories holding a config.json; hidden ones, such as
    a paper run's staging directory, are not models yet); with `kind`, only
    those whose card says that kind ("induction" for the toy models, whose cards name none;
    "paper-task" for the models of docs/reproduction.md; "text-lm")."""
    names = sorted(p.name for p in ZOO_DIR.iterdir()
                   if not p.name.startswith(".") and (p / "config.json").is_file())
    if kind is None:
        return names
    return [n for n in names if _card_kind(ZOO_DIR / n) == kind]


def _card_kind(directory: Path) -> str:
    card = directory / "card.json"
    return json.loads(card.read_text()).get("kind", "induction") if card.is_file() else ""


def path(name: str) -> Path:
    if name not in available():
        raise ValueError(f"no bundled model {name!r}; available: {available()}")
    return ZOO_DIR / name


def load(name: str, device: str | None = None):
    """The bundled model `name` as an eval-mode HookedVariantTransformer (its card in
    `model.card`), ready for TransformerLens's patching, which refuses training-mode models."""
    from hooked_models.model import HookedVariantTransformer

    return HookedVariantTransformer.from_pretrained(path(name), device=device)
