"""Small helpers shared by the analyses: head labels, stage look-ups, caches and map transforms.

Everything here goes through the stage catalogue (`model.stages(layer)`), never through variant
names. The `check_*` helpers are the analyses' boundary: a NaN or inf in a weight or an
activation, or a count / probability argument out of range, raises ValueError naming it, instead
of turning into plausible numbers ("no change", a gate class) or a bare linear-algebra error.

Example:
    >>> head_labels(model)[:3]                                   # doctest: +SKIP
    ['L0H0', 'L0H1', 'L0H2']
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlens.hooked_models.attention import Stage

MAP_DIMS = ("batch", "head_index", "query_pos", "key_pos")


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def head_labels(model, layers: list[int] | None = None) -> list[str]:
    """`["L0H0", "L0H1", ...]` for `layers` (all by default), layer-major."""
    layers = range(model.cfg.n_layers) if layers is None else layers
    return [head_label(layer, h) for layer in layers for h in range(model.cfg.n_heads)]


def check_layer(model, layer: int) -> int:
    if not isinstance(layer, int) or not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer {layer!r} is outside [0, n_layers={model.cfg.n_layers})")
    return layer


def check_head(model, head: int) -> int:
    if not isinstance(head, int) or not 0 <= head < model.cfg.n_heads:
        raise ValueError(f"head {head!r} is outside [0, n_heads={model.cfg.n_heads})")
    return head


def check_int(name: str, value, minimum: int = 1) -> int:
    """`value` as an int >= `minimum` (bools and floats are refused: `half_len=2.5` is a bug)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return value


def check_fraction(name: str, value, low: float = 0.0, high: float = 1.0,
                   open_low: bool = False) -> float:
    """`value` as a float in [low, high] (or (low, high] with `open_low`); NaN is refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (low < value if open_low else low <= value) and value <= high  # False for NaN
    if not ok:
        interval = f"{'(' if open_low else '['}{low}, {high}]"
        raise ValueError(f"{name}={value!r} must be a number in {interval}")
    return float(value)


def _non_finite(t: Tensor, allow_neginf: bool) -> tuple[int, str]:
    """(count, kinds) of the values of `t` that are not finite (-inf allowed on request)."""
    kinds = {"NaN": torch.isnan(t), "+inf": torch.isposinf(t)}
    if not allow_neginf:
        kinds["-inf"] = torch.isneginf(t)
    counts = {k: int(m.sum()) for k, m in kinds.items()}
    return sum(counts.values()), ", ".join(k for k, n in counts.items() if n)


def check_finite(name: str, t: Tensor, allow_neginf: bool = False) -> Tensor:
    """`t` unchanged; ValueError "`name` has N non-finite values (NaN)" otherwise.

    `allow_neginf` is for pre-softmax maps, where -inf is the causal / padding mask.

    Example:
        >>> check_finite("x", torch.tensor([1.0, float("nan")]))
        Traceback (most recent call last):
        ValueError: x has 1 non-finite values (NaN)
    """
    if t.is_floating_point() or t.is_complex():
        n, kinds = _non_finite(t.detach(), allow_neginf)
        if n:
            raise ValueError(f"{name} has {n} non-finite values ({kinds})")
    return t


def check_weights(model, prefixes: tuple[str, ...] = ("",)) -> None:
    """Every parameter whose name starts with one of `prefixes` (all by default) is finite.

    Analyses that run the model check all parameters first, so that a NaN weight is named as
    such rather than as the activation it poisons.
    """
    for name, p in model.named_parameters():
        if name.startswith(prefixes):
            check_finite(name, p)


def check_attention_weights(model, layers=None, extra: tuple[str, ...] = ()) -> None:
    """`check_weights` on the attention parameters of `layers` (all by default) and on the
    parameters named in `extra` (e.g. "embed.W_E"): what the circuit analyses read."""
    layers = range(model.cfg.n_layers) if layers is None else layers
    check_weights(model, tuple(f"blocks.{layer}.attn." for layer in layers) + tuple(extra))


def find_stage(model, layer: int, name: str) -> Stage:
    """The catalogue entry `name` of `layer`; ValueError listing the stages otherwise."""
    for s in model.stages(layer):
        if s.name == name:
            return s
    names = [s.name for s in model.stages(layer)]
    raise ValueError(f"layer {layer} ({model.cfg.attention}) has no stage {name!r}; "
                     f"stages: {names}")


def has_stage(model, layer: int, name: str) -> bool:
    return any(s.name == name for s in model.stages(layer))


def layers_with_stage(model, name: str) -> list[int]:
    return [layer for layer in range(model.cfg.n_layers) if has_stage(model, layer, name)]


def map_stage_names(model) -> list[str]:
    """Names of map stages (`[batch head q k]`) present in any layer, in catalogue order."""
    out: list[str] = []
    for layer in range(model.cfg.n_layers):
        for s in model.stages(layer):
            if s.is_map and s.name not in out:
                out.append(s.name)
    return out


def as_tokens(model, tokens) -> Tensor:
    """Token ids `[batch pos]` from a string, list of strings or ids (validated by the model)."""
    if isinstance(tokens, (str, list)):
        return model.to_tokens(tokens)
    return model._check_tokens(tokens)


def _masked_map_hooks(model) -> set[str]:
    """Hook names of pre-softmax map stages, where -inf marks masked (query, key) pairs."""
    return {model.stage_hook_name(layer, s) for layer in range(model.cfg.n_layers)
            for s in model.stages(layer) if s.is_map and s.softmax == "pre"}


def run_cache(model, tokens: Tensor, names: list[str], fwd_hooks=()) -> dict[str, Tensor]:
    """Forward `tokens` caching only `names` (no grad), with optional extra forward hooks.

    Checks the parameters first and every cached activation as it is produced (ValueError
    naming the parameter or the hook that holds a NaN or inf; -inf only where it is a mask):
    raising inside the forward stops it before later steps misread the NaN (CoPE's position
    interpolation would index with it).
    """
    check_weights(model)
    masked = _masked_map_hooks(model)
    store: dict[str, Tensor] = {}

    def save(t: Tensor, hook) -> None:
        store[hook.name] = check_finite(hook.name, t.detach(), allow_neginf=hook.name in masked)

    hooks = list(fwd_hooks) + [(n, save) for n in names]
    with torch.no_grad():
        model.run_with_hooks(tokens, return_type=None, fwd_hooks=hooks)
    return store


def attention_input_name(model, layer: int) -> str:
    """Hook holding the attention input x of `layer` (ln1 output, or resid_pre without norm)."""
    if model.cfg.normalization_type is None:
        return f"blocks.{layer}.hook_resid_pre"
    return f"blocks.{layer}.ln1.hook_normalized"


def to_distribution(maps: Tensor, stage: Stage) -> Tensor:
    """Rows of a map stage as distributions over keys.

    Pre-softmax stages go through a softmax over their finite entries (the attention the head
    would pay if every later step were the identity); row-stochastic stages are returned as they
    are; other post-softmax stages (MTA's convolved maps, DCMHA's composed weights: rows may be
    negative or not sum to one) are clamped at 0 and renormalised.
    """
    if stage.softmax == "pre":
        finite = torch.isfinite(maps)
        work = maps.masked_fill(~finite, float("-inf")).double()
        out = torch.softmax(work, dim=-1)
        return torch.where(finite.any(-1, keepdim=True), out, torch.zeros_like(out)).to(maps.dtype)
    if stage.row_stochastic:
        return maps
    pos = maps.clamp(min=0)
    return pos / pos.sum(-1, keepdim=True).clamp(min=torch.finfo(maps.dtype).tiny)
