"""Checkpoints: a directory with `config.json`, `model.safetensors` and optionally `card.json`
and `tokenizer.json` (a trained BPE in HF `tokenizers` format, or a word vocabulary:
`attnlens.hooked_models.tokenizers.vocab.WordTokenizer`).

Nothing is ever unpickled. A save touches only those four files and nothing else in the
directory (it may hold the user's own files, or a trainer's optimizer state).

At every moment one complete checkpoint loads, the old one or the new one (docs/design.md contract
6),
whatever the moment a save is interrupted. A save runs as a small transaction:

1. stage: the new `tokenizer.json`, `card.json` and `config.json` are written to fsynced
   temporary files beside them (`.config.json.<16 hex>.attnlens-tmp`; an empty one stands for
   "remove this file"); the old files are untouched, so the old checkpoint still loads;
2. commit: the weights are written to a temporary file and renamed over `model.safetensors`
   (`os.replace`, atomic). Their safetensors metadata records the config, and the hashes of the
   tokenizer and card, they were saved with;
3. install: each staged file is renamed over its file (config.json last), then leftover temporary
   files of earlier interrupted saves are removed.

A loader reads the weights first. A side file that is not the one the weights record, while a
staged file of the interrupted save is, is read from the staged file (the directory is not
written; the next save completes or replaces it). A side file that matches neither (a hand edit
of config.json or tokenizer.json) is named in a ValueError instead of loading new weights under
an old config. A card may be edited by hand (evaluation writes metrics into it): only a staged
card takes precedence over it. Loading names every missing, unexpected or mis-shaped tensor and
every corrupt file.
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
CARD_META = "attnlens_card_sha256"            # "" when the checkpoint has no card.json
# Staged by a save and installed after the weights, in this order (config.json completes it).
SIDE_FILES = (TOKENIZER_FILE, CARD_FILE, CONFIG_FILE)
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


def _new_temp(path: Path) -> Path:
    """A new, empty temp file beside `path`, ours alone (O_EXCL: never someone else's file)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}{TEMP_SUFFIX}")
        try:  # 0o666 lets the umask set permissions
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` a temp file beside `path`, flush it to disk, then rename it over `path`.

    On any failure the temp file is removed and `path` keeps its old content.
    """
    tmp = _new_temp(path)
    mode = tmp.stat().st_mode & 0o777   # what the umask allows
    try:
        write(tmp)
        # safetensors writes a file of its own, readable by its owner only (0600): give it the
        # permissions every other checkpoint file gets
        os.chmod(tmp, mode)
        _fsync(tmp)   # the data must be on disk before the rename makes it the checkpoint
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path, text: str) -> None:
    """Write a text file atomically (UTF-8, fsynced, a temp file renamed over `path`): a reader
    sees the old content or the new, never half; on failure `path` keeps its old content."""
    _write_atomic(Path(path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_tensors(tensors: dict, path, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (a temp file renamed over `path`), with the
    permissions the umask gives (safetensors alone writes 0600)."""
    _write_atomic(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _stage(path: Path, text: str | None) -> Path:
    """The next content of `path` in a fsynced temp file beside it; empty stands for "remove
    `path`" (no checkpoint file is ever empty). Returns the temp file."""
    tmp = _new_temp(path)
    try:
        if text:
            tmp.write_text(text, encoding="utf-8")
        _fsync(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _install(path: Path, staged: Path) -> None:
    """Make the staged content `path`'s: rename it over `path`, or remove both if it is empty."""
    if staged.stat().st_size:
        os.replace(staged, path)
    else:
        path.unlink(missing_ok=True)
        staged.unlink()


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
    config_json = model.cfg.to_json()
    tokenizer_json = model.tokenizer.to_json() if hasattr(model.tokenizer, "to_json") else None
    card_json = None if card is None else json.dumps(card, indent=2, sort_keys=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if weights_dtype is not None:
        state = {k: v.to(weights_dtype) if v.is_floating_point() else v
                 for k, v in state.items()}
    metadata = {"format": "pt", CONFIG_META: config_json,
                TOKENIZER_META: "" if tokenizer_json is None else _sha256(tokenizer_json),
                CARD_META: "" if card_json is None else _sha256(card_json)}
    texts = {TOKENIZER_FILE: tokenizer_json, CARD_FILE: card_json, CONFIG_FILE: config_json}
    staged: dict[str, Path] = {}
    try:   # 1. stage the side files; 2. commit: the weights' rename makes the new checkpoint
        for name in SIDE_FILES:
            staged[name] = _stage(directory / name, texts[name])
        _write_atomic(directory / WEIGHTS_FILE,
                      lambda tmp: save_file(state, str(tmp), metadata=metadata))
    except BaseException:
        for tmp in staged.values():   # not committed: the old checkpoint stands as it was
            tmp.unlink(missing_ok=True)
        raise
    # 3. install. Committed: an interruption from here on leaves the new checkpoint, completed
    # by the staged files, so they are never removed on failure.
    for name in SIDE_FILES:
        _install(directory / name, staged[name])
    remove_stale_temp_files(directory)   # what earlier interrupted saves left
    return directory


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the file is corrupt or "
                         "truncated") from None


def read_config(directory):
    """The `VariantConfig` in `directory/config.json` (ValueError naming the file if bad)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{directory} is not an attnlens checkpoint: no {CONFIG_FILE}")
    return _config_from(_read_json(path), path)


def _config_from(data, path: Path):
    from attnlens.hooked_models.config import VariantConfig

    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object of config fields, "
                         f"got {type(data).__name__}")
    try:
        return VariantConfig.from_dict(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None


def read_card(directory, text: str | None = None) -> dict | None:
    """`card.json` as a dict, or None when absent. The card is optional documentation, so a
    corrupt one warns (naming the file) and reads as None instead of blocking the model.
    `text`: the card's content when it comes from elsewhere (an interrupted save's staged file).
    """
    path = Path(directory) / CARD_FILE
    if text is None and not path.is_file():
        return None
    try:
        if text is None:
            card = _read_json(path)
        else:
            card = json.loads(text)
    except (ValueError, json.JSONDecodeError) as err:
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


def _is_recorded(name: str, text: str | None, metadata: dict) -> bool:
    """Whether `text` (None: the file is absent) is the side file `name` that the weights were
    saved with; True when the weights carry no record of it (older checkpoints)."""
    if name == CONFIG_FILE:
        if CONFIG_META not in metadata:
            return True
        try:
            return text is not None and json.loads(text) == json.loads(metadata[CONFIG_META])
        except json.JSONDecodeError:
            return False
    key = TOKENIZER_META if name == TOKENIZER_FILE else CARD_META
    if key not in metadata:
        return True
    return metadata[key] == ("" if text is None else _sha256(text))


def _read_text(path: Path) -> str | None:
    """The file's text, None when absent, unreadable or not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def staged_side_files(directory: Path, metadata: dict) -> dict[str, str | None]:
    """The side files to read from an interrupted save's staged files instead of the directory.

    For each side file whose current version is not the one the weights record while a staged
    file (`.NAME.<hex>.attnlens-tmp`) is: name -> the staged text (None: that save removes the
    file). Empty when nothing was interrupted after its commit.
    """
    out: dict[str, str | None] = {}
    temps = [(m.group(1), p) for p in directory.iterdir()
             if (m := _TEMP_NAME.fullmatch(p.name)) and m.group(1) in SIDE_FILES]
    for name in SIDE_FILES:
        path = directory / name
        if _is_recorded(name, _read_text(path) if path.is_file() else None, metadata):
            continue
        for _, tmp in (t for t in temps if t[0] == name):
            text = _read_text(tmp)
            if text is None:
                continue
            text = text or None   # an empty staged file: the save removes the file
            if _is_recorded(name, text, metadata):
                out[name] = text
                break
    return out


def check_torn_checkpoint(directory: Path, metadata: dict, resolved=()) -> None:
    """ValueError when config.json or tokenizer.json is not the one the weights were saved with
    and no staged file of an interrupted save is (`resolved`: the names `staged_side_files`
    found): a hand edit, or staged files that were removed. Older checkpoints carry no record
    and are not checked."""
    weights = directory / WEIGHTS_FILE
    if CONFIG_META in metadata and CONFIG_FILE not in resolved:
        saved = json.loads(metadata[CONFIG_META])
        current = _read_json(directory / CONFIG_FILE)
        if saved != current:
            fields = sorted(k for k in set(saved) | set(current)
                            if saved.get(k) != current.get(k))
            raise ValueError(f"{directory / CONFIG_FILE} differs from the config {weights} was "
                             f"saved with in fields {fields} (a hand edit?); save the model "
                             "again")
    if TOKENIZER_META in metadata and TOKENIZER_FILE not in resolved:
        path = directory / TOKENIZER_FILE
        current = _sha256(path.read_text(encoding="utf-8")) if path.is_file() else ""
        if current != metadata[TOKENIZER_META]:
            if not metadata[TOKENIZER_META]:
                problem = f"is present but {weights} was saved without a tokenizer"
            elif not current:
                problem = f"is missing but {weights} was saved with one"
            else:
                problem = f"differs from the one {weights} was saved with"
            raise ValueError(f"{path} {problem} (a hand edit?); save the model again")


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
    """The model saved in `directory`, in eval mode, with its card (or None) in `model.card`.

    The weights decide which checkpoint this is: side files come from the directory, or from
    the staged files of a save interrupted after its commit (see the module docstring).
    """
    from attnlens.hooked_models.devices import check_device

    check_device(device)   # before reading the weights: say so at once when it is unusable
    directory = Path(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        read_config(directory)   # names a directory that is no checkpoint at all
        raise ValueError(f"{directory} has no {WEIGHTS_FILE}")
    state, metadata = read_weights(weights)
    staged = staged_side_files(directory, metadata)
    if CONFIG_FILE in staged:
        cfg = _config_from(json.loads(staged[CONFIG_FILE]), directory / CONFIG_FILE)
    else:
        cfg = read_config(directory)
    check_torn_checkpoint(directory, metadata, staged)
    if device is not None:
        cfg.device = device
    if tokenizer is None:
        tokenizer = _read_tokenizer(directory, staged)
    model = cls(cfg, tokenizer=tokenizer)
    try:
        check_state_dict(model, state)
    except ValueError as err:
        raise ValueError(f"{weights}: {err}") from None
    model.load_state_dict(state, strict=True)
    if CARD_FILE in staged:
        model.card = None if staged[CARD_FILE] is None else read_card(directory,
                                                                      staged[CARD_FILE])
    else:
        model.card = read_card(directory)
    # A loaded model is for analysis: TransformerLens's patching refuses training-mode models.
    return model.eval()


def _read_tokenizer(directory: Path, staged: dict):
    """The checkpoint's tokenizer (a word vocabulary or a trained BPE), or None when it has
    none."""
    from attnlens.hooked_models.tokenizers.bpe import BPETokenizer
    from attnlens.hooked_models.tokenizers.vocab import WordTokenizer

    path = directory / TOKENIZER_FILE
    if TOKENIZER_FILE not in staged:
        if not path.is_file():
            return None
        text = _read_text(path)
        if text is not None and WordTokenizer.is_word_tokenizer_json(text):
            return WordTokenizer.from_json(text, str(path))
        return BPETokenizer.from_file(path)
    if staged[TOKENIZER_FILE] is None:
        return None
    if WordTokenizer.is_word_tokenizer_json(staged[TOKENIZER_FILE]):
        return WordTokenizer.from_json(staged[TOKENIZER_FILE], f"the staged {path}")
    from tokenizers import Tokenizer

    try:
        return BPETokenizer(Tokenizer.from_str(staged[TOKENIZER_FILE]))
    except Exception as err:  # tokenizers raises its own exception type
        raise ValueError(f"the staged {path} is not a valid tokenizer.json: {err}") from None
