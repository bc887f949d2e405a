"""Scripted analyses: run `interp` on a checkpoint and write tables and figures to a folder.

Used by `attnlens analyze CHECKPOINT --analysis induction diversity gating circuits --out DIR`.
Each analysis writes CSV tables (and JSON where a table does not fit), HTML figures and, when
kaleido is installed, PNG figures; `manifest.json` lists what was written. Analyses that do not
apply to a model (no gates, no head mixing, no key-query kernels) write what applies and say
so in the manifest; nothing branches on the variant's name.

Example:
    >>> written = run_analyses(model, ["induction", "diversity"], "out/")  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from attnlens.interp import plots
from attnlens.interp._common import check_int, map_stage_names
from attnlens.interp.circuits import composed
from attnlens.interp.circuits import qk_ov as circuits
from attnlens.interp.tasks.induction import repeated_tokens
from attnlens.interp.tools import diversity, gating, heads
from attnlens.interp.tools import stage_change as change
from attnlens.interp.variants import cope, infini, mta

ANALYSES = ("induction", "diversity", "gating", "circuits", "stages", "views")


class _Writer:
    def __init__(self, out: Path, png: bool):
        self.out, self.png = out, png
        self.files: dict[str, list[str]] = {}
        self.notes: dict[str, list[str]] = {}
        self.pngs: list[tuple[str, object, Path]] = []    # drawn together by `draw_pngs`

    def table(self, analysis: str, name: str, df: pd.DataFrame, index: bool = True) -> None:
        path = self.out / analysis / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=index)
        self.files.setdefault(analysis, []).append(str(path.relative_to(self.out)))

    def json(self, analysis: str, name: str, obj) -> None:
        path = self.out / analysis / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj, indent=2))
        self.files.setdefault(analysis, []).append(str(path.relative_to(self.out)))

    def figure(self, analysis: str, name: str, fig) -> None:
        if not (self.out / "plotly.min.js").exists():
            plots.write_plotlyjs(self.out)
            self.files.setdefault("figures", []).append("plotly.min.js")
        path = self.out / analysis / name
        for p in plots.save_figure(fig, path, png=False, plotlyjs="../plotly.min.js"):
            self.files.setdefault(analysis, []).append(str(p.relative_to(self.out)))
        if self.png:
            self.pngs.append((analysis, fig, path))

    def draw_pngs(self) -> None:
        """Every figure's PNG, drawn with one Chromium start (a start per figure was ~3.5 s of
        each figure's ~4 s: 69 s of the 76 s of all six analyses on a tiny model)."""
        written = plots.save_pngs([(fig, path) for _, fig, path in self.pngs])
        for analysis, _, path in self.pngs:
            if path.with_suffix(".png") in written:
                self.files[analysis].append(str(path.with_suffix(".png").relative_to(self.out)))
        self.pngs = []

    def note(self, analysis: str, text: str) -> None:
        self.notes.setdefault(analysis, []).append(text)


def probe_tokens(model, batch: int = 8, half_len: int | None = None, seed: int = 0):
    """`[BOS] r r` repeated random tokens that fit the context, and their half length."""
    check_int("batch", batch)
    check_int("seed", seed, minimum=0)
    half = (max(2, min(32, (model.cfg.n_ctx - 1) // 2)) if half_len is None
            else check_int("half_len", half_len))
    if 1 + 2 * half > model.cfg.n_ctx:
        raise ValueError(f"half_len={half} needs {1 + 2 * half} positions; n_ctx="
                         f"{model.cfg.n_ctx}")
    toks = repeated_tokens(batch, half, model.cfg.d_vocab, seed=seed).to(model.W_E.device)
    return toks, half


def _induction(model, w: _Writer, batch: int, half: int, seed: int) -> None:
    table = heads.induction_table(model, batch, half, seed)
    w.table("induction", "heads", table)
    cols = ["previous_token", "duplicate_token", "induction", "induction_stripe"]
    w.figure("induction", "heads", plots.head_table_figure(table, cols, "Head detectors "
                                                                      "(hook_pattern)"))
    frames = [heads.induction_table(model, batch, half, seed, stage=s).reset_index()
              for s in map_stage_names(model) if s != "pattern"]
    if frames:
        w.table("induction", "heads_by_stage", pd.concat(frames, ignore_index=True), index=False)
    first = table[table["layer"] == 0]
    if model.cfg.n_layers > 1:
        prev = first["previous_token"].idxmax()
        layer, head = int(first.loc[prev, "layer"]), int(first.loc[prev, "head"])
        # z, and the first post-softmax map when steps follow it (mixing lets other heads
        # borrow the head's weights, which zeroing its z does not remove)
        post = [s.name for s in model.stages(layer) if s.is_map and s.softmax == "post"]
        hooks = ["z"] + ([post[0]] if post and post[0] != "pattern" else [])
        frames = []
        for hook in hooks:
            ablated = heads.induction_ablation(model, [(layer, head)], batch, half, seed,
                                               hook=hook)
            frames.append(ablated.assign(ablated=prev, hook=hook).reset_index())
        ablated = pd.concat(frames, ignore_index=True)
        w.table("induction", "ablation", ablated, index=False)
        w.figure("induction", "ablation", plots.ablation_figure(ablated))
        w.note("induction", f"ablation: {prev}, the strongest layer-0 previous-token head, "
                            f"knocked out at {', '.join('hook_' + h for h in hooks)}")


def _diversity(model, w: _Writer, seed: int) -> None:
    curves = diversity.head_diversity(model, seed=seed)
    w.table("diversity", "curves", curves, index=False)
    w.table("diversity", "summary", diversity.diversity_summary(curves), index=False)
    w.figure("diversity", "curves", plots.diversity_figure(curves))
    mixes = any(m is not None for b in model.blocks for m in b.attn.head_mixing().values())
    if mixes:
        comp = diversity.head_diversity(model, composed=True, seed=seed)
        w.table("diversity", "curves_composed", comp, index=False)
        w.table("diversity", "summary_composed", diversity.diversity_summary(comp), index=False)
        w.figure("diversity", "curves_composed", plots.diversity_figure(comp))


def _gating(model, w: _Writer, tokens) -> None:
    gates = gating.gate_values(model, tokens)
    w.table("gating", "gates", gates, index=False)
    if len(gates):
        w.figure("gating", "gates", plots.gate_figure(gates))
    else:
        w.note("gating", "no per-head gate stage in this model's catalogue")
    if infini.memory_layers(model):
        mem = infini.memory_specialisation(model, tokens)
        w.table("gating", "memory", mem)
        w.figure("gating", "memory", plots.memory_figure(mem))
    for layer in range(model.cfg.n_layers):
        for phase in ("pre", "post"):
            borrow = composed.borrowing_table(model, tokens[:2], layer, phase, max_pairs=64)
            if len(borrow):
                w.table("gating", f"borrowing_L{layer}_{phase}", borrow, index=False)


def _circuits(model, w: _Writer) -> None:
    table = circuits.composition_table(model)
    w.table("circuits", "composition", table, index=False)
    for mode in circuits.MODES:
        if len(table):
            w.figure("circuits", f"composition_{mode}", plots.composition_figure(table, mode))
    copy = circuits.copying_scores(model)
    w.table("circuits", "copying", copy)
    w.figure("circuits", "copying", plots.copying_figure(copy))
    for layer in range(model.cfg.n_layers):
        for phase, M in composed.mixing_matrices(model, layer).items():
            if M is not None:
                w.table("circuits", f"mixing_L{layer}_{phase}",
                        composed.mixing_pairs(model, layer, phase), index=False)
                w.figure("circuits", f"mixing_L{layer}_{phase}",
                         plots.mixing_figure(M, layer, phase))


def _stages(model, w: _Writer, tokens) -> None:
    table = change.catalogue_changes(model, tokens[:4])
    w.table("stages", "changes", table, index=False)
    if len(table):
        w.figure("stages", "changes", plots.stage_change_figure(table))


def _views(model, w: _Writer, tokens) -> None:
    kernels = mta.kernel_table(model)
    if len(kernels):
        w.table("views", "kernels", kernels, index=False)
        for (layer, phase), k in mta.key_query_kernels(model).items():
            classes = list(kernels[(kernels.layer == layer) & (kernels.phase == phase)]["class"])
            w.figure("views", f"kernels_L{layer}_{phase}",
                     plots.kernel_figure(k, classes, f"Layer {layer} {phase}-softmax kernels",
                                         key_centre=mta.kernel_centre(model, layer,
                                                                      k.shape[-1])))
    if cope.cope_layers(model):
        w.table("views", "gate_openers", cope.gate_openers(model, tokens), index=False)
        w.table("views", "counted_units", cope.counted_units(model, tokens))
        layer = cope.cope_layers(model)[0]
        pos = cope.positional_attention(model, tokens[:1], layer)
        w.figure("views", f"positional_attention_L{layer}",
                 plots.positional_attention_figure(pos, head=0))
    if not w.files.get("views"):
        w.note("views", "no variant-specific stages or kernels (key-query kernels, contextual "
                        "positions) in this model")


def run_analyses(model, analyses, out_dir, batch: int = 8, half_len: int | None = None,
                 seed: int = 0, png: bool = True, progress: bool = True) -> dict:
    """Run `analyses` (names from `ANALYSES`) on `model`, writing into `out_dir`.

    Returns the manifest: {"files": {analysis: [relative paths]}, "notes": {...}, ...}, also
    written to `out_dir/manifest.json`.
    """
    analyses = list(analyses)
    unknown = [a for a in analyses if a not in ANALYSES]
    if unknown:
        raise ValueError(f"unknown analyses {unknown}; choose from {list(ANALYSES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    w = _Writer(out, png and plots.kaleido_available())
    tokens, half = probe_tokens(model, batch, half_len, seed)
    steps = {"induction": lambda: _induction(model, w, batch, half, seed),
             "diversity": lambda: _diversity(model, w, seed),
             "gating": lambda: _gating(model, w, tokens),
             "circuits": lambda: _circuits(model, w),
             "stages": lambda: _stages(model, w, tokens),
             "views": lambda: _views(model, w, tokens)}
    model.eval()
    with torch.no_grad():
        for name in tqdm(analyses, desc="analyze", disable=not progress):
            steps[name]()
    w.draw_pngs()
    manifest = {"model": model.cfg.to_dict(), "analyses": analyses,
                "probe": {"batch": batch, "half_len": half, "seed": seed},
                "png": w.png, "files": w.files, "notes": w.notes}
    if png and not w.png:
        manifest["notes"].setdefault("figures", []).append(
            "PNG skipped: install kaleido for PNG export (HTML written)")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    return manifest
