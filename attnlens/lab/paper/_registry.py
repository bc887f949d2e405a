"""The recipes of the paper-task zoo and the modules that own them.

Each phenomenon module (`cope`, `mta`, `infini`, `dcmha` in this package) declares
`RECIPES: dict[str, Recipe]` and two functions:

    train(recipe, out_dir, resume=True) -> None      writes a checkpoint with save_pretrained
    evaluate(model, recipe) -> dict[str, float]       deterministic, seeded, seconds on a CPU

and, optionally, `CLAIMS: dict[phenomenon, str]` (the paper's claim, quoted in the report) and
`report_section(cards, figure_dir) -> str` (Markdown for docs/reproduction.md; without it the
report shows a plain table of the cards' metrics).

Example:
    >>> from attnlens.lab.paper._registry import all_recipes
    >>> recipes = all_recipes()                                   # doctest: +SKIP
    >>> module_of(recipes["cope-flipflop-cope-s0"]).evaluate      # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

PACKAGE = "attnlens.lab.paper"
PHENOMENON_MODULES = ("cope", "mta", "infini", "dcmha")


@dataclass(frozen=True)
class Recipe:
    """One trained model of the paper-task zoo.

    Attributes:
        name: the zoo directory name, `hooked_models/zoo/<name>/`.
        phenomenon: what it reproduces, e.g. "cope-counting" (groups rows in the report).
        variant: the setting compared, e.g. "cope", "rope", "absolute", "nope", "mta", "mha".
        task: a one-line description of the task and its sizes.
        seed: seeds the weights and the training batches.
        config: `VariantConfig` keyword arguments (without `seed`).
        train: `attnlens.training.trainer.TrainConfig` keyword arguments (steps, batch_size, lr,
        ...).
        task_args: the task generator's arguments (module-specific; e.g. lengths, splits).
        module: the phenomenon module that trains and evaluates it ("cope", "mta", ...).
    """

    name: str
    phenomenon: str
    variant: str
    task: str
    seed: int
    config: dict = field(hash=False)
    train: dict = field(hash=False)
    task_args: dict = field(default_factory=dict, hash=False)
    module: str = ""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise ValueError(f"recipe name {self.name!r} must be a plain directory name")
        if "seed" in self.config:
            raise ValueError(f"recipe {self.name}: put the seed in Recipe.seed, not in config")
        if "steps" not in self.train:
            raise ValueError(f"recipe {self.name}: train needs 'steps', got {sorted(self.train)}")


def _import(module: str) -> ModuleType | None:
    """The phenomenon module, or None when it does not exist (yet); a broken one raises."""
    full = f"{PACKAGE}.{module}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as err:
        if err.name == full:
            return None
        raise


def modules() -> dict[str, ModuleType]:
    """The phenomenon modules present, by short name."""
    found = {name: _import(name) for name in PHENOMENON_MODULES}
    return {name: mod for name, mod in found.items() if mod is not None}


def all_recipes() -> dict[str, Recipe]:
    """Every recipe of every present module, by name (names must be unique across modules)."""
    out: dict[str, Recipe] = {}
    for short, mod in modules().items():
        for name, recipe in mod.RECIPES.items():
            if name != recipe.name:
                raise ValueError(f"{short}.RECIPES key {name!r} != recipe.name {recipe.name!r}")
            if name in out:
                raise ValueError(f"recipe {name!r} is declared twice")
            if recipe.module and recipe.module != short:
                raise ValueError(f"recipe {name!r} says module {recipe.module!r}, lives in {short}")
            out[name] = recipe
    return out


def get_recipe(name: str) -> Recipe:
    recipes = all_recipes()
    if name not in recipes:
        from attnlens.hooked_models.zoo import closest_names

        close = closest_names(name, sorted(recipes))
        raise ValueError(f"no paper-task recipe {name!r}"
                         + (f"; the closest: {', '.join(close)}" if close else "")
                         + f" ({len(recipes)} recipes: `python -m attnlens.lab.paper list`)")
    return recipes[name]


def module_of(recipe: Recipe) -> ModuleType:
    """The module that trains and evaluates `recipe`."""
    for mod in modules().values():
        if recipe.name in mod.RECIPES:
            return mod
    raise ValueError(f"recipe {recipe.name!r} belongs to no present module")
