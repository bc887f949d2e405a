"""attnlens: mechanistic interpretability for modern attention variants (MHA, MTA, CoPE, DCMHA,
Infini-attention).

Everything installed lives under this one name, in five floors whose imports only go down
(docs/design.md):

- `attnlens.kernels`: the Triton kernels and each op's plain-torch spec;
- `attnlens.hooked_models`: the hooked, TransformerLens-compatible models and the zoo loader;
- `attnlens.interp`: the analyses (head detectors, circuits, attribution graphs, SAEs, sweeps);
- `attnlens.dashboards`: the Dash app;
- the production line: `attnlens.cli` (the `attnlens` command), `attnlens.training`,
  `attnlens.lab` (the recipes, training queues and evaluations that make the zoo's models),
  `attnlens.reports` (the generators of docs/), `attnlens.bench` and `attnlens.benchmarks`.

The everyday names load on first use, so `import attnlens` costs nothing until one is read:

    >>> import attnlens
    >>> model = attnlens.zoo.load("text-mha-l2")                      # doctest: +SKIP
    >>> attnlens.detect_heads(model, model.to_tokens("a b a b"))      # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from pathlib import Path

_FLOORS = ("kernels", "hooked_models", "interp", "dashboards")


class _CheckoutFloors(importlib.abc.MetaPathFinder):
    """In a source checkout (this folder beside setup.py and the floors' folders), the floors are
    this checkout's own: `attnlens.kernels` is `<checkout>/kernels`, whichever install (editable
    or not, of this checkout or another) is active. An installed wheel has no setup.py beside it,
    and its floors are ordinary subpackages."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        package, _, floor = fullname.partition(".")
        if package != __name__ or floor not in _FLOORS:
            return None
        folder = self.root / floor
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)])


_ROOT = Path(__file__).resolve().parent.parent
if (_ROOT / "setup.py").is_file() and all((_ROOT / f / "__init__.py").is_file() for f in _FLOORS):
    sys.meta_path.insert(0, _CheckoutFloors(_ROOT))

# name -> the module that defines it (a module's own name: the module itself)
_EVERYDAY = {
    # models
    "HookedVariantTransformer": "attnlens.hooked_models.model",
    "VariantConfig": "attnlens.hooked_models.config",
    "KVCache": "attnlens.hooked_models.model",
    "Stage": "attnlens.hooked_models.attention",
    "available_variants": "attnlens.hooked_models.attention",
    "register_attention": "attnlens.hooked_models.attention",
    "CharTokenizer": "attnlens.hooked_models.tokenizers.vocab",
    "zoo": "attnlens.hooked_models.zoo",
    # analyses
    "detect_heads": "attnlens.interp.tools.heads",
    "induction_table": "attnlens.interp.tools.heads",
    "stage_maps": "attnlens.interp.tools.heads",
    "ablate_heads": "attnlens.interp.tools.heads",
    "head_logit_attribution": "attnlens.interp.tools.logit_attribution",
    "qk_circuit": "attnlens.interp.circuits.qk_ov",
    "ov_circuit": "attnlens.interp.circuits.qk_ov",
    "composition_table": "attnlens.interp.circuits.qk_ov",
    "attribute": "attnlens.interp.attribution",
    "prune": "attnlens.interp.attribution",
    # the floors themselves, for `attnlens.interp.tools...` after `import attnlens`
    "kernels": "attnlens.kernels",
    "hooked_models": "attnlens.hooked_models",
    "interp": "attnlens.interp",
    "dashboards": "attnlens.dashboards",
}

__all__ = sorted(_EVERYDAY)


def __getattr__(name: str):
    where = _EVERYDAY.get(name)
    if where is None:
        raise AttributeError(f"module 'attnlens' has no attribute {name!r}")
    module = importlib.import_module(where)
    value = module if where.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EVERYDAY))
