"""`attnlens convert SRC DST`: rewrite a pickled checkpoint (`.bin`/`.pt`) as safetensors.

Many checkpoints are published only as pickles (`pytorch_model.bin`, or shards
`pytorch_model-00001-of-00003.bin` listed by `pytorch_model.bin.index.json`, as
DCPythia-6.9B and DCFormer-2.8B are). Unpickling can run arbitrary code, so attnlens's importers
never do it. This one step does, restricted: every file is read with
`torch.load(weights_only=True)`, PyTorch's allow-list unpickler, which builds tensors and plain
containers and refuses any other global (a crafted pickle raises instead of running).

DST receives one safetensors file per pickle file (`model.safetensors`, or
`model-0000i-of-0000n.safetensors` + `model.safetensors.index.json` when SRC is sharded), in the
order and grouping of the source, plus copies of SRC's small metadata files (`config.json`,
tokenizer files). Custom code (`*.py`) is not copied. DST is assembled in a temporary directory
beside it and renamed into place, so it never exists half-written. Tensors that share storage in
the pickle (tied embeddings) are written as separate copies (safetensors stores no aliasing).

Example:
    >>> convert_checkpoint("downloads/DCPythia-6.9B", "checkpoints/DCPythia-6.9B")  # doctest: +SKIP
    >>> from_dcformer("checkpoints/DCPythia-6.9B")                                # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import shutil
from pathlib import Path

import torch
from torch import Tensor

from attnlens.hooked_models.checkpoint import save_tensors
from attnlens.hooked_models.converters._shards import (
    PICKLE_SUFFIXES,
    SAFETENSORS_INDEX,
    pickle_files,
    read_index,
)

# Metadata files copied from SRC to DST (never code, never weights).
_COPIED_SUFFIXES = (".json", ".txt", ".model", ".md", ".tiktoken")
# Training checkpoints often nest the state dict one level down under one of these keys.
_NESTED_KEYS = ("state_dict", "model", "module", "model_state_dict")


def _load_pickle(path: Path) -> dict[str, Tensor]:
    """The {name: tensor} of one pickle file, loaded with weights_only=True only."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=False)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError,
            TypeError) as err:
        raise ValueError(f"{path} was refused by torch.load(weights_only=True): it is not a "
                         f"plain tensor checkpoint (or it is corrupt): "
                         f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                         ) from None
    if isinstance(obj, dict) and len(obj) == 1 and next(iter(obj)) in _NESTED_KEYS \
            and isinstance(next(iter(obj.values())), dict):
        obj = next(iter(obj.values()))
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise ValueError(f"{path}: entries {bad[:5]} are not named tensors; only flat state "
                         "dicts {name: tensor} can be converted")
    return obj


def _untie(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Contiguous tensors, each with its own storage (safetensors refuses shared storage)."""
    out, seen = {}, set()
    for name, t in state.items():
        t = t.detach().contiguous()
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        elif ptr is not None:
            seen.add(ptr)
        out[name] = t
    return out


def _source_files(src: Path) -> tuple[Path, list[Path], dict[str, str] | None]:
    """(directory, pickle files in order, the pickle index's weight_map or None)."""
    if src.is_file():
        if src.suffix not in PICKLE_SUFFIXES:
            raise ValueError(f"{src} is not a pickle checkpoint file ({list(PICKLE_SUFFIXES)})")
        return src.parent, [src], None
    if not src.is_dir():
        raise ValueError(f"{str(src)!r} does not exist (convert reads local files only)")
    indexes = sorted(p for p in src.glob("*.index.json") if ".safetensors." not in p.name)
    if len(indexes) > 1:
        raise ValueError(f"{src} has several pickle shard indexes {[p.name for p in indexes]}")
    if indexes:
        weight_map = read_index(indexes[0])
        names = sorted(set(weight_map.values()))
        absent = [n for n in names if not (src / n).is_file()]
        if absent:
            raise ValueError(f"{indexes[0].name} names missing shard files {absent}")
        return src, [src / n for n in names], weight_map
    files = pickle_files(src)
    if not files:
        raise ValueError(f"{src} holds no pickle weights ({list(PICKLE_SUFFIXES)}); if it has "
                         "*.safetensors already, import it directly")
    return src, files, None


def _target_names(n: int) -> list[str]:
    if n == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def convert_checkpoint(src, dst) -> Path:
    """Convert pickle weights at `src` (a file or directory) into safetensors in `dst`.

    `dst` must not exist or be an empty directory. Returns `dst`. Raises ValueError naming the
    file when a pickle is refused by `weights_only=True`, is not a flat state dict, or
    disagrees with its index, and when a tensor name appears in two files.
    """
    src, dst = Path(src), Path(dst)
    directory, files, weight_map = _source_files(src)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ValueError(f"{dst} exists and is not an empty directory; choose a new DST")
    if dst.resolve() == directory.resolve():
        raise ValueError("DST must differ from SRC")
    tmp = dst.parent / f".{dst.name}.{secrets.token_hex(8)}.attnlens-convert"
    tmp.mkdir(parents=True)
    try:
        index: dict[str, str] = {}
        total = 0
        for path, target in zip(files, _target_names(len(files)), strict=True):
            state = _untie(_load_pickle(path))
            dup = sorted(set(state) & set(index))
            if dup:
                raise ValueError(f"tensors {dup[:5]} appear in more than one file ({path.name})")
            if weight_map is not None:
                stray = sorted(k for k in state if weight_map.get(k) != path.name)
                if stray:
                    raise ValueError(f"{path.name} holds tensors {stray[:5]} that its index "
                                     "places elsewhere or not at all")
            save_tensors(state, tmp / target, metadata={"format": "pt"})
            total += sum(t.numel() * t.element_size() for t in state.values())
            index.update(dict.fromkeys(state, target))
            del state
        if weight_map is not None:
            lost = sorted(set(weight_map) - set(index))
            if lost:
                raise ValueError(f"the pickle index lists tensors {lost[:5]} that no file holds")
        if len(files) > 1:
            (tmp / SAFETENSORS_INDEX).write_text(json.dumps(
                {"metadata": {"total_size": total, "converted_by": "attnlens convert"},
                 "weight_map": dict(sorted(index.items()))}, indent=2))
        if src.is_dir():
            for extra in sorted(directory.iterdir()):
                if (extra.is_file() and extra.suffix in _COPIED_SUFFIXES
                        and not extra.name.endswith(".index.json")):
                    shutil.copy2(extra, tmp / extra.name)
        if dst.exists():
            dst.rmdir()   # empty, checked above
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def add_convert_parser(sub) -> None:
    """Register `attnlens convert SRC DST` on an argparse subparsers object."""
    p = sub.add_parser("convert", help="rewrite pickled .bin/.pt weights as safetensors "
                                       "(torch.load(weights_only=True) only)")
    p.add_argument("src", help="a pickle file, or a directory of pickle shards (+ index)")
    p.add_argument("dst", help="new directory for the safetensors shards, index and metadata")
    p.set_defaults(fn=_cmd_convert)


def _cmd_convert(args) -> int:
    import sys

    try:
        out = convert_checkpoint(args.src, args.dst)
    except ValueError as err:
        print(f"attnlens convert: error: {err}", file=sys.stderr)
        return 2
    files = sorted(p.name for p in out.iterdir())
    print(f"wrote {out}: {', '.join(files)}")
    return 0


__all__ = ["add_convert_parser", "convert_checkpoint"]
