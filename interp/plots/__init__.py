"""Plotly figures of attnlens: they draw what the analyses of `interp` return.

One package around one colour module (`attnlens.interp.plots.colors`: explicit scales, white zero,
zero-centred signed maps, grey masked cells):

    colors     the colour scales and discrete colours every figure uses
    maps       attention maps: one map, every head's thumbnails, rows and columns, token ticks
    analyses   per-head tables, ablations, composition, diversity, gates, kernels, stages
    circuits   full QK / OV circuits over tokens, copying and composition scores
    outputs    predictions: loss by position, top-k, repeated-text loss, ablation effects
    training   the text-zoo studies: curves across training, variant comparisons
    views      token view (CircuitsVis-style), head view (bertviz-style), head ranking, DLA

Every public name of these modules is importable from `attnlens.interp.plots` itself; the earlier
module names (`attnlens.interp.plots.maps`, `attnlens.interp.plots.circuits`,
`attnlens.interp.plots.outputs`, `attnlens.interp.plots.training`) are aliases of the modules here.

Example:
    >>> from attnlens.interp.tools.heads import induction_table
    >>> fig = head_heatmap(induction_table(model), "induction_stripe")   # doctest: +SKIP
    >>> save_figure(fig, "out/induction")                                # doctest: +SKIP
"""

from __future__ import annotations

from attnlens.interp.plots import analyses, circuits, colors, maps, outputs, training, views
from attnlens.interp.plots.analyses import *  # noqa: F403
from attnlens.interp.plots.circuits import *  # noqa: F403
from attnlens.interp.plots.colors import *  # noqa: F403
from attnlens.interp.plots.maps import *  # noqa: F403
from attnlens.interp.plots.outputs import *  # noqa: F403
from attnlens.interp.plots.training import *  # noqa: F403
from attnlens.interp.plots.views import *  # noqa: F403


def _public(module) -> list[str]:
    return [n for n in vars(module) if not n.startswith("_") and getattr(
        vars(module)[n], "__module__", module.__name__) == module.__name__]


__all__ = sorted({n for m in (analyses, circuits, colors, maps, outputs, training, views)
                  for n in getattr(m, "__all__", _public(m))})
