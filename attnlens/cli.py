"""The `attnlens` command line.

    attnlens demo [--steps N]     train a 2-layer attention-only model on repeated random tokens,
                                  then print its head table (previous-token, induction, duplicate
                                  scores) and an ablation check
    attnlens stages               print every registered variant's stage catalogue
    attnlens serve [CKPT_DIR_OR_ZOO_NAME ...] [--zoo KIND ...] [--port 8050]
                                  the dashboard on those checkpoints (default: the bundled text
                                  language models; --zoo induction: the toy induction models)
    attnlens train --zoo text [--device cuda] [--only NAME ...] [--measure] [--smoke]
                                  train (resumably), evaluate and release the text-LM zoo:
                                  5 variants x (1-, 2-layer attention-only, 4-layer MLP)
    attnlens analyze CKPT_DIR_OR_ZOO_NAME --analysis induction diversity gating circuits --out DIR
                                  write analysis tables (CSV/JSON) and figures (HTML; PNG with
                                  kaleido) for a checkpoint directory or a bundled model
                                  (see docs/analyses.md)
    attnlens convert SRC DST      rewrite pickled .bin/.pt weights (+ their index) as safetensors
                                  shards + index, reading them with torch.load(weights_only=True)
    attnlens sweep SPEC [--out DIR] [--ray [ADDRESS]] [--workers N]
                                  run a sweep spec (models x prompt sets x analyses, YAML/JSON)
                                  in shards, resumably; merged Parquet table + summary figures
    attnlens circuit CKPT_DIR_OR_ZOO_NAME [--task induction|findblock|conjunction-...] [--out DIR]
                                  find a circuit by edge attribution patching (EAP-IG or first
                                  order) on every variant's graph, head-mixing edges included;
                                  top edges, faithfulness, a figure (see docs/circuit_discovery.md)
    attnlens graph CKPT_DIR_OR_ZOO_NAME "prompt" [--target TOKEN] [--out DIR]
                                  an attribution graph (transcoders in place of the MLPs, frozen
                                  effective patterns): pruned, summarised, written as
                                  circuit-tracer / Neuronpedia graph JSON (docs/attribution.md)
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time
import warnings
from pathlib import Path

import pandas as pd

from attnlens.commands import UsageError, count
from attnlens.hooked_models import HookedVariantTransformer, available_variants
from attnlens.hooked_models.attention import get_attention_class
from attnlens.interp.tools import heads
from attnlens.training.trainer import train


def cmd_demo(args) -> int:
    """Train the bundled induction recipe from scratch and show the circuit it learns."""
    from attnlens.hooked_models.zoo.recipes import config
    from attnlens.interp.tasks.zoo_induction import induction_metrics, sample

    model = HookedVariantTransformer(config(args.attention, seed=args.seed))
    print(f"attnlens demo: 2-layer attention-only {args.attention!r} model, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters, trained on the second "
          f"copy of [BOS] r r (random letters)")
    t0 = time.time()
    train(model, sample, steps=args.steps, batch_size=32, lr=3e-3, seed=args.seed)
    metrics = induction_metrics(model)
    print(f"trained {args.steps} steps in {time.time() - t0:.1f}s; held-out second-copy loss "
          f"{metrics['second_copy_loss']:.3f}, accuracy {metrics['second_copy_accuracy']:.3f}")
    table = heads.induction_table(model, batch=32, half_len=15)
    pd.set_option("display.float_format", "{:.3f}".format)
    print("\nHead table (attention mass on each pattern, 32 held-out sequences of 15 + 15):")
    print(table[["previous_token", "induction_stripe", "duplicate_token"]].to_string())
    layer0, layer1 = table[table.layer == 0], table[table.layer == 1]
    prev = layer0["previous_token"].idxmax()
    ind = layer1["induction_stripe"].idxmax()
    knockout = heads.induction_ablation(model, [(0, int(layer0.loc[prev, "head"]))], batch=32,
                                        half_len=15)
    print(f"\nKnocking out {prev} (the strongest previous-token head) moves {ind}'s induction "
          f"score {knockout.loc[ind, 'before']:.3f} -> {knockout.loc[ind, 'after']:.3f}")
    return 0


def cmd_stages(args) -> int:
    for name in available_variants():
        print(f"\n{name}:")
        for s in get_attention_class(name).stages:
            kind = "rows sum to 1" if s.row_stochastic else ""
            where = "not softmax" if s.softmax == "neither" else f"{s.softmax}-softmax"
            print(f"  hook_{s.name:<22} {where:<12} {kind:<13} {s.description}")
    return 0


# `attnlens serve --zoo KIND`: every bundled model of that kind (the zoo cards' "kind")
ZOO_KINDS = {"text": "text-lm", "induction": "induction", "paper": "paper-task"}


# MHA, then CoPE: the Compare page opens on two maps that are both distributions, on one colour
# scale (MTA's effective pattern is not one: its small values would draw blank beside them).
OPENING_VARIANTS = ("mha", "cope", "mta", "dcmha", "infini")


def default_sources() -> list[str]:
    """What `attnlens serve` opens on without sources: every text language model of the zoo,
    the zoo's own 2-layer models first (the ones with circuits to find), MHA first and then
    CoPE, MTA, DCMHA, Infini, so the opening Compare page sets MHA's textbook induction circuit
    beside CoPE's, which splits it over two pairs of heads; then the 2-layer twins (data mix,
    package corpus), then by depth; the toy induction models when no text model is bundled."""
    from attnlens.hooked_models import zoo

    def opening_order(name: str) -> tuple:
        cfg = json.loads((zoo.path(name) / "config.json").read_text())
        layers, variant = cfg["n_layers"], cfg.get("attention", "mha")
        twin = not re.fullmatch(r"text-[a-z]+-l\d+(mlp)?", name)
        rank = OPENING_VARIANTS.index(variant) if variant in OPENING_VARIANTS else 99
        return layers != 2, twin, layers, rank, name

    return sorted(zoo.available(kind="text-lm"), key=opening_order) or zoo.available(
        kind="induction")


def build_store(sources: list[str] | None = None):
    """A ModelStore of the checkpoint directories / zoo names in `sources` (default:
    `default_sources()`)."""
    from attnlens.dashboards.store import load_store

    sources = sources or default_sources()
    if not sources:
        raise SystemExit("no bundled models found in hooked_models/zoo; pass checkpoint "
                         "directories: attnlens serve DIR [DIR ...]")
    try:
        return load_store(sources)
    except ValueError as err:
        raise SystemExit(f"attnlens serve: {err}") from None


def check_port(host: str, port: int) -> None:
    """SystemExit naming the problem and suggesting --port when `host:port` cannot be listened
    on (taken by another program, a bad host, a privileged port); nothing is started."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            # as Werkzeug's server does: a port left in TIME_WAIT by a closed server is free
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except (OSError, OverflowError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        other = port + 1 if 0 < port < 65535 else 8051
        raise SystemExit(f"attnlens serve: cannot listen on {host}:{port} ({reason}); another "
                         "program (perhaps another dashboard) may hold the port: choose a free "
                         f"one with --port, e.g. attnlens serve --port {other}") from None


def cmd_serve(args) -> int:
    from attnlens.dashboards.app import create_app

    check_port(args.host, args.port)   # before loading models and before saying where it runs
    from attnlens.hooked_models import zoo

    sources = [*(args.sources or []), *(args.models or [])]
    for kind in args.zoo or []:   # a zoo's superseded models (1000-step baselines) come last
        names = zoo.available(kind=ZOO_KINDS[kind], superseded=False)
        names += [n for n in zoo.available(kind=ZOO_KINDS[kind]) if n not in names]
        sources += [n for n in names if n not in sources]
    with warnings.catch_warnings():   # said once below, not once per model
        warnings.simplefilter("ignore", zoo.SupersededModelWarning)
        store = build_store(sources)
    old = [n for n in sources if n in store.names and zoo.superseded_by(n)]
    if old:
        print(f"{len(old)} superseded model(s), kept as baselines, better ones bundled "
              f"(docs/reproduction.md, 'Superseded models'): {', '.join(old)}", file=sys.stderr)
    app = create_app(store, host=args.host)
    print(f"attnlens dashboard on http://{args.host}:{args.port} with {', '.join(store.names)}")
    app.run(host=args.host, port=args.port, debug=False)
    return 0


def cmd_train(args) -> int:
    """Thin wrapper over attnlens.lab.text_train (see its docstring for the layout)."""
    import shlex

    import torch

    from attnlens.lab.text_recipes import RECIPES, SMOKE, VOCAB_SIZE
    from attnlens.lab.text_train import default_runs_dir, measure, prepare_data, train_zoo
    from attnlens.training.stop_signals import TrainingStopped

    if args.out is None:
        args.out = str(default_runs_dir())
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.threads:
        # One thread per model: on a shared 2-core machine two single-thread runs beat one
        # two-thread run (issue 26's measurements).
        torch.set_num_threads(args.threads)
    names = args.only or list(RECIPES)
    if args.status:
        from attnlens.hooked_models import zoo
        from attnlens.lab.text_train import print_queue_status, queue_status, shipped_recipes

        print_queue_status(queue_status(args.out, names, args.release_to), file=sys.stdout,
                           shipped=shipped_recipes(names, zoo.ZOO_DIR))
        return 0
    if args.measure:
        data = prepare_data(f"{args.out}/cache",
                            vocab_size=SMOKE["vocab_size"] if args.smoke else VOCAB_SIZE,
                            max_files=SMOKE["max_files"] if args.smoke else None,
                            val_fraction=SMOKE["val_fraction"] if args.smoke else 0.05)
        rows = measure(names, data, device, steps=args.measure_steps, batch=args.measure_batch,
                       smoke=args.smoke)
        table = pd.DataFrame(rows).set_index("recipe")
        print(table.to_string())
        print(f"projected total on {device}: {table.projected_s.sum() / 60:.1f} min of wall "
              f"time, {table.projected_cpu_s.sum() / 3600:.2f} CPU-hours (training steps only; "
              f"evaluation adds about 1%)")
        return 0
    from attnlens.hooked_models import zoo

    command = "attnlens " + shlex.join(args.argv)
    try:
        released = train_zoo(args.out, device=device, names=names, seed=args.seed,
                             smoke=args.smoke, release_to=args.release_to,
                             progress=not args.no_progress, command=command,
                             skip_shipped_in=zoo.ZOO_DIR if args.skip_shipped else None)
    except TrainingStopped as stop:   # SIGTERM / SIGHUP / Ctrl-C, after the step's checkpoint
        print(f"[attnlens train] {stop}", file=sys.stderr, flush=True)
        return 128 + stop.signum
    for path in released:
        print(f"released {path}")
    return 0


def load_model(source: str, device: str | None, command: str):
    """The model of a checkpoint directory or a zoo name (a directory wins, as in `serve`);
    SystemExit with a one-line message for a missing path or a checkpoint that fails to load."""
    from attnlens.hooked_models import zoo

    path = Path(source)
    if (path / "config.json").is_file():
        directory = path
    elif source in zoo.available():
        directory = zoo.path(source)
    elif path.exists():
        raise SystemExit(f"attnlens {command}: {source} is not a checkpoint directory (it has "
                         "no config.json)")
    else:
        raise SystemExit(f"attnlens {command}: {source!r} is neither an existing checkpoint "
                         f"directory nor a bundled model; bundled: {', '.join(zoo.available())}")
    try:
        return HookedVariantTransformer.from_pretrained(directory, device=device)
    except ValueError as err:
        raise SystemExit(f"attnlens {command}: {err}") from None


def cmd_analyze(args) -> int:
    from attnlens.interp.tools.analyze import run_analyses

    model = load_model(args.checkpoint, args.device, "analyze")
    try:
        manifest = run_analyses(model, args.analysis, args.out, batch=args.batch,
                                half_len=args.half_len, seed=args.seed, png=not args.no_png)
    except ValueError as err:
        raise SystemExit(f"attnlens analyze: {err}") from None
    n = sum(len(v) for v in manifest["files"].values())
    print(f"wrote {n} files to {args.out} (manifest.json lists them)")
    for analysis, notes in manifest["notes"].items():
        for note in notes:
            print(f"  {analysis}: {note}")
    return 0


def cmd_sweep(args) -> int:
    from attnlens.interp.sweep import run_sweep

    try:
        result = run_sweep(args.spec, out=args.out, ray=args.ray, workers=args.workers,
                           progress=not args.no_progress, png=not args.no_png)
    except ValueError as err:
        raise SystemExit(f"attnlens sweep: {err}") from None
    print(f"{result.shards} shards ({result.ran} run, {result.skipped} already done) in "
          f"{result.seconds:.1f}s; merged table {result.out / 'merged.parquet'} "
          f"({len(result.merged)} rows), {len(result.figures)} figure files")
    return 0


def cmd_circuit(args) -> int:
    """Discover a circuit (issue 25): print the top edges and faithfulness, write the figure."""
    import json

    import torch

    from attnlens.interp.circuits.discovery import (
        circuit_figure,
        conjunction_task_pair,
        discover,
        find_block_task,
        induction_task,
    )
    from attnlens.interp.plots.analyses import save_figure

    if args.variant is not None and args.task != "findblock":
        raise UsageError("circuit", "--variant is the find-the-block answer variant: it goes "
                                    f"with --task findblock, not --task {args.task}")
    torch.set_num_threads(max(1, args.threads))
    model = load_model(args.model, args.device, "circuit")
    try:
        if args.task == "induction":
            task = induction_task(model, n_prompts=args.prompts, half_len=args.half_len,
                                  seed=args.seed)
        elif args.task == "findblock":
            task = find_block_task(model, n_prompts=args.prompts, seed=args.seed,
                                   variant=find_block_variant(model, args))
        else:   # "conjunction-attribute" / "conjunction-value"
            task = conjunction_task_pair(model, n_prompts=args.prompts, seed=args.seed,
                                         corrupt=args.task.split("-", 1)[1])
        found = discover(model, task, method=args.method, steps=args.steps,
                         top_k=None if args.threshold is not None else args.top_k,
                         threshold=args.threshold, ablation=args.ablation)
    except ValueError as err:
        raise SystemExit(f"attnlens circuit: {err}") from None
    print(task.description)
    print(f"graph: {found.graph.summary()}")
    print(found.top_edges(args.show).to_string(index=False))
    faith = found.faithfulness
    print(f"faithfulness {faith['faithfulness']:.3f} ({faith['edges']} edges, rest patched to "
          f"{faith['ablation']}): metric clean {faith['clean']:.4f}, circuit "
          f"{faith['circuit']:.4f}, all ablated {faith['ablated']:.4f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        fig = circuit_figure(found.graph, found.scores, found.circuit,
                             title=f"{args.model}: {args.method} circuit, faithfulness "
                                   f"{faith['faithfulness']:.3f}")
        # plotly.min.js is written beside the page, which then works offline (no CDN)
        written = save_figure(fig, out / "circuit", png=not args.no_png)
        (out / "circuit.json").write_text(json.dumps({
            "model": args.model, "task": task.description, "method": args.method,
            "steps": args.steps, "faithfulness": faith,
            "circuit": [e.name for e in found.circuit], "figure": json.loads(fig.to_json())}))
        found.scores.to_csv(out / "scores.csv", index=False)
        names = [p.name for p in written]
        print(f"wrote {', '.join(str(out / n) for n in names)}, circuit.json, scores.csv "
              "(plotly.min.js beside the page: it opens offline)")
    return 0


def find_block_variant(model, args) -> str:
    """The find-the-block answer variant: --variant, else the one in the model's recipe name
    (the zoo's mta-findblock-* models); UsageError naming both ways when there is neither."""
    from attnlens.hooked_models import zoo
    from attnlens.interp.circuits.discovery.paper_tasks import FIND_BLOCK_VARIANTS, model_variant

    if args.variant is not None:
        return FIND_BLOCK_VARIANTS[args.variant]
    try:
        return model_variant(model)
    except ValueError:
        recipe = model.cfg.metadata.get("recipe", "")
        bundled = [n for n in zoo.available() if n.startswith("mta-findblock-")]
        example = f" (bundled: {bundled[0]}, ...)" if bundled else ""
        raise UsageError("circuit", f"{args.model} is not one of the zoo's find-the-block "
                                    f"models (its recipe {recipe!r} names no answer variant): "
                                    "--task findblock is for models trained on find-the-block"
                                    f"{example}; for a checkpoint of your own trained on it, "
                                    "add --variant first|last|all") from None


def build_parser() -> argparse.ArgumentParser:
    """The `attnlens` parser; docs/cli.md is generated from it
    (`python -m attnlens.reports.docs_gen`)."""
    parser = argparse.ArgumentParser(prog="attnlens", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a toy model and print its head table")
    demo.add_argument("--steps", type=int, default=1500)
    demo.add_argument("--attention", default="mha", help=f"one of {available_variants()}")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(fn=cmd_demo)
    stages = sub.add_parser("stages", help="print the stage catalogue of every variant")
    stages.set_defaults(fn=cmd_stages)
    serve = sub.add_parser("serve", help="run the dashboard on checkpoints or zoo models")
    serve.add_argument("sources", nargs="*", metavar="CKPT_DIR_OR_ZOO_NAME",
                       help="checkpoint directories or bundled model names (default: the "
                            "bundled text language models, 2-layer first); the browser can "
                            "choose only among these")
    serve.add_argument("--zoo", nargs="+", choices=sorted(ZOO_KINDS), default=None,
                       metavar="KIND", help="add every bundled model of a kind: text (the "
                       "text language models), induction (the five toy induction models), "
                       "paper (the paper-task models)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8050)
    serve.add_argument("--models", nargs="*", default=None, help="more zoo names (old spelling)")
    serve.set_defaults(fn=cmd_serve)
    from attnlens.lab.text_recipes import all_recipe_names

    tr = sub.add_parser("train", help="train, evaluate and release the text-LM zoo")
    tr.add_argument("--zoo", choices=["text"], required=True, help="which zoo to train")
    tr.add_argument("--only", nargs="+", choices=all_recipe_names(),
                    default=None, metavar="RECIPE",
                    help="recipes to train: text-{mha,mta,cope,dcmha,infini}-{l1,l2,l4mlp}, "
                         "a 2-layer data-mix twin text-VARIANT-l2-mix, a calibration run "
                         "text-mha-l2-* (ctx256, b8 and the session-sized runs listed in "
                         "docs/zoo.md), a seed of the DCMHA vs MHA comparison "
                         "text-{mha,dcmha}-l2-short-s{0,1,2}, or a seed replicate of the zoo's "
                         "text-{mha,dcmha}-l2-s{1,2} (default: the 15)")
    tr.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when present)")
    tr.add_argument("--out", default=None,
                    help="runs, caches and releases go here (default $ATTNLENS_RUNS/zoo-text, "
                         "else ~/.cache/attnlens/lab-text: outside the work tree, which each "
                         "session lays anew)")
    tr.add_argument("--release-to", default=None,
                    help="where finished models are written (default OUT/release; "
                         "hooked_models/zoo only for full-budget runs)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--smoke", action="store_true",
                    help="tiny shapes, 40 files, 4 steps: checks the pipeline, never a zoo")
    tr.add_argument("--status", action="store_true",
                    help="print where each recipe stands (shipped, released, step x of y with "
                         "CPU hours so far and the CPU hours left at its recent tokens per "
                         "CPU-second, not started); train nothing")
    tr.add_argument("--measure", action="store_true",
                    help="print tokens per wall-second and per CPU-second of each recipe and the "
                         "projected time; train nothing")
    tr.add_argument("--measure-steps", type=int, default=3)
    tr.add_argument("--measure-batch", type=int, default=None)
    tr.add_argument("--threads", type=int, default=1,
                    help="torch threads for this process (default 1; 0: torch's default)")
    tr.add_argument("--no-progress", action="store_true")
    tr.add_argument("--skip-shipped", action="store_true",
                    help="skip the recipes whose model is shipped in hooked_models/zoo at "
                         "today's recipe (what scripts/zoo_queue.sh does)")
    tr.set_defaults(fn=cmd_train)
    from attnlens.interp.tools.analyze import ANALYSES

    analyze = sub.add_parser("analyze", help="write analysis tables and figures for a checkpoint")
    analyze.add_argument("checkpoint", metavar="CKPT_DIR_OR_ZOO_NAME",
                         help="checkpoint directory (config.json, safetensors) or bundled model "
                              "name")
    analyze.add_argument("--analysis", nargs="+", choices=ANALYSES,
                         default=["induction", "diversity", "gating", "circuits"])
    analyze.add_argument("--out", required=True, help="output directory")
    analyze.add_argument("--batch", type=int, default=8, help="probe sequences")
    analyze.add_argument("--half-len", type=int, default=None,
                         help="length of the repeated half of the probe (default: fits n_ctx)")
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--device", default="cpu")
    analyze.add_argument("--no-png", action="store_true", help="HTML figures only")
    analyze.set_defaults(fn=cmd_analyze)
    from attnlens.hooked_models.converters.convert import add_convert_parser

    add_convert_parser(sub)
    sweep = sub.add_parser("sweep", help="run an analysis sweep spec (in-process or on Ray)")
    sweep.add_argument("spec", help="sweep spec (.yaml, .yml or .json; see interp/sweep/spec.py)")
    sweep.add_argument("--out", default=None, help="sweep folder (default: the spec's 'out')")
    sweep.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                       help="run shards as Ray tasks: on the cluster at ADDRESS, or a local "
                            "one when no address is given (needs attnlens[ray])")
    sweep.add_argument("--workers", type=int, default=2, help="Ray workers (actors)")
    sweep.add_argument("--no-png", action="store_true", help="HTML figures only")
    sweep.add_argument("--no-progress", action="store_true")
    sweep.set_defaults(fn=cmd_sweep)
    circuit = sub.add_parser("circuit", help="discover a circuit by edge attribution patching")
    circuit.add_argument("model", metavar="CKPT_DIR_OR_ZOO_NAME")
    circuit.add_argument("--task", choices=["induction", "findblock", "conjunction-attribute",
                                            "conjunction-value"], default="induction",
                         help="induction: clean [BOS] r r vs corrupted [BOS] r' r, metric "
                              "next-token log-prob on the second copy; findblock (MTA's "
                              "find-the-block models): the target block's letters replaced; "
                              "conjunction-attribute / -value (DCMHA's conjunction models): "
                              "one attribute or the value of the target record replaced; "
                              "metric: the answer's log-prob")
    circuit.add_argument("--variant", choices=["first", "last", "all"], default=None,
                         help="--task findblock: the answer variant the model was trained on "
                              "(default: read from the zoo model's recipe name)")
    circuit.add_argument("--method", choices=["eap-ig", "attribution"], default="eap-ig")
    circuit.add_argument("--steps", type=count(1), default=10,
                         help="EAP-IG interpolation steps")
    circuit.add_argument("--top-k", type=count(1), default=20, help="edges kept (after pruning)")
    circuit.add_argument("--threshold", type=float, default=None,
                         help="keep edges with |score| >= this instead of --top-k")
    circuit.add_argument("--prompts", type=count(1), default=16)
    circuit.add_argument("--half-len", type=int, default=None,
                         help="length of the repeated half (default: fits n_ctx, at most 10)")
    circuit.add_argument("--seed", type=int, default=0)
    circuit.add_argument("--ablation", choices=["corrupted", "mean"], default="corrupted")
    circuit.add_argument("--show", type=count(0), default=15, help="edges printed")
    circuit.add_argument("--out", default=None,
                         help="write circuit.html (with plotly.min.js beside it, so it opens "
                              "offline), circuit.png, circuit.json and scores.csv here")
    circuit.add_argument("--no-png", action="store_true", help="HTML figure only")
    circuit.add_argument("--device", default="cpu")
    circuit.add_argument("--threads", type=int, default=1)
    circuit.set_defaults(fn=cmd_circuit)
    from attnlens.commands import graph
    graph.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.fn(args)
    except UsageError as err:   # a bad argument found before any work: one line, status 2
        print(f"attnlens {err.command}: error: {err.message}", file=sys.stderr)
        raise


if __name__ == "__main__":
    sys.exit(main())
