"""One model's view of the shared controls, shared by the explorer and compare pages: the
request values checked, the maps computed by `attnlens.interp.tools.explore`, the figures by
`attnlens.interp.plots`.

No analysis here: this file only wires validated inputs to interp calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnlens.dashboards.figures import safe_filename
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.hooked_models.attention import Stage
from attnlens.interp.plots.maps import WINDOW, head_mosaic_figure, map_figure_dict, token_ticks
from attnlens.interp.tools.explore import (
    ExploreView,
    all_map_keys,
    closest_stage,
    downsample,
    downsample_labels,
    find_map_stage,
    map_stages,
)

THUMBNAIL = 32       # thumbnails are block means onto at most 32 x 32 cells
STAGE_VIEW = 128     # the zoomed head's other stages: at most 128 x 128
STAGE_TICKS = 16     # tick labels per axis of a stage view: more overlap in its 420 px
STAGE_TICK_CHARS = 10   # a longer tick label is cut with "…" (the hover names it in full)
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


@dataclass(frozen=True)
class Choice:
    """The layer, head and stage a page shows for a request, and `note`: what it shows instead
    of what was asked for ("" when it shows just that)."""

    layer: int
    head: int
    stage: Stage
    note: str = ""


def _closest_index(what: str, value, size: int, name: str) -> tuple[int, str]:
    """`value` (an int, or digits from a URL) as an index below `size`, else the closest one and
    a note naming what was replaced."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < size:
            return value, ""
        got = min(max(value, 0), size - 1)
        return got, (f"{name} has no {what} {value} ({what}s 0 .. {size - 1}): showing "
                     f"{what} {got}")
    return 0, f"{what} {value!r} is not a {what} number: showing {what} 0"


def stage_entry(store, names, stage: str) -> Stage | None:
    """The catalogue entry named `stage`: from the chosen models first (a name's role may
    differ between variants: MHA's pattern is row-stochastic, MTA's is not), then any model of
    the store; None when no model has such a map stage."""
    for name in [*(names or []), *store.names]:
        if name not in store.models:
            continue
        model = store.models[name]
        for layer in range(model.cfg.n_layers):
            for s in map_stages(model, layer):
                if s.name == stage:
                    return s
    return None


def choose_view(store, name: str, layer, head, stage, names=None) -> Choice:
    """What model `name` shows for a request: the asked-for layer, head and stage where it has
    them, else the closest ones (the last layer for too large a layer; the stage playing the
    same role, `attnlens.interp.tools.explore.closest_stage`), with a note that says which. A link
    made for another model, or edited by hand, thus still shows a map. `names`: the chosen models,
    where the stage's role is looked up first."""
    model = store.get(name)
    layer, layer_note = _closest_index("layer", layer, model.cfg.n_layers, name)
    head, head_note = _closest_index("head", head, model.cfg.n_heads, name)
    wanted = stage_entry(store, names, stage) if isinstance(stage, str) else None
    if wanted is None:
        chosen = find_map_stage(model, layer, "pattern")
        # every model has `pattern`, so a stage found nowhere is never `pattern` itself
        stage_note = f"stage {stage!r} is not a map stage of any model here: showing hook_pattern"
    else:
        chosen = closest_stage(model, layer, wanted)
        stage_note = ("" if chosen.name == stage else
                      f"{name} has no hook_{stage}; showing its closest stage hook_{chosen.name}")
    note = "; ".join(n for n in (layer_note, head_note, stage_note) if n)
    return Choice(layer, head, chosen, note)


def build_panel(store, name: str, text, layer, head, stage, names=None) -> Panel:
    """Validate the request for model `name` and compute its maps (ValueError for the user).

    A layer, head or stage the model lacks is replaced by the closest one and the panel's note
    says so (`choose_view`); `names`: the chosen models (the Compare page's columns).
    """
    choice = choose_view(store, name, layer, head, stage, names or [name])
    prompt = store.prompt(name, text)
    key, view = MAP_CACHE.view(store, name, prompt.tokens, choice.stage.name, choice.layer)
    note = "; ".join(n for n in (prompt.note, choice.note) if n)
    return Panel(name, choice.layer, choice.head, choice.stage, prompt.labels, view, note, key)


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
    return _fit_labels(_explicit_axes(fig, len(labels)))


def _explicit_axes(fig: dict, n: int) -> dict:
    """`fig` (an `n`-position map) with each axis' type and range spelled out: the browser
    updates the zoomed map in place, and plotly.js carried the type and range of a windowed
    map (numbered positions, 64 of 481 shown) over to a short map drawn after it (a 38-token
    prompt: labelled positions), which collapsed the axes ("ax.dtick error: Infinity") and
    left the map blank until a reload (issue 56). Tick labels are drawn as they are
    (`ticklabeloverflow` "allow", a category axis' default): a numbered axis' default, "hide past
    div", measured every label's box on every draw (~270 ms of a 512-token head change in
    headless Chromium, issue 56 item 3), and the margins fit the labels anyway (`_fit_labels`)."""
    layout = fig["layout"]
    numbered = not isinstance(fig["data"][0]["x"][0], str)
    for axis in ("xaxis", "yaxis"):
        spec = {"type": "linear" if numbered else "category", "ticklabeloverflow": "allow"}
        if "range" not in layout[axis]:    # the whole map: every position in view
            whole = [-0.5, n - 0.5]
            spec.update(range=whole if axis == "xaxis" else whole[::-1], autorange=False)
        layout[axis] = {**layout[axis], **spec}
    return fig


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
    tiles (`attnlens.interp.plots.maps.head_mosaic_figure`, the explorer); memoised with the
    maps."""
    def build() -> dict:
        tiles = _tiles(panel.cache_key, panel.stage.name, panel.view.grid)
        return head_mosaic_figure(panel.view.grid, panel.stage, THUMBNAIL, cell_px=cell_px,
                                  title=f"{panel.name}: every head<br>hook_{panel.stage.name} "
                                  "(click a tile to zoom)", tiles=tiles)

    return MAP_CACHE.memo(panel.cache_key, ("mosaic", panel.stage.name, cell_px), build)


def _few_ticks(fig: dict, labels: list[str]) -> dict:
    """`fig` labelled by at most STAGE_TICKS short tick labels per axis: a small figure of a
    long text prompt had 48 labels per axis overlapping each other (issue 56)."""
    ticks = token_ticks(labels, STAGE_TICKS)
    ticks["ticktext"] = [t if len(t) <= STAGE_TICK_CHARS else t[:STAGE_TICK_CHARS - 1] + "…"
                         for t in ticks["ticktext"]]
    for axis in ("xaxis", "yaxis"):
        fig["layout"][axis].update(ticks)
    return fig


def stage_figures(panel: Panel) -> list[dict]:
    """The zoomed head at every map stage of its layer (downsampled beyond STAGE_VIEW)."""
    labels = downsample_labels(panel.labels, STAGE_VIEW)
    return [_fit_labels(_few_ticks(map_figure_dict(
                downsample(maps[panel.head], STAGE_VIEW), s, labels, height=420,
                title=f"L{panel.layer}H{panel.head} hook_{s.name} ({s.softmax})"), labels))
            for s, maps in panel.view.zoom]


def zoom_table(panel: Panel) -> pd.DataFrame:
    """The zoomed map as a query x key table (rows, columns: position labels) for CSV export."""
    return pd.DataFrame(panel.zoom_map.double().numpy(), index=panel.labels,
                        columns=panel.labels)
