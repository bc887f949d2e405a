"""Calibration of the text zoo (issue 26 item 2): when does each run form induction heads?

Reads the training logs (`metrics.jsonl`, one evaluation every 250 steps) of any set of runs and
returns their trajectories (tokens seen vs. validation loss, best induction score, copy-loss
ratio on repeated random tokens and on repeated real text) and, per run, the tokens at which it
first met the zoo's bar (`attnlens.lab.text_studies.forms_induction`) or "not yet" with how far it
got. Runs still in progress are read as they stand: the table says how many tokens each has seen.

    python -m attnlens.lab.calibration RUNS/runs/* [--keep docs/figures/zoo/calibration.csv]
                                                 [--csv docs/figures/zoo/calibration.csv]
                                                 [--png docs/figures/zoo/calibration.png]
                                                 [--focus RUN ... --focus-png PATH]
RUNS: `attnlens train --zoo text`'s runs directory (`attnlens.lab.text_train.default_runs_dir`).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd

from attnlens.interp.plots.png import write_png
from attnlens.lab.text_studies import COPY_RATIO_THRESHOLD, INDUCTION_THRESHOLD, forms_induction

COLUMNS = ["run", "step", "tokens", "val_loss", "induction_score", "copy_loss_ratio",
           "text_copy_ratio"]


def trajectory(run_dir) -> pd.DataFrame:
    """The evaluation records of one run (`COLUMNS`; a missing probe value is NaN)."""
    run_dir = Path(run_dir)
    log = run_dir / "metrics.jsonl"
    if not log.is_file():
        raise ValueError(f"{run_dir} has no metrics.jsonl: not a training run directory")
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    evals = [{"run": run_dir.name, **{c: r.get(c) for c in COLUMNS[1:]}}
             for r in rows if "induction_score" in r]
    return pd.DataFrame(evals, columns=COLUMNS)


def trajectories(run_dirs) -> pd.DataFrame:
    """`trajectory` of every run, stacked."""
    frames = [trajectory(d) for d in run_dirs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def keep_earlier(traj: pd.DataFrame, csv) -> pd.DataFrame:
    """`traj` plus the rows of the trajectories CSV `csv` whose run `traj` does not have."""
    csv = Path(csv)
    if not csv.is_file():
        raise ValueError(f"--keep {csv}: no such trajectories CSV")
    earlier = pd.read_csv(csv)
    missing = set(COLUMNS) - set(earlier.columns)
    if missing:
        raise ValueError(f"{csv} is not a trajectories CSV: it lacks {sorted(missing)}")
    earlier = earlier[~earlier["run"].isin(set(traj["run"]))][COLUMNS]
    return pd.concat([earlier, traj], ignore_index=True) if len(traj) else earlier


def onset_table(traj: pd.DataFrame) -> pd.DataFrame:
    """Per run: tokens seen, the first evaluation that met the bar (tokens, or None), and the
    best induction score and lowest copy ratios so far."""
    rows = []
    for run, g in traj.groupby("run", sort=True):
        g = g.sort_values("tokens")
        met = [r for r in g.itertuples() if r.copy_loss_ratio is not None
               and forms_induction({"induction_score": r.induction_score,
                                    "copy_loss_ratio": r.copy_loss_ratio})]
        rows.append({"run": run, "tokens_seen": int(g.tokens.max()),
                     "induction_at_tokens": int(met[0].tokens) if met else None,
                     "best_induction_score": float(g.induction_score.max()),
                     "lowest_copy_loss_ratio": float(g.copy_loss_ratio.min()),
                     "lowest_text_copy_ratio": float(g.text_copy_ratio.min()),
                     "last_val_loss": float(g.val_loss.iloc[-1])})
    return pd.DataFrame(rows)


def run_style(run: str, index: int) -> tuple[dict, str, bool]:
    """(line, marker symbol, is a zoo model) of `run`: a zoo model (text-VARIANT-SHAPE) in its
    variant's colour and its shape's dash and marker, as in docs/zoo.md's other figures; any
    other run (a calibration run) in colour `index` of a 24-colour palette, solid."""
    from plotly.colors import qualitative

    from attnlens.interp.plots.colors import VARIANT_COLOURS
    from attnlens.interp.plots.training import SHAPE_DASH, SHAPE_MARKER

    m = re.fullmatch(r"text-(?P<variant>[a-z]+)-(?P<shape>.+)", run)
    if m and m["variant"] in VARIANT_COLOURS and m["shape"] in SHAPE_DASH:
        return (dict(color=VARIANT_COLOURS[m["variant"]], dash=SHAPE_DASH[m["shape"]]),
                SHAPE_MARKER[m["shape"]], True)
    palette = qualitative.Dark24
    return dict(color=palette[index % len(palette)], dash="solid"), "x-thin-open", False


def figure(traj: pd.DataFrame, val_loss: bool = False, split: bool = True):
    """Copy-loss ratio (random tokens) and best induction score against tokens, one line per
    run, with the bar drawn (and the validation loss, with `val_loss`). With `split`, zoo
    models and calibration runs get a row each when both are drawn (zoo models in their
    variant's colour and shape's dash, calibration runs in 24 distinct colours), so no two
    runs look alike; without it (a few runs compared on the same axes) every run gets its own
    colour of the 24."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    runs = sorted(traj["run"].unique())
    styles, calibration = {}, 0
    for i, run in enumerate(runs):
        styles[run] = run_style(run, calibration)
        calibration += not styles[run][2]
        if not split:
            palette = qualitative.Dark24
            styles[run] = (dict(color=palette[i % len(palette)], dash="solid"), "circle", True)
    kinds = [k for k in (True, False) if any(st[2] == k for st in styles.values())]
    titles = ["second / first copy loss (random tokens)", "best head's induction score"]
    titles += ["validation loss"] * val_loss
    label = {True: "zoo models", False: "calibration runs"}
    fig = make_subplots(rows=len(kinds), cols=len(titles), vertical_spacing=0.12,
                        subplot_titles=[f"{label[k]}: {t}" if len(kinds) > 1 else t
                                        for k in kinds for t in titles])
    for run in runs:
        line, symbol, zoo_model = styles[run]
        row = kinds.index(zoo_model) + 1
        g = traj[traj["run"] == run].sort_values("tokens")
        x = g.tokens / 1e6
        columns = ["copy_loss_ratio", "induction_score"] + ["val_loss"] * val_loss
        for col, column in enumerate(columns, 1):
            fig.add_scatter(x=x, y=g[column], mode="lines+markers", name=run, line=line,
                            marker=dict(symbol=symbol, size=5), legendgroup=run,
                            showlegend=col == 1, row=row, col=col)
    for row in range(1, len(kinds) + 1):
        fig.add_hline(y=COPY_RATIO_THRESHOLD, line_dash="dot", row=row, col=1)
        fig.add_hline(y=INDUCTION_THRESHOLD, line_dash="dot", row=row, col=2)
    fig.update_xaxes(title_text="training tokens (M)", row=len(kinds))
    # the legend below the plots, four runs a row, so every run is named however many there are
    legend_rows = -(-len(runs) // 4)
    height = 120 + 320 * len(kinds)
    fig.update_layout(width=1100, height=height + 24 * legend_rows + 60,
                      title="Induction-head formation by run",
                      legend=dict(orientation="h", yanchor="top",
                                  y=-60 / height, entrywidth=250, font=dict(size=11)))
    return fig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlens.lab.calibration",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (metrics.jsonl)")
    parser.add_argument("--csv", type=Path, default=None, help="write the trajectories here")
    parser.add_argument("--png", type=Path, default=None, help="draw the figure here (kaleido)")
    parser.add_argument("--focus", nargs="+", default=None, metavar="RUN",
                        help="runs drawn in a second figure, with their validation loss")
    parser.add_argument("--focus-png", type=Path, default=None, help="where it is drawn")
    parser.add_argument("--keep", type=Path, default=None,
                        help="an earlier trajectories CSV: its runs that are not among RUNS are "
                             "kept (the logs of earlier sessions' runs are not in git)")
    args = parser.parse_args(argv)
    traj = trajectories(args.runs)
    if args.keep:
        traj = keep_earlier(traj, args.keep)
    print(onset_table(traj).to_string(index=False))
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        traj.to_csv(args.csv, index=False)
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        write_png(figure(traj), args.png)
    if args.focus:
        unknown = sorted(set(args.focus) - set(traj["run"]))
        if unknown or not args.focus_png:
            raise SystemExit(f"--focus needs --focus-png and runs of the trajectories; "
                             f"unknown: {unknown}")
        args.focus_png.parent.mkdir(parents=True, exist_ok=True)
        write_png(figure(traj[traj["run"].isin(args.focus)], val_loss=True, split=False),
                  args.focus_png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
