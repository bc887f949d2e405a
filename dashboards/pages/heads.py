"""Induction heads: on a probe the user chooses (repeated random tokens of a chosen length, or the
prompt), every chosen model's previous-token / duplicate-token / induction scores at the chosen
stage; the first model's K-composition between heads; the head of the shared layer / head
controls knocked out at any stage, with the scores and the loss before and after; and, for
models with a training log, the induction score across training."""

from __future__ import annotations

from urllib.parse import parse_qs

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

from attnlens.dashboards.app_links import explorer_link
from attnlens.dashboards.figures import (
    check_index,
    check_models,
    control_row,
    error_box,
    graph,
    loading,
    note_box,
    number_input,
)
from attnlens.dashboards.panels import choose_view
from attnlens.interp._common import map_stage_names
from attnlens.interp.circuits.qk_ov import composition_table
from attnlens.interp.plots.circuits import composition_vs_baseline_figure
from attnlens.interp.plots.outputs import (
    ablation_effect_figure,
    scores_figure,
    training_curve_figure,
)
from attnlens.interp.tools.explore import find_map_stage
from attnlens.interp.tools.induction_study import (
    METRICS_FILE,
    ablation_effect,
    make_probe,
    probe_scores,
    training_curve,
)
from attnlens.interp.tools.text_eval import distribution_stage

TITLE = "Induction heads"
ID = "heads"
PROBE_BATCH = 8
SCORES = ["previous_token", "duplicate_token", "induction"]
HOW = ("zero", "mean")
# the page's own controls in the deep link (`attnlens.dashboards.app`): URL key -> (component,
# default)
LINK = {"probe": ("heads-probe", "random"), "half": ("heads-half", 10),
        "ablate_at": ("heads-ablate-at", "z"), "ablate_how": ("heads-ablate-how", "zero"),
        "ablate_score": ("heads-ablate-score", "induction"),
        "ablate_head": ("heads-ablate-head", "auto"), "rank_by": ("heads-rank-by", "induction")}
RANK_TOP = 10   # heads listed in the ranking table
AUTO = "auto"   # the knock-out head: the strongest previous-token head feeding a later layer


def _head_options(store, names=None) -> list[dict]:
    """"auto" and every head L{layer}H{head} of the first model (the largest one served before
    a model is chosen, so that a deep link's head is an option when restored)."""
    models = [store.get(n) for n in (names or []) if n in store.models][:1] or list(
        store.models.values())
    cfg = max((m.cfg for m in models), key=lambda c: c.n_layers * c.n_heads)
    return [{"label": "auto (strongest previous-token head)", "value": AUTO}] + [
        f"L{la}H{h}" for la in range(cfg.n_layers) for h in range(cfg.n_heads)]


def auto_knockout(table, n_layers: int) -> tuple[int, int]:
    """The head the knock-out defaults to, from
    `attnlens.interp.tools.induction_study.probe_scores`' table: the strongest previous-token head
    below the last layer (the head an induction head reads through K-composition: knocking it out
    moves the later heads' bars); in a one-layer model the strongest induction head (its own bar
    drops)."""
    if n_layers > 1:
        part = table[table["layer"] < n_layers - 1]
        best = part["previous_token"].astype(float).idxmax()
    else:
        best = table["induction"].astype(float).idxmax()
    return int(table.loc[best, "layer"]), int(table.loc[best, "head"])


def parse_head(value, model, name) -> tuple[int, int] | None:
    """(layer, head) of a "L{layer}H{head}" choice, None for "auto"; ValueError otherwise."""
    if value in (None, AUTO):
        return None
    import re

    match = re.fullmatch(r"L(\d+)H(\d+)", str(value))
    if match is None:
        raise ValueError(f"knock-out head {value!r} is not 'auto' nor L<layer>H<head>")
    layer = check_index("layer", int(match.group(1)), model.cfg.n_layers, name)
    return layer, check_index("head", int(match.group(2)), model.cfg.n_heads, name)


def _all_points(store) -> list[str]:
    """Knock-out points of any served model: the dropdown's first options, so that a deep
    link's point is valid when restored (the callback then narrows them to the first model's)."""
    names = [p for name in store.names for p in map_stage_names(store.get(name))]
    return list(dict.fromkeys(["z", "v", *names]))


def layout(store):
    return html.Div([
        html.P("Scores: the share of each head's attention on the previous token, on earlier "
               "copies of the current token (duplicate) and on the token after an earlier copy "
               "(induction: the head that lets a model continue a repeated text). The random "
               "probe is [BOS] r r with r random tokens; 'stripe' is the attention on exactly "
               "the token after the earlier copy. Stages after cross-head mixing are not "
               "probability distributions, so their scores can leave [0, 1]."),
        control_row("probe",
                    dcc.RadioItems([{"label": "repeated random tokens", "value": "random"},
                                    {"label": "the prompt", "value": "text"}],
                                   LINK["probe"][1], id="heads-probe", inline=True),
                    "random tokens per copy",
                    number_input("heads-half", LINK["half"][1], minimum=2, width="80px")),
        control_row("rank heads by",
                    dcc.Dropdown(SCORES + ["induction_stripe"], LINK["rank_by"][1],
                                 id="heads-rank-by", clearable=False, style={"width": "200px"})),
        error_box("heads-error"),
        note_box("heads-note"),
        loading(html.Div(id="heads-scores")),
        html.H4("Knock a head out"),
        html.P("The first chosen model with one head knocked out (by default the strongest "
               "previous-token head below the last layer, whose knock-out the induction heads "
               "feel; or any head you choose), set to zero or to its mean, at the chosen "
               "point: its output z, its values v, "
               "or any attention map stage (before a head-mixing step this also removes what "
               "other heads borrow from it). Bars: every head's score before and after; the "
               "title gives the probe's loss before and after."),
        control_row("knock out",
                    dcc.Dropdown(_head_options(store), LINK["ablate_head"][1],
                                 id="heads-ablate-head", clearable=False,
                                 style={"width": "300px"}),
                    "at",
                    dcc.Dropdown(_all_points(store), LINK["ablate_at"][1],
                                 id="heads-ablate-at", clearable=False, style={"width": "200px"}),
                    dcc.RadioItems(list(HOW), LINK["ablate_how"][1], id="heads-ablate-how",
                                   inline=True),
                    "score shown",
                    dcc.Dropdown(SCORES + ["induction_stripe"], LINK["ablate_score"][1],
                                 id="heads-ablate-score", clearable=False,
                                 style={"width": "200px"})),
        error_box("heads-ablate-error"),
        loading(graph("heads-ablation")),
        html.H4("K-composition between heads (first chosen model)"),
        html.P("How much an earlier head's output (OV) feeds a later head's keys (QK), from the "
               "weights alone, minus the score of random matrices of the same sizes: red is "
               "more composition than chance. Induction heads read the previous-token head "
               "this way."),
        loading(graph("heads-composition")),
        html.H4("Induction score across training"),
        note_box("heads-training-note"),
        loading(graph("heads-training")),
    ])


def probe_for(store, name, kind, half, text):
    """The probe of model `name` from the page's values (ValueError for the user)."""
    if kind == "text":
        prompt = store.prompt(name, text)
        return make_probe(store.get(name), "text", tokens=prompt.tokens), prompt.note
    if kind != "random":
        raise ValueError(f"probe {kind!r} is not one of ['random', 'text']")
    model = store.get(name)
    longest = (model.cfg.n_ctx - 1) // 2
    if not isinstance(half, int) or isinstance(half, bool) or not 2 <= half <= longest:
        raise ValueError(f"random tokens per copy {half!r}: {name} fits 2 .. {longest}")
    return make_probe(model, "random", half_len=half, batch=PROBE_BATCH), ""


def scored_stage(store, name, stage, names) -> tuple[str, str]:
    """The stage `name` is scored at: `stage`, or the closest one it has (`choose_view`), and a
    note saying so ("" when it has `stage`)."""
    choice = choose_view(store, name, 0, 0, stage, names)
    return choice.stage.name, choice.note


def ranking(name: str, table, by: str, stage: str, text) -> html.Table:
    """The heads of `table` (`probe_scores`) by `by`, best first: every score, and the head's
    name linking to it in the explorer at `stage`."""
    if by not in table:
        raise ValueError(f"no score {by!r} to rank by; scores: {list(SCORES)}")
    columns = [c for c in [*SCORES, "induction_stripe"] if c in table]
    ranked = table.sort_values(by, ascending=False).head(RANK_TOP)
    rows = [html.Tr([html.Th("head"), *[html.Th(c) for c in columns]])]
    for label, r in ranked.iterrows():
        link = explorer_link(name, int(r["layer"]), int(r["head"]), stage, text)
        rows.append(html.Tr([html.Td(dcc.Link(str(r.get("head_label", label)), href=link)),
                             *[html.Td(f"{float(r[c]):.3f}",
                                       style={"fontWeight": "bold"} if c == by else {})
                               for c in columns]]))
    return html.Table(rows, className="heads-ranking",
                      style={"fontFamily": "monospace", "fontSize": "12px",
                             "marginBottom": "12px"})


def scores(store, names, text, kind, half, stage, rank_by="induction") -> tuple[list, str]:
    """One score figure per model, each with its heads ranked (`ranking`); notes for models
    that cannot answer."""
    names = check_models(store, names)
    rank_by = LINK["rank_by"][1] if rank_by is None else rank_by
    if rank_by not in [*SCORES, "induction_stripe"]:
        raise ValueError(f"no score {rank_by!r} to rank by; scores: {SCORES}")
    figures, notes = [], []
    for i, name in enumerate(names):
        try:
            model = store.get(name)
            shown, replaced = scored_stage(store, name, stage, names)
            probe, note = probe_for(store, name, kind, half, text)
            with store.using(name):
                table = probe_scores(model, probe, shown)
        except ValueError as err:
            notes.append(f"{name}: {err}")
            continue
        if replaced:   # "NAME has no hook_probs ..." names the model itself
            notes.append(replaced if replaced.startswith(name) else f"{name}: {replaced}")
        if note:
            notes.append(f"{name}: {note}")
        meaning = score_meaning(model, name, shown)
        if meaning:
            notes.append(meaning)
        columns = SCORES + (["induction_stripe"] if "induction_stripe" in table else [])
        block = [graph(f"heads-scores-{i}", figure=scores_figure(
            table, columns, title=f"{name}: hook_{shown}, {probe_label(probe)}"))]
        if rank_by in table:
            block += [html.Div(f"{name}: heads by {rank_by} (a name opens it in the explorer)",
                               style={"fontWeight": "bold"}),
                      ranking(name, table, rank_by, shown, text)]
        else:
            notes.append(f"{name}: no {rank_by} score on this probe to rank by")
        figures.append(html.Div(block, className="heads-model"))
    if not figures:
        raise ValueError("\n".join(notes))
    return figures, "\n".join(notes)


def score_meaning(model, name: str, stage: str) -> str:
    """What the scores of a stage whose rows are not attention distributions are ("" for a
    row-stochastic stage): DCMHA's `pattern` after Compose is a signed mix of the heads' maps
    (text-dcmha-l4mlp's L3H0 scores 2.72, its rows summing to 3.4 on average), so a score is that
    signed weight on the induction stripe, not a share of attention (issue 56)."""
    if find_map_stage(model, 0, stage).row_stochastic:
        return ""
    other = distribution_stage(model)
    return (f"{name}: hook_{stage} is not an attention distribution (its rows need not sum to "
            "1 and its entries may be negative): a score is the signed weight on the stripe, "
            "not attention mass, and can exceed 1"
            + (f"; hook_{other} is the row-stochastic stage, whose scores are attention mass"
               if other else ""))


def probe_label(probe) -> str:
    if probe.kind == "random":
        return f"{probe.batch} x [BOS] r r, {probe.half_len} random tokens per copy"
    return f"the prompt ({probe.tokens.shape[1]} tokens)"


def ablation(store, names, text, kind, half, stage, choice, at, how, score):
    names = check_models(store, names)
    name = names[0]
    model = store.get(name)
    chosen = parse_head(choice, model, name)
    stage, _ = scored_stage(store, name, stage, names)
    if at not in ["z", "v", *map_stage_names(model)]:
        raise ValueError(f"knock-out point {at!r} is not z, v or a map stage of {name}")
    if not isinstance(how, str) or how not in HOW:
        raise ValueError(f"knock-out {how!r} is not one of {list(HOW)}")
    if not isinstance(score, str):
        raise ValueError(f"no score {score!r}: choose one of {[*SCORES, 'induction_stripe']}")
    probe, _ = probe_for(store, name, kind, half, text)
    with store.using(name):
        if chosen is None:
            chosen = auto_knockout(probe_scores(model, probe, "pattern"), model.cfg.n_layers)
        layer, head = chosen
        table, loss = ablation_effect(model, probe, [(layer, head)], hook=at, how=how,
                                      stage=stage)
    auto = " (auto)" if choice in (None, AUTO) else ""
    return ablation_effect_figure(table, loss, score, title=(
        f"{name}: L{layer}H{head}{auto} set to {'its mean' if how == 'mean' else 'zero'} "
        f"at hook_{at}; "
        f"{score} at hook_{stage}"))


def composition(store, names):
    name = check_models(store, names)[0]
    with store.using(name) as model:
        table = composition_table(model, modes=["K"])
    return composition_vs_baseline_figure(table, modes=["K"], title=f"{name}: K-composition "
                                          "minus the random baseline")


def training(store, names) -> tuple[dict, str]:
    curves, notes = {}, []
    for name in check_models(store, names):
        directory = store.directories.get(name)
        if directory is None:
            notes.append(f"{name}: no checkpoint directory, so no training log")
            continue
        if not (directory / METRICS_FILE).is_file():
            notes.append(f"{name}: no training log ({METRICS_FILE}) beside its checkpoint")
            continue
        try:
            curves[name] = training_curve(directory)
        except ValueError as err:   # name the model, not the server's paths
            notes.append(f"{name}: {str(err).replace(str(directory), name)}")
    return (training_curve_figure(curves) if curves else {}), "\n".join(notes)


def register(app, store):
    @app.callback(Output("heads-ablate-at", "options"), Output("heads-ablate-at", "value"),
                  Input("ctl-models", "value"), State("heads-ablate-at", "value"),
                  State("url", "search"))
    def _points(names, current, search):
        """The first model's knock-out points; the value is kept while it is one of them (a
        deep link may set it together with the models), else the link's, else "z"."""
        if not isinstance(names, list) or not names or not isinstance(names[0], str) \
                or names[0] not in store.models:
            raise PreventUpdate
        points = ["z", "v", *map_stage_names(store.get(names[0]))]
        if current in points:
            return points, current
        linked = parse_qs((search or "").lstrip("?")).get("ablate_at", [None])[-1]
        return points, (linked if linked in points else "z")

    @app.callback(Output("heads-ablate-head", "options"), Output("heads-ablate-head", "value"),
                  Input("ctl-models", "value"), State("heads-ablate-head", "value"))
    def _heads(names, current):
        """The first model's heads; the choice is kept while that model has it."""
        if not isinstance(names, list) or not names or names[0] not in store.models:
            raise PreventUpdate
        options = _head_options(store, names)
        values = [o["value"] if isinstance(o, dict) else o for o in options]
        return options, current if current in values else AUTO

    shared = [Input("tabs", "value"), Input("ctl-models", "value"),
              Input("ctl-applied-prompt", "data"), Input("heads-probe", "value"),
              Input("heads-half", "value"), Input("ctl-stage", "value")]

    @app.callback(Output("heads-scores", "children"), Output("heads-error", "children"),
                  Output("heads-note", "children"), *shared, Input("heads-rank-by", "value"))
    def _scores(tab, names, text, kind, half, stage, rank_by):
        if tab != ID:   # nothing computed for a hidden tab (nor at page load)
            raise PreventUpdate
        try:
            figures, note = scores(store, names, text, kind, half, stage, rank_by)
        except ValueError as err:
            return [], str(err), ""
        return figures, "", note

    @app.callback(Output("heads-ablation", "figure"), Output("heads-ablate-error", "children"),
                  *shared, Input("heads-ablate-head", "value"),
                  Input("heads-ablate-at", "value"), Input("heads-ablate-how", "value"),
                  Input("heads-ablate-score", "value"))
    def _ablation(tab, names, text, kind, half, stage, choice, at, how, score):
        if tab != ID:
            raise PreventUpdate
        try:
            return ablation(store, names, text, kind, half, stage, choice, at, how,
                            score), ""
        except ValueError as err:
            return {}, str(err)

    @app.callback(Output("heads-composition", "figure"), Output("heads-training", "figure"),
                  Output("heads-training", "style"), Output("heads-training-note", "children"),
                  Input("tabs", "value"), Input("ctl-models", "value"))
    def _weights(tab, names):
        if tab != ID:
            raise PreventUpdate
        notes = []
        try:
            comp = composition(store, names)
        except ValueError as err:
            comp = {}
            notes.append(f"composition: {err}")
        try:
            curve, note = training(store, names)
            notes.append(note)
        except ValueError as err:
            curve = {}
            notes.append(str(err))
        style = {} if curve else {"display": "none"}     # no empty axes without a log
        return comp, curve, style, "\n".join(n for n in notes if n)
