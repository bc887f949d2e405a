"""`attnlens graph MODEL "prompt" [--target TOKEN]`: an attribution graph on a model with
transcoders (attnlens.interp.attribution; docs/attribution.md).

The features that enter the graph are chosen by influence up to a node budget
(`--max-features`, default 2,048) within a memory budget (`--memory`, default 2GB); what the
budget left out is printed and written into the JSON (`metadata.info.budget`). float32 unless
`--float64`. Prints the target, the graph's size before and after pruning, the error nodes'
share of the target's direct effects, and the most influential features (with their top
contexts from the model's validation windows, `--contexts`). With `--out DIR` writes
`<slug>.json` in the format circuit-tracer's local server and Neuronpedia's graph viewer read
(plus `graph-metadata.json`) and `<slug>.html`, the pruned graph drawn with plotly
(plotly.min.js beside it: it opens offline). Into that JSON, on request: `--head-loadings`
(each kept edge split across the attention heads it passes, the `attention` extension,
`attnlens.interp.attribution.head_loadings`), `--qk-heads N` (the QK attribution of the N heads
carrying the most of it) and `--feature-pages N` (each kept feature's N top contexts as the
per-feature pages circuit-tracer's local viewer reads, under `<out>/features/<slug>/`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlens.commands import UsageError, count

# AttributionBudget's defaults (attnlens.interp.attribution.budget; a test checks they agree),
# written here so building the parser does not import torch
DEFAULT_MAX_FEATURE_NODES = 2048
DEFAULT_MEMORY = "2GB"


def share(text: str) -> float:
    """An argparse type: a number in (0, 1] (a share of the influence)."""
    from attnlens.interp.attribution.prune import check_threshold

    try:
        return check_threshold("threshold", float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1], got {text!r}") from None


def feature_budget(text: str) -> int | None:
    """An argparse type: a positive number of features, or "all" (None: every feature)."""
    if text.strip().lower() in ("all", "none"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number of features or 'all', "
                                         f"got {text!r}")
    return value


def memory_budget(text: str) -> str | None:
    """An argparse type: a size such as 2GB (checked by `budget.parse_memory`), or none."""
    from attnlens.interp.attribution.budget import parse_memory

    try:
        return None if parse_memory(text) is None else text
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="an attribution graph (transcoders, frozen patterns) on a "
                                     "prompt, in circuit-tracer's JSON format")
    p.add_argument("model", metavar="CKPT_DIR_OR_ZOO_NAME",
                   help="a model with transcoders in <dir>/transcoders (the zoo's -l4mlp text "
                        "models ship them)")
    p.add_argument("prompt")
    p.add_argument("--target", action="append", default=None, metavar="TOKEN",
                   help="the logit to explain at the last position (text of one token; "
                        "repeatable, each token once; default: the likeliest tokens up to 95%% "
                        "probability)")
    p.add_argument("--node-threshold", type=share, default=0.8,
                   help="keep the features covering this share of influence, in (0, 1] "
                        "(default 0.8)")
    p.add_argument("--edge-threshold", type=share, default=0.98,
                   help="keep the edges covering this share of edge influence, in (0, 1] "
                        "(default 0.98)")
    p.add_argument("--show", type=count(0), default=12, metavar="N",
                   help="features printed (default 12)")
    p.add_argument("--contexts", type=count(0), default=0, metavar="N",
                   help="print each shown feature's N top contexts (validation windows)")
    p.add_argument("--batch-size", type=count(1), default=None,
                   help="targets per backward pass (default: as many as the memory budget "
                        "allows, at most 64)")
    p.add_argument("--max-features", type=feature_budget, default=DEFAULT_MAX_FEATURE_NODES,
                   metavar="N",
                   help="the node budget: at most N features enter the graph, chosen by "
                        "influence on the targets (estimated from the logit rows, refined as "
                        "rows come in); 'all' for every active feature (default "
                        f"{DEFAULT_MAX_FEATURE_NODES})")
    p.add_argument("--memory", type=memory_budget, default=DEFAULT_MEMORY, metavar="SIZE",
                   help="the memory budget of the rows, the adjacency and a batch, e.g. 2GB, "
                        f"512MB, 'none' (default {DEFAULT_MEMORY}): a graph that cannot fit "
                        "is refused before the rows are computed")
    p.add_argument("--float64", action="store_true",
                   help="run in float64 (identities exact to ~1e-12; twice the memory) instead "
                        "of float32")
    p.add_argument("--out", default=None, help="write <slug>.json and <slug>.html here")
    p.add_argument("--head-loadings", action="store_true",
                   help="with --out: split each kept edge across the attention heads it passes "
                        "(per layer; MTA / DCMHA over the source heads of their mixing) and "
                        "write the split into the JSON's 'attention' extension")
    p.add_argument("--qk-heads", type=count(0), default=0, metavar="N",
                   help="with --out: also the QK attribution of the N heads carrying the most "
                        "head loading, at their busiest (query, key) entry (implies "
                        "--head-loadings)")
    p.add_argument("--feature-pages", type=count(0), default=0, metavar="N",
                   help="with --out: write each kept feature's N top contexts (validation "
                        "windows) as the per-feature pages circuit-tracer's viewer reads, "
                        "beside the graph")
    p.add_argument("--slug", default=None,
                   help="graph name in the viewer and file name (default: the model and "
                        "prompt's letters and digits plus a hash of the exact model, prompt "
                        "and targets, so distinct prompts never share a file)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(fn=run)


def resolve(source: str) -> Path:
    from attnlens.hooked_models import zoo

    path = Path(source)
    if (path / "config.json").is_file():
        return path
    if source in zoo.available():
        return zoo.path(source)
    raise SystemExit(f"attnlens graph: {source!r} is neither a checkpoint directory (with "
                     "config.json) nor a bundled model")


def check_arguments(args, directory: Path) -> str | None:
    """Everything about the arguments that can be wrong, checked before the model is loaded and
    the graph computed (UsageError): the prompt's characters, repeated targets, the slug and
    the output folder. Returns the slug (None without --out)."""
    from attnlens.interp.attribution.contexts import EVAL_TOKENS_FILE, context_windows
    from attnlens.interp.attribution.export import check_output, check_slug, default_slug
    from attnlens.interp.attribution.replacement import check_prompt_text

    try:
        check_prompt_text(args.prompt)
        for target in args.target or []:
            check_prompt_text(target, f"--target {target!r}")
        repeated = sorted({t for t in args.target or [] if args.target.count(t) > 1})
        if repeated:
            raise ValueError(f"--target {repeated[0]!r} is given more than once: each logit "
                             "node needs its own token")
        if args.slug is not None:
            check_slug(args.slug)
        asked = [flag for flag, on in (("--head-loadings", args.head_loadings),
                                       ("--qk-heads", args.qk_heads),
                                       ("--feature-pages", args.feature_pages)) if on]
        if asked and not args.out:
            raise ValueError(f"{' and '.join(asked)} write into the graph's files: give --out")
        if args.feature_pages and context_windows(directory) is None:
            raise ValueError(f"--feature-pages needs the validation windows beside the model "
                             f"({directory}/{EVAL_TOKENS_FILE}); this checkpoint has none")
        if not args.out:
            return None
        slug = args.slug or default_slug(directory.name, args.prompt, args.target)
        check_output(args.out, slug)
        return slug
    except ValueError as err:
        raise UsageError("graph", str(err)) from None


def missing_transcoders(directory: Path, err: Exception) -> str:
    """The message for a model without transcoders: the lab's command where it takes this
    model (a zoo MLP model in the zoo's own folder), the library otherwise."""
    from attnlens.hooked_models import zoo
    from attnlens.lab.transcoders import MLP_MODELS

    name = directory.name
    if name in MLP_MODELS and name in zoo.available() \
            and zoo.path(name).resolve() == directory.resolve():
        return (f"{name} has no transcoders; train them with "
                f"`python -m attnlens.lab.transcoders train {name}`")
    return (f"{err} (`python -m attnlens.lab.transcoders train` takes only the zoo's MLP "
            f"models: {', '.join(MLP_MODELS)})")


def run(args) -> int:
    import torch

    from attnlens.hooked_models import HookedVariantTransformer
    from attnlens.interp.attribution.budget import AttributionBudget
    from attnlens.interp.attribution.contexts import transcoders_for
    from attnlens.interp.attribution.graph import attribute
    from attnlens.interp.attribution.prune import prune

    directory = resolve(args.model)
    slug = check_arguments(args, directory)
    budget = AttributionBudget(max_feature_nodes=args.max_features, memory=args.memory)
    dtype = torch.float64 if args.float64 else torch.float32
    try:
        model = HookedVariantTransformer.from_pretrained(directory, device="cpu").to(dtype).eval()
        if model.cfg.attn_only:
            raise ValueError(f"{directory.name} is attention-only: attribution graphs replace "
                             "MLPs by transcoders, so they need a model with MLPs (the zoo's "
                             "-l4mlp text models ship transcoders)")
        try:
            transcoders = transcoders_for(directory, dtype=dtype)
        except FileNotFoundError as err:
            raise ValueError(missing_transcoders(directory, err)) from None
        graph = attribute(model, transcoders, args.prompt, targets=args.target,
                          batch_size=args.batch_size, progress=not args.no_progress,
                          budget=budget,
                          model_name=directory.name, transcoder_set=f"{directory.name}/transcoders")
        pruned = prune(graph, args.node_threshold, args.edge_threshold)
    except ValueError as err:
        raise SystemExit(f"attnlens graph: {err}") from None
    graph.node_influence = pruned.node_influence
    summary(graph, pruned, args.show)
    if args.contexts:
        print_contexts(model, transcoders, directory, graph, pruned, args.show, args.contexts)
    if args.out:
        from attnlens.interp.attribution.export import write_graph
        from attnlens.interp.plots.analyses import save_figure
        from attnlens.interp.plots.attribution_graph import graph_figure

        out = Path(args.out)
        try:
            extras = attention_extras(model, transcoders, graph, pruned, args)
            if args.feature_pages:
                from attnlens.interp.attribution.contexts import (
                    context_windows,
                    write_feature_pages,
                )

                scan, pages = write_feature_pages(
                    model, transcoders, graph, out, slug, context_windows(directory),
                    node_mask=pruned.node_mask, n=args.feature_pages)
                extras["scan"] = scan
                print(f"wrote {len(pages)} feature pages under {out / 'features'}")
            path = write_graph(graph, out, slug, node_mask=pruned.node_mask,
                               edge_mask=pruned.edge_mask, node_threshold=args.node_threshold,
                               **extras)
            fig = graph_figure(graph, pruned, title=f"{directory.name}: {args.prompt!r} -> "
                                                     f"{graph.logit_token_strings[0]!r}")
            written = save_figure(fig, out / slug, png=False)
        except (ValueError, OSError) as err:
            raise SystemExit(f"attnlens graph: {err}") from None
        print(f"wrote {path} (circuit-tracer / Neuronpedia graph JSON) and "
              f"{', '.join(str(p) for p in written)}")
    return 0


def attention_extras(model, transcoders, graph, pruned, args) -> dict:
    """`write_graph`'s head loadings and QK of the top heads, when asked (module doc); the
    heads carrying the most loading printed."""
    if not (args.head_loadings or args.qk_heads):
        return {}
    from attnlens.interp.attribution.head_loadings import head_loadings, qk_for_top_heads
    from attnlens.interp.attribution.replacement import clean_run

    run = clean_run(model, transcoders, graph.tokens[None])
    loads = head_loadings(model, transcoders, graph, edge_mask=pruned.edge_mask, run=run)
    kind = "source heads (post-softmax mixing)" if loads.source_heads else "heads"
    top = ", ".join(f"L{layer}H{head} {value:.3g}" for layer, head, value in loads.top_heads(3))
    print(f"head loadings of {len(loads.edges)} kept edges; {kind} carrying the most: {top}")
    extras = {"head_loadings": loads}
    if args.qk_heads:
        extras["qk"] = qk_for_top_heads(model, transcoders, graph, loads, n=args.qk_heads,
                                        run=run)
    return extras


def summary(graph, pruned, show: int) -> None:
    n_edges = int((graph.adjacency != 0).sum())
    print(f"{graph.model_name}: {graph.n_pos} tokens {graph.prompt_tokens}")
    for i in range(graph.n_logits):
        p = float(graph.logit_probabilities[i])
        print(f"  logit {graph.logit_token_strings[i]!r}: p={p:.3f}")
    active = graph.budget.n_active if graph.budget is not None else graph.n_features
    print(f"graph: {active} active features, {graph.n_features} in the graph, "
          f"{graph.n_errors} error nodes, "
          f"{n_edges} edges; pruned to {int(pruned.node_mask[:graph.n_features].sum())} "
          f"features and {int(pruned.edge_mask.sum())} edges (node threshold "
          f"{pruned.node_threshold}, edge threshold {pruned.edge_threshold})")
    if graph.budget is not None:
        print(graph.budget.summary())
        if graph.budget.n_left_out:
            top = graph.budget.to_json(top=3)["top_left_out"]
            print("  most influential features left out: " + ", ".join(
                f"L{t['layer']} F{t['feature']} @{t['pos']} ({t['influence']:.3g})"
                for t in top))
    print(f"error nodes' share of |direct effects| on {graph.logit_token_strings[0]!r}: "
          f"{graph.error_share():.1%}")
    influence = pruned.node_influence[:graph.n_features]
    order = influence.argsort(descending=True)[:show]
    print("most influential features:")
    for i in order.tolist():
        print(f"  {float(influence[i]):.3f}  {graph.node_label(i)}  "
              f"(activation {float(graph.activations[i]):.3f})")


def print_contexts(model, transcoders, directory, graph, pruned, show: int, n: int) -> None:
    from attnlens.interp.attribution.contexts import (
        context_windows,
        feature_activations,
        top_contexts,
    )

    tokens = context_windows(directory)
    if tokens is None:
        print("(no validation windows beside the model: no contexts)")
        return
    influence = pruned.node_influence[:graph.n_features]
    acts = {}
    for i in influence.argsort(descending=True)[:show].tolist():
        layer, _, feature = graph.features[i].tolist()
        if layer not in acts:
            acts[layer] = feature_activations(model, transcoders[layer], tokens)
        print(f"{graph.node_label(i)}:")
        for c in top_contexts(model, acts[layer], tokens, feature, n=n):
            print(f"    {c.activation:7.3f}  {(c.before + '[[' + c.token + ']]' + c.after)!r}")
