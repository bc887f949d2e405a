"""Benchmark: server-side time of the analysis pages' updates (Variants views, the token and
head views) on a new prompt and on a head change, at 512 tokens.

    python -m attnlens.benchmarks.pages [--variants mha,mta,cope,dcmha,infini]
        [--tokens 512] [--layers 2] [--heads 4] [--d-model 64] [--repeats 5] [--threads 1]

Issue 22 item 4: what a view shows that does not depend on the head is computed once per
prompt (`attnlens.dashboards.map_cache.MapCache.per_prompt`), so a head change only lays out
figures. Targets: a head change < 100 ms, a new prompt < 1 s. Each request goes through the Dash
endpoint (Flask test client) as the browser sends it. Models: random weights and a character
tokenizer (weights do not change the cost), the shape of the bundled toy models by default.
Rows: "new prompt" (caches empty) and "head" (another head of the same layer, same prompt);
median of `--repeats`. Not a timed test: run it by hand and copy the table into
docs/benchmarks.md.
"""

from __future__ import annotations

import os
import random
import statistics
import time

import torch

from attnlens.benchmarks.explorer import ALPHABET, OPTIONS, dashboard_header, dashboard_parser
from attnlens.dashboards.app import create_app
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.pages.variants import CHANGE_MODES, available_views
from attnlens.dashboards.store import ModelStore
from attnlens.hooked_models import HookedVariantTransformer, VariantConfig

HEAD_TARGET_MS, PROMPT_TARGET_MS = 100.0, 1000.0


def build_model(variant: str, args) -> HookedVariantTransformer:
    options = dict(OPTIONS[variant])
    if variant == "infini":
        options["attn_cfg"] = {"segment_len": max(8, args.tokens // 4)}
    cfg = VariantConfig(d_model=args.d_model, d_head=args.d_model // args.heads,
                        n_heads=args.heads, n_layers=args.layers, n_ctx=args.tokens,
                        d_mlp=4 * args.d_model, d_vocab=len(ALPHABET) + 1, attention=variant,
                        act_fn="gelu", normalization_type="LN", tokenizer_alphabet=ALPHABET,
                        seed=0, **options)
    return HookedVariantTransformer(cfg).eval()


class Callback:
    """Posts one callback (by the id of its first output) as the browser does."""

    def __init__(self, app, output: str):
        self.client = app.server.test_client()
        self.key = next(k for k in app.callback_map if k.lstrip(".").startswith(output))
        self.spec = app.callback_map[self.key]

    def post(self, values: dict) -> float:
        def props(items):
            return [{"id": i["id"], "property": i["property"],
                     "value": values.get(f"{i['id']}.{i['property']}")} for i in items]

        outputs = [{"id": o.split(".")[0], "property": o.split(".")[1].split("@")[0]}
                   for o in self.key.strip(".").split("...")]
        body = {"output": self.key, "outputs": outputs if len(outputs) > 1 else outputs[0],
                "inputs": props(self.spec["inputs"]), "state": props(self.spec["state"]),
                "changedPropIds": []}
        start = time.perf_counter()
        resp = self.client.post("/_dash-update-component", json=body,
                                headers={"Accept-Encoding": "zstd, gzip"})
        ms = (time.perf_counter() - start) * 1000
        if resp.status_code not in (200, 204):
            raise RuntimeError(f"{self.key}: HTTP {resp.status_code}")
        plain = self.client.post("/_dash-update-component", json=body)   # untimed: errors?
        for name, out in (plain.get_json(silent=True) or {}).get("response", {}).items():
            if name.endswith("-error") and out.get("children"):
                raise RuntimeError(f"{name}: {out['children']}")
        return ms


def measure(variant: str, args, rng: random.Random) -> list[dict]:
    model = build_model(variant, args)
    store = ModelStore()
    store.add("m", model, "abc")
    app = create_app(store)
    pages = {f"variants {v}": (Callback(app, "variants-body"), {"variants-view.value": v,
                                                        "tabs.value": "variants"})
             for v in available_views(model)}
    for v in available_views(model):
        if v in CHANGE_MODES:   # the stage-change table: its own callback, drawn after
            pages[f"variants {v} stage change"] = (Callback(app, "variants-change"),
                                                   {"variants-view.value": v,
                                                    "tabs.value": "variants"})
    pages["token view"] = (Callback(app, "tokens-text"), {"tokens-mode.value": "head"})
    pages["head view"] = (Callback(app, "tokens-lines"), {})
    rows = []
    for page, (callback, own) in pages.items():
        runs = {"new prompt": [], "head": []}
        for i in range(args.repeats):
            MAP_CACHE.clear()
            text = "".join(rng.choice(ALPHABET) for _ in range(args.tokens - 1))
            values = {"ctl-model.value": "m", "ctl-models.value": ["m"],
                      "ctl-applied-prompt.data": text, "ctl-layer.value": args.layers - 1,
                      "ctl-stage.value": "pattern", "tokens-token.value": args.tokens // 2,
                      "tokens-direction.value": "from", "tabs.value": "tokens", **own}
            head = i % args.heads
            runs["new prompt"].append(callback.post({**values, "ctl-head.value": head}))
            runs["head"].append(callback.post({**values, "ctl-head.value": (head + 1)
                                               % args.heads}))
        rows += [{"variant": variant, "page": page, "update": k, "ms": statistics.median(v)}
                 for k, v in runs.items()]
    return rows


def main(argv=None) -> None:
    args = dashboard_parser(__doc__, layers=2, heads=4, d_model=64, repeats=5).parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    load = os.getloadavg()[0]
    rows = [r for v in args.variants.split(",") for r in measure(v, args, rng)]
    print(dashboard_header("dashboard pages", args, load))
    print(f"- median of {args.repeats} requests; targets: head change < {HEAD_TARGET_MS:.0f} ms, "
          f"new prompt < {PROMPT_TARGET_MS:.0f} ms\n")
    print("| variant | page | update | ms |")
    print("|---|---|---|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['page']} | {r['update']} | {r['ms']:.0f} |")


if __name__ == "__main__":
    main()
