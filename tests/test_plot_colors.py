"""Issue 22 item 2: one colour module for every figure. Explicit scales (plotly.js reads named
scales differently from plotly.py), white zero on every one-sided and signed scale, signed maps
zero-centred, masked cells grey and said so."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from attnlens.interp import plots
from attnlens.interp.plots.colors import DIVERGING, MASKED, SEQUENTIAL, coloraxis_args, scale_args

ROOT = Path(__file__).resolve().parents[1]
FIGURE_CODE = [*ROOT.glob("interp/plots/*.py"), *ROOT.glob("dashboards/**/*.py"),
               ROOT / "interp/sweep/figures.py"]


def test_scales_are_explicit_with_white_zero():
    assert SEQUENTIAL[0] == [0.0, "#ffffff"]
    assert [0.5, "#ffffff"] in DIVERGING and DIVERGING[0][0] == 0 and DIVERGING[-1][0] == 1
    one = scale_args(np.array([0.1, 0.7, np.nan]))
    assert one == dict(colorscale=SEQUENTIAL, zmin=0.0, zmax=0.7)
    signed = scale_args([-0.5, 3.0, -np.inf])
    assert signed == dict(colorscale=DIVERGING, zmin=-3.0, zmax=3.0, zmid=0.0)
    assert scale_args([0.0, 0.0])["zmax"] == 1.0 and scale_args([], signed=True)["zmax"] == 1.0
    assert coloraxis_args([-1, 2])["cmid"] == 0.0


@pytest.mark.parametrize("path", FIGURE_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_named_plotly_scale_in_figure_code(path):
    text = path.read_text()
    named = re.findall(r"colou?r(?:scale|_continuous_scale)\s*=\s*[\"']([A-Za-z_]+)[\"']", text)
    assert not named, f"{path.name} passes named colour scales {named}"


def test_every_heatmap_figure_uses_the_module_scales():
    df = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "s": [0.1, 0.9, 0.3, 0.0],
                       "t": [-0.2, 0.4, 0.1, 0.0], "copying": [0.5, -0.5, 0.2, 0.1]})
    figures = [plots.head_heatmap(df, "s"), plots.head_heatmap(df, "t", zmid=0.0),
               plots.copying_figure(df),
               plots.mixing_figure(torch.tensor([[1.0, -0.5], [0.2, 0.3]]), 0, "pre"),
               plots.kernel_figure(torch.randn(2, 3, 3)),
               plots.positional_attention_figure(torch.rand(1, 2, 4, 4), 0)]
    for fig in figures:
        h = fig.data[0]
        if h.coloraxis:     # a shared colour axis (small multiples)
            axis = fig.layout.coloraxis
            assert [list(c) for c in axis.colorscale] == DIVERGING and axis.cmid == 0
            assert axis.cmin == -axis.cmax
            continue
        scale = [list(c) for c in h.colorscale]
        assert scale in (SEQUENTIAL, DIVERGING), fig.layout.title.text
        if scale == DIVERGING:
            assert h.zmid is not None and h.zmin == pytest.approx(2 * h.zmid - h.zmax)
        else:
            assert h.zmin == 0
    axis = plots.head_table_figure(df, ["s", "t"]).layout.coloraxis
    assert [list(c) for c in axis.colorscale] == DIVERGING and axis.cmid == 0


def test_kernel_small_multiples_have_square_cells_and_one_colour_bar():
    fig = plots.kernel_figure(torch.randn(2, 2, 5), ["mixed", "edge"])
    assert fig.layout.yaxis.scaleanchor == "x" and fig.layout.yaxis2.scaleanchor == "x2"
    assert fig.layout.height >= 2 * 34 + 70 and fig.layout.xaxis.dtick == 1
    assert sum(bool(t.coloraxis) for t in fig.data) == 2


def test_masked_cells_are_grey_and_the_legend_says_so():
    from attnlens.hooked_models.attention import Stage

    stage = Stage("pattern", "softmax", "post", True, "[batch head_index query_pos key_pos]")
    m = torch.tril(torch.rand(4, 4)).masked_fill(torch.triu(torch.ones(4, 4, dtype=bool), 1),
                                                 float("-inf"))
    fig = plots.map_figure_dict(m, stage, [f"{i}:a" for i in range(4)])
    assert fig["layout"]["plot_bgcolor"] == MASKED
    assert "grey: masked" in fig["data"][0]["colorbar"]["title"]["text"]
    assert fig["data"][0]["colorscale"] == SEQUENTIAL and fig["data"][0]["zmin"] == 0.0


def test_gate_classes_share_one_vocabulary():
    from attnlens.interp.variants.infini import CLASS_NAMES

    df = pd.DataFrame({"head_label": ["L0H0", "L0H1"], "layer": [0, 0], "head": [0, 1],
                       "stage": ["gate", "gate"], "mean": [0.9, 0.1], "min": [0.8, 0.0],
                       "max": [1.0, 0.2], "class": ["high", "low"]})
    infini = {t.name for t in plots.gate_figure(df, CLASS_NAMES).data}
    assert infini == {"memory specialist", "local specialist"}
    mem = pd.DataFrame({"gate": [0.9, 0.1], "memory_ratio": [0.8, 0.1],
                        "class": ["memory specialist", "local specialist"]},
                       index=["L0H0", "L0H1"])
    assert {t.name for t in plots.memory_figure(mem).data} == infini
    other = {t.name for t in plots.gate_figure(df).data}
    assert other == {"high (mean >= 0.8)", "low (mean <= 0.2)"}
    for fig in (plots.gate_figure(df, CLASS_NAMES), plots.gate_figure(df)):
        assert all(t.marker.color for t in fig.data)


def test_old_module_names_are_the_package_modules():
    import attnlens.interp.plots.circuits
    import attnlens.interp.plots.maps
    import attnlens.interp.plots.outputs
    import attnlens.interp.plots.training

    assert attnlens.interp.plots.maps is plots.maps
    assert attnlens.interp.plots.circuits is plots.circuits
    assert attnlens.interp.plots.outputs is plots.outputs
    assert attnlens.interp.plots.training is plots.training
    for name in ("map_figure", "head_heatmap", "token_circuit_figure", "top_k_figure",
                 "phase_change_figure", "save_figure", "kernel_figure", "SEQUENTIAL"):
        assert hasattr(plots, name), name


def test_every_shipped_text_model_has_its_own_line_style_in_the_training_figures():
    """Colour is the variant and dash the shape: each shipped text model (the 2-layer twins on
    the data mix and the package corpus included) gets a pair no other model has."""
    from attnlens.hooked_models.zoo import ZOO_DIR
    from attnlens.interp.plots.training import SHAPE_DASH, SHAPE_MARKER
    from attnlens.lab.text_studies import _parts, released_models

    pairs = [_parts(name) for name in released_models(ZOO_DIR)]
    assert pairs and all(s in SHAPE_DASH and s in SHAPE_MARKER for _, s in pairs), pairs
    styles = [(variant, SHAPE_DASH[shape]) for variant, shape in pairs]
    assert len(set(styles)) == len(styles)


def test_diversity_comparison_draws_one_labelled_horizontal_bar_per_model_layer():
    import pandas as pd

    from attnlens.interp.plots.training import diversity_comparison_figure

    rows = [{"model": f"text-{v}-l{n}", "variant": v, "layer": layer, "circuit": c,
             "composed": composed, "mean_captured": 0.7, "baseline_mean_captured": 0.6}
            for v in ("mha", "dcmha") for n in (1, 2) for layer in range(n)
            for c in ("ov", "qk") for composed in ((False, True) if v == "dcmha" else (False,))]
    fig = diversity_comparison_figure(pd.DataFrame(rows))
    labels = {y for trace in fig.data for y in trace.y}
    assert labels == {"text-mha-l1 L0", "text-mha-l2 L0", "text-mha-l2 L1", "text-dcmha-l1 L0",
                      "text-dcmha-l2 L0", "text-dcmha-l2 L1"}
    assert all(trace.orientation == "h" for trace in fig.data)
    assert fig.layout.height >= 24 * len(labels)     # room for every label
    assert list(fig.layout.yaxis.categoryarray)[:2] == ["text-mha-l1 L0", "text-mha-l2 L0"]


def test_kernel_offsets_read_relative_to_the_query_and_its_key():
    """With `key_centre` the ticks are the offsets of the map cell (i-1, i; j-2 ... j+2): set as
    an array, since plotly ignores tick labels on a linear axis (the paper report's kernel
    figures were drawn with 0, 1, ... for that reason)."""
    fig = plots.kernel_figure(torch.randn(2, 2, 5), ["mixed", "edge"], key_centre=2)
    for axis in (fig.layout.xaxis, fig.layout.xaxis2):
        assert axis.tickmode == "array" and list(axis.ticktext) == ["j-2", "j-1", "j", "j+1",
                                                                   "j+2"]
    assert fig.layout.yaxis.tickmode == "array" and list(fig.layout.yaxis.ticktext) == ["i-1", "i"]
    assert plots.kernel_figure(torch.randn(1, 2, 5)).layout.xaxis.tickmode == "linear"
    with pytest.raises(ValueError, match="key_centre 5 is not a column of a 5-wide kernel"):
        plots.kernel_figure(torch.randn(1, 2, 5), key_centre=5)


def test_wide_kernels_shrink_to_fit_four_across_a_page():
    """text-mta-l2's 6 x 11 kernels at 34 px made the dashboard's figure 1,896 px wide: the
    fourth head was cut off. With `max_width` the cells shrink to fit."""
    wide = plots.kernel_figure(torch.randn(4, 6, 11))
    fits = plots.kernel_figure(torch.randn(4, 6, 11), max_width=1250)
    assert wide.layout.width > 1800 and fits.layout.width <= 1250
    small = plots.kernel_figure(torch.randn(2, 2, 5), max_width=1250)
    assert small.layout.width == plots.kernel_figure(torch.randn(2, 2, 5)).layout.width
