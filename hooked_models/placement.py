"""Place a model too large for one device across several: layers split in order over devices.

A placement is a device map `{module name: device}` in accelerate's format (`"embed"`,
`"blocks.3"`, `"unembed"`, ...), so a map from `accelerate.infer_auto_device_map` works too.
`plan_placement` makes a balanced one from the model's sizes: the units (the embeddings; each
block; the final norm with the unembedding) are split into contiguous runs, one per device, in
pipeline order, so the embedding sits on the first device and the unembedding on the last, and
the largest load relative to each device's capacity is as small as possible (exact dynamic
programme, not a greedy fill). `apply_placement` moves the modules and adds forward pre-hooks
that move each module's tensor inputs (the residual stream, masks, positions) to its device, so
activations cross devices only at block boundaries; the logits come back to the embedding's
device, where the tokens are, so the loss, `generate` and the KV cache work unchanged. Every hook
point still fires on the device of its block: hooks, `run_with_cache` (pass `device="cpu"` to
gather the cache on one device) and patching work across devices.

Weights stacked over layers (`model.W_Q`, `QK`, `OV`, `accumulated_bias`) need one device;
`remove_placement(model, device)` brings the model back. Layers that share a parameter (CoPE's
shared position embeddings) must sit on one device; a plan that splits them is refused.

Example:
    >>> plan = plan_placement(model, ["cuda:0", "cuda:1"])     # doctest: +SKIP
    >>> apply_placement(model, plan)                           # doctest: +SKIP
    >>> logits, cache = model.run_with_cache(tokens, device="cpu")   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

_HANDLES = "_placement_handles"


def placement_units(model) -> dict[str, list[str]]:
    """Ordered units of placement: {unit name: module names}, embed first, unembed last."""
    first = [n for n in ("embed", "hook_embed", "pos_embed", "hook_pos_embed")
             if hasattr(model, n)]
    units = {"embed": first}
    units |= {f"blocks.{i}": [f"blocks.{i}"] for i in range(len(model.blocks))}
    units["unembed"] = ["ln_final", "unembed"]
    return units


def unit_sizes(model) -> dict[str, int]:
    """Bytes of parameters and buffers of each placement unit, in pipeline order."""
    sizes = {}
    for unit, names in placement_units(model).items():
        total = 0
        for name in names:
            module = model.get_submodule(name)
            total += sum(t.numel() * t.element_size()
                         for t in [*module.parameters(), *module.buffers()])
        sizes[unit] = total
    return sizes


def _contiguous_split(sizes: Sequence[float], capacities: Sequence[float]) -> list[int]:
    """Split points minimising max(load_d / capacity_d) over contiguous, non-empty runs.

    Returns `starts` (len = number of devices): device d holds units starts[d]..starts[d+1]-1.
    """
    n, k = len(sizes), len(capacities)
    prefix = [0.0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    # cost[d][i]: best max relative load placing units[:i] on devices[:d + 1].
    cost = [[inf] * (n + 1) for _ in range(k)]
    cut = [[0] * (n + 1) for _ in range(k)]
    for i in range(1, n + 1):
        cost[0][i] = prefix[i] / capacities[0]
    for d in range(1, k):
        for i in range(d + 1, n + 1):
            for s in range(d, i):
                value = max(cost[d - 1][s], (prefix[i] - prefix[s]) / capacities[d])
                if value < cost[d][i]:
                    cost[d][i], cut[d][i] = value, s
    starts, i = [0] * k, n
    for d in range(k - 1, 0, -1):
        i = cut[d][i]
        starts[d] = i
    return starts


def plan_placement(model_or_sizes, devices: Sequence[str | torch.device],
                   capacities: Mapping[str, int] | Sequence[int] | None = None
                   ) -> dict[str, str]:
    """A balanced device map for a model (or for `{unit: bytes}` in pipeline order).

    Args:
        model_or_sizes: a `HookedVariantTransformer`, or ordered unit sizes (`unit_sizes`).
        devices: the devices in pipeline order (the same device may repeat, e.g. for tests).
        capacities: bytes available on each device (a sequence aligned with `devices`, or a
            mapping by device string); None balances equal loads.

    Returns `{module name: device}` covering every module that holds weights. Raises
    ValueError when there are no devices, more devices than units, or a unit does not fit.
    """
    sizes = unit_sizes(model_or_sizes) if isinstance(model_or_sizes, nn.Module) \
        else dict(model_or_sizes)
    devices = [str(d) for d in devices]
    if not devices:
        raise ValueError("plan_placement needs at least one device")
    if len(devices) > len(sizes):
        raise ValueError(f"{len(devices)} devices but only {len(sizes)} units to place "
                         f"({list(sizes)}); pass at most {len(sizes)} devices")
    if capacities is None:
        caps = [1.0] * len(devices)
    elif isinstance(capacities, Mapping):
        absent = [d for d in devices if d not in capacities]
        if absent:
            raise ValueError(f"capacities has no entry for devices {absent}")
        caps = [float(capacities[d]) for d in devices]
    else:
        caps = [float(c) for c in capacities]
        if len(caps) != len(devices):
            raise ValueError(f"{len(caps)} capacities for {len(devices)} devices")
    if any(not c > 0 for c in caps):
        raise ValueError(f"capacities must be positive, got {caps}")
    names, weights = list(sizes), list(sizes.values())
    starts = _contiguous_split(weights, caps) + [len(names)]
    plan: dict[str, str] = {}
    for d, device in enumerate(devices):
        run = names[starts[d]:starts[d + 1]]
        load = sum(weights[starts[d]:starts[d + 1]])
        if capacities is not None and load > caps[d]:
            raise ValueError(f"the model does not fit: {device} would hold {run} = {load} bytes "
                             f"> its capacity {int(caps[d])} (total {sum(weights)} bytes over "
                             f"capacities {[int(c) for c in caps]})")
        for unit in run:
            plan[unit] = device
    if isinstance(model_or_sizes, nn.Module):
        units = placement_units(model_or_sizes)
        plan = {module: plan[unit] for unit, modules in units.items() for module in modules}
    return plan


def _device_of(module: nn.Module) -> torch.device | None:
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return None


def _move(obj, device: torch.device):
    if isinstance(obj, Tensor):
        return obj.to(device) if obj.device != device else obj
    if isinstance(obj, tuple):
        return tuple(_move(o, device) for o in obj)
    if isinstance(obj, list):
        return [_move(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    return obj


def _inputs_to_own_device(module: nn.Module, args, kwargs):
    device = _device_of(module)
    if device is None:
        return None
    return _move(args, device), _move(kwargs, device)


def _shared_layer_pairs(model) -> list[tuple[int, int]]:
    """(i, j): block i's attention references block j's attention (a shared parameter)."""
    index = {id(b.attn): b.layer for b in model.blocks}
    pairs = []
    for block in model.blocks:
        for value in vars(block.attn).values():
            refs = value.values() if isinstance(value, dict) else [value]
            for ref in refs:
                j = index.get(id(ref)) if isinstance(ref, nn.Module) else None
                if j is not None and j != block.layer:
                    pairs.append((block.layer, j))
    return pairs


def _resolve(plan: Mapping[str, str], module_name: str) -> str | None:
    """The device of `module_name` under `plan` (longest matching prefix)."""
    parts = module_name.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in plan:
            return str(plan[key])
    return None


def apply_placement(model, plan: Mapping[str, str | torch.device]):
    """Move `model`'s modules as `plan` says and make forward, hooks and caches work across them.

    `plan` maps module names to devices (`plan_placement`'s output or an accelerate device
    map). Every parameter must be covered (its module or an ancestor named). Returns the model.
    Raises ValueError naming uncovered parameters, unknown module names, or shared layers split
    across devices.
    """
    plan = {name: str(device) for name, device in plan.items()}
    if "" in plan:
        raise ValueError("a device map entry for the whole model ('') is not a placement; use "
                         "model.to(device)")
    modules = dict(model.named_modules())
    unknown = sorted(n for n in plan if n not in modules)
    if unknown:
        raise ValueError(f"device map names unknown modules {unknown[:5]}")
    uncovered = [n for n, _ in model.named_parameters() if _resolve(plan, n) is None]
    if uncovered:
        raise ValueError(f"device map leaves parameters {uncovered[:5]} without a device")
    for i, j in _shared_layer_pairs(model):
        a, b = _resolve(plan, f"blocks.{i}.attn"), _resolve(plan, f"blocks.{j}.attn")
        if a != b:
            raise ValueError(f"layers {i} and {j} share parameters (linked layers) but the map "
                             f"puts them on {a} and {b}; place them on one device")
    remove_hooks(model)
    for name in sorted(plan, key=lambda n: n.count(".")):   # parents first, children override
        modules[name].to(plan[name])
    handles = []
    for name in plan:
        if name in ("embed", "hook_embed", "pos_embed", "hook_pos_embed"):
            continue   # the model puts the tokens on the embedding's device itself
        handles.append(modules[name].register_forward_pre_hook(_inputs_to_own_device,
                                                               with_kwargs=True))
    unembed = modules.get("unembed")
    if unembed is not None:
        def logits_home(module, args, output):
            return _move(output, model.W_E.device)

        handles.append(unembed.register_forward_hook(logits_home))
    setattr(model, _HANDLES, handles)
    model.cfg.device = str(model.W_E.device)
    return model


def remove_hooks(model) -> None:
    """Remove the device-moving hooks of `apply_placement` (weights stay where they are)."""
    for handle in getattr(model, _HANDLES, []):
        handle.remove()
    if hasattr(model, _HANDLES):
        delattr(model, _HANDLES)


def remove_placement(model, device: str | torch.device = "cpu"):
    """Undo `apply_placement`: remove its hooks and move the whole model to `device`."""
    remove_hooks(model)
    return model.to(device)


def placement_of(model) -> dict[str, str]:
    """Where each placement unit's weights live now: {unit: device}."""
    out = {}
    for unit, names in placement_units(model).items():
        devices = {str(d) for n in names
                   if (d := _device_of(model.get_submodule(n))) is not None}
        out[unit] = devices.pop() if len(devices) == 1 else sorted(devices)
    return out


__all__ = ["apply_placement", "placement_of", "placement_units", "plan_placement",
           "remove_hooks", "remove_placement", "unit_sizes"]
