"""Command line of the paper-task zoo.

    python -m attnlens.lab.paper list [PATTERN...]          recipes, and which are shipped
    python -m attnlens.lab.paper train NAME... [--resume]   train, eval, then publish the finished
                                                          model into hooked_models/zoo/NAME
    python -m attnlens.lab.paper eval NAME... [--write]     re-measure; --write stores card metrics
    python -m attnlens.lab.paper report                     docs/reproduction.md + its figures
    python -m attnlens.lab.paper lr-probe NAME... --lrs LR... [--steps N] [--csv PATH]
                                                          validation loss at each lr (lr_probe.py)

NAME may be a shell-style pattern ("mta-findblock-first-*"), quoted.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import signal
import sys
from pathlib import Path

import torch

from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.hooked_models.zoo import available, closest_names, superseded_by
from attnlens.lab.paper._registry import all_recipes, module_of
from attnlens.lab.paper._training import (
    CLI,
    EVAL_SEED,
    default_run_root,
    evaluate_model,
    publish,
    staging_dir,
    up_to_date,
    write_metrics,
    zoo_dir,
)
from attnlens.lab.run_progress import describe, progress
from attnlens.training.stop_signals import TrainingStopped


def _names(names: list[str]) -> str:
    """`a-s0, a-s1, a-s2` as `a-s{0,1,2}` (seeds of one recipe), else comma-separated."""
    stems = {n.rsplit("-s", 1)[0] for n in names}
    if len(stems) == 1 and all(n.rsplit("-s", 1)[-1].isdigit() for n in names) and len(names) > 1:
        return f"{stems.pop()}-s{{{','.join(n.rsplit('-s', 1)[1] for n in names)}}}"
    return ", ".join(names)


def _select(patterns: list[str]) -> list[str]:
    names = sorted(all_recipes())
    chosen: list[str] = []
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            close = closest_names(pattern, names)
            raise SystemExit(f"no recipe matches {pattern!r}"
                             + (f"; the closest: {', '.join(close)}" if close else "")
                             + f". `{CLI} list` lists all {len(names)} recipes; a pattern "
                             "may use * and ? (e.g. 'cope-flipflop-*-long-s0').")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def _measure(name: str, directory: Path, write: bool) -> None:
    """Evaluate the model saved in `directory` on the eval seed, print the metrics and, with
    `write`, store them in its card."""
    metrics = evaluate_model(HookedVariantTransformer.from_pretrained(directory))
    print(name, f"eval seed {EVAL_SEED}", json.dumps(metrics), flush=True)
    if write:
        write_metrics(directory, metrics, eval_seed=EVAL_SEED)


def _eval(names: list[str], write: bool) -> None:
    shipped = set(available())
    for name in names:
        if name not in shipped:
            raise SystemExit(f"{name} is not shipped (train it first: "
                             f"python -m attnlens.lab.paper train {name} --resume)")
        _measure(name, zoo_dir(name), write)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnlens.lab.paper")
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list")
    p_list.add_argument("names", nargs="*", default=["*"])
    p_train = sub.add_parser("train")
    p_train.add_argument("names", nargs="+")
    p_train.add_argument("--resume", action="store_true",
                         help="continue from the run's last checkpoint under "
                              "$ATTNLENS_RUNS/paper-zoo (default ~/.cache/attnlens/paper-zoo)")
    p_train.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p_eval = sub.add_parser("eval")
    p_eval.add_argument("names", nargs="+")
    p_eval.add_argument("--write", action="store_true", help="store the metrics in card.json")
    p_eval.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    sub.add_parser("report")
    p_probe = sub.add_parser("lr-probe", help="validation loss of recipes at several lrs")
    p_probe.add_argument("names", nargs="+")
    p_probe.add_argument("--lrs", type=float, nargs="+", required=True)
    p_probe.add_argument("--steps", type=int, default=2500)
    p_probe.add_argument("--csv", default=None, help="write the trajectories here")
    p_probe.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)

    if args.command == "list":
        shipped = set(available())
        recipes = all_recipes()
        for name in _select(args.names):
            mark = "shipped" if name in shipped else "-"
            if name in shipped and superseded_by(name):
                mark += f"; superseded by {_names(superseded_by(name))}"
            run = progress(default_run_root() / name)
            if run["step"] and name not in shipped:   # a run in progress (or not evaluated)
                mark = describe(run, ceiling=bool(recipes[name].train.get("early_stop_patience")))
            print(f"{name:50s} {recipes[name].phenomenon:22s} {mark}")
    elif args.command == "train":
        torch.set_num_threads(args.threads)
        recipes = all_recipes()
        for name in _select(args.names):
            recipe = recipes[name]
            if args.resume and up_to_date(recipe, zoo_dir(name)):
                print(f"{name}: finished, shipped and evaluated; skipped (eval {name} --write "
                      "re-measures its card)", file=sys.stderr, flush=True)
                continue
            print(f"training {name}", file=sys.stderr, flush=True)
            staging = staging_dir(name)
            try:
                module_of(recipe).train(recipe, staging, resume=args.resume)
            except TrainingStopped as stop:   # SIGTERM / SIGHUP / Ctrl-C, after a checkpoint
                print(f"{name}: stopped by {signal.Signals(stop.signum).name} after step "
                      f"{stop.step:,}, checkpoint saved in {stop.checkpoint}; train it again "
                      "with --resume to continue", file=sys.stderr, flush=True)
                sys.exit(128 + stop.signum)
            _measure(name, staging, write=True)
            publish(staging, zoo_dir(name))
    elif args.command == "eval":
        torch.set_num_threads(args.threads)
        _eval(_select(args.names), args.write)
    elif args.command == "report":
        from attnlens.reports.reproduction.page import write_report

        print(write_report())
    elif args.command == "lr-probe":
        from attnlens.lab.paper import lr_probe

        lr_probe.main(_select(args.names), args.lrs, args.steps, args.csv, args.threads)


if __name__ == "__main__":
    main()
