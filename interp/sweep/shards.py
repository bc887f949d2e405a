"""Shards of a sweep: the plan (model x prompt shard x analysis), their keys, and the runner.

A shard is a plain JSON-able dict; its `key` is the SHA-256 of everything its table depends on
(the model's files, the prompt set and its slice, the text file's bytes, the analysis and its
arguments, the device, the dtype), so a finished shard is found again by key on a rerun and a
changed input runs anew. `run_shard` is a pure function of the shard (given the same library
versions): the in-process and the Ray backends both call it, in a `ModelCache` that loads each
model once per process.

Example:
    >>> shards = plan(load_spec("sweep.yaml"))                      # doctest: +SKIP
    >>> table = run_shard(shards[0], ModelCache())                  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch

from attnlens.interp.sweep.analyses import ANALYSES
from attnlens.interp.sweep.prompts import make_prompts

FORMAT = 1   # bump when a shard's table changes for the same inputs
ID_COLUMNS = ["model", "prompt_set", "shard", "analysis", "kind", "n_prompts", "seq_len"]
_HASHED_SUFFIXES = (".json", ".safetensors")


def file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_fingerprint(path: str | Path) -> str:
    """SHA-256 over the checkpoint's config, tokenizer, index and weight files (not card.json)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file() and f.suffix in _HASHED_SUFFIXES and f.name != "card.json":
            h.update(f.name.encode() + b"\0" + file_digest(f).encode() + b"\0")
    return h.hexdigest()


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def shard_key(shard: dict) -> str:
    body = {k: v for k, v in shard.items() if k not in ("key", "label")}
    blob = json.dumps({"format": FORMAT, **body}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def plan(spec: dict) -> list[dict]:
    """Every shard of a validated spec, in a fixed order (model, analysis, prompt set, slice)."""
    device = resolve_device(spec["device"])
    fingerprints = {m["path"]: model_fingerprint(m["path"]) for m in spec["models"]}
    texts = {p["file"]: file_digest(p["file"]) for p in spec["prompts"] if "file" in p}
    sets = {p["name"]: p for p in spec["prompts"]}
    size = spec["shard_size"]
    shards = []
    for m in spec["models"]:
        model = {**m, "fingerprint": fingerprints[m["path"]]}
        for a in spec["analyses"]:
            base = {"model": model, "analysis": a, "device": device,
                    "threads": spec["threads"]}
            if not a["prompts"]:
                shards.append({**base, "prompts": None})
                continue
            for name in a["prompts"]:
                ps = sets[name]
                extra = {"file_sha256": texts[ps["file"]]} if "file" in ps else {}
                for index, start in enumerate(range(0, ps["count"], size)):
                    stop = min(start + size, ps["count"])
                    shards.append({**base, "prompts": {**ps, **extra, "shard": index,
                                                       "start": start, "stop": stop}})
    for s in shards:
        s["key"] = shard_key(s)
        p = s["prompts"]
        s["label"] = (f"{s['model']['name']}/{s['analysis']['name']}" +
                      (f"/{p['name']}[{p['start']}:{p['stop']}]" if p else ""))
    return shards


class ModelCache:
    """Models loaded in this process, least recently used dropped beyond `capacity`."""

    def __init__(self, capacity: int = 2):
        self.capacity, self.loads = capacity, 0
        self._models: OrderedDict[tuple, object] = OrderedDict()

    def get(self, model: dict, device: str):
        from attnlens.hooked_models import HookedVariantTransformer

        key = (model["path"], model["fingerprint"], model["dtype"], device)
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        loaded = HookedVariantTransformer.from_pretrained(model["path"], device=device)
        if model["dtype"] is not None:
            loaded = loaded.to(getattr(torch, model["dtype"]))
        self.loads += 1
        self._models[key] = loaded
        while len(self._models) > self.capacity:
            self._models.popitem(last=False)
        return loaded


@contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _with_ids(table: pd.DataFrame, shard: dict, n_prompts: int, seq_len: int) -> pd.DataFrame:
    p = shard["prompts"]
    ids = {"model": shard["model"]["name"], "prompt_set": p["name"] if p else "",
           "shard": p["shard"] if p else -1, "analysis": shard["analysis"]["name"],
           "kind": shard["analysis"]["analysis"], "n_prompts": n_prompts, "seq_len": seq_len}
    table = table.reset_index(drop=True)
    front = pd.DataFrame({k: [v] * len(table) for k, v in ids.items()})
    front = front.astype({"shard": "int64", "n_prompts": "int64", "seq_len": "int64"})
    return pd.concat([front, table], axis=1)


def run_shard(shard: dict, cache: ModelCache) -> pd.DataFrame:
    """The shard's table: the analysis's rows with the ID columns in front.

    Prompt shards run the analysis once per group of equal-length prompts (shortest first);
    `n_prompts` and `seq_len` say which group a row describes (0 and 0 for weight analyses).
    """
    spec = ANALYSES[shard["analysis"]["analysis"]]
    args = shard["analysis"]["args"]
    try:
        with _threads(shard["threads"]), torch.no_grad():
            model = cache.get(shard["model"], shard["device"])
            if shard["prompts"] is None:
                return _with_ids(spec.fn(model, **args), shard, 0, 0)
            p = shard["prompts"]
            prompts = make_prompts(model, p)[p["start"]:p["stop"]]
            groups: dict[int, list] = {}
            for tokens in prompts:
                groups.setdefault(tokens.numel(), []).append(tokens)
            tables = []
            for length in sorted(groups):
                tokens = torch.stack(groups[length]).to(model.W_E.device)
                tables.append(_with_ids(spec.fn(model, tokens, **args), shard,
                                        len(groups[length]), length))
            return pd.concat(tables, ignore_index=True)
    except ValueError as err:
        raise ValueError(f"sweep shard {shard['label']}: {err}") from err


def to_parquet_bytes(table: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    table.to_parquet(buf, index=False, engine="pyarrow")
    return buf.getvalue()


def run_shard_bytes(shard: dict, cache: ModelCache) -> bytes:
    """`run_shard` as Parquet bytes: what a backend hands back to the driver to store."""
    return to_parquet_bytes(run_shard(shard, cache))
