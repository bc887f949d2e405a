"""One model's view of the shared controls, shared by the explorer and compare pages: the
request values checked, the maps computed by `interp.explore`, the figures by `interp.plots`.

No analysis here: this file only wires validated inputs to interp calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dashboards.figures import check_index, safe_filename
from dashboards.map_cache import MAP_CACHE
from hooked_models.attention import Stage
from interp.explore import (
    ExploreView,
    all_map_keys,
    closest_stage,
    downsample,
    downsample_labels,
    find_map_stage,
    map_stages,
)
from interp.plots.maps import WINDOW, head_mosaic_figure, map_figure_dict

THUMBNAIL = 32       # thumbnails are block means onto at most 32 x 32 cells
STAGE_VIEW = 128     # the zoomed head's other stages: at most 128 x 128
FULL = 1024          # the zoomed head itself: full size up to this many tokens


@dataclass
class Panel:
    """Everything one model shows for one request."""

    name: str
    layer: int
    head: int
    stage: Stage
    labels: list[str]
    view: ExploreView
    note: str = ""
    cache_key: tuple = ()   # the `MAP_CACHE` entry holding the maps (memoised figures)

    @property
    def zoom_map(self):
        return next(m for s, m in self.view.zoom if s.name == self.stage.name)[self.head]

    @property
    def filename(self) -> str:
        return safe_filename(f"{self.name}_L{self.layer}H{self.head}_{self.stage.name}")


def wanted_stage(store, names: list[str], stage) -> Stage:
    """The catalogue entry of `stage` in the first chosen model that has it as a map stage."""
    for name in names:
        model = store.get(name)
        for layer in range(model.cfg.n_layers):
            for s in map_stages(model, layer):
                if s.name == stage:
                    return s
    raise ValueError(f"stage {stage!r} is not a map stage of {', '.join(names)}")


def build_panel(store, name: str, text, layer, head, stage, closest: Stage | None = None
                ) -> Panel:
    """Validate the request for model `name` and compute its maps (ValueError for the user).

    With `closest`, a model lacking the stage shows the stage playing the same role
    (`interp.explore.closest_stage`) and says so; without it, the stage must exist.
    """
    model = store.get(name)
    layer = check_index("layer", layer, model.cfg.n_layers, name)
    head = check_index("head", head, model.cfg.n_heads, name)
    if not isinstance(stage, str):
        raise ValueError(f"stage {stage!r} must be a stage name")
    note = ""
    if closest is None:
        chosen = find_map_stage(model, layer, stage)
    else:
        chosen = closest_stage(model, layer, closest)
        if chosen.name != stage:
            note = f"{name} has no hook_{stage}; showing its closest stage hook_{chosen.name}"
    prompt = store.prompt(name, text)
    key, view = MAP_CACHE.view(store, name, prompt.tokens, chosen.name, layer)
    note = "; ".join(n for n in (prompt.note, note) if n)
    return Panel(name, layer, head, chosen, prompt.labels, view, note, key)


def zoom_figure(panel: Panel, window: int = WINDOW) -> dict:
    """The zoomed head at full size (block means beyond FULL tokens), as a figure dict; longer
    than `window` positions, it opens on a window of them (`map_figure_dict`). Every zoomed map
    has a windowed map's height: in the browser a shorter map that replaced a windowed one kept
    the window's key range (a line of code typed after a 480-token default prompt showed an
    empty map)."""
    m, labels = panel.zoom_map, panel.labels
    if len(labels) > FULL:
        m, labels = downsample(m, FULL), downsample_labels(labels, FULL)
    fig = map_figure_dict(m, panel.stage, labels, title=f"{panel.name} L{panel.layer}"
                          f"H{panel.head} hook_{panel.stage.name}", window=window)
    fig["layout"]["height"] = max(fig["layout"]["height"], WINDOWED_HEIGHT)
    return _fit_labels(fig)


WINDOWED_HEIGHT = 640   # the height `map_figure_dict` gives a windowed map


def _fit_labels(fig: dict) -> dict:
    """`fig` with margins grown to fit its tick labels: a text model's labels ("467:␣warnings")
    are longer than the fixed margins of `map_figure_dict`, and would run under the axis
    titles. The title keeps to the figure's left edge, so that a wider margin does not push
    it out of a narrow Compare column."""
    layout = fig["layout"]
    for axis in ("xaxis", "yaxis"):
        layout[axis]["automargin"] = True
    layout["title"] = {**layout["title"], "xref": "container",
                       "pad": {**layout["title"].get("pad", {}), "l": 20}}
    return fig


def _tiles(key: tuple, stage: str, grid: list) -> list:
    """`downsample(grid[layer], THUMBNAIL)` per layer, memoised in map-cache entry `key`."""
    return MAP_CACHE.memo(key, ("tiles", stage), lambda: [
        None if g is None else downsample(g, THUMBNAIL) for g in grid])


def warm_tiles(store, panel: Panel) -> None:
    """Thumbnail tiles of every other map stage, when the map cache holds all of the model's
    maps (after a prefetching forward): a new prompt pays once, so that a stage change only
    lays out tiles. Does nothing when some maps are missing."""
    model = store.get(panel.name)
    keys = all_map_keys(model)
    maps = MAP_CACHE.cached_maps(panel.cache_key)
    if any(k not in maps for k in keys):
        return
    for stage in dict.fromkeys(s for _, s in keys):
        if stage != panel.stage.name:
            _tiles(panel.cache_key, stage, [maps.get((layer, stage))
                                            for layer in range(model.cfg.n_layers)])


def mosaic_figure(panel: Panel, cell_px: int = 100) -> dict:
    """Every head's map at the panel's stage as ONE heatmap of THUMBNAIL x THUMBNAIL block-mean
    tiles (`interp.plots.maps.head_mosaic_figure`, the explorer); memoised with the maps."""
    def build() -> dict:
        tiles = _tiles(panel.cache_key, panel.stage.name, panel.view.grid)
        return head_mosaic_figure(panel.view.grid, panel.stage, THUMBNAIL, cell_px=cell_px,
                                  title=f"{panel.name}: every head<br>hook_{panel.stage.name} "
                                  "(click a tile to zoom)", tiles=tiles)

    return MAP_CACHE.memo(panel.cache_key, ("mosaic", panel.stage.name, cell_px), build)


def stage_figures(panel: Panel) -> list[dict]:
    """The zoomed head at every map stage of its layer (downsampled beyond STAGE_VIEW)."""
    labels = downsample_labels(panel.labels, STAGE_VIEW)
    return [_fit_labels(map_figure_dict(downsample(maps[panel.head], STAGE_VIEW), s, labels,
                                        height=420, title=f"L{panel.layer}H{panel.head} "
                                        f"hook_{s.name} ({s.softmax})"))
            for s, maps in panel.view.zoom]


def zoom_table(panel: Panel) -> pd.DataFrame:
    """The zoomed map as a query x key table (rows, columns: position labels) for CSV export."""
    return pd.DataFrame(panel.zoom_map.double().numpy(), index=panel.labels,
                        columns=panel.labels)
