"""Circuits of the zoo's paper-task models: MTA's find-the-block and DCMHA's conjunction (the
tables of docs/circuit_discovery.md).

    python -m attnlens.interp.circuits.discovery.paper_report [--prompts 32] [--seed 0] [--top-k 20]
        [--models "mta-findblock-*-s0,dcmha-conjunction-*"]

For each model: the metric on clean and corrupted prompts (`paper_tasks`), the pruned top-k
EAP-IG (10 steps) circuit's faithfulness (first-order attribution's too), its top edges, and the
within-layer edges: how many are in the smallest top-k circuit with faithfulness >= 0.9, the
faithfulness of that circuit without them, and the metric change when every within-layer edge
of the model is patched. Conjunction models are run with both corruptions. Where the metric
moves by less than MIN_GAP between clean and corrupted prompts, faithfulness (a ratio over that
gap) is not reported.
"""

from __future__ import annotations

import argparse
import fnmatch
import math

import pandas as pd
import torch

from attnlens.interp.circuits.discovery.discover import discover
from attnlens.interp.circuits.discovery.engine import run
from attnlens.interp.circuits.discovery.extract import (
    circuit_metric,
    faithfulness_curve,
    reference_record,
    select_edges,
)
from attnlens.interp.circuits.discovery.paper_tasks import (
    CORRUPTIONS,
    conjunction_task_pair,
    find_block_task,
)
from attnlens.interp.circuits.discovery.report import markdown

SIZES = (5, 10, 20, 30, 40, 60, 80)
MIN_GAP = 0.05   # nats: below this clean - corrupted gap, faithfulness is a ratio of noise
DEFAULT_MODELS = "mta-findblock-*,dcmha-conjunction-*"


def tasks_of(name: str, model, prompts: int, seed: int) -> dict:
    """`{label: Task}` for the zoo model `name`: find-the-block, or both conjunction
    corruptions."""
    if name.startswith("mta-findblock"):
        return {"target block": find_block_task(model, prompts, seed)}
    # the -twin models' lookups write the target's value twice (attnlens.interp.tasks.conjunction)
    twin = bool((getattr(model, "card", None) or {}).get("task_args", {}).get("twin_target"))
    kwargs = {"twin_target": True} if twin else {}
    return {c: conjunction_task_pair(model, prompts, seed, corrupt=c, **kwargs)
            for c in CORRUPTIONS}


def circuit_row(name: str, model, task, label: str, top_k: int = 20, steps: int = 10) -> dict:
    """One table row: metric clean / corrupted, faithfulness of the top-k circuit (EAP-IG and
    first-order), its top 3 edges, and the within-layer edges of the smallest top-k circuit
    (k in SIZES) with faithfulness >= 0.9."""
    found = discover(model, task, "eap-ig", steps=steps, top_k=top_k)
    first = discover(model, task, "attribution", top_k=top_k)
    graph, faith = found.graph, found.faithfulness
    gap = faith["clean"] - faith["ablated"]
    top = found.top_edges(3)
    row = {"model": name, "corruption": label,
           "metric clean / corrupted": f"{faith['clean']:.3f} / {faith['ablated']:.3f}",
           "edges": len(found.circuit), "faith EAP-IG": faith["faithfulness"],
           "faith AP": first.faithfulness["faithfulness"],
           "top edges (EAP-IG score)": ", ".join(f"{r.edge} ({r.score:.2f})"
                                                 for r in top.itertuples()),
           "within-layer edges in model": len(graph.edges_of("mix"))
           + len(graph.edges_of("sub"))}
    maps = [e for e in graph.edges if e.kind != "resid"]
    if abs(gap) < MIN_GAP or not math.isfinite(faith["faithfulness"]):
        row.update({"faith EAP-IG": f"- (gap {gap:.3f})", "faith AP": "-",
                    "k for faith >= 0.9": "-", "within-layer in it": "-",
                    "faith without them": "-", "all within-layer patched": "-"})
        return row
    curve = faithfulness_curve(model, graph, found.scores, task.clean, task.corrupted,
                               task.metric, sizes=SIZES)
    enough = curve[curve.faithfulness >= 0.9]
    k90 = int(enough.top_k.iloc[0]) if len(enough) else SIZES[-1]
    circuit = select_edges(graph, found.scores, top_k=k90)
    ref = reference_record(model, graph, task.corrupted)

    def faith_of(edges) -> float:
        value = circuit_metric(model, graph, edges, task.clean, task.metric, ref)
        return (value - faith["ablated"]) / gap

    inner = [e for e in circuit if e.kind != "resid"]
    row.update({"k for faith >= 0.9": f"{len(circuit)} ({faith_of(circuit):.2f})"
                if len(enough) else f"none <= {len(circuit)}",
                "within-layer in it": len(inner),
                "faith without them": faith_of([e for e in circuit if e.kind == "resid"])
                if inner else "-"})
    if maps:
        patched = run(model, graph, task.clean, task.metric, patch={e: 1.0 for e in maps},
                      reference=ref).metric
        row["all within-layer patched"] = f"{patched - faith['clean']:+.3f}"
    else:
        row["all within-layer patched"] = "-"
    return row


def zoo_names(patterns: str) -> list[str]:
    """Zoo checkpoints matching any of the comma-separated glob `patterns`, sorted."""
    from attnlens.hooked_models import zoo

    wanted = patterns.split(",")
    return sorted(n for n in zoo.available() if any(fnmatch.fnmatch(n, p) for p in wanted))


def main(argv=None) -> None:
    from attnlens.hooked_models import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in zoo_names(args.models):
        model = zoo.load(name)
        for label, task in tasks_of(name, model, args.prompts, args.seed).items():
            rows.append(circuit_row(name, model, task, label, args.top_k, args.steps))
            print(rows[-1], flush=True)
    print(markdown(pd.DataFrame(rows).astype(object).fillna("-")))


if __name__ == "__main__":
    main()
