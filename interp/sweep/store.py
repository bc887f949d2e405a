"""A sweep's folder: one Parquet file per finished shard, a manifest, the merged table.

    OUT/shards/<key>.parquet     a finished shard's table (written atomically)
    OUT/manifest.jsonl           one JSON line per finished shard: key, label, file, rows,
                                 sha256 of the file, seconds; appended after the file is in place
    OUT/merged.parquet           every shard's table, in plan order
    OUT/summary.parquet          see attnlens.interp.sweep.summary
    OUT/figures/                 see attnlens.interp.sweep.figures

A shard counts as finished when the manifest names its key and its file has the recorded
hash; anything else (a torn last line, a missing or altered file) runs again.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pandas as pd


class SweepStore:
    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.manifest = self.out / "manifest.jsonl"

    def shard_path(self, key: str) -> Path:
        return self.out / "shards" / f"{key}.parquet"

    def finished(self) -> dict[str, dict]:
        """Manifest entries whose file is present and intact, by key."""
        if not self.manifest.is_file():
            return {}
        done = {}
        for line in self.manifest.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue   # a line torn by a crash; its shard reruns
            path = self.shard_path(entry.get("key", ""))
            if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == entry.get(
                    "sha256"):
                done[entry["key"]] = entry
        return done

    def write_shard(self, shard: dict, data: bytes, seconds: float) -> dict:
        """Store a shard's Parquet bytes atomically, then append its manifest line."""
        path = self.shard_path(shard["key"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".parquet.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        rows = pd.read_parquet(io.BytesIO(data)).shape[0]
        entry = {"key": shard["key"], "label": shard["label"],
                 "file": str(path.relative_to(self.out)), "rows": rows,
                 "sha256": hashlib.sha256(data).hexdigest(), "seconds": round(seconds, 4)}
        with open(self.manifest, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return entry

    def merge(self, shards: list[dict]) -> pd.DataFrame:
        """Every shard's table in plan order (columns: the union, in first-seen order)."""
        tables = [pd.read_parquet(self.shard_path(s["key"])) for s in shards]
        tables = [t for t in tables if len(t)] or tables[:1]
        merged = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
        # integer and bool columns missing from some analyses stay nullable ints and bools
        # (not floats and objects), so the table reads back from Parquet exactly as it was
        kinds = {"Int64": pd.api.types.is_integer_dtype, "boolean": pd.api.types.is_bool_dtype}
        for nullable, test in kinds.items():
            cols = {c for t in tables for c in t.columns if test(t[c])}
            merged = merged.astype({c: nullable for c in cols if not test(merged[c])})
        write_parquet(merged, self.out / "merged.parquet")
        return merged


def write_parquet(table: pd.DataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    table.to_parquet(tmp, index=False, engine="pyarrow")
    os.replace(tmp, path)
    return path
