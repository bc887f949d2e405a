"""A small least-recently-used cache of attention maps per (model, prompt), so that changing the
head, layer or stage of a view does not run the model again.

An entry holds the batch-mean `[head q k]` maps computed by
`attnlens.interp.tools.explore.compute_maps` for one model and one token tensor, plus derived
objects (the thumbnail figures) memoised under a key. On a new prompt the whole model's maps are
computed in one forward pass when they fit in `prefetch_bytes` (then every later layer/stage change
is free), otherwise only what the request needs; later misses of the same entry add their maps in
one more pass. Entries are evicted, least recently used first, once the total exceeds `max_bytes` or
`max_entries`.

Entries are keyed by the model object (held weakly), its parameters' in-place version counters
(an edited weight invalidates the maps) and the tokens, so a stale map is never served.

Example:
    >>> view = MAP_CACHE.view(store, "induction-mha", tokens, "pattern", layer=1)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

from attnlens.interp.tools.explore import (
    ExploreView,
    all_map_keys,
    assemble_view,
    compute_maps,
    map_bytes,
    view_keys,
)

MAX_BYTES = 1 << 30          # 1 GiB of maps in all
PREFETCH_BYTES = 256 << 20   # a new prompt computes every map stage when they fit in this
MAX_ENTRIES = 16


def _weights_version(model) -> int:
    """Sum of the in-place version counters of every parameter and buffer: any in-place
    edit of a weight (an ablation, `set_gates`) changes it."""
    return sum(t._version for t in (*model.parameters(), *model.buffers()))


@dataclass
class Entry:
    model_ref: weakref.ref
    maps: dict = field(default_factory=dict)
    memo: dict = field(default_factory=dict)
    nbytes: int = 0


class MapCache:
    """Thread-safe LRU of `Entry`s; see the module docstring."""

    def __init__(self, max_bytes: int = MAX_BYTES, prefetch_bytes: int = PREFETCH_BYTES,
                 max_entries: int = MAX_ENTRIES):
        if max_entries < 1 or max_bytes < 0 or prefetch_bytes < 0:
            raise ValueError(f"max_entries={max_entries!r} must be >= 1 and byte limits >= 0")
        self.max_bytes, self.prefetch_bytes, self.max_entries = (max_bytes, prefetch_bytes,
                                                                 max_entries)
        self._entries: OrderedDict[tuple, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.forwards = 0    # forward passes run (for tests and the benchmark)

    def key(self, store, name: str, tokens) -> tuple:
        model = store.get(name)
        return (name, id(model), _weights_version(model), tuple(tokens.shape),
                tokens.cpu().numpy().tobytes())

    def _entry(self, key: tuple, model) -> Entry:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.model_ref() is not model:
                entry = self._entries[key] = Entry(weakref.ref(model))
            self._entries.move_to_end(key)
            return entry

    def _evict(self, keep: tuple) -> None:
        with self._lock:
            total = sum(e.nbytes for e in self._entries.values())
            for key in list(self._entries):
                if total <= self.max_bytes and len(self._entries) <= self.max_entries:
                    break
                if key != keep:
                    total -= self._entries.pop(key).nbytes

    def maps(self, store, name: str, tokens, keys: list) -> tuple[tuple, dict]:
        """(entry key, `{(layer, stage): [head q k]}` holding at least `keys`)."""
        model = store.get(name)
        key = self.key(store, name, tokens)
        entry = self._entry(key, model)
        if any(k not in entry.maps for k in keys):
            with store.using(name):            # one forward at a time per model
                missing = [k for k in keys if k not in entry.maps]
                if missing:
                    if not entry.maps:
                        every = all_map_keys(model)
                        if map_bytes(model, every, tokens.shape[-1]) <= self.prefetch_bytes:
                            missing = every
                    new = compute_maps(model, tokens, missing)
                    self.forwards += 1
                    entry.maps.update(new)
                    entry.nbytes += sum(t.numel() * t.element_size() for t in new.values())
            self._evict(keep=key)
        return key, entry.maps

    def view(self, store, name: str, tokens, stage: str, layer: int) -> tuple[tuple, ExploreView]:
        """(entry key, `attnlens.interp.tools.explore.explore_maps(model, tokens, stage, layer)`),
        cached."""
        model = store.get(name)
        key, maps = self.maps(store, name, tokens, view_keys(model, stage, layer))
        return key, assemble_view(model, maps, stage, layer)

    def memo(self, key: tuple, what: tuple, build):
        """`build()`, memoised in entry `key` under `what` (built again if evicted)."""
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            return build()
        if what not in entry.memo:
            entry.memo.setdefault(what, build())
        return entry.memo[what]

    def per_prompt(self, store, name: str, tokens, what: tuple, build):
        """`build()` memoised for model `name` on `tokens` under `what`: the analyses of a view
        that do not depend on the head (computed once per prompt, then a head change only
        lays out figures). The entry is created if needed; evicted with its maps."""
        model = store.get(name)
        key = self.key(store, name, tokens)
        entry = self._entry(key, model)
        with self._lock:
            if what in entry.memo:
                return entry.memo[what]
        value = build()
        with self._lock:
            return entry.memo.setdefault(what, value)

    def cached_maps(self, key: tuple) -> dict:
        """A copy of entry `key`'s `{(layer, stage): [head q k]}` maps ({} if evicted)."""
        with self._lock:
            entry = self._entries.get(key)
            return dict(entry.maps) if entry is not None else {}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


MAP_CACHE = MapCache()
