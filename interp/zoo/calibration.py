"""Calibration of the text zoo (issue 26 item 2): when does each run form induction heads?

Reads the training logs (`metrics.jsonl`, one evaluation every 250 steps) of any set of runs and
returns their trajectories (tokens seen vs. validation loss, best induction score, copy-loss
ratio on repeated random tokens and on repeated real text) and, per run, the tokens at which it
first met the zoo's bar (`interp.zoo.text_studies.forms_induction`) or "not yet" with how far it
got. Runs still in progress are read as they stand: the table says how many tokens each has seen.

    python -m interp.zoo.calibration RUNS/runs/* [--keep docs/figures/zoo/calibration.csv]
                                                 [--csv docs/figures/zoo/calibration.csv]
                                                 [--png docs/figures/zoo/calibration.png]
                                                 [--focus RUN ... --focus-png PATH]
RUNS: `attnlens train --zoo text`'s runs directory (`interp.zoo.text_train.default_runs_dir`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from interp.zoo.text_studies import COPY_RATIO_THRESHOLD, INDUCTION_THRESHOLD, forms_induction

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


def figure(traj: pd.DataFrame, val_loss: bool = False):
    """Copy-loss ratio (random tokens) and best induction score against tokens, one line per
    run, with the bar drawn (and the validation loss, with `val_loss`)."""
    from plotly.subplots import make_subplots

    titles = ["second / first copy loss (random tokens)", "best head's induction score"]
    fig = make_subplots(rows=1, cols=2 + val_loss,
                        subplot_titles=titles + ["validation loss"] * val_loss)
    from plotly.colors import qualitative

    palette = qualitative.Plotly
    for i, (run, g) in enumerate(traj.groupby("run", sort=True)):
        g = g.sort_values("tokens")
        x, line = g.tokens / 1e6, dict(color=palette[i % len(palette)])
        fig.add_scatter(x=x, y=g.copy_loss_ratio, mode="lines+markers", name=run, line=line,
                        legendgroup=run, row=1, col=1)
        fig.add_scatter(x=x, y=g.induction_score, mode="lines+markers", name=run, line=line,
                        legendgroup=run, showlegend=False, row=1, col=2)
        if val_loss:
            fig.add_scatter(x=x, y=g.val_loss, mode="lines+markers", name=run, line=line,
                            legendgroup=run, showlegend=False, row=1, col=3)
    fig.add_hline(y=COPY_RATIO_THRESHOLD, line_dash="dot", row=1, col=1)
    fig.add_hline(y=INDUCTION_THRESHOLD, line_dash="dot", row=1, col=2)
    fig.update_xaxes(title_text="training tokens (M)")
    # the legend below the plots, four runs a row, so every run is named however many there are
    rows = -(-traj["run"].nunique() // 4)
    fig.update_layout(width=1100, height=440 + 24 * rows, title="Induction-head formation by run",
                      legend=dict(orientation="h", yanchor="top", y=-0.18, entrywidth=250,
                                  font=dict(size=11)))
    return fig


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m interp.zoo.calibration",
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
        figure(traj).write_image(str(args.png))
    if args.focus:
        unknown = sorted(set(args.focus) - set(traj["run"]))
        if unknown or not args.focus_png:
            raise SystemExit(f"--focus needs --focus-png and runs of the trajectories; "
                             f"unknown: {unknown}")
        args.focus_png.parent.mkdir(parents=True, exist_ok=True)
        figure(traj[traj["run"].isin(args.focus)], val_loss=True).write_image(str(args.focus_png))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
