"""Vectorised head detectors over `[batch head_index query_pos key_pos]` maps of any stage.

Each score follows TransformerLens's `detect_head(..., error_measure="mul")`: the fraction of a
head's attention mass that falls on the detection pattern's (query, key) pairs, per sequence, then
averaged over the batch. The functions take any map of the stage catalogue; `detect_heads` runs
them on every layer and head of a model at a chosen stage (pre-softmax stages are scored through
their softmax, see `attnlens.interp._common.to_distribution`).

Where the scores equal `transformer_lens.head_detector.detect_head` (TL 4.3) on `hook_pattern`,
exactly (same prompt, same `exclude_bos` / `exclude_current_token`, "mul"):

- previous_token and duplicate_token: whenever the head's pattern is non-negative. TL divides by
  the signed sum of the pattern, we by the absolute mass (so a score stays in [-1, 1] on signed
  maps); the two coincide on every row-stochastic pattern (MHA, CoPE, Infini's first segment,
  MTA / DCMHA in their MHA-equivalent settings). On a pattern with negative entries (MTA's
  post-softmax convolution or head mixing, DCMHA's Compose) ours = TL * sum(p) / sum(|p|):
  they cannot agree.
- induction: in addition, no token equals the token just before it (position 1 against BOS too),
  or `exclude_current_token=True`. TL's induction pattern is its duplicate pattern shifted one key
  right and then `tril` *with* the diagonal, so after "a a" the query attending to itself counts
  as induction; ours keeps keys k < q only, because a head attending to the current token is a
  current-token head, not one that looked up an earlier copy.
- a list of prompts: TL runs each prompt alone and averages; we score one padded batch, which is
  the same when every prompt has the same number of tokens.

Example:
    >>> pattern = torch.eye(5)[None, None].repeat(1, 2, 1, 1)  # attends to itself
    >>> previous_token_scores(pattern)
    tensor([0., 0.])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from attnlens.interp._common import (
    as_tokens,
    check_finite,
    check_head,
    check_int,
    check_layer,
    find_stage,
    head_label,
    layers_with_stage,
    run_cache,
    to_distribution,
)
from attnlens.interp.tasks.induction import repeated_tokens


def _mass_on(pattern: Tensor, detection: Tensor, exclude_bos: bool = False,
             exclude_current_token: bool = False) -> Tensor:
    """Fraction of each head's mass on `detection` (`[batch q k]` or `[q k]`), mean over batch.

    `exclude_bos` / `exclude_current_token` drop key 0 / the diagonal from numerator and
    denominator, as TransformerLens's `detect_head` does.
    """
    check_finite("pattern", pattern)
    if detection.ndim == 2:
        detection = detection[None]
    detection = detection[:, None].to(pattern.dtype)
    if exclude_bos or exclude_current_token:
        keep = torch.ones(pattern.shape[-2:], dtype=pattern.dtype, device=pattern.device)
        if exclude_bos:
            keep[:, 0] = 0
        if exclude_current_token:
            keep.fill_diagonal_(0)
        pattern = pattern * keep
    on = (pattern * detection).sum((-2, -1))
    total = pattern.abs().sum((-2, -1)).clamp(min=torch.finfo(pattern.dtype).tiny)
    return (on / total).mean(0)


def previous_token_detection(n: int) -> Tensor:
    """`[q k]` 1 on the sub-diagonal (key = query - 1)."""
    check_int("n", n)
    return torch.diag(torch.ones(n - 1), -1)


def previous_token_scores(pattern: Float[Tensor, "batch head_index query_pos key_pos"],
                          **kw) -> Tensor:
    """`[head_index]` fraction of attention on the previous token (the sub-diagonal)."""
    return _mass_on(pattern, previous_token_detection(pattern.shape[-1]).to(pattern.device), **kw)


def duplicate_token_detection(tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """`[batch q k]` 1 where key k < q holds the same token as query q (TL's detection pattern)."""
    same = tokens[:, :, None] == tokens[:, None, :]
    return torch.tril(same, diagonal=-1).float()


def induction_detection(tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """`[batch q k]` 1 where key k < q follows an earlier occurrence of query q's token.

    The duplicate-token mask shifted right by one key, as TL's `induction_head` pattern, but
    without the diagonal: TL also marks key q itself when token q - 1 equals token q (see the
    module docstring for when the two scores agree).
    """
    dup = duplicate_token_detection(tokens)
    shifted = torch.zeros_like(dup)
    shifted[:, :, 1:] = dup[:, :, :-1]
    return torch.tril(shifted, diagonal=-1)


def duplicate_token_scores(pattern: Tensor, tokens: Tensor, **kw) -> Tensor:
    """`[head_index]` fraction of attention on earlier copies of the current token."""
    return _mass_on(pattern, duplicate_token_detection(tokens.to(pattern.device)), **kw)


def induction_scores(pattern: Tensor, tokens: Tensor, **kw) -> Tensor:
    """`[head_index]` fraction of attention on tokens that followed earlier copies (any input).

    This is Olsson et al.'s prefix-matching score generalised to any sequence.
    """
    return _mass_on(pattern, induction_detection(tokens.to(pattern.device)), **kw)


def repeated_induction_scores(pattern: Tensor, half_len: int, bos: bool = True) -> Tensor:
    """`[head_index]` mean attention on the induction stripe of `[BOS] r r` inputs.

    Query i of the second copy attends to key i - half_len + 1 (the token after its earlier copy).
    """
    check_finite("pattern", pattern)
    start = int(bos) + check_int("half_len", half_len)
    if start >= pattern.shape[-2]:
        raise ValueError(f"half_len={half_len} leaves no second-copy query in a pattern of "
                         f"{pattern.shape[-2]} positions (bos={bos})")
    q = torch.arange(start, pattern.shape[-2])
    k = q - half_len + 1
    return pattern[..., q, k].mean((0, -1))


def _scorable(maps: Tensor, stage) -> Tensor:
    """Pre-softmax stages through their softmax; post-softmax stages as they are (signed)."""
    return to_distribution(maps, stage) if stage.softmax == "pre" else maps


# name -> score(maps, tokens, **kw): the detectors `detect_heads` knows (a registry, not eval).
DETECTORS: dict[str, Callable[..., Tensor]] = {
    "previous_token": lambda maps, tokens, **kw: previous_token_scores(maps, **kw),
    "duplicate_token": duplicate_token_scores,
    "induction": induction_scores,
}


def stage_maps(model, tokens, stage: str = "pattern", layers: Iterable[int] | None = None,
               fwd_hooks=()) -> dict[int, Tensor]:
    """`{layer: [batch head q k]}` of map stage `stage` for `tokens` (layers that have it).

    Example:
        >>> maps = stage_maps(model, tokens, "softmax")        # doctest: +SKIP
    """
    return stages_maps(model, tokens, [stage], layers, fwd_hooks)[stage]


def stages_maps(model, tokens, stages: Iterable[str], layers: Iterable[int] | None = None,
                fwd_hooks=()) -> dict[str, dict[int, Tensor]]:
    """`{stage: {layer: [batch head q k]}}` for several map stages, from one forward.

    Example:
        >>> maps = stages_maps(model, tokens, ["softmax", "pattern"])   # doctest: +SKIP
    """
    tokens = as_tokens(model, tokens)
    names: dict[str, dict[int, str]] = {}
    for stage in stages:
        at = (layers_with_stage(model, stage) if layers is None
              else [check_layer(model, x) for x in layers])
        if not at:
            raise ValueError(f"no layer of this {model.cfg.attention!r} model has a stage "
                             f"{stage!r}; stages: {[s.name for s in model.stages(0)]}")
        for layer in at:
            if not find_stage(model, layer, stage).is_map:
                raise ValueError(f"stage {stage!r} is not a [batch head query key] map")
        names[stage] = {layer: model.stage_hook_name(layer, stage) for layer in at}
    store = run_cache(model, tokens, [n for by in names.values() for n in by.values()],
                      fwd_hooks)
    return {stage: {layer: store[n] for layer, n in by.items()} for stage, by in names.items()}


def detect_heads(model, tokens, detectors: Iterable[str] = tuple(DETECTORS),
                 stage: str = "pattern", exclude_bos: bool = False,
                 exclude_current_token: bool = False, fwd_hooks=()) -> pd.DataFrame:
    """Score every head of every layer that has `stage` with each detector.

    Args:
        model: a `HookedVariantTransformer`.
        tokens: `[batch pos]` ids, or text.
        detectors: names from `DETECTORS` ("previous_token", "duplicate_token", "induction").
        stage: any map stage of the catalogue ("pattern", MTA's "softmax", DCMHA's "probs", ...).
            Pre-softmax stages are scored through their softmax.
        exclude_bos, exclude_current_token: as TransformerLens's `detect_head`.
        fwd_hooks: extra hooks during the forward (e.g. an ablation, see `ablate_heads`).

    Returns:
        DataFrame indexed by head label ("L1H3") with columns `layer`, `head`, `stage` and one
        score per detector. On `hook_pattern` these equal `detect_head(..., "mul")` under the
        conditions of the module docstring (non-negative pattern; for induction, no adjacent
        repeated tokens or `exclude_current_token=True`).

    Example:
        >>> detect_heads(model, tokens).loc["L1H2", "induction"]   # doctest: +SKIP
        0.83
    """
    detectors = list(detectors)
    unknown = [d for d in detectors if d not in DETECTORS]
    if unknown:
        raise ValueError(f"unknown detectors {unknown}; choose from {list(DETECTORS)}")
    tokens = as_tokens(model, tokens)
    maps = stage_maps(model, tokens, stage, fwd_hooks=fwd_hooks)
    return _detector_table(model, tokens, _scorable_maps(model, maps, stage), stage, detectors,
                           dict(exclude_bos=exclude_bos,
                                exclude_current_token=exclude_current_token))


def _scorable_maps(model, maps: dict[int, Tensor], stage: str) -> dict[int, Tensor]:
    """`{layer: _scorable(map)}`: what the detectors score."""
    return {layer: _scorable(m, find_stage(model, layer, stage)) for layer, m in maps.items()}


def _detector_table(model, tokens: Tensor, dists: dict[int, Tensor], stage: str,
                    detectors: list[str], kw: dict) -> pd.DataFrame:
    """`detect_heads`'s table from scorable maps already cached (`_scorable_maps`)."""
    rows = []
    for layer, dist in dists.items():
        scores = {d: DETECTORS[d](dist, tokens, **kw).cpu() for d in detectors}
        for h in range(model.cfg.n_heads):
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "stage": stage, **{d: float(s[h]) for d, s in scores.items()}})
    return pd.DataFrame(rows).set_index("head_label")


def induction_table(model, batch: int = 8, half_len: int | None = None, seed: int = 0,
                    stage: str = "pattern", fwd_hooks=()) -> pd.DataFrame:
    """Head scores on `[BOS] r r` repeated random tokens (Olsson et al.'s probe).

    Returns a DataFrame indexed by head label with columns `layer`, `head`, `stage`,
    `previous_token`, `duplicate_token`, `induction` (the prefix-matching detector) and
    `induction_stripe` (mean attention on the exact stripe key = query - half_len + 1).

    Example:
        >>> induction_table(model, half_len=10)["induction_stripe"].idxmax()  # doctest: +SKIP
        'L1H2'
    """
    return induction_tables(model, [stage], batch, half_len, seed, fwd_hooks)[stage]


def induction_tables(model, stages: Iterable[str] = ("pattern",), batch: int = 8,
                     half_len: int | None = None, seed: int = 0,
                     fwd_hooks=()) -> dict[str, pd.DataFrame]:
    """`{stage: induction_table(..., stage=stage)}` for several map stages, from one forward.

    Example:
        >>> induction_tables(model, ["softmax", "pattern"])["softmax"]   # doctest: +SKIP
    """
    check_int("batch", batch)
    check_int("seed", seed, minimum=0)
    half = max(2, (model.cfg.n_ctx - 1) // 2) if half_len is None else check_int("half_len",
                                                                                half_len)
    if 1 + 2 * half > model.cfg.n_ctx:
        raise ValueError(f"half_len={half} needs {1 + 2 * half} positions; n_ctx="
                         f"{model.cfg.n_ctx}")
    tokens = repeated_tokens(batch, half, model.cfg.d_vocab, seed=seed).to(model.W_E.device)
    tables = {}
    for stage, maps in stages_maps(model, tokens, stages, fwd_hooks=fwd_hooks).items():
        dists = _scorable_maps(model, maps, stage)
        table = _detector_table(model, tokens, dists, stage, list(DETECTORS),
                                dict(exclude_bos=False, exclude_current_token=False))
        table["induction_stripe"] = [float(x) for dist in dists.values()
                                     for x in repeated_induction_scores(dist, half).cpu()]
        tables[stage] = table
    return tables


def ablation_hooks(model, heads: Iterable[tuple[int, int]], how: str = "zero",
                   hook: str = "z", tokens: Tensor | None = None) -> list:
    """Forward hooks that knock out `heads` [(layer, head), ...] at `hook`.

    `hook` is "z" or "v" (the head's output or values), or the name of any map stage of the
    catalogue (the head's map `[batch head q k]` at that stage is replaced). Knocking a head out
    at a map stage before a mixing step removes what other heads borrow from it, which zeroing
    its z does not (MTA head mixing, DCMHA Compose). `how` is "zero" or "mean" (the head's mean
    activation over batch and positions of `tokens`, or of the ablated input itself when
    `tokens` is None); on pre-softmax stages "zero" makes the head attend uniformly.

    Example:
        >>> with model.hooks(fwd_hooks=ablation_hooks(model, [(0, 1)])):   # doctest: +SKIP
        ...     logits = model(tokens)
    """
    if how not in ("zero", "mean"):
        raise ValueError(f"how={how!r}; choose 'zero' or 'mean'")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(check_layer(model, layer), []).append(check_head(model, head))
    names, axis = {}, {}
    if hook == "v" and model.blocks[0].attn.kv_group > 1:
        raise ValueError(f"hook='v' cannot knock out one query head under grouped-query "
                         f"attention (n_key_value_heads={model.cfg.n_key_value_heads}: hook_v "
                         f"holds the shared key/value heads); use hook='z' or a map stage")
    for layer in by_layer:
        if hook in ("z", "v"):
            names[layer], axis[layer] = f"blocks.{layer}.attn.hook_{hook}", 2
        else:
            stage = find_stage(model, layer, hook)
            if not stage.is_map:
                raise ValueError(f"hook={hook!r}: choose 'z', 'v' or a map stage")
            names[layer], axis[layer] = model.stage_hook_name(layer, hook), 1
    means: dict[int, Tensor] = {}
    if how == "mean" and tokens is not None:
        store = run_cache(model, as_tokens(model, tokens), list(names.values()))
        means = {layer: _mean_over(store[n], axis[layer]) for layer, n in names.items()}

    def make(layer: int, idx: list[int]):
        def fn(act: Tensor, hook) -> Tensor:
            act = act.clone()
            view = act.movedim(axis[layer], 0)
            if how == "zero":
                view[idx] = 0
            else:
                fill = means[layer] if layer in means else _mean_over(act, axis[layer])
                view[idx] = fill[idx].to(act.dtype)
            return act
        return fn

    return [(names[layer], make(layer, idx)) for layer, idx in by_layer.items()]


def _mean_over(act: Tensor, axis: int) -> Tensor:
    """Per-head mean: over batch and positions for `[b p h d]`, over batch for maps."""
    if axis == 2:
        return act.mean((0, 1))                       # [head d]
    return act.nan_to_num(neginf=0.0).mean(0)         # [head q k]


@contextmanager
def ablate_heads(model, heads: Iterable[tuple[int, int]], how: str = "zero", hook: str = "z"):
    """Context manager: run the model with `heads` knocked out (hooks removed afterwards);
    arguments as `ablation_hooks`."""
    with model.hooks(fwd_hooks=ablation_hooks(model, heads, how, hook)):
        yield model


def induction_ablation(model, heads: Iterable[tuple[int, int]], batch: int = 8,
                       half_len: int | None = None, seed: int = 0, stage: str = "pattern",
                       how: str = "zero", hook: str = "z") -> pd.DataFrame:
    """Induction scores of the heads in later layers, before and after knocking out `heads`.

    The check of Olsson et al.: ablating a previous-token head (K-composition source) lowers the
    induction score of the heads it feeds. `how` and `hook` are as `ablation_hooks` (e.g.
    `hook="probs"` ablates a DCMHA head's weights before they are composed into other heads).
    Returns a DataFrame indexed by head label (heads in layers after the first ablated layer)
    with `induction_stripe` `before`, `after` and `delta`.

    Example:
        >>> induction_ablation(model, [(0, 3)]).sort_values("delta").head(1)  # doctest: +SKIP
    """
    heads = list(heads)
    if not heads:
        raise ValueError("give at least one (layer, head) to ablate")
    check_int("batch", batch)
    if half_len is not None:
        check_int("half_len", half_len)
    first = min(layer for layer, _ in heads)
    before = induction_table(model, batch, half_len, seed, stage)
    after = induction_table(model, batch, half_len, seed, stage,
                            fwd_hooks=ablation_hooks(model, heads, how, hook))
    keep = before["layer"] > first
    out = before.loc[keep, ["layer", "head"]].copy()
    out["before"] = before.loc[keep, "induction_stripe"]
    out["after"] = after.loc[keep, "induction_stripe"]
    out["delta"] = out["after"] - out["before"]
    return out
