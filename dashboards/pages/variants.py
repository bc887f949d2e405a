"""Variant views: what is particular to CoPE, MTA, DCMHA and Infini-attention, one view each,
for one model, layer and head (the shared controls) on the applied prompt.

A view needs the stages or weights its analysis reads (found through the catalogue, never by
variant name); a model without them gets a message saying what the view needs. Every number
comes from interp (cope, mta, composed, stage_change, infini, gating); this file only lays out
the figures and the plain-words explanations.
"""

from __future__ import annotations

import torch
from dash import Input, Output, dcc, html

from attnlens.dashboards.figures import check_index, error_box, graph, graph_config, loading
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.visible import TAB, drawn_output, drawn_state, drawn_store, when_shown
from attnlens.interp.circuits.composed import borrowing_table, mixing_matrices
from attnlens.interp.plots import (
    head_heatmap,
    kernel_figure,
    memory_figure,
    mixing_figure,
    positional_attention_figure,
    stage_change_figure,
)
from attnlens.interp.plots.maps import map_figure
from attnlens.interp.tools.explore import downsample, downsample_labels, find_map_stage
from attnlens.interp.tools.gating import gate_values
from attnlens.interp.tools.stage_change import catalogue_changes
from attnlens.interp.variants.cope import (
    cope_layers,
    counted_units,
    gate_openers,
    positional_attention,
)
from attnlens.interp.variants.infini import memory_layers, memory_specialisation
from attnlens.interp.variants.mta import kernel_centre, kernel_table, key_query_kernels

TITLE = "Variants"
ID = "variants"
VIEW_SIZE = 256          # maps of this page: at most 256 x 256 cells (block means beyond)
KERNELS_PX = 1250        # the kernels' small multiples fit a 1280-px page (four across)

EXPLAIN = {
    "cope": "CoPE (contextual position encoding) lets each head decide what to count. For a "
            "query i and key j a gate g_ij = sigmoid(q_i . k_j) says whether token j counts; "
            "the position of j seen from i is the sum of the gates between them, so a head "
            "whose gates open only on '.' measures distance in sentences, not tokens. Below: "
            "the gates and positions of the chosen head, how much of the input each head "
            "counts (1 = every token: plain relative positions), the tokens that open its "
            "gates, and the attention it would pay on position alone.",
    "mta": "Multi-Token Attention convolves each head's score map over neighbouring queries "
           "and keys (the key-query kernel) and mixes the maps of a group of heads, before "
           "and/or after the softmax. Below: each head's kernel with its class (identity = "
           "plain attention; diagonal = matches a block of tokens; induction = matches the "
           "token before each key, so the head attends to what followed an earlier copy; "
           "priming = keys that earlier queries liked), the head-mixing matrices, and how much "
           "each step changes each head's map (Jensen-Shannon divergence between consecutive "
           "stages, in bits).",
    "dcmha": "DCMHA composes heads dynamically: at every query-key pair the scores (before the "
             "softmax) and the weights (after it) of a head are a mix of all heads' maps, with "
             "mixing weights computed from the query and key tokens. Below: who borrows from "
             "whom in the chosen layer (mean mixing weight of each source head into each head "
             "over query-key pairs of the prompt: the diagonal is a head keeping its own map) "
             "and how far the composed map moves from the plain softmax.",
    "infini": "Infini-attention cuts the input into segments: inside a segment a head attends "
              "normally (local attention); earlier segments are only reachable through a "
              "compressive memory. A learned gate per head sets the share of memory vs local "
              "attention. Below: the chosen head's effective map with the segment boundaries "
              "(memory reads appear left of the current segment), each head's gate against "
              "the share of its output that comes from the memory, and the heads by class.",
}
VIEWS = list(EXPLAIN)


def available_views(model) -> list[str]:
    """The views whose stages/weights `model` has (catalogue and weights only: no forward)."""
    out = []
    if cope_layers(model):
        out.append("cope")
    if key_query_kernels(model):
        out.append("mta")
    if any(_mixes(model, x) for x in range(model.cfg.n_layers)):
        out.append("dcmha")
    if memory_layers(model):
        out.append("infini")
    return out


def _mixes(model, layer: int) -> bool:
    """Whether `layer` mixes heads (`head_mixing_at` gives a matrix for some phase), asked on
    one zero token: a few small products, no forward pass of the model."""
    x = torch.zeros(1, 1, model.cfg.d_model, dtype=model.cfg.dtype)
    with torch.no_grad():
        mix = model.blocks[layer].attn.head_mixing_at(x, 0, 0)
    return any(m is not None for m in mix.values())


def layout(store):
    first = store.get(store.names[0])
    views = available_views(first)
    return html.Div([
        html.Div([html.Span("model: the bar's \"one-model pages\" choice;",
                            style={"color": "#555"}),
                  html.Label("view"),
                  dcc.RadioItems([{"label": f" {v}", "value": v} for v in VIEWS],
                                 views[0] if views else VIEWS[0], id="variants-view",
                                 inline=True, inputStyle={"marginLeft": "10px"})],
                 style={"display": "flex", "gap": "10px", "alignItems": "center"}),
        html.P("Layer, head and prompt come from the bar above (an empty prompt uses the "
               "model's default text).", style={"color": "#555"}),
        html.P(id="variants-explain"),
        error_box("variants-error"),
        drawn_store(ID), drawn_store(ID, "change"),
        loading(html.Div(id="variants-body")),
        loading(graph("variants-change", style={"display": "none"})),
    ])


def _map(store, name, prompt, layer, head, stage_name, title):
    """One stage map of the chosen head (cached maps), downsampled beyond VIEW_SIZE."""
    model = store.get(name)
    stage = find_map_stage(model, layer, stage_name)
    _, maps = MAP_CACHE.maps(store, name, prompt.tokens, [(layer, stage_name)])
    m = downsample(maps[(layer, stage_name)][head], VIEW_SIZE)
    return map_figure(m, stage, downsample_labels(prompt.labels, VIEW_SIZE), title=title,
                      height=460)


def _table(df, columns) -> html.Table:
    head = html.Tr([html.Th(c) for c in columns])
    rows = [html.Tr([html.Td(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]))
                     for c in columns]) for _, r in df.iterrows()]
    return html.Table([head, *rows], className="variants-table",
                      style={"fontFamily": "monospace", "fontSize": "12px"})


def _row(*children) -> html.Div:
    return html.Div(list(children), style={"display": "flex", "gap": "12px", "flexWrap": "wrap"})


def _once(store, name, prompt, what: tuple, build):
    """`build()` once per (model, prompt, what): what a view shows that does not depend on
    the head is computed on the first request and reused by every head change."""
    return MAP_CACHE.per_prompt(store, name, prompt.tokens, ("variants", *what), build)


def _cope(store, name, prompt, layer, head, model) -> list:
    if layer not in cope_layers(model):
        raise ValueError(f"layer {layer} of {name} has no contextual positions; CoPE layers: "
                         f"{cope_layers(model)}")
    units = _once(store, name, prompt, ("cope-units",),
                  lambda: counted_units(model, prompt.tokens).reset_index())
    openers = _once(store, name, prompt, ("cope-openers",),
                    lambda: gate_openers(model, prompt.tokens, top=8))
    mine = openers[(openers["layer"] == layer) & (openers["head"] == head)]

    def positional():
        pos = positional_attention(model, prompt.tokens, layer).mean(0, keepdim=True)
        return downsample(pos[0], VIEW_SIZE)[None]

    pos = _once(store, name, prompt, ("cope-positional", layer), positional)
    return [
        _row(graph("variants-cope-gates", figure=_map(store, name, prompt, layer, head, "gates",
                                                      f"L{layer}H{head} gates g_ij")),
             graph("variants-cope-positions", figure=_map(
                 store, name, prompt, layer, head, "positions",
                 f"L{layer}H{head} positions p_ij (sum of gates)"))),
        _row(graph("variants-cope-counted", figure=head_heatmap(
                 units, "counted_share", "share of keys counted (gate > 0.5)")),
             graph("variants-cope-relative", figure=head_heatmap(
                 units, "relative_likeness", "units counted / tokens (1 = relative PE)"))),
        html.H4(f"Tokens that open L{layer}H{head}'s gates (mean gate over the queries that "
                "see them)"),
        _table(mine, ["token_str", "mean_gate", "count"]),
        graph("variants-cope-positional", figure=positional_attention_figure(
            pos, head, labels=downsample_labels(prompt.labels, VIEW_SIZE))),
    ]


def _mta(store, name, prompt, layer, head, model) -> list:
    """Nothing here depends on the head: built once per prompt and layer."""
    return _once(store, name, prompt, ("mta", layer),
                 lambda: _mta_figures(name, prompt, layer, model))


def _mta_figures(name, prompt, layer, model) -> list:
    kernels = key_query_kernels(model)
    table = kernel_table(model)
    out = []
    for (lay, phase), k in kernels.items():
        if lay == layer:
            classes = list(table[(table.layer == lay) & (table.phase == phase)]["class"])
            out.append(graph(f"variants-mta-kernel-{phase}", figure=kernel_figure(
                k, classes, title=f"Layer {lay} key-query kernels ({phase}-softmax)",
                key_centre=kernel_centre(model, lay, k.shape[-1]), max_width=KERNELS_PX)))
    if not out:
        raise ValueError(f"layer {layer} of {name} has no key-query kernel; layers with one: "
                         f"{sorted({lay for lay, _ in kernels})}")
    for phase, M in mixing_matrices(model, layer).items():
        if M is not None:
            out.append(graph(f"variants-mta-mixing-{phase}", figure=mixing_figure(M, layer, phase)))
    return out


def _dcmha(store, name, prompt, layer, head, model) -> list:
    """Nothing here depends on the head: built once per prompt and layer."""
    return _once(store, name, prompt, ("dcmha", layer),
                 lambda: _dcmha_figures(name, prompt, layer, model))


def _dcmha_figures(name, prompt, layer, model) -> list:
    out = []
    for phase in ("pre", "post"):
        table = borrowing_table(model, prompt.tokens, layer, phase=phase, max_pairs=128)
        if len(table):
            fig = mixing_figure(_square(table), layer, phase)
            fig.update_layout(title=f"Layer {layer}: who borrows from whom ({phase}-softmax, "
                                    "mean mixing weight over query-key pairs)")
            out.append(graph(f"variants-dcmha-borrow-{phase}", figure=fig))
    if not out:
        raise ValueError(f"layer {layer} of {name} does not mix heads; this view needs "
                         "dynamically composed heads (DCMHA)")
    return out


# The views whose stage-change table (every head and layer: no layer or head in it) is drawn
# by its own callback, so that the view's other figures do not wait for it.
CHANGE_MODES = {"mta": "consecutive", "dcmha": "to_pattern"}


def stage_change(store, name, view, text) -> dict | None:
    """The stage-to-stage change figure of `view` (None for views without one), once per
    prompt; ValueError for the user."""
    if not isinstance(view, str) or view not in CHANGE_MODES:
        return None
    model = store.get(name)
    if view not in available_views(model):
        return None
    prompt = store.prompt(name, text)
    mode = CHANGE_MODES[view]

    def build():
        with store.using(name):
            return stage_change_figure(catalogue_changes(model, prompt.tokens, mode=mode))

    return _once(store, name, prompt, ("change", mode), build)


def _square(table):
    """`[source head, target head]` tensor of a `borrowing_table` (heads in label order)."""
    heads = list(dict.fromkeys(table["target"]))
    grid = table.pivot(index="source", columns="target", values="mean_weight")
    return torch.tensor(grid.loc[heads, heads].to_numpy())


def _infini(store, name, prompt, layer, head, model) -> list:
    if layer not in memory_layers(model):
        raise ValueError(f"layer {layer} of {name} has no compressive memory; memory layers: "
                         f"{memory_layers(model)}")
    fig = _map(store, name, prompt, layer, head, "pattern",
               f"L{layer}H{head} effective pattern, segment boundaries dashed")
    seg = getattr(model.blocks[layer].attn.opts, "segment_len", None)
    n = len(prompt.labels)
    f = max(1, -(-n // VIEW_SIZE))       # downsampling factor of the map
    for start in range(seg or n, n, seg or n):
        edge = (start / f) - 0.5
        fig.add_vline(x=edge, line=dict(dash="dash", color="#333", width=1))
        fig.add_hline(y=edge, line=dict(dash="dash", color="#333", width=1))
    fig.update_xaxes(type="category")
    memory = _once(store, name, prompt, ("infini-memory",),
                   lambda: memory_specialisation(model, prompt.tokens))
    gates = _once(store, name, prompt, ("infini-gates",),
                  lambda: gate_values(model, prompt.tokens))
    counts = memory.groupby("class").size().rename("heads").reset_index()
    return [
        _row(graph("variants-infini-pattern", figure=fig, config=graph_config(
                 f"{name}_L{layer}H{head}_segments")),
             graph("variants-infini-memory", figure=memory_figure(memory))),
        html.H4("Heads by gate class (paper Fig. 3: memory >= 0.8, local <= 0.2)"),
        _table(counts, ["class", "heads"]),
        _table(memory.reset_index(), ["head_label", "gate", "class", "memory_ratio"]),
        html.Div(f"{len(gates)} per-head gate rows (all gate stages) on the Gating page.",
                 style={"color": "#555"}),
    ]


SECTIONS = {"cope": _cope, "mta": _mta, "dcmha": _dcmha, "infini": _infini}


def compute(store, name, view, text, layer, head) -> list:
    """The view's components; ValueError (shown in the page) for bad input or a model that
    lacks what the view needs."""
    model = store.get(name)
    if not isinstance(view, str) or view not in SECTIONS:
        raise ValueError(f"view {view!r} is not one of {VIEWS}")
    if view not in available_views(model):
        have = available_views(model)
        raise ValueError(f"{name} ({model.cfg.attention}) has nothing for the {view} view: it "
                         f"needs a {view} model. Views for {name}: {have or 'none'} "
                         "(head diversity and gating work for every model)")
    layer = check_index("layer", layer, model.cfg.n_layers, name)
    head = check_index("head", head, model.cfg.n_heads, name)
    prompt = store.prompt(name, text)
    with store.using(name):
        children = SECTIONS[view](store, name, prompt, layer, head, model)
    note = [html.Div(prompt.note, style={"color": "#555"})] if prompt.note else []
    return note + children


def register(app, store):
    @app.callback(Output("variants-view", "value"), Input("ctl-model", "value"))
    def _default_view(name):
        try:
            views = available_views(store.get(name))
        except ValueError:
            return VIEWS[0]
        return views[0] if views else VIEWS[0]

    @app.callback(Output("variants-body", "children"), Output("variants-explain", "children"),
                  Output("variants-error", "children"), drawn_output(ID),
                  Input("ctl-model", "value"), Input("variants-view", "value"),
                  Input("ctl-applied-prompt", "data"), Input("ctl-layer", "value"),
                  Input("ctl-head", "value"), TAB, drawn_state(ID))
    def _update(name, view, text, layer, head, tab, drawn):
        """The view's figures for the layer and head (the stage-change table: `_change`)."""
        drawn = when_shown(ID, tab, drawn, name, view, text, layer, head)
        explain = EXPLAIN.get(view, "") if isinstance(view, str) else ""
        try:
            return compute(store, name, view, text, layer, head), explain, "", drawn
        except ValueError as err:
            return [], explain, str(err), drawn

    @app.callback(Output("variants-change", "figure"), Output("variants-change", "style"),
                  drawn_output(ID, "change"),
                  Input("ctl-model", "value"), Input("variants-view", "value"),
                  Input("ctl-applied-prompt", "data"), TAB, drawn_state(ID, "change"))
    def _change(name, view, text, tab, drawn):
        """Every head's stage-to-stage change: independent of the layer and head, so a head
        change does not even call it."""
        drawn = when_shown(ID, tab, drawn, name, view, text)
        try:
            figure = stage_change(store, name, view, text)
        except ValueError:
            figure = None
        return (figure, {}, drawn) if figure is not None else ({}, {"display": "none"}, drawn)
