"""The analyses a sweep can run: names -> functions of interp returning tidy tables.

Each entry says whether it reads prompts (`uses_prompts`: it runs once per prompt shard, on
groups of equal-length prompts) or only the weights (one shard per model), which columns
identify a row (`keys`) and how a column summarises over shards (`summary`: "mean" is the mean
weighted by the number of prompts, which for these analyses equals the value on all prompts
at once, "sum", "min", "max", "any"). Columns not named in `summary` are kept in the merged
table but not summarised.

Example:
    >>> ANALYSES["heads"].fn(model, tokens, stage="pattern")       # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from attnlens.interp.circuits import qk_ov as circuits
from attnlens.interp.tools import diversity, gating, heads


@dataclass(frozen=True)
class Analysis:
    fn: Callable[..., pd.DataFrame]
    uses_prompts: bool
    keys: tuple[str, ...]
    summary: dict[str, str] = field(default_factory=dict)
    what: str = ""

    def arguments(self) -> list[str]:
        """Argument names a spec may pass (those after model / tokens)."""
        params = list(inspect.signature(self.fn).parameters.values())[1 + self.uses_prompts:]
        return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _heads(model, tokens, detectors=tuple(heads.DETECTORS), stage: str = "pattern",
           exclude_bos: bool = False, exclude_current_token: bool = False) -> pd.DataFrame:
    return heads.detect_heads(model, tokens, detectors, stage, exclude_bos,
                              exclude_current_token).reset_index()


def _gates(model, tokens, low: float = 0.2, high: float = 0.8, band: float = 0.15,
           signed_threshold: float = 0.25) -> pd.DataFrame:
    table = gating.gate_values(model, tokens, low=low, high=high, band=band,
                               signed_threshold=signed_threshold)
    return table.astype({"layer": "int64", "head": "int64", "signed": "bool"})


def _composition(model, modes=circuits.MODES, n_baseline: int = 300,
                 seed: int = 0) -> pd.DataFrame:
    return circuits.composition_table(model, list(modes), n_baseline, seed)


def _circuit(model, tokens, corrupt: str = "first_half", method: str = "eap-ig", steps: int = 5,
             seed: int = 0) -> pd.DataFrame:
    from attnlens.interp.circuits.discovery.prompt_scores import prompt_edge_scores

    return prompt_edge_scores(model, tokens, corrupt, method, steps, seed)


def _diversity(model, circuits=diversity.CIRCUITS, composed: bool = False,
               n_baseline: int = 2, seed: int = 0, thresholds=(0.9, 0.95)) -> pd.DataFrame:
    curves = diversity.head_diversity(model, list(circuits), composed=composed,
                                      n_baseline=n_baseline, seed=seed)
    return diversity.diversity_summary(curves, list(thresholds))


def _attribution(model, tokens, transcoders: str = "", batch_size: int = 64) -> pd.DataFrame:
    """Attribution graphs of each prompt (attnlens.interp.attribution.prompt_study), with the
    transcoders in folder `transcoders` (a checkpoint folder holding `transcoders/`, or the
    `transcoders` folder itself); "" takes the zoo model's own (the model's recipe name)."""
    from attnlens.interp.attribution.prompt_study import attribution_measures

    return attribution_measures(model, _transcoders(model, transcoders), tokens, batch_size)


def _transcoders(model, folder: str) -> dict:
    from pathlib import Path

    from attnlens.interp.attribution.contexts import transcoders_for

    if not isinstance(folder, str):
        raise ValueError(f"transcoders must be a folder path (str), got {folder!r}")
    if not folder:
        from attnlens.hooked_models import zoo

        name = model.cfg.metadata.get("recipe", "")
        if name not in zoo.available():
            raise ValueError("the attribution analysis needs transcoders: give args.transcoders "
                             f"(a folder) for this model (recipe {name!r} is not a zoo model)")
        folder = str(zoo.path(name))
    path = Path(folder)
    path = path.parent if path.name == "transcoders" else path
    try:
        tcs = transcoders_for(path, dtype=model.W_E.dtype)
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None
    return {layer: tc.to(model.W_E.device) for layer, tc in tcs.items()}


_DETECTOR_MEANS = {d: "mean" for d in heads.DETECTORS}

ANALYSES: dict[str, Analysis] = {
    "heads": Analysis(_heads, True, ("head_label", "layer", "head", "stage"), _DETECTOR_MEANS,
                      "head detectors (attnlens.interp.tools.heads.detect_heads) on the prompts"),
    "gates": Analysis(_gates, True, ("head_label", "layer", "head", "stage"),
                      {"mean": "mean", "frac_low": "mean", "frac_high": "mean", "min": "min",
                       "max": "max", "signed": "any"},
                      "per-head gate statistics (attnlens.interp.tools.gating.gate_values)"),
    "composition": Analysis(_composition, False, ("source", "dest", "mode"),
                            {"score": "mean", "z": "mean"},
                            "Q/K/V composition scores "
                            "(attnlens.interp.circuits.qk_ov.composition_table)"),
    "circuit": Analysis(_circuit, True, ("edge", "edge_kind", "src", "dst"),
                        {"score": "mean", "score_sum": "sum", "metric_clean": "mean",
                         "metric_corrupted": "mean"},
                        "edge scores of circuit discovery (attnlens.interp.circuits.discovery."
                        "prompt_scores): per shard the mean and the sum over its prompts"),
    "attribution": Analysis(_attribution, True, ("measure", "layer", "head"),
                            {"value": "mean"},
                            "attribution-graph measures per prompt: error, embedding and feature "
                            "shares of the target logit, head loadings "
                            "(attnlens.interp.attribution.prompt_study)"),
    "diversity": Analysis(_diversity, False, ("layer", "circuit"), {},
                          "head diversity k90/k95 (attnlens.interp.tools.diversity)"),
}
