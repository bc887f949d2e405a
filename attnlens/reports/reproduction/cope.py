"""docs/reproduction.md's CoPE sections: per-scheme error tables and bar charts with 95%
t-intervals over seeds, the loss figure, and the reading of whether CoPE's advantage reproduces
(`reading`), for the models of `attnlens.lab.paper.cope`. `attnlens.reports.reproduction.page` finds
`report_section` and `reading` here (`page.report_module`)."""

from __future__ import annotations

from attnlens.lab.paper.cope import (
    EVAL_SAMPLES,
    LONG_SHAPE,
    PAPER_SHAPE,
    POSITIONS,
    RECIPES,
    SPLITS,
    VAL_BATCHES,
    VAL_SEED,
    _model_config,
)

NAMES = {"cope": "CoPE", "rope": "RoPE", "absolute": "learned absolute", "nope": "NoPE"}
SOLVED = 0.01   # "solves" a split: error below 1%


def _groups(cards: list[dict]) -> dict[tuple[int, str], list[dict]]:
    """Cards by (number of variables or 0, positional scheme), in table order."""
    order = list(POSITIONS)
    out: dict[tuple[int, str], list[dict]] = {}
    for c in sorted(cards, key=lambda c: (c["task_args"].get("n_vars", 0),
                                          order.index(c["variant"]), c["seed"])):
        out.setdefault((c["task_args"].get("n_vars", 0), c["variant"]), []).append(c)
    return out


def errors(group: list[dict], split: str) -> list[float]:
    """The group's error on `split`, one value per seed (every seed of an early-stopped
    group, whatever step it stopped at)."""
    return [c["metrics"][f"error_{split}"] for c in group]


def error_bar(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high) in %: the 95% t-interval over seeds clipped to 0-100 (low = high =
    mean for one seed: no interval to draw)."""
    from attnlens.reports.reproduction.page import t_interval

    if len(values) == 1:
        return (100 * values[0],) * 3
    m, lo, hi = t_interval(values)
    return 100 * m, 100 * max(lo, 0.0), 100 * min(hi, 1.0)


def _bar_label(scheme: str, setting: str | None, seeds: int, many: bool) -> str:
    """A bar's x label: the scheme, its setting, and "1 seed" where other settings have an
    interval and this one has none."""
    notes = [x for x in (setting, "1 seed" if many and seeds == 1 else None) if x]
    return f"{scheme} ({', '.join(notes)})" if notes else scheme


def _steps_cell(group: list[dict]) -> int | str:
    """The table's steps: the fixed budget, or the steps each seed took before it stopped."""
    from attnlens.reports.reproduction.page import early_stopped

    if not any(map(early_stopped, group)):
        return group[0]["steps"]
    return f"{' / '.join(str(c['steps']) for c in group)} (early stopping)"


def report_section(cards: list[dict], figure_dir) -> str:
    """Error (%) per split for each positional scheme (and counting's number of variables):
    one row per setting (its seeds' mean and 95% t-interval when there are several), and a
    grouped bar chart. An early-stopped setting pools all its seeds, whatever step each
    stopped at; its runs (steps, stop, time) and the CPU-hours spent are listed below."""
    import plotly.graph_objects as go

    from attnlens.interp.plots.colors import colour
    from attnlens.reports.reproduction.page import (
        budget_spent,
        early_stopped,
        markdown_table,
        runs_table,
        save_png,
        short,
    )

    task = cards[0]["task_args"]["task"]
    splits = SPLITS[task]
    groups = _groups(cards)

    def setting(n):
        return f"{n} var" if n else "-"

    rows = [[setting(n), NAMES[v], ", ".join(str(c["seed"]) for c in g), _steps_cell(g),
             *(short(errors(g, s)) for s in splits)] for (n, v), g in groups.items()]
    table = markdown_table(["setting", "positions", "training seed(s)", "steps",
                            *(f"{label} (%)" for _, label in splits.values())], rows)
    n_seeds = sorted({len(g) for g in groups.values()})
    table += (f"\n\nError (%) on {EVAL_SAMPLES} held-out samples per split (eval seed "
              f"{cards[0].get('eval_seed')}); "
              + ("1 seed per setting: no interval, so the table ranks nothing."
                 if n_seeds == [1] else "several seeds: mean [95% t-interval] (n seeds)."))
    fig = go.Figure()
    many = max(n_seeds) > 1   # error bars only where some setting has an interval
    labelled = {_bar_label(v, setting(n) if n else None, len(g), many): g
                for (n, v), g in groups.items()}
    for k, (split, (_, label)) in enumerate(splits.items()):
        # one trace per split for the settings with an interval, one beside it (same slot,
        # colour and legend entry) for the one-seed settings, which get no error bar at all:
        # plotly draws a missing error value as a zero-width cap, which reads as certainty
        for with_interval in (True, False):
            part = {x: g for x, g in labelled.items() if (len(g) > 1) == with_interval}
            if not part:
                continue
            bars = [error_bar(errors(g, split)) for g in part.values()]
            error_y = (dict(type="data", symmetric=False, array=[hi - m for m, _, hi in bars],
                            arrayminus=[m - lo for m, lo, _ in bars], thickness=1.2)
                       if with_interval else dict(visible=False))
            fig.add_bar(name=label, x=list(part), y=[m for m, _, _ in bars],
                        error_y=error_y, offsetgroup=label, legendgroup=label,
                        marker_color=colour(k), showlegend=with_interval or part == labelled,
                        hovertext=[" / ".join(f"{100 * e:.1f}" for e in errors(g, split))
                                   for g in part.values()])
    fig.update_xaxes(categoryorder="array", categoryarray=list(labelled))
    runs = [c for g in groups.values() for c in g if early_stopped(c)]
    if runs:
        table += (f"\n\n**Runs** ({_shape(runs)}, each trained until the answer "
                  f"loss on {VAL_BATCHES} x 64 in-distribution validation samples, seeds from "
                  f"{VAL_SEED}, stopped improving; evaluated on the separate eval seed above):"
                  f"\n\n{runs_table(runs, label=lambda c: c['recipe'])}\n\n"
                  f"{budget_spent(runs)}")
    phenomenon = cards[0]["phenomenon"]
    fig.update_layout(barmode="group", title=f"{phenomenon}: error by positional scheme"
                      + (" (mean over seeds, 95% t-interval)" if many else " (1 seed each)"),
                      yaxis_title="error (%)", width=900, height=420)
    out = table + "\n\n" + save_png(fig, phenomenon, figure_dir)
    curves = loss_figure(cards, phenomenon)
    if curves.data:
        out += "\n\n" + save_png(curves, f"{phenomenon}-loss", figure_dir)
    return out


SEED_DASH = ("solid", "dash", "dot", "dashdot")


def loss_figure(cards: list[dict], phenomenon: str):
    """The runs' training loss on the answers: one panel per setting (counting's number of
    variables), one colour per positional scheme (one legend entry each), one line style per
    training seed, so that a dozen runs stay tellable apart."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from attnlens.interp.plots.colors import colour

    runs = [c for c in cards if c.get("train_loss_curve")]
    if not runs:
        return go.Figure()
    panels = sorted({c["task_args"].get("n_vars") for c in runs}, key=lambda n: n or 0)
    titles = [f"{n} variable{'s' * (n > 1)}" if n else "" for n in panels]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=titles, shared_yaxes=True,
                        horizontal_spacing=0.04)
    schemes = list(NAMES)
    shown = set()
    for c in sorted(runs, key=lambda c: (schemes.index(c["variant"]), c["seed"])):
        steps, losses = zip(*c["train_loss_curve"], strict=True)
        n, v = c["task_args"].get("n_vars"), c["variant"]
        fig.add_scatter(x=steps, y=losses, mode="lines", name=NAMES[v], legendgroup=v,
                        showlegend=v not in shown,
                        line=dict(color=colour(schemes.index(v)),
                                  dash=SEED_DASH[c["seed"] % len(SEED_DASH)], width=1.5),
                        hovertext=c["recipe"], row=1, col=panels.index(n) + 1)
        shown.add(v)
    seeds = sorted({c["seed"] for c in runs})
    styles = ", ".join(f"{SEED_DASH[s % len(SEED_DASH)]} {s}" for s in seeds)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="loss", row=1, col=1)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=f"{phenomenon}: training loss on the answers"
                      + (f" (line style = training seed: {styles})" if len(seeds) > 1 else ""),
                      width=max(900, 420 * len(panels)), height=400)
    return fig


def _by_scheme(groups, n_vars: int, split: str) -> str:
    """`"CoPE 7.4, RoPE 50.8, ..."` for one setting and split (with intervals when seeded)."""
    from attnlens.reports.reproduction.page import short

    return ", ".join(f"{NAMES[v]} {short(errors(g, split))}"
                     for (n, v), g in groups.items() if n == n_vars)


def _seeds_text(groups, n_vars: int) -> str:
    counts = sorted({len(g) for (n, _), g in groups.items() if n == n_vars})
    if counts == [1]:
        return "1 seed per scheme, no interval"
    return f"{'-'.join(map(str, counts))} seeds per scheme, mean [95% t-interval]"


def _ordering(groups, n_vars: int, split: str, a: str = "cope") -> str:
    """Which schemes `a` is separated from on `split`: with one seed none can be claimed;
    with several, Welch 95% intervals of the difference that exclude 0."""
    from attnlens.reports.reproduction.page import pct, welch_interval

    mine = groups.get((n_vars, a))
    others = {v: g for (n, v), g in groups.items() if n == n_vars and v != a}
    if mine is None or not others:
        return ""
    if len(mine) < 2 or any(len(g) < 2 for g in others.values()):
        return (f"With one training seed per scheme and no interval, no ordering of "
                f"{NAMES[a]} against {', '.join(NAMES[v] for v in others)} can be claimed here.")
    parts = []
    for v, g in others.items():
        d, lo, hi = welch_interval(errors(mine, split), errors(g, split))
        verdict = ("lower" if hi < 0 else "higher" if lo > 0 else "not separated from")
        parts.append(f"{verdict} than {NAMES[v]} ({pct(d)} points, 95% interval {pct(lo)} to "
                     f"{pct(hi)})" if verdict != "not separated from" else
                     f"not separated from {NAMES[v]} (difference {pct(d)}, 95% interval "
                     f"{pct(lo)} to {pct(hi)})")
    return f"{NAMES[a]}'s error is " + "; ".join(parts) + "."


def _lowest(groups, n_vars: int, split: str) -> str:
    """The scheme with the lowest mean error on `split` (only a ranking of these numbers)."""
    best = min(((n, v) for n, v in groups if n == n_vars),
               key=lambda k: sum(errors(groups[k], split)) / len(groups[k]))
    return best[1]


def reading(phenomenon: str, cards: list[dict]) -> str:
    """Our reading of `phenomenon`, every number computed from `cards`."""
    from attnlens.reports.reproduction.page import early_stopped, pct, span

    if any(map(early_stopped, cards)):
        return _long_reading(cards)
    groups = _groups(cards)
    steps = span([c["steps"] for c in cards], fmt=str)
    budget = (f"Our models have 2 layers of d_model 64 and {steps} training steps, far less "
              "than the paper's (see its claim); the loss figure shows whether training had "
              "converged.")
    if phenomenon == "cope-selcopy":
        splits = list(SPLITS["selcopy"])
        cope = groups.get((0, "cope"), [])
        solved = cope and all(max(errors(cope, s)) < SOLVED for s in splits)
        others_fail = all(min(errors(g, s)) >= 10 * SOLVED for (_, v), g in groups.items()
                          if v != "cope" for s in splits[1:])
        verdict = ("Consistent with the paper's Table 2 on one seed per scheme: CoPE copies "
                   "in and out of distribution while every other scheme fails out of "
                   "distribution" if solved and others_fail else
                   "Not as in the paper's Table 2")
        lines = [f"{verdict} ({_seeds_text(groups, 0)})."]
        for s, (_, label) in SPLITS["selcopy"].items():
            lines.append(f"{label}: {_by_scheme(groups, 0, s)}.")
        lines.append(_ordering(groups, 0, "sparse_64") if len(cope) > 1 else
                     "A gap this large on one seed is suggestive, not an interval.")
        return " ".join(lines + [budget])
    if phenomenon == "cope-flipflop":
        solved = [v for (_, v), g in groups.items() if max(errors(g, "id")) < SOLVED]
        rest = [g for (_, v), g in groups.items() if v not in solved]
        rest_ids = [e for g in rest for e in errors(g, "id")]
        cope_solves = "cope" in solved
        lines = [("Consistent with the paper in distribution: CoPE solves Flip-Flop"
                  if cope_solves else "Not reproduced at our scale: CoPE does not solve "
                  "Flip-Flop in distribution")
                 + f" ({_seeds_text(groups, 0)}). In distribution: "
                 f"{_by_scheme(groups, 0, 'id')}"
                 + (f"; only {', '.join(NAMES[v] for v in solved)} stays below "
                    f"{pct(SOLVED)}%, the others stall at {span(rest_ids)}%." if solved and rest
                    else ".")]
        for s in ("sparse", "long_2x", "sparse_long_2x"):
            lines.append(f"{SPLITS['flipflop'][s][1]}: {_by_scheme(groups, 0, s)}.")
        cope, nope, rope = (groups.get((0, v)) for v in ("cope", "nope", "rope"))
        if cope and nope and rope:
            c, n, r = (sum(errors(g, "sparse_long_2x")) / len(g) for g in (cope, nope, rope))
            tie = abs(c - n) < 2 * SOLVED
            worse = [s for s in SPLITS["flipflop"] if
                     sum(errors(rope, s)) / len(rope) > sum(errors(cope, s)) / len(cope)]
            if r > max(c, n):
                lines.append(
                    f"Sparse and long together is "
                    f"{'the only split' if worse == ['sparse_long_2x'] else 'a split'} where RoPE "
                    f"({pct(r)}%) errs more than CoPE ({pct(c)}%); NoPE "
                    + (f"ties CoPE there ({pct(n)}%)" if tie else f"errs {pct(n)}% there")
                    + (", so that advantage over RoPE is not CoPE's: removing positions "
                       "altogether gives it too." if tie or n < c else "."))
        lines.append(_ordering(groups, 0, "sparse_long_2x"))
        if not cope_solves:
            lines.append("Since CoPE has not learned the task in distribution, the paper's "
                         "out-of-distribution comparison cannot be made here.")
        return " ".join(lines + [budget])
    # counting
    lines = []
    n_vars = sorted({n for n, _ in groups})
    for n in n_vars:
        lines.append(f"**{n} variable{'s' * (n > 1)}** ({_seeds_text(groups, n)}). Training "
                     f"lengths: {_by_scheme(groups, n, 'id')}. Exactly twice the longest "
                     f"training program (64 statements): {_by_scheme(groups, n, 'len_64')}; "
                     f"33-64 statements: {_by_scheme(groups, n, 'len_33_64')}; 65-128 "
                     f"statements: {_by_scheme(groups, n, 'len_65_128')}. "
                     f"{_ordering(groups, n, 'len_64')}")
    one = groups.get((1, "cope"))
    longer = [s for s in SPLITS["counting"] if s != "id"]
    if one and max(errors(one, "id")) < SOLVED and all(
            _lowest(groups, 1, s) == "cope" for s in longer):
        lines.append("With one variable CoPE counts in distribution and has the lowest error "
                     "at every longer length, the paper's picture, but on one seed per scheme: "
                     "the gaps have no interval. Every scheme's error grows with the length, "
                     "CoPE's too.")
    for n in n_vars:
        single = any(len(g) < 2 for (m, _), g in groups.items() if m == n)
        if n > 1 and (single or "lower than" not in _ordering(groups, n, "len_64")):
            lines.append(f"With {n} variables the paper's CoPE advantage (its Table 3) is not "
                         "established here" + (": one seed per scheme, no interval." if single
                                               else ": CoPE is not separated from every "
                                               "other scheme."))
    return "\n\n".join(lines + [budget])


def _separation(groups, n_vars: int, split: str, a: str = "cope") -> dict[str, str | None]:
    """Per other scheme: "below" / "above" when `a`'s 95% t-interval of the error on `split`
    lies wholly below / above that scheme's (`report.separated`), None when they overlap or a
    side has one seed."""
    from attnlens.reports.reproduction.page import separated

    mine = errors(groups[(n_vars, a)], split)
    return {v: separated(mine, errors(g, split)) for (n, v), g in groups.items()
            if n == n_vars and v != a}


def _split_verdict(groups, n_vars: int, split: str) -> str:
    """Whether CoPE's error is below each other scheme's on `split`, intervals apart (every
    scheme has two seeds or more: `_long_reading` says so once where one has a single seed)."""
    sep = _separation(groups, n_vars, split)
    if not sep:
        return "No other scheme to compare CoPE with."
    below = [NAMES[v] for v, s in sep.items() if s == "below"]
    above = [NAMES[v] for v, s in sep.items() if s == "above"]
    tied = [NAMES[v] for v, s in sep.items() if s is None]
    if sep and len(below) == len(sep):
        return "CoPE is below every other scheme (95% t-intervals apart)."
    parts = ([f"below {', '.join(below)}"] if below else []) + (
        [f"above {', '.join(above)}"] if above else []) + (
        [f"not separated from {', '.join(tied)}"] if tied else [])
    return (f"CoPE is {'; '.join(parts)} (95% t-intervals): its advantage over every other "
            f"scheme is not established on this split.")


def _shape(cards: list[dict]) -> str:
    """`"4 layers of d_model 128"`, from the cards' recipes."""
    config = RECIPES[cards[0]["recipe"]].config if cards[0].get("recipe") in RECIPES \
        else {**_model_config(cards[0]["task_args"]["task"], "nope"), **LONG_SHAPE}
    return f"{config['n_layers']} layers of d_model {config['d_model']}"


def _shape_text(cards: list[dict]) -> str:
    """The cards' shape and how it relates to the paper's."""
    paper = f"{PAPER_SHAPE['n_layers']} layers of d_model {PAPER_SHAPE['d_model']}"
    if _shape(cards) == paper:
        return f"{paper} (the paper's shape)"
    return (f"{_shape(cards)} (the paper's are {paper}: ours is the nearest shape that the CPU "
            f"calibration allows, `python -m attnlens.benchmarks.paper_shapes`)")


def _long_reading(cards: list[dict]) -> str:
    """The reading of early-stopped groups (the -long recipes): per setting and split, each
    scheme's error over seeds and whether CoPE's is below each other scheme's with
    non-overlapping 95% t-intervals; the paper's comparison is stated only where they are."""
    from attnlens.reports.reproduction.page import pct, stopping_text

    task = cards[0]["task_args"]["task"]
    groups = _groups(cards)
    splits = SPLITS[task]
    paragraphs = []
    for n in sorted({n for n, _ in groups}):
        head = f"**{n} variable{'s' * (n > 1)}** " if n else ""
        if (n, "cope") not in groups:
            paragraphs.append(f"{head}No CoPE model: no comparison.")
            continue
        single = [NAMES[v] for (m, v), g in groups.items() if m == n and len(g) < 2]
        wins = [] if single else [s for s in splits
                                  if set(_separation(groups, n, s).values()) == {"below"}]
        labels = [splits[s][1] for s in wins]
        lines = [f"{head}({_seeds_text(groups, n)}, trained to early stopping). " + (
            f"One seed of {', '.join(single)} so far: no split can show CoPE's error below "
            f"the others' with intervals yet." if single else
            "CoPE's error is below every other scheme's, 95% t-intervals apart, on "
            + (f"{len(wins)} of {len(splits)} splits ({'; '.join(labels)})."
               if wins else "no split."))]
        if task == "flipflop":
            solved = [v for (m, v), g in groups.items() if m == n
                      and max(errors(g, "id")) < SOLVED]
            lines.append(f"In distribution {', '.join(NAMES[v] for v in solved)} "
                         f"{'stays' if len(solved) == 1 else 'stay'} below {pct(SOLVED)}% on "
                         f"every seed." if solved else
                         f"In distribution no scheme stays below {pct(SOLVED)}% on every seed.")
        for s, (_, label) in splits.items():
            lines.append(f"{label}: {_by_scheme(groups, n, s)}."
                         + ("" if single else f" {_split_verdict(groups, n, s)}"))
        if single:
            lines.append("The paper's CoPE advantage is not established yet.")
        elif len(wins) == len(splits):
            lines.append("The paper's CoPE advantage reproduces on every split.")
        elif wins:
            lines.append("The paper's CoPE advantage reproduces on those splits only and is "
                         "not established on the others.")
        else:
            lines.append("The paper's CoPE advantage is not established here.")
        paragraphs.append(" ".join(lines))
    paragraphs.append(f"Our models have {_shape_text(cards)}, trained to early "
                      f"stopping ({stopping_text(cards)}); the loss figure shows each run.")
    return "\n\n".join(paragraphs)
