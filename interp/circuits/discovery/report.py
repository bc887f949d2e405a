"""The induction circuit on the bundled models: the tables of docs/circuit_discovery.md.

    python -m attnlens.interp.circuits.discovery.report [--prompts 32] [--seed 0] [--top-k 20]
    python -m attnlens.interp.circuits.discovery.report --models text-mha-l2 --half-len 20

For each `induction-<variant>` (or each model named by `--models`): EAP-IG (10 steps) and
first-order attribution scores on `induction_task` (clean `[BOS] r r` vs corrupted `[BOS] r' r`,
|r| = 10 or `--half-len`), the pruned top-k circuit, its faithfulness with the rest patched to
the corrupted run and to the corrupted mean, whether a previous-token head -> induction head
K-composition edge and an induction head -> logits edge were recovered, and the strongest
within-layer map edge checked by exact patching.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from attnlens.interp.circuits.discovery.discover import discover
from attnlens.interp.circuits.discovery.engine import run
from attnlens.interp.circuits.discovery.extract import (
    circuit_metric,
    faithfulness,
    faithfulness_curve,
    reference_record,
    select_edges,
)
from attnlens.interp.circuits.discovery.graph import build_graph
from attnlens.interp.circuits.discovery.induction import induction_heads, induction_task, recovery
from attnlens.interp.circuits.discovery.scoring import attribution_patching, eap_ig, exact_patching

VARIANTS = ("mha", "mta", "cope", "dcmha", "infini")
SIZES = (5, 10, 20, 30, 40, 60, 80, 100)


def load(name: str):
    """A checkpoint directory (one with config.json) or else the bundled model `name`."""
    from attnlens.hooked_models import HookedVariantTransformer, zoo

    path = Path(name)
    if (path / "config.json").is_file():
        return HookedVariantTransformer.from_pretrained(path).eval()
    return zoo.load(name)


def model_rows(name: str, prompts: int = 32, seed: int = 0, top_k: int = 20,
               steps: int = 10, half_len: int = 10) -> tuple[dict, dict]:
    """The two table rows of the bundled model `name`: the top-k circuit (recovery and
    faithfulness) and its within-layer edges (in the smallest circuit with faithfulness >= 0.9)."""
    model = load(name)
    task = induction_task(model, n_prompts=prompts, half_len=half_len, seed=seed)
    heads = induction_heads(model, task)
    found = discover(model, task, "eap-ig", steps=steps, top_k=top_k)
    first = discover(model, task, "attribution", top_k=top_k)
    graph, faith = found.graph, found.faithfulness
    mean = faithfulness(model, graph, found.circuit, task.clean, task.corrupted, task.metric,
                        "mean")
    rec = recovery(graph, found.scores, found.circuit, heads)
    comp = rec["k_composition"]
    top = {"model": name, "prev-token heads": " ".join(heads["previous_token"]) or "none",
           "induction heads": " ".join(heads["induction"]) or "none",
           "metric clean / corrupted": f"{faith['clean']:.3f} / {faith['ablated']:.3f}",
           "edges": len(found.circuit), "faith EAP-IG": faith["faithfulness"],
           "faith AP": first.faithfulness["faithfulness"],
           "faith EAP-IG, mean-ablated": mean["faithfulness"],
           "K-composition edges (of possible)": f"{len(comp)} of "
                                                f"{rec['k_composition_possible']}: "
                                                + (" ".join(comp) or "-"),
           "best K-comp rank": rec["best_k_composition_rank"] or "-",
           "induction -> logits": " ".join(rec["induction_to_logits"]) or "none",
           "recovered": rec["recovered"],
           "how": ("K-composition" if rec["k_composition"] and rec["induction_to_logits"]
                   else "one layer" if rec["one_layer"] else "-")}
    curve = faithfulness_curve(model, graph, found.scores, task.clean, task.corrupted,
                               task.metric, sizes=SIZES)
    enough = curve[curve.faithfulness >= 0.9]
    k90 = int(enough.top_k.iloc[0]) if len(enough) else SIZES[-1]
    circuit = select_edges(graph, found.scores, top_k=k90)
    ref = reference_record(model, graph, task.corrupted)
    gap = faith["clean"] - faith["ablated"]

    def faith_of(edges) -> float:
        value = circuit_metric(model, graph, edges, task.clean, task.metric, ref)
        return (value - faith["ablated"]) / gap

    inner = [e for e in circuit if e.kind != "resid"]
    within = {"model": name,
              # the largest size tried when no size reaches 0.9 ("> 100": its faith says how far)
              "edges for faith >= 0.9": len(circuit) if len(enough) else f"> {SIZES[-1]}",
              "its faith": faith_of(circuit), "within-layer edges in it": len(inner),
              "faith without them": faith_of([e for e in circuit if e.kind == "resid"])
              if inner else "-"}
    maps = [e for e in graph.edges if e.kind != "resid"]
    if maps:
        patched = run(model, graph, task.clean, task.metric, patch={e: 1.0 for e in maps},
                      reference=ref).metric
        exact = exact_patching(model, graph, task.clean, task.corrupted, task.metric, maps)
        best = exact.loc[exact.score.abs().idxmax()]
        within.update({"all within-layer edges patched (metric change)":
                       patched - faith["clean"],
                       "strongest single one (exact change)": f"{best.edge}: {best.score:.3f}"})
    return top, within


def agreement_row(name: str, prompts: int = 16, seed: int = 0, half_len: int = 10) -> dict:
    """Pearson correlation, over every edge of the bundled model `name`, between exact patching
    of that edge alone and attribution patching / EAP-IG with 2 and 10 steps."""
    model = load(name)
    task = induction_task(model, n_prompts=prompts, half_len=half_len, seed=seed)
    graph = build_graph(model)
    exact = exact_patching(model, graph, task.clean, task.corrupted, task.metric,
                           graph.edges).score.to_numpy()
    row = {"model": name, "edges": len(graph.edges),
           "median abs exact": float(np.median(np.abs(exact)))}
    for label, table in (
            ("attribution", attribution_patching(model, graph, task.clean, task.corrupted,
                                                 task.metric)),
            ("EAP-IG 2", eap_ig(model, graph, task.clean, task.corrupted, task.metric, 2)),
            ("EAP-IG 10", eap_ig(model, graph, task.clean, task.corrupted, task.metric, 10))):
        row[f"r({label}, exact)"] = float(np.corrcoef(table.score.to_numpy(), exact)[0, 1])
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--agreement", action="store_true",
                        help="also: scores vs exact patching of every edge (16 prompts)")
    parser.add_argument("--models", nargs="+", default=[f"induction-{v}" for v in VARIANTS],
                        help="zoo names or checkpoint directories (default: induction-*)")
    parser.add_argument("--half-len", type=int, default=10, help="|r| of the prompts")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.agreement:
        print(markdown(pd.DataFrame([agreement_row(name, seed=args.seed, half_len=args.half_len)
                                     for name in args.models])))
        print()
    rows = [model_rows(name, args.prompts, args.seed, args.top_k, args.steps, args.half_len)
            for name in args.models]
    print(markdown(pd.DataFrame([r[0] for r in rows])))
    print()
    print(markdown(pd.DataFrame([r[1] for r in rows]).astype(object).fillna("-")))


def markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """A GitHub table of `table` (floats rounded), without the optional tabulate package."""
    def cell(v) -> str:
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |"
              for row in table.itertuples(index=False)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
