"""The bundled models: small checkpoints trained here (by `attnlens.lab`), toy induction models,
small text language models and the paper-task models.

Each is a folder `<name>/` of `config.json` + `model.safetensors` + `card.json` (task, training
command, metrics written by `python -m attnlens.lab.evaluate`). The library's wheel does not carry
them: they are the `attnlens-zoo` distribution (import name `attnlens_zoo`), built from this
repository by `python -m scripts.build_zoo_wheel` and installed by `make setup`. The models are
found (`ZOO_DIR`) in the folder `$ATTNLENS_ZOO` names, else in a source checkout's
`hooked_models/zoo/` (where the lab writes new ones), else in the installed `attnlens_zoo`.

Example:
    >>> from attnlens import zoo
    >>> model = zoo.load("induction-mha")                    # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

SUPERSEDED_FILE = "superseded.json"   # written by `python -m attnlens.lab.paper report`
ZOO_ENV = "ATTNLENS_ZOO"
ZOO_DISTRIBUTION = "attnlens-zoo"
INSTALL_HINT = (f"the bundled models are the `{ZOO_DISTRIBUTION}` distribution: from a clone of "
                "the repository, `make setup` installs it into .venv, or build it with "
                "`python -m scripts.build_zoo_wheel` and `pip install dist/attnlens_zoo-*.whl`; "
                f"or point ${ZOO_ENV} at a folder of models")


def _holds_models(folder: Path) -> bool:
    return folder.is_dir() and any((p / "config.json").is_file() for p in folder.iterdir())


def find_zoo_dir(checkout: Path | None = None, environ=None) -> Path:
    """Where the bundled models are: `$ATTNLENS_ZOO`, else `checkout` (this package's own folder,
    which in a source checkout holds them) when it holds a model, else the installed
    `attnlens_zoo` package, else `checkout` (empty: `available()` is [] and `load` says how to
    install the models)."""
    environ = os.environ if environ is None else environ
    if environ.get(ZOO_ENV):
        return Path(environ[ZOO_ENV])
    checkout = Path(__file__).parent if checkout is None else Path(checkout)
    if _holds_models(checkout):
        return checkout
    try:
        import attnlens_zoo
    except ImportError:
        return checkout
    return Path(attnlens_zoo.__file__).parent


ZOO_DIR = find_zoo_dir()


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
    if not ZOO_DIR.is_dir():
        return []
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
    if not names:
        raise ValueError(f"no bundled model {name!r}: no models are installed ({ZOO_DIR} holds "
                         f"none); {INSTALL_HINT}.")
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
    from attnlens.hooked_models.model import HookedVariantTransformer

    better = superseded_by(name)
    if better:
        warnings.warn(f"{name} is superseded by {', '.join(better)}, which score better on its "
                      "task (docs/reproduction.md, 'Superseded models'); it stays bundled as "
                      "the 1000-step baseline", SupersededModelWarning, stacklevel=2)
    return HookedVariantTransformer.from_pretrained(path(name), device=device)
