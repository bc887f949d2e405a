"""The studies of the text-LM zoo (issue 17 items 4-6, issue 26 item 5), run on released models.

    python -m attnlens.lab.text_studies RELEASE_DIR [--out docs/figures/zoo] [--no-png]

RELEASE_DIR holds released text models (`text-<variant>-<shape>/`, as written by
`attnlens train --zoo text`): `hooked_models/zoo` once the zoo ships, `RUNS/release`
after a run. Each study returns tidy DataFrames; `run_studies` writes them as CSV beside their
figures (HTML, and PNG when kaleido works) into OUT, where `attnlens.reports.zoo_docs` reads them.

1. Induction (`induction_study`, `training_logs`): the final induction score, second-copy loss
   and in-context-learning score of every model, and the training log (induction score and
   validation loss against tokens seen: the phase change, `attnlens.interp.plots.training`). A model
   "forms induction heads" when its best head's induction-stripe score reaches
   `INDUCTION_THRESHOLD`; the 1-layer models are the controls. Induction by copy distance
   (`copy_distance_study`): the same probe at |r| = 20 to 255, which tells an Infini model's
   in-segment induction (local attention) from copying across segments (the memory).
2. Head diversity (`diversity_study`): captured-variance curves of every layer's QK and OV
   circuits (plain, and composed for variants with static head mixing) with the random-init
   baseline (`attnlens.interp.tools.diversity`), summarised by the mean captured variance (DCFormer
   Fig. 5: lower = more diverse).
3. Gating (`gating_study`): Infini's memory vs local heads on validation windows longer than a
   segment (`attnlens.interp.variants.infini.memory_specialisation`), MTA's output gates and
   key-query kernel classes, DCMHA's dynamic weights (`attnlens.interp.tools.gating.gate_values` on
   the dd stages), CoPE's gates by token category (what it counts: newlines, indentation,
   identifiers, ...).
4. Sharpness (`sharpness_study`): per head, the spread of the raw q.k scores and of the logits
   entering the softmax, and the entropy of the attention they give, on validation windows
   (`attnlens.interp.tools.score_spread`): where a variant's attention gets its sharpness.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd
import torch

from attnlens.interp.tools.diversity import diversity_summary, head_diversity
from attnlens.interp.tools.gating import gate_values
from attnlens.interp.tools.score_spread import score_spread
from attnlens.interp.tools.text_eval import load_eval_tokens
from attnlens.interp.variants.cope import gates_by_category
from attnlens.interp.variants.infini import memory_specialisation
from attnlens.interp.variants.mta import kernel_table

INDUCTION_THRESHOLD = 0.3
# Issue 26's second bar: second-copy loss below half the first-copy loss on the same probe.
COPY_RATIO_THRESHOLD = 0.5
# Copy distances of the copy-distance study: from well inside an Infini segment (128 tokens in
# the zoo) to the longest that fits n_ctx 512 (the zoo's probe is 150).
COPY_DISTANCES = (20, 50, 100, 150, 200, 255)
STUDY_WINDOWS = 8            # validation windows the gating study reads (each n_ctx tokens)
# text-<variant>-<shape>; the data-mix and package-corpus twins as shapes "l2-mix" and
# "l2-pkgs" (their own rows, beside "l2")
NAME = re.compile(r"^text-(?P<variant>[a-z]+)-(?P<shape>[a-z0-9]+(?:-mix|-pkgs|-s\d+)?)$")


def released_models(release_dir) -> dict[str, Path]:
    """`{name: directory}` of the released text models in `release_dir` (sorted by name)."""
    release_dir = Path(release_dir)
    if not release_dir.is_dir():
        raise ValueError(f"release directory {str(release_dir)!r} does not exist")
    found = {}
    for d in sorted(release_dir.iterdir()):
        card = d / "card.json"
        if NAME.match(d.name) and card.is_file() and \
                json.loads(card.read_text()).get("kind") == "text-lm":
            found[d.name] = d
    return found


def _parts(name: str) -> tuple[str, str]:
    """`(variant, shape)` as a text-zoo name spells them (`text-<variant>-<shape>`)."""
    m = NAME.match(name)
    if not m:
        raise ValueError(f"{name!r} is not a text-zoo model name (text-<variant>-<shape>)")
    return m["variant"], m["shape"]


def _labels(name: str, directory: Path) -> tuple[str, str]:
    """`(variant, shape)` of a released model: the variant its checkpoint's config.json builds
    (what the studies branch on), the shape its name gives; ValueError when they disagree."""
    named, shape = _parts(name)
    config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    variant = config.get("attention", "mha")
    if variant != named:
        raise ValueError(f"{name}: its config.json builds {variant!r} attention, its name says "
                         f"{named!r}")
    return variant, shape


def _mixes_heads(model) -> bool:
    """Whether the model's attention class mixes heads statically (overrides `head_mixing`):
    its circuits have a composed form (MTA, DCMHA)."""
    from attnlens.hooked_models.attention import VariantAttention

    return type(model.blocks[0].attn).head_mixing is not VariantAttention.head_mixing


def load_card(directory) -> dict:
    return json.loads((Path(directory) / "card.json").read_text())


def training_logs(models: dict[str, Path]) -> pd.DataFrame:
    """Every validation row of every model's metrics.jsonl: `model`, `variant`, `shape`,
    `step`, `tokens`, `val_loss`, `induction_score`, `repeat_loss`, `copy_loss_ratio`
    (None in logs written before the probe had it)."""
    rows = []
    for name, d in models.items():
        variant, shape = _labels(name, d)
        log = d / "metrics.jsonl"
        if not log.is_file():
            raise ValueError(f"{d} has no metrics.jsonl: the training log is released with "
                             "every text model")
        for line in log.read_text().splitlines():
            r = json.loads(line)
            if "induction_score" in r:
                rows.append({"model": name, "variant": variant, "shape": shape,
                             "step": r["step"], "tokens": r.get("tokens"),
                             "val_loss": r.get("val_loss"),
                             "induction_score": r["induction_score"],
                             "repeat_loss": r.get("repeat_loss"),
                             "copy_loss_ratio": r.get("copy_loss_ratio")})
    return pd.DataFrame(rows, columns=["model", "variant", "shape", "step", "tokens",
                                       "val_loss", "induction_score", "repeat_loss",
                                       "copy_loss_ratio"])


def distribution_score(metrics: dict) -> tuple[str, float] | None:
    """`(stage, score)` of the probe's row-stochastic stage where the card has one
    (`induction_score_<stage>`: the variant's pattern is not a distribution), else None."""
    extra = [(k.removeprefix("induction_score_"), v) for k, v in metrics.items()
             if k.startswith("induction_score_")]
    return extra[0] if extra else None


def has_induction_head(metrics: dict, threshold: float = INDUCTION_THRESHOLD) -> bool:
    """The bar's first half: the best head's induction score >= `threshold` at the pattern
    stage or, where the card has one, at the row-stochastic stage before it (the head's
    attention distribution). Either counts because a non-stochastic pattern's scale need not
    mean anything: MTA's post-softmax head mix scales each head's map (row sums 0.18-0.32 in
    text-mta-l2) and the group RMSNorm after it undoes any such scale. The bar's second half,
    the copy-loss ratio, checks that the head is used."""
    dist = distribution_score(metrics)
    return bool(metrics["induction_score"] >= threshold
                or (dist is not None and dist[1] >= threshold))


def forms_induction(metrics: dict, threshold: float = INDUCTION_THRESHOLD) -> bool:
    """The zoo's bar on a card's probe: `has_induction_head` and, where the card has it,
    second-copy loss < COPY_RATIO_THRESHOLD x the first-copy loss."""
    ratio = metrics.get("copy_loss_ratio")
    return has_induction_head(metrics, threshold) and (ratio is None
                                                       or ratio < COPY_RATIO_THRESHOLD)


def induction_study(models: dict[str, Path], threshold: float = INDUCTION_THRESHOLD
                    ) -> pd.DataFrame:
    """One row per model from its card (the eval command's numbers): `induction_score`,
    `repeat_loss`, `icl_score`, `val_loss`, the best induction head and `forms_induction`.
    Where the card has a row-stochastic stage, `distribution_head` is that stage's best head
    (re-measured on the card's probe: the card keeps the pattern stage's head table only)."""
    from attnlens.interp.tools.text_eval import distribution_head

    rows = []
    for name, d in models.items():
        variant, shape = _labels(name, d)
        m = load_card(d)["metrics"]
        best = max(m["head_table"], key=lambda h: h["induction_stripe"])
        dist_stage, dist_score = distribution_score(m) or (None, None)
        dist_head = None
        if dist_stage is not None:
            stage, dist_head, score = distribution_head(_load(d))
            if stage != dist_stage or abs(score - dist_score) > 1e-3:
                raise ValueError(f"{name}: the probe's best `{stage}` score {score:.4f} is not "
                                 f"the card's {dist_stage} {dist_score}: re-run `python -m "
                                 f"attnlens.lab.evaluate {name}`")
        rows.append({"model": name, "variant": variant, "shape": shape,
                     "val_loss": m["val_loss"], "icl_score": m["icl_score"],
                     "induction_score": m["induction_score"], "repeat_loss": m["repeat_loss"],
                     "copy_loss_ratio": m.get("copy_loss_ratio"), "best_head": best["label"],
                     "distribution_stage": dist_stage, "distribution_score": dist_score,
                     "distribution_head": dist_head,
                     "has_induction_head": has_induction_head(m, threshold),
                     "forms_induction": forms_induction(m, threshold)})
    return pd.DataFrame(rows)


def copy_distance_study(models: dict[str, Path], distances=COPY_DISTANCES,
                        batch: int = 8) -> pd.DataFrame:
    """Induction by copy distance: issue 26's probe `[BOS] r r` (random ids, held-out
    PROBE_SEED) with |r| = each of `distances` that fits the model's context. One row per
    (model, distance): the best head's `induction_score`, `first_copy_loss`, `repeat_loss`,
    `copy_loss_ratio`, and `segment_len` (Infini's; NaN otherwise): an earlier copy further back
    than the segment is out of local attention's reach, so only the memory can serve it."""
    from attnlens.interp.tools.text_eval import induction_probe

    rows = []
    for name, d in models.items():
        variant, shape = _labels(name, d)
        model = _load(d)
        segment = getattr(model.cfg.attn_cfg, "segment_len", None)
        for dist in distances:
            if 2 * dist + 1 > model.cfg.n_ctx:
                continue
            probe = induction_probe(model, batch=batch, half=dist)
            rows.append({"model": name, "variant": variant, "shape": shape, "distance": dist,
                         "induction_score": probe["induction_score"],
                         "first_copy_loss": probe["first_copy_loss"],
                         "repeat_loss": probe["repeat_loss"],
                         "copy_loss_ratio": probe["copy_loss_ratio"],
                         "segment_len": float(segment) if segment else float("nan")})
    return pd.DataFrame(rows, columns=["model", "variant", "shape", "distance",
                                       "induction_score", "first_copy_loss", "repeat_loss",
                                       "copy_loss_ratio", "segment_len"])


def _load(directory):
    from attnlens.hooked_models.model import HookedVariantTransformer

    model = HookedVariantTransformer.from_pretrained(directory, device="cpu")
    return model.float() if model.cfg.dtype != torch.float32 else model


def diversity_study(models: dict[str, Path], n_baseline: int = 2) -> tuple[pd.DataFrame,
                                                                            pd.DataFrame]:
    """(curves, summary): `head_diversity` of every model (plain circuits, and composed ones
    for MTA and DCMHA), with a `model`, `variant`, `shape`, `composed` column each."""
    curves, summaries = [], []
    for name, d in models.items():
        variant, shape = _labels(name, d)
        model = _load(d)
        for composed in (False, True) if _mixes_heads(model) else (False,):
            c = head_diversity(model, composed=composed, n_baseline=n_baseline)
            s = diversity_summary(c)
            for frame in (c, s):
                frame.insert(0, "composed", composed)
                frame.insert(0, "shape", shape)
                frame.insert(0, "variant", variant)
                frame.insert(0, "model", name)
            curves.append(c)
            summaries.append(s)
    if not curves:
        return pd.DataFrame(), pd.DataFrame()
    return pd.concat(curves, ignore_index=True), pd.concat(summaries, ignore_index=True)


def gating_study(models: dict[str, Path], n_windows: int = STUDY_WINDOWS) -> dict[str,
                                                                                 pd.DataFrame]:
    """Per variant, the gating tables of its models (a `model` column each):
    `infini_memory`, `mta_gates`, `mta_kernels`, `dcmha_dynamic`, `cope_categories`."""
    out: dict[str, list[pd.DataFrame]] = {}

    def add(key, frame, name):
        frame = frame.reset_index() if frame.index.name else frame
        frame.insert(0, "model", name)
        out.setdefault(key, []).append(frame)

    for name, d in models.items():
        variant, _ = _labels(name, d)
        if variant == "mha":
            continue
        model = _load(d)
        windows = load_eval_tokens(d)[:n_windows]
        if variant == "infini":
            add("infini_memory", memory_specialisation(model, windows), name)
        elif variant == "mta":
            gates = gate_values(model, windows)
            add("mta_gates", gates[gates["stage"] == "gate"], name)
            add("mta_kernels", kernel_table(model), name)
        elif variant == "dcmha":
            gates = gate_values(model, windows)
            add("dcmha_dynamic", gates[gates["stage"].str.endswith("dd")], name)
        elif variant == "cope":
            add("cope_categories", gates_by_category(model, windows), name)
    return {k: pd.concat(v, ignore_index=True) for k, v in out.items()}


def sharpness_study(models: dict[str, Path], n_windows: int = STUDY_WINDOWS) -> pd.DataFrame:
    """`attnlens.interp.tools.score_spread` of every model on its first `n_windows` validation
    windows, with `model`, `variant` and `shape` columns."""
    frames = []
    for name, d in models.items():
        variant, shape = _labels(name, d)
        table = score_spread(_load(d), load_eval_tokens(d)[:n_windows]).reset_index()
        frames.append(table.assign(model=name, variant=variant, shape=shape))
    table = pd.concat(frames, ignore_index=True)
    return table[["model", "variant", "shape", *[c for c in table.columns
                                                 if c not in ("model", "variant", "shape")]]]


STUDY_TABLES = ("induction", "training_log", "copy_distance", "diversity_curves", "diversity",
                "infini_memory", "mta_gates", "mta_kernels", "dcmha_dynamic", "cope_categories",
                "score_spread")


def merge_into_tables(new: dict[str, pd.DataFrame], out_dir, names) -> dict[str, pd.DataFrame]:
    """The study tables in `out_dir` with the rows of models `names` replaced by `new`'s, in the
    order a run on every model writes (by model name, each model's rows in their own order)."""
    merged = {}
    for key in STUDY_TABLES:
        path = Path(out_dir) / f"{key}.csv"
        old = pd.read_csv(path) if path.is_file() else None
        frames = [] if old is None else [old[~old["model"].isin(names)]]
        if key in new:
            frames.append(new[key])
        frames = [f for f in frames if len(f)]
        if frames:
            table = pd.concat(frames, ignore_index=True)
            merged[key] = table.sort_values("model", kind="stable").reset_index(drop=True)
    return merged


def run_studies(release_dir, out_dir, png: bool = True, progress: bool = True,
                only=None) -> dict:
    """Run the studies on the models in `release_dir`; write CSVs and figures to
    `out_dir`. Returns `{table name: DataFrame}`. With `only` (model names), run them on those
    models alone and replace their rows in the tables already in `out_dir` (a model shipped
    into a studied zoo costs its own studies, not the whole zoo's)."""
    from tqdm.auto import tqdm

    from attnlens.interp.plots import save_figure
    from attnlens.interp.plots.training import (
        cope_category_figure,
        copy_distance_figure,
        diversity_comparison_figure,
        phase_change_figure,
    )

    models = released_models(release_dir)
    if not models:
        raise ValueError(f"no released text model (text-<variant>-<shape>/ with a text-lm "
                         f"card) in {str(release_dir)!r}")
    if only:
        unknown = sorted(set(only) - set(models))
        if unknown:
            raise ValueError(f"not released text models in {str(release_dir)!r}: {unknown}")
        models = {n: d for n, d in models.items() if n in only}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=6, desc="text-zoo studies", disable=not progress)
    tables = {"induction": induction_study(models), "training_log": training_logs(models)}
    steps.update()
    tables["copy_distance"] = copy_distance_study(models)
    steps.update()
    tables["diversity_curves"], tables["diversity"] = diversity_study(models)
    steps.update()
    tables.update(gating_study(models))
    steps.update()
    tables["score_spread"] = sharpness_study(models)
    steps.update()
    if only:
        tables = merge_into_tables(tables, out, list(models))
    for key, frame in tables.items():
        frame.to_csv(out / f"{key}.csv", index=False)
    figures = {"phase_change": phase_change_figure(tables["training_log"]),
               "copy_distance": copy_distance_figure(tables["copy_distance"]),
               "diversity": diversity_comparison_figure(tables["diversity"])}
    if "cope_categories" in tables:
        figures["cope_categories"] = cope_category_figure(tables["cope_categories"])
    for key, fig in figures.items():
        save_figure(fig, out / key, png=png)
    steps.update()
    steps.close()
    return tables


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlens.lab.text_studies",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("release_dir", help="directory of released text models")
    parser.add_argument("--out", default="docs/figures/zoo", help="tables and figures go here")
    parser.add_argument("--no-png", action="store_true", help="HTML figures only")
    parser.add_argument("--only", nargs="+", metavar="MODEL",
                        help="study these models alone and replace their rows in the tables "
                             "already in --out (the other models' rows are kept)")
    args = parser.parse_args(argv)
    tables = run_studies(args.release_dir, args.out, png=not args.no_png, only=args.only)
    print(tables["induction"].to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
