"""Checkpoints: a directory with `config.json`, `model.safetensors` and optionally `card.json`
and `tokenizer.json`.

Nothing is ever unpickled. A save touches only those four files and nothing else in the
directory (it may hold the user's own files, or a trainer's optimizer state). Each file is
written to a temporary file beside it and renamed over the old one with `os.replace`, so every
file is always either the old or the new version and at no moment is there no checkpoint.
The weights go first and `config.json` last; the weights' safetensors metadata records the
config (and the tokenizer's hash) they were saved with, so a checkpoint torn by a crash between
two renames is detected on load and named, instead of loading new weights under an old config.
Loading names every missing, unexpected or mis-shaped tensor and every corrupt file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import warnings
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "card.json"
TOKENIZER_FILE = "tokenizer.json"
OWN_FILES = (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE, TOKENIZER_FILE)
# Keys in the weights file's safetensors metadata (string -> string).
CONFIG_META = "attnlens_config"
TOKENIZER_META = "attnlens_tokenizer_sha256"  # "" when the checkpoint has no tokenizer.json
# `.model.safetensors.<16 hex>.attnlens-tmp`: the only names a save ever cleans up.
TEMP_SUFFIX = ".attnlens-tmp"
_TEMP_NAME = re.compile(
    r"\.(" + "|".join(re.escape(f) for f in OWN_FILES) + r")\.[0-9a-f]{16}"
    + re.escape(TEMP_SUFFIX))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def remove_stale_temp_files(directory: Path) -> list[Path]:
    """Delete temporary files an interrupted save (a killed process) left in `directory`.

    Only names matching this module's own temp pattern are touched. Returns what was removed.
    """
    removed = []
    for path in directory.iterdir():
        if _TEMP_NAME.fullmatch(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` a temp file beside `path`, flush it to disk, then rename it over `path`.

    On any failure the temp file is removed and `path` keeps its old content.
    """
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")
        try:  # O_EXCL: never reuse someone else's file; 0o666 lets the umask set permissions
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:  # the data must be on disk before the rename makes it the checkpoint
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_text_atomic(path: Path, text: str) -> None:
    _write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_checkpoint(model, directory, card: dict | None = None,
                    weights_dtype=None) -> Path:
    """Write `model` to `directory` (created if needed); returns the directory.

    `card` becomes `card.json`; a trained tokenizer (one with `to_json`) becomes
    `tokenizer.json`. A `card.json`/`tokenizer.json` left from an earlier save is removed when
    this save has none, so it never describes another model. `weights_dtype` (e.g.
    torch.float16) stores floating weights in that dtype; loading casts them to `cfg.dtype`.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} is an existing file, not a checkpoint directory; "
                         "pass a directory path (existing or new)")
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(directory)
    config_json = model.cfg.to_json()
    tokenizer_json = model.tokenizer.to_json() if hasattr(model.tokenizer, "to_json") else None
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if weights_dtype is not None:
        state = {k: v.to(weights_dtype) if v.is_floating_point() else v
                 for k, v in state.items()}
    metadata = {"format": "pt", CONFIG_META: config_json,
                TOKENIZER_META: "" if tokenizer_json is None else _sha256(tokenizer_json)}
    _write_atomic(directory / WEIGHTS_FILE,
                  lambda tmp: save_file(state, str(tmp), metadata=metadata))
    for name, text in ((TOKENIZER_FILE, tokenizer_json),
                       (CARD_FILE, None if card is None
                        else json.dumps(card, indent=2, sort_keys=True))):
        if text is None:
            (directory / name).unlink(missing_ok=True)
        else:
            _write_text_atomic(directory / name, text)
    _write_text_atomic(directory / CONFIG_FILE, config_json)  # last: completes the checkpoint
    return directory


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the file is corrupt or "
                         "truncated") from None


def read_config(directory):
    """The `VariantConfig` in `directory/config.json` (ValueError naming the file if bad)."""
    from hooked_models.config import VariantConfig

    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{directory} is not an attnlens checkpoint: no {CONFIG_FILE}")
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object of config fields, "
                         f"got {type(data).__name__}")
    try:
        return VariantConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None


def read_card(directory) -> dict | None:
    """`card.json` as a dict, or None when absent. The card is optional documentation, so a
    corrupt one warns (naming the file) and reads as None instead of blocking the model."""
    path = Path(directory) / CARD_FILE
    if not path.is_file():
        return None
    try:
        card = _read_json(path)
    except ValueError as err:
        warnings.warn(f"{err}; loading the model without a card", stacklevel=2)
        return None
    if not isinstance(card, dict):
        warnings.warn(f"{path} must hold a JSON object, got {type(card).__name__}; loading the "
                      "model without a card", stacklevel=2)
        return None
    return card


def read_weights(path: Path) -> tuple[dict, dict]:
    """`(tensors, metadata)` of a safetensors file; ValueError naming it when it is corrupt."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {})
    except SafetensorError as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); the file is "
                         "corrupt or truncated") from None


def check_torn_checkpoint(directory: Path, metadata: dict) -> None:
    """ValueError when config.json or tokenizer.json is not the one the weights were saved with
    (a save interrupted between its renames, or a hand edit). Older checkpoints carry no
    record and are not checked."""
    weights = directory / WEIGHTS_FILE
    if CONFIG_META in metadata:
        saved = json.loads(metadata[CONFIG_META])
        current = _read_json(directory / CONFIG_FILE)
        if saved != current:
            fields = sorted(k for k in set(saved) | set(current)
                            if saved.get(k) != current.get(k))
            raise ValueError(f"{directory / CONFIG_FILE} differs from the config {weights} was "
                             f"saved with in fields {fields} (an interrupted save or a hand "
                             "edit); save the model again")
    if TOKENIZER_META in metadata:
        path = directory / TOKENIZER_FILE
        current = _sha256(path.read_text(encoding="utf-8")) if path.is_file() else ""
        if current != metadata[TOKENIZER_META]:
            if not metadata[TOKENIZER_META]:
                problem = f"is present but {weights} was saved without a tokenizer"
            elif not current:
                problem = f"is missing but {weights} was saved with one"
            else:
                problem = f"differs from the one {weights} was saved with"
            raise ValueError(f"{path} {problem} (an interrupted save or a hand edit); save the "
                             "model again")


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
    """The model saved in `directory`, in eval mode, with its card (or None) in `model.card`."""
    from hooked_models.devices import check_device

    check_device(device)   # before reading the weights: say so at once when it is unusable
    directory = Path(directory)
    cfg = read_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise ValueError(f"{directory} has no {WEIGHTS_FILE}")
    state, metadata = read_weights(weights)
    check_torn_checkpoint(directory, metadata)
    if device is not None:
        cfg.device = device
    if tokenizer is None and (directory / TOKENIZER_FILE).is_file():
        from hooked_models.bpe import BPETokenizer

        tokenizer = BPETokenizer.from_file(directory / TOKENIZER_FILE)
    model = cls(cfg, tokenizer=tokenizer)
    try:
        check_state_dict(model, state)
    except ValueError as err:
        raise ValueError(f"{weights}: {err}") from None
    model.load_state_dict(state, strict=True)
    model.card = read_card(directory)
    # A loaded model is for analysis: TransformerLens's patching refuses training-mode models.
    return model.eval()
