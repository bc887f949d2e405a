"""`run_sweep`: plan the shards, run those not finished, merge, summarise, draw.

Example:
    >>> result = run_sweep("sweep.yaml", out="runs/s1")              # doctest: +SKIP
    >>> result.summary.query("kind == 'heads'").head()
    >>> result = run_sweep("sweep.yaml", out="runs/s1", ray="local", workers=2)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from attnlens.interp.sweep.figures import write_figures
from attnlens.interp.sweep.shards import ModelCache, plan, run_shard_bytes
from attnlens.interp.sweep.spec import load_spec
from attnlens.interp.sweep.store import SweepStore, write_parquet
from attnlens.interp.sweep.summary import summarise


@dataclass
class SweepResult:
    out: Path
    merged: pd.DataFrame
    summary: pd.DataFrame
    shards: int
    ran: int
    skipped: int
    seconds: float
    figures: list[Path] = field(default_factory=list)
    model_loads: list[int] = field(default_factory=list)   # per process (in-process: one)
    analyses: list[str] = field(default_factory=list)      # the spec's analysis names

    def of(self, analysis: str, summary: bool = False) -> pd.DataFrame:
        """The rows of one analysis (by its spec name), without the other analyses' columns.

        An analysis of the spec that found nothing to report (e.g. "gates" on models without a
        gate stage) gives an empty table; a name that is not in the spec raises ValueError.
        """
        table = self.summary if summary else self.merged
        if analysis not in set(table["analysis"]):
            if analysis in self.analyses:
                return pd.DataFrame(columns=["analysis"])
            raise ValueError(f"no analysis {analysis!r} in this sweep; it has "
                             f"{sorted(set(self.analyses) or set(table['analysis']))}")
        return table[table["analysis"] == analysis].dropna(axis=1, how="all").reset_index(
            drop=True)


def _in_process(todo: list[dict], cache: ModelCache):
    for shard in todo:
        t0 = time.perf_counter()
        data = run_shard_bytes(shard, cache)
        yield shard, data, time.perf_counter() - t0


def run_sweep(spec, out: str | Path | None = None, ray: str | None = None, workers: int = 2,
              progress: bool = True, figures: bool = True, png: bool = True,
              gpus_per_worker: float | None = None) -> SweepResult:
    """Run a sweep spec (file path or dict, see attnlens.interp.sweep.spec) into the folder `out`.

    Args:
        out: the sweep folder (default: the spec's `out`); finished shards there are skipped.
        ray: None runs in this process; "local" starts a local Ray cluster; any other string is
            a cluster address for `ray.init` (needs the `attnlens[ray]` extra).
        workers: Ray actors (each loads its models once).
        figures / png: write summary figures (HTML; PNG too when kaleido works).

    Returns:
        A SweepResult with the merged table (`out/merged.parquet`) and the summary.
    """
    spec = load_spec(spec)
    out = out if out is not None else spec["out"]
    if out is None:
        raise ValueError("sweep: no output folder; pass out= (--out) or set 'out' in the spec")
    store = SweepStore(out)
    store.out.mkdir(parents=True, exist_ok=True)
    (store.out / "spec.json").write_text(json.dumps(spec, indent=2))
    shards = plan(spec)
    done = store.finished()
    todo = [s for s in shards if s["key"] not in done]
    t0 = time.perf_counter()
    loads: list[int] = []
    if ray is None:
        cache = ModelCache()
        results = _in_process(todo, cache)
    else:
        from attnlens.interp.sweep.ray_backend import run_ray

        stats: dict = {}
        results = run_ray(todo, address=ray, workers=workers, gpus_per_worker=gpus_per_worker,
                          stats=stats)
    bar = tqdm(total=len(shards), initial=len(shards) - len(todo), desc="sweep shards",
               unit="shard", disable=not progress)
    try:
        for shard, data, seconds in results:
            store.write_shard(shard, data, seconds)
            bar.update(1)
    finally:
        bar.close()
    loads = [cache.loads] if ray is None else stats.get("loads", [])
    merged = store.merge(shards)
    summary = summarise(merged)
    write_parquet(summary, store.out / "summary.parquet")
    written = write_figures(summary, store.out / "figures", png=png) if figures else []
    return SweepResult(store.out, merged, summary, len(shards), len(todo),
                       len(shards) - len(todo), time.perf_counter() - t0, written, loads,
                       [a["name"] for a in spec["analyses"]])
