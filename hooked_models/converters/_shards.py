"""Read the tensors of a published checkpoint directory: safetensors only, sharded or not.

Published checkpoints come as one `model.safetensors`, several `*.safetensors` files, or shards
listed by a `*.safetensors.index.json` (`{"weight_map": {tensor name: shard file}}`, the layout
`save_pretrained(max_shard_size=...)` writes). Nothing here ever unpickles: a directory holding
only pickle weights (`pytorch_model.bin`, `pytorch_model-00001-of-00003.bin` + its
`pytorch_model.bin.index.json`, `.pt`, ...) is refused with a message pointing at
`attnlens convert`, which rewrites them as safetensors with `torch.load(weights_only=True)`.

Example:
    >>> state = read_safetensors_dir("checkpoints/llama-tiny")    # doctest: +SKIP
    >>> sorted(state)[:2]                                         # doctest: +SKIP
    ['lm_head.weight', 'model.embed_tokens.weight']
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def pickle_refusal(path: Path) -> ValueError:
    """The error every importer raises for pickle weights: it names `attnlens convert`."""
    return ValueError(
        f"{path} holds pickle weights ({path.suffix}), which attnlens never loads (unpickling "
        f"can run arbitrary code). Convert the checkpoint to safetensors once with "
        f"`attnlens convert {path if path.is_dir() else path.parent} DST` (it reads the tensors "
        f"with torch.load(weights_only=True)) and import DST instead")


def pickle_files(directory: Path) -> list[Path]:
    """The pickle weight files of `directory` (sorted)."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)


def read_index(index_file: Path) -> dict[str, str]:
    """The `weight_map` (tensor name -> shard file name) of a `*.index.json` file."""
    try:
        weight_map = json.loads(index_file.read_text()).get("weight_map")
    except (OSError, json.JSONDecodeError, AttributeError) as err:
        raise ValueError(f"{index_file} is not a readable shard index: {err}") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise ValueError(f"{index_file} has no 'weight_map' of tensor name -> shard file")
    for shard in set(weight_map.values()):
        if Path(shard).name != shard:
            raise ValueError(f"{index_file} names shard {shard!r} outside its directory")
    return weight_map


def safetensors_files(directory: Path) -> tuple[list[str], dict[str, str] | None]:
    """(shard file names, weight_map or None) of the safetensors weights in `directory`.

    Raises ValueError when there are none (naming `attnlens convert` if pickle files are
    there) or when an index names a missing shard.
    """
    if not directory.is_dir():
        raise ValueError(f"{str(directory)!r} is not a local directory (importers read local "
                         "files only; nothing is downloaded)")
    indexes = sorted(directory.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise ValueError(f"{directory} has several shard indexes {[p.name for p in indexes]}")
    weight_map = read_index(indexes[0]) if indexes else None
    if weight_map is not None:
        files = sorted(set(weight_map.values()))
        absent = [f for f in files if not (directory / f).is_file()]
        if absent:
            raise ValueError(f"{indexes[0].name} names missing shard files {absent}")
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        pickles = pickle_files(directory)
        if pickles:
            raise pickle_refusal(pickles[0])
        raise ValueError(f"{directory} has no *.safetensors weights")
    return files, weight_map


def read_safetensors_dir(directory) -> dict[str, Tensor]:
    """Every tensor of a checkpoint directory's safetensors weights, on the CPU.

    With an index, each tensor must sit in the shard the index names and every indexed tensor
    must be present; without one, every `*.safetensors` file is read and a name found in two
    files raises. Returns {name: tensor}; ValueError names the file or tensors at fault.
    """
    directory = Path(directory)
    files, weight_map = safetensors_files(directory)
    state: dict[str, Tensor] = {}
    for name in files:
        try:
            shard = load_file(str(directory / name), device="cpu")
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{directory / name} is not a readable safetensors file: "
                             f"{err}") from None
        dup = sorted(set(shard) & set(state))
        if dup:
            raise ValueError(f"tensors {dup[:5]} appear in more than one shard ({name})")
        if weight_map is not None:
            stray = sorted(k for k in shard if weight_map.get(k) != name)
            if stray:
                raise ValueError(f"{name} holds tensors {stray[:5]} that the index places "
                                 "elsewhere or not at all")
        state.update(shard)
    if weight_map is not None:
        lost = sorted(set(weight_map) - set(state))
        if lost:
            raise ValueError(f"the index lists tensors {lost[:5]} that no shard holds")
    return state


__all__ = ["PICKLE_SUFFIXES", "SAFETENSORS_INDEX", "pickle_files", "pickle_refusal",
           "read_index", "read_safetensors_dir", "safetensors_files"]
