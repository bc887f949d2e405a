"""Bundled toy models: small checkpoints trained here (by `attnlens.zoo`), one per variant.

Each lives in `hooked_models/zoo/<name>/` as `config.json` + `model.safetensors` + `card.json`
(task, training command, metrics written by `python -m attnlens.zoo.evaluate`).

Example:
    >>> from hooked_models.zoo import available, load
    >>> model = load("induction-mha")                    # doctest: +SKIP
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

ZOO_DIR = Path(__file__).parent
SUPERSEDED_FILE = "superseded.json"   # written by `python -m attnlens.zoo.paper report`


class SupersededModelWarning(UserWarning):
    """A bundled model was loaded that a better one of the same setting replaces."""


def _superseded_table() -> dict[str, dict]:
    table = ZOO_DIR / SUPERSEDED_FILE
    return json.loads(table.read_text()) if table.is_file() else {}


def superseded_by(name: str) -> list[str]:
    """The bundled models that replace `name` (its setting's larger-budget runs, which score
    better: docs/reproduction.md, "Superseded models"); [] for a current model."""
    entry = _superseded_table().get(name)
    return list(entry["by"]) if entry else []


def available(kind: str | None = None, superseded: bool = True) -> list[str]:
    """Names of the bundled checkpoints (directories holding a config.json; hidden ones, such as
    a paper run's staging directory, are not models yet); with `kind`, only
    those whose card says that kind ("induction" for the toy models, whose cards name none;
    "paper-task" for the models of docs/reproduction.md; "text-lm"). `superseded=False` leaves
    out the models that better ones replace (`superseded_by`)."""
    names = sorted(p.name for p in ZOO_DIR.iterdir()
                   if not p.name.startswith(".") and (p / "config.json").is_file())
    if not superseded:
        names = [n for n in names if n not in _superseded_table()]
    if kind is None:
        return names
    return [n for n in names if _card_kind(ZOO_DIR / n) == kind]


def _card_kind(directory: Path) -> str:
    card = directory / "card.json"
    return json.loads(card.read_text()).get("kind", "induction") if card.is_file() else ""


def path(name: str) -> Path:
    names = available()
    if name not in names:
        raise ValueError(unknown_model_message(name, names))
    return ZOO_DIR / name


def closest_names(name: str, names: list[str]) -> list[str]:
    """Up to five of `names` closest to a mistyped `name` (difflib), best first."""
    import difflib

    return difflib.get_close_matches(name, names, n=5, cutoff=0.6)


def unknown_model_message(name: str, names: list[str]) -> str:
    """The error for a name not among `names`: the closest names (`closest_names`), how to list
    them all, and for a text-zoo name where a model still in training will appear."""
    close = closest_names(name, names)
    text = f"no bundled model {name!r}"
    if len(names) <= 12:
        return f"{text}; available: {names}"
    if close:
        text += f"; the closest: {', '.join(map(repr, close))}"
    text += (f". {len(names)} models are bundled: zoo.available() lists them, "
             "zoo.available(kind='text-lm') those of one kind ('text-lm', 'paper-task', "
             "'induction')")
    if str(name).startswith("text-"):
        text += (". A text-zoo model still training is bundled when its run ends "
                 "(`attnlens train --zoo text --status` says where each run stands)")
    return text + "."


def load(name: str, device: str | None = None):
    """The bundled model `name` as an eval-mode HookedVariantTransformer (its card in
    `model.card`), ready for TransformerLens's patching, which refuses training-mode models.
    A superseded model loads as asked, with a `SupersededModelWarning` naming its replacements."""
    from hooked_models.model import HookedVariantTransformer

    better = superseded_by(name)
    if better:
        warnings.warn(f"{name} is superseded by {', '.join(better)}, which score better on its "
                      "task (docs/reproduction.md, 'Superseded models'); it stays bundled as "
                      "the 1000-step baseline", SupersededModelWarning, stacklevel=2)
    return HookedVariantTransformer.from_pretrained(path(name), device=device)
