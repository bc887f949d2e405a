"""Benchmark: server-side time and payload of the attention explorer's update at 512 tokens.

    python -m attnlens.benchmarks.explorer [--variants mha,mta,cope,dcmha,infini]
        [--tokens 512] [--layers 4] [--heads 8] [--d-model 256] [--repeats 15] [--threads 1]

Target (dashboard issue, item 11): an update of the explorer (another head, layer or stage on
the same prompt) is answered in under 150 ms at 512 tokens, with a small payload: thumbnails
downsampled, only the zoomed head at full size. Each request goes through the Dash endpoint
(`/_dash-update-component`, Flask test client, `Accept-Encoding: zstd, gzip` as a browser
sends it), so a time includes validation, the maps (cached per model and prompt by
`attnlens.dashboards.map_cache`), the figures (the thumbnails as ONE heatmap, every figure a plain
dict with typed float32 arrays: `attnlens.interp.plots.maps.head_mosaic_figure`, `map_figure_dict`),
JSON (orjson through plotly) and compression. The models have the text zoo's
`l4mlp` shape (4 layers with MLPs, d_model 256, 8 heads, n_ctx 512) with random weights and a
character tokenizer, so a 511-character prompt is 512 tokens; weights do not change the cost.

Rows: "new prompt" (cache empty: the forward pass, every thumbnail), "head" (another head of
the same layer), "layer" (a thumbnail of another layer clicked: layer and head change),
"stage" (another stage: new thumbnails). Median of `--repeats` requests, each a different
head / layer / prompt.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import statistics
import time

import torch

from attnlens.dashboards.app import create_app
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.store import ModelStore
from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.interp.tools.explore import map_stages

ALPHABET = "abcdefghijklmnopqrstuvwxyz ."
TARGET_MS = 150.0
OPTIONS = {"mha": dict(positional_embedding_type="rotary"),
           "mta": dict(positional_embedding_type="rotary"),
           "cope": dict(positional_embedding_type="none"),
           "dcmha": dict(positional_embedding_type="rotary"),
           "infini": dict(positional_embedding_type="rotary", attn_cfg={"segment_len": 128})}


def dashboard_parser(doc: str, variants: str = "mha,mta,cope,dcmha,infini", layers: int = 4,
                     heads: int = 8, d_model: int = 256,
                     repeats: int = 15) -> argparse.ArgumentParser:
    """The command line of the dashboard benchmarks (this one, `pages`, `browser`): variants,
    the models' shape, the prompt's tokens, repeats and torch threads, with each script's
    defaults; `doc`: the script's docstring (its first line describes the command)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--variants", default=variants)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--heads", type=int, default=heads)
    parser.add_argument("--d-model", type=int, default=d_model)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=1)
    return parser


def dashboard_header(what: str, args, load_before: float) -> str:
    """The first lines of a dashboard benchmark's table: what was timed at which shape, and
    the date, machine, torch and the 1-minute load average before and now (a shared machine's
    load is part of every number)."""
    cpu = platform.processor() or platform.machine()
    return (f"# {what} ({args.tokens} tokens, {args.layers} layers x {args.heads} heads, "
            f"d_model {args.d_model})\n\n"
            f"- date: {datetime.datetime.now():%Y-%m-%dT%H:%M}, device: CPU ({cpu}, "
            f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, 1-minute load "
            f"average {load_before:.1f} before / {_load():.1f} after: a shared "
            f"machine), torch {torch.__version__}")


def build_model(variant: str, args) -> HookedVariantTransformer:
    cfg = VariantConfig(d_model=args.d_model, d_head=args.d_model // args.heads,
                        n_heads=args.heads, n_layers=args.layers, n_ctx=args.tokens,
                        d_mlp=4 * args.d_model, d_vocab=len(ALPHABET) + 1, attention=variant,
                        act_fn="gelu", normalization_type="LN", tokenizer_alphabet=ALPHABET,
                        seed=0, **OPTIONS[variant])
    return HookedVariantTransformer(cfg).eval()


class Explorer:
    """Posts the explorer's update callback as the browser does (keeping `explorer-shown`)."""

    def __init__(self, app):
        self.client = app.server.test_client()
        self.key = next(k for k in app.callback_map if k.lstrip(".").startswith("explorer-grid"))
        self.spec = app.callback_map[self.key]
        self.shown = {}

    def post(self, text: str, layer: int, head: int, stage: str) -> tuple[float, int, int]:
        """(ms, bytes sent, bytes before compression) of one update."""
        values = {"tabs.value": "explorer", "ctl-models.value": ["m"],
                  "ctl-applied-prompt.data": text,
                  "ctl-layer.value": layer, "ctl-head.value": head, "ctl-stage.value": stage,
                  "explorer-format.value": "png", "explorer-shown.data": self.shown}

        def props(items):
            return [{"id": i["id"], "property": i["property"],
                     "value": values.get(f"{i['id']}.{i['property']}")} for i in items]

        outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]}
                   for o in self.key.strip(".").split("...")]
        body = {"output": self.key, "outputs": outputs, "inputs": props(self.spec["inputs"]),
                "state": props(self.spec["state"]), "changedPropIds": []}
        start = time.perf_counter()
        resp = self.client.post("/_dash-update-component", json=body,
                                headers={"Accept-Encoding": "zstd, gzip"})
        ms = (time.perf_counter() - start) * 1000
        sent = len(resp.get_data())
        raw = self.client.post("/_dash-update-component", json=body)   # uncompressed size
        out = raw.get_json()["response"]
        if out["explorer-error"]["children"]:
            raise RuntimeError(out["explorer-error"]["children"])
        self.shown = out["explorer-shown"]["data"]
        return ms, sent, len(raw.get_data())


def measure(variant: str, args, rng: random.Random) -> list[dict]:
    model = build_model(variant, args)
    store = ModelStore()
    store.add("m", model, "abc")
    explorer = Explorer(create_app(store))
    n_heads, n_layers = model.cfg.n_heads, model.cfg.n_layers
    stages = [s.name for s in map_stages(model, 0)]

    def text() -> str:
        return "".join(rng.choice(ALPHABET) for _ in range(args.tokens - 1))

    rows = {"new prompt": [], "head": [], "layer": [], "stage": []}
    for i in range(args.repeats):
        MAP_CACHE.clear()
        prompt = text()
        layer, head = i % n_layers, i % n_heads
        rows["new prompt"].append(explorer.post(prompt, layer, head, "pattern"))
        head = (head + 1) % n_heads
        rows["head"].append(explorer.post(prompt, layer, head, "pattern"))
        layer, head = (layer + 1) % n_layers, (head + 3) % n_heads
        rows["layer"].append(explorer.post(prompt, layer, head, "pattern"))
        rows["stage"].append(explorer.post(prompt, layer, head, stages[i % (len(stages) - 1)]))
    return [{"variant": variant, "update": name, "ms": statistics.median(r[0] for r in runs),
             "sent_kb": statistics.median(r[1] for r in runs) / 1024,
             "raw_kb": statistics.median(r[2] for r in runs) / 1024} for name, runs in rows.items()]


def _load() -> float:
    """The 1-minute load average (other jobs on a shared machine inflate every time)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def main(argv=None) -> None:
    parser = dashboard_parser(__doc__)
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in OPTIONS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {sorted(OPTIONS)}")
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    load_before = _load()
    rows = [r for v in args.variants.split(",") for r in measure(v, args, rng)]

    print(dashboard_header("dashboard explorer update", args, load_before))
    print(f"- median of {args.repeats} requests each; target: head / layer / stage updates "
          f"<= {TARGET_MS:.0f} ms\n")
    print("| variant | update | ms | sent KiB (zstd) | JSON KiB |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['update']} | {r['ms']:.0f} | {r['sent_kb']:.0f} | "
              f"{r['raw_kb']:.0f} |")
    updates = [r for r in rows if r["update"] != "new prompt"]
    worst = max(updates, key=lambda r: r["ms"])
    verdict = "met" if worst["ms"] <= TARGET_MS else "NOT met"
    print(f"\nTarget updates <= {TARGET_MS:.0f} ms: {verdict} (slowest: {worst['variant']} "
          f"{worst['update']}, {worst['ms']:.0f} ms)")


if __name__ == "__main__":
    main()
