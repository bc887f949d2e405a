"""The induction circuit on the bundled toy models: the table of docs/circuit_discovery.md.

    python -m interp.circuit_discovery.report [--prompts 32] [--seed 0] [--top-k 20]

For each `induction-<variant>`: EAP-IG (10 steps) and first-order attribution scores on
`induction_task` (clean `[BOS] r r` vs corrupted `[BOS] r' r`, |r| = 10), the pruned top-k
circuit, its faithfulness with the rest patched to the corrupted run and to the corrupted mean,
whether a previous-token head -> induction head K-composition edge and an induction head ->
logits edge were recovered, and the strongest within-layer map edge checked by exact patching.
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

from interp.circuit_discovery.discover import discover
from interp.circuit_discovery.engine import run
from interp.circuit_discovery.extract import (
    circuit_metric,
    faithfulness,
    faithfulness_curve,
    reference_record,
)
from interp.circuit_discovery.induction import induction_heads, induction_task, recovery
from interp.circuit_discovery.scoring import exact_patching

VARIANTS = ("mha", "mta", "cope", "dcmha", "infini")
SIZES = (5, 10, 20, 30, 40, 60, 80, 100)


def model_row(name: str, prompts: int = 32, seed: int = 0, top_k: int = 20,
              steps: int = 10) -> dict:
    """One row of the table for the bundled model `name`."""
    from hooked_models import zoo

    model = zoo.load(name)
    task = induction_task(model, n_prompts=prompts, half_len=10, seed=seed)
    heads = induction_heads(model, task)
    found = discover(model, task, "eap-ig", steps=steps, top_k=top_k)
    first = discover(model, task, "attribution", top_k=top_k)
    mean = faithfulness(model, found.graph, found.circuit, task.clean, task.corrupted,
                        task.metric, "mean")
    rec = recovery(found.graph, found.scores, found.circuit, heads)
    row = {"model": name, "prev-token heads": " ".join(heads["previous_token"]) or "none",
           "induction heads": " ".join(heads["induction"]) or "none",
           "clean": found.faithfulness["clean"], "corrupted": found.faithfulness["ablated"],
           "edges": len(found.circuit), "faith (EAP-IG, corrupted)":
               found.faithfulness["faithfulness"], "faith (EAP-IG, mean)": mean["faithfulness"],
           "faith (AP, corrupted)": first.faithfulness["faithfulness"],
           "K-comp edges": " ".join(rec["k_composition"]) or "none",
           "best K-comp rank": rec["best_k_composition_rank"],
           "induction->logits": " ".join(rec["induction_to_logits"]) or "none",
           "map edges in circuit": len(rec["map_edges"]), "recovered": rec["recovered"]}
    curve = faithfulness_curve(model, found.graph, found.scores, task.clean, task.corrupted,
                               task.metric, sizes=SIZES)
    enough = curve[curve.faithfulness >= 0.9]
    row["edges for faith >= 0.9"] = int(enough.edges.iloc[0]) if len(enough) else None
    maps = [e for e in found.graph.edges if e.kind != "resid"]
    if maps:
        ref = reference_record(model, found.graph, task.corrupted)
        without = [e for e in found.circuit if e.kind == "resid"]
        value = circuit_metric(model, found.graph, without, task.clean, task.metric, ref)
        gap = found.faithfulness["clean"] - found.faithfulness["ablated"]
        row["faith without its map edges"] = (value - found.faithfulness["ablated"]) / gap
        everything = {e: 1.0 for e in maps}
        patched = run(model, found.graph, task.clean, task.metric, patch=everything,
                      reference=ref).metric
        row["all map edges patched: metric change"] = patched - found.faithfulness["clean"]
        exact = exact_patching(model, found.graph, task.clean, task.corrupted, task.metric,
                               maps)
        best = exact.loc[exact.score.abs().idxmax()]
        row.update({"strongest single map edge (exact)": best.edge,
                    "its exact change": best.score})
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = [model_row(f"induction-{v}", args.prompts, args.seed, args.top_k, args.steps)
            for v in VARIANTS]
    table = pd.DataFrame(rows)
    print(markdown(table))


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
