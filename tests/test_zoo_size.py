"""The zoo's size caps (issues 24 and 26): the models under hooked_models/zoo/, shipped now or
still to be trained by a recipe, stay under 150 MiB of fp16 weights and files; their
transcoders (`<model>/transcoders/`, issue 47: an add-on of the MLP models, fp16) have a cap of
their own, 32 MiB."""

from __future__ import annotations

import json

import torch

from attnlens.hooked_models.zoo import ZOO_DIR
from attnlens.lab import text_recipes
from attnlens.lab.paper._registry import all_recipes
from attnlens.lab.paper._training import build_model

ZOO_CAP_BYTES = 150 * 2**20
TRANSCODER_CAP_BYTES = 32 * 2**20


def _is_transcoder_file(f) -> bool:
    return "transcoders" in f.relative_to(ZOO_DIR).parts[:-1]


def _dir_bytes(path) -> int:
    """The bytes of the model files under `path` (transcoders not counted)."""
    return sum(f.stat().st_size for f in path.rglob("*")
               if f.is_file() and not _is_transcoder_file(f))


def test_shipped_transcoders_are_under_their_cap():
    total = sum(f.stat().st_size for f in ZOO_DIR.rglob("*")
                if f.is_file() and _is_transcoder_file(f))
    assert total < TRANSCODER_CAP_BYTES, f"the zoo's transcoders take {total / 2**20:.1f} MiB"


def _fp16_bytes(model: torch.nn.Module) -> int:
    return 2 * sum(p.numel() for p in model.parameters())


def test_shipped_zoo_is_under_the_cap():
    total = _dir_bytes(ZOO_DIR)
    assert total < ZOO_CAP_BYTES, f"hooked_models/zoo takes {total / 2**20:.1f} MiB"


def test_zoo_with_every_recipe_trained_fits_the_cap():
    """The shapes chosen for the models still to train (the text zoo's 15 recipes and its seed
    replicates, the paper zoo's -long/-full groups) leave the finished zoo under the cap:
    shipped directories count as they are, the others as their fp16 weights plus a shipped
    sibling's tokenizer and card."""
    from attnlens.hooked_models.model import HookedVariantTransformer

    shipped = {d.name for d in ZOO_DIR.iterdir() if (d / "card.json").is_file()}
    total = _dir_bytes(ZOO_DIR)
    text_extra = max(_dir_bytes(ZOO_DIR / n) - (ZOO_DIR / n / "model.safetensors").stat().st_size
                     for n in shipped if n.startswith("text-"))
    d_vocab = text_recipes.VOCAB_SIZE
    for name, recipe in {**text_recipes.RECIPES, **text_recipes.SEED_RECIPES}.items():
        if name not in shipped:
            model = HookedVariantTransformer(recipe.config(d_vocab))
            total += _fp16_bytes(model) + text_extra
    for name, recipe in all_recipes().items():
        if name not in shipped:
            total += _fp16_bytes(build_model(recipe)) + 64 * 2**10   # card, tokenizer, config
    assert total < ZOO_CAP_BYTES, f"the finished zoo would take {total / 2**20:.1f} MiB"


def test_text_models_ship_fp16_weights():
    for d in sorted(ZOO_DIR.glob("text-*")):
        header = (d / "model.safetensors").read_bytes()
        size = int.from_bytes(header[:8], "little")
        dtypes = {v["dtype"] for k, v in json.loads(header[8:8 + size]).items()
                  if k != "__metadata__"}
        assert dtypes == {"F16"}, (d.name, dtypes)
