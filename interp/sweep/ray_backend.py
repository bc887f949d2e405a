"""Run sweep shards as Ray tasks: `workers` actors, each loading its models once.

Each actor keeps a `ModelCache`, so a worker loads a model on its first shard of it and reuses
it after; shards are handed to whichever actor is free (`ray.util.ActorPool`), in plan order,
which keeps a model's shards together. Actors ask Ray for one CPU each and, for CUDA shards, one
GPU. With no address a local cluster is started (small: `object_store_memory` 200 MB, no
dashboard) and shut down afterwards; with an address (`ray://host:10001`, `auto`, or
`host:6379`) the running cluster is used and left running. Workers must import attnlens (it is
installed on every node of the cluster, or sent with `runtime_env`). Tables come back as
Parquet bytes; the driver alone writes the sweep folder.

Example:
    >>> for shard, data, seconds in run_ray(shards, workers=2):   # doctest: +SKIP
    ...     ...
"""

from __future__ import annotations

import time
from collections.abc import Iterator

LOCAL_OBJECT_STORE = 200 * 1024 * 1024


class ShardWorker:
    """A Ray actor's state: its model cache (the class is wrapped by `ray.remote` at run time)."""

    def __init__(self, cache_capacity: int = 2):
        from attnlens.interp.sweep.shards import ModelCache

        self.cache = ModelCache(cache_capacity)

    def run(self, shard: dict) -> tuple[str, bytes, float]:
        from attnlens.interp.sweep.shards import run_shard_bytes

        t0 = time.perf_counter()
        data = run_shard_bytes(shard, self.cache)
        return shard["key"], data, time.perf_counter() - t0

    def loads(self) -> int:
        return self.cache.loads


def _init(ray, address: str | None, workers: int) -> bool:
    """Connect to (or start) a cluster; True when this call started it."""
    if ray.is_initialized():
        return False
    if address in (None, "", "local"):
        ray.init(num_cpus=workers, object_store_memory=LOCAL_OBJECT_STORE,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    return True


def run_ray(shards: list[dict], address: str | None = None, workers: int = 2,
            gpus_per_worker: float | None = None, cache_capacity: int = 2,
            stats: dict | None = None) -> Iterator[tuple[dict, bytes, float]]:
    """Yield (shard, parquet bytes, seconds) as the shards finish, in completion order.

    `gpus_per_worker` defaults to 1 when the shards run on CUDA, else 0. `stats`, if given,
    receives `loads`: the number of model loads of each actor.
    """
    import ray
    from ray.util import ActorPool

    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not shards:
        return
    if gpus_per_worker is None:
        gpus_per_worker = 1 if shards[0]["device"].startswith("cuda") else 0
    started = _init(ray, address, workers)
    actors = []
    try:
        cls = ray.remote(num_cpus=1, num_gpus=gpus_per_worker)(ShardWorker)
        actors = [cls.remote(cache_capacity) for _ in range(workers)]
        pool = ActorPool(actors)
        by_key = {s["key"]: s for s in shards}
        for key, data, seconds in pool.map_unordered(lambda a, s: a.run.remote(s), shards):
            yield by_key[key], data, seconds
        if stats is not None:
            stats["loads"] = ray.get([a.loads.remote() for a in actors])
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()
