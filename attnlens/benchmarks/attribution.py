"""Benchmark: peak memory and time of an attribution graph at 24 .. 512 tokens, on a budget and
unbounded.

    python -m attnlens.benchmarks.attribution [--models text-mha-l4mlp,text-dcmha-l4mlp]
        [--tokens 24,128,256,512] [--max-features 2048] [--memory 2GB] [--cap 8GB]
        [--float64]

Target (issue 55, item 1): a 512-token graph of the zoo's MLP models in under 4 GB peak RSS and
under 5 minutes on 2 CPU cores, with the default budget (`AttributionBudget()`: 2,048
features, 2 GB). Each case runs in a fresh subprocess (`--one`), so its peak RSS
(`ru_maxrss`: the model, transcoders, rows, adjacency, every batch) is its own; wall time and
CPU seconds (user + system, of the whole child) are of the `attribute` call only, RSS of the
whole child. The prompt: the model's validation windows (real text), concatenated and cut to
the token count. "unbounded" (every active feature, no memory limit) runs only when its
estimated size (`attnlens.interp.attribution.budget`) is under `--cap`; the others are
skipped with the estimate as the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time

import torch

TARGET_GB = 4.0
TARGET_S = 300.0


def prompt_tokens(directory, n: int) -> torch.Tensor:
    """`[1 n]` tokens of the model's validation windows, BOS first (as a text prompt has)."""
    from attnlens.interp.tools.text_eval import load_eval_tokens

    windows = load_eval_tokens(directory)
    flat = windows.flatten()
    return flat[:n].unsqueeze(0).long()


def one(model_name: str, n: int, budget_name: str, max_features: int, memory: str,
        float64: bool) -> dict:
    """One case in this process: the numbers as a dict."""
    from attnlens.hooked_models import HookedVariantTransformer, zoo
    from attnlens.interp.attribution.budget import AttributionBudget
    from attnlens.interp.attribution.contexts import transcoders_for
    from attnlens.interp.attribution.graph import attribute

    torch.manual_seed(0)
    directory = zoo.path(model_name)
    dtype = torch.float64 if float64 else torch.float32
    model = HookedVariantTransformer.from_pretrained(directory, device="cpu").to(dtype).eval()
    transcoders = transcoders_for(directory, dtype=dtype)
    tokens = prompt_tokens(directory, n)
    budget = AttributionBudget.unbounded() if budget_name == "unbounded" else \
        AttributionBudget(max_feature_nodes=max_features, memory=memory)
    cpu0, wall0 = os.times(), time.perf_counter()
    graph = attribute(model, transcoders, tokens, budget=budget, model_name=model_name)
    wall = time.perf_counter() - wall0
    cpu1 = os.times()
    report = graph.budget
    return dict(model=model_name, tokens=n, budget=budget_name, wall_s=round(wall, 1),
                cpu_s=round((cpu1.user - cpu0.user) + (cpu1.system - cpu0.system), 1),
                peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                active=report.n_active, features=report.n_selected, batch=report.batch_size,
                nodes=graph.n_nodes, edges=int((graph.adjacency != 0).sum()),
                adjacency_mb=round(graph.adjacency.numel() * graph.adjacency.itemsize / 1e6, 1),
                influence_left_out=round(report.influence_left_out, 4),
                target_effect_left_out=round(report.target_effect_left_out, 4))


def unbounded_estimate(model_name: str, n: int, float64: bool) -> float:
    """Estimated bytes of the unbounded graph at `n` tokens (the clean run counts features)."""
    from attnlens.hooked_models import HookedVariantTransformer, zoo
    from attnlens.interp.attribution.budget import copy_bytes, stored_bytes
    from attnlens.interp.attribution.contexts import transcoders_for
    from attnlens.interp.attribution.replacement import clean_run

    directory = zoo.path(model_name)
    model = HookedVariantTransformer.from_pretrained(directory, device="cpu").eval()
    run = clean_run(model, transcoders_for(directory, dtype=torch.float32),
                    prompt_tokens(directory, n))
    active = sum(len(f[0]) for f in run.features.values())
    nodes = active + (model.cfg.n_layers + 1) * n + 10
    size = 8 if float64 else 4
    return stored_bytes(0, 0, nodes, size, False) + 64 * copy_bytes(model, n, active, size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="text-mha-l4mlp,text-dcmha-l4mlp")
    p.add_argument("--tokens", default="24,128,256,512")
    p.add_argument("--max-features", type=int, default=None,
                   help="the node budget (default: AttributionBudget's)")
    p.add_argument("--memory", default=None,
                   help="the memory budget (default: AttributionBudget's)")
    p.add_argument("--cap", default="8GB", help="skip unbounded cases estimated above this")
    p.add_argument("--float64", action="store_true")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "TOKENS", "BUDGET"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from attnlens.interp.attribution.budget import (
        DEFAULT_MAX_FEATURE_NODES,
        DEFAULT_MEMORY,
        parse_memory,
    )

    max_features = args.max_features or DEFAULT_MAX_FEATURE_NODES
    memory = args.memory or DEFAULT_MEMORY
    if args.one:
        name, n, budget = args.one
        print(json.dumps(one(name, int(n), budget, max_features, memory, args.float64)))
        return 0
    cap = parse_memory(args.cap)
    print(f"# attribution graph benchmark, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
          f"UTC, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{'float64' if args.float64 else 'float32'}, default budget {max_features} features,"
          f" {memory}; load average at start {os.getloadavg()[0]:.1f}")
    print("| model | tokens | budget | active features | features in graph | batch | nodes | "
          "edges | adjacency MB | wall s | CPU s | peak RSS GB | influence left out | "
          "target effect left out |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for n in (int(t) for t in args.tokens.split(",")):
            for budget in ("default", "unbounded"):
                if budget == "unbounded":
                    estimate = unbounded_estimate(name, n, args.float64)
                    if estimate > cap:
                        print(f"| {name} | {n} | unbounded | skipped: estimated "
                              f"{estimate / 1e9:.1f} GB > cap {cap / 1e9:.1f} GB |")
                        continue
                cmd = [sys.executable, "-m", "attnlens.benchmarks.attribution", "--one", name,
                       str(n), budget, "--max-features", str(max_features), "--memory", memory]
                cmd += ["--float64"] if args.float64 else []
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    print(f"| {name} | {n} | {budget} | failed: "
                          f"{done.stderr.strip().splitlines()[-1:]} |")
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"| {name} | {n} | {budget} | {r['active']} | {r['features']} | "
                      f"{r['batch']} | {r['nodes']} | {r['edges']} | {r['adjacency_mb']} | "
                      f"{r['wall_s']} | {r['cpu_s']} | {r['peak_rss_gb']} | "
                      f"{r['influence_left_out']:.1%} | {r['target_effect_left_out']:.1%} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
