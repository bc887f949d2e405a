"""One forward of the model through the circuit graph: capture node outputs, patch edges, keep
the inputs for gradients.

Patching edge `u -> d` by a coefficient c moves what d reads from u toward a reference value:
`input_d += c * (ref_u - current_u)`, where `current_u` is u's output in this same forward (so
patching many edges at once composes exactly, as circuit ablation needs) and `ref_u` its output on
the corrupted prompts (or a mean). Map edges patch `M[n, m] A_n` the same way inside the layer;
sub-node edges patch the sub-node's per-head value. With `grads=True` every graph input (and
every mixing target and sub-node value) is a fresh tensor in the autograd graph, so one backward
gives the metric's gradient at each of them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnlens.hooked_models.interop import norm_without_hooks
from attnlens.interp.circuits.discovery.graph import CircuitGraph, Edge
from attnlens.interp.circuits.discovery.mixing import finite_map, mixing_tensors
from attnlens.interp.circuits.discovery.switches import graph_switches


@dataclass
class Record:
    """What one forward saw.

    Attributes:
        acts: hook name -> value (detached): node outputs, mixing sources, sub-node values.
        mixing: (layer, phase) -> M used in this forward (`[b q k head head]` or broadcastable).
        grads: hook name -> gradient of the metric at that input / mixing target / sub-node
            (for the shared attention input: at its pre-norm residual).
        metric: the metric's value (float) when a metric was given.
    """

    acts: dict[str, Tensor] = field(default_factory=dict)
    mixing: dict[tuple[int, str], Tensor] = field(default_factory=dict)
    grads: dict[str, Tensor] = field(default_factory=dict)
    metric: float | None = None

    def output(self, graph: CircuitGraph, node: str) -> Tensor:
        hook, head = graph.outputs[node]
        t = self.acts[hook]
        return t if head is None else t[:, :, head]


def _slot(t: Tensor, head: int | None) -> Tensor:
    return t if head is None else t[:, :, head]


def run(model, graph: CircuitGraph, tokens: Tensor, metric=None, *,
        patch: dict[Edge, float] | None = None, reference: Record | None = None,
        input_value: Tensor | None = None, grads: bool = False) -> Record:
    """Forward `tokens` through `graph`'s hooks.

    Args:
        metric: `metric(logits) -> scalar tensor`; needed for `grads`.
        patch: edge -> coefficient in [0, 1] (1: the edge carries the reference value).
        reference: a `Record` of the reference run (corrupted prompts or means), needed by patch.
        input_value: replaces the input node's output (the embeddings), e.g. an interpolation.
        grads: keep the gradient of `metric` at every graph input.
    Returns:
        a `Record`.
    """
    patch = {e: c for e, c in (patch or {}).items() if c != 0}
    if patch and reference is None:
        raise ValueError("patching edges needs a reference record (corrupted or mean run)")
    rec = Record()
    keep: dict[str, Tensor] = {}
    resid_pre: dict[int, Tensor] = {}
    n_pos = tokens.shape[1]
    by_input = defaultdict(list)       # input hook -> [(dst head, src hook, src head, c)]
    by_mix = defaultdict(list)         # (layer, phase) -> [(n, m, c)]
    by_sub = defaultdict(list)         # sub hook -> [(head, c)]
    for e, c in patch.items():
        if e.kind == "resid":
            hook, head = graph.inputs[(e.dst, e.port)]
            by_input[hook].append((head, *graph.outputs[e.src], c))
        elif e.kind == "mix":
            by_mix[(e.layer, e.port)].append((e.src_head, e.dst_head, c))
        else:
            by_sub[graph.subnodes[(e.layer, e.port)]].append((e.src_head, c))

    def delta_for(hook: str, value: Tensor) -> Tensor:
        for dst_head, src_hook, src_head, c in by_input.get(hook, ()):
            d = c * (_slot(reference.acts[src_hook], src_head) - _slot(rec.acts[src_hook],
                                                                           src_head))
            if dst_head is None:
                value = value + d
            else:   # one head's copy of the residual
                value = value.clone()
                value[:, :, dst_head] = value[:, :, dst_head] + d
        return value

    def fresh(name: str, value: Tensor) -> Tensor:
        if grads:
            value = value.detach().clone().requires_grad_(True) if not value.requires_grad \
                else value.clone()
            keep[name] = value
        return value

    def capture(t: Tensor, hook) -> None:
        rec.acts[hook.name] = t.detach()

    def on_input(t: Tensor, hook):
        return fresh(hook.name, delta_for(hook.name, t))

    def on_resid_pre(t: Tensor, hook):
        layer = int(hook.name.split(".")[1])
        if layer == 0 and input_value is not None:
            t = input_value.to(t.dtype)
        resid_pre[layer] = t
        if layer == 0:
            capture(t, hook)
        return t

    def on_shared_input(t: Tensor, hook):
        layer = int(hook.name.split(".")[1])
        resid = fresh(hook.name, delta_for(hook.name, resid_pre[layer]))
        return norm_without_hooks(model.blocks[layer].ln1, resid)

    def on_sub(t: Tensor, hook):
        rec.acts[hook.name] = t.detach()
        for head, c in by_sub.get(hook.name, ()):
            t = t.clone()
            t[:, :, head] = t[:, :, head] + c * (reference.acts[hook.name][:, :, head]
                                                 - rec.acts[hook.name][:, :, head])
        return fresh(hook.name, t)

    def on_mix_source(t: Tensor, hook):
        rec.acts[hook.name] = finite_map(t.detach())

    def on_mix_target(spec, layer: int):
        def hook_fn(t: Tensor, hook):
            edits = by_mix.get((layer, spec.phase), ())
            if not edits and not grads:   # M is only needed to patch or to score
                return t
            if (layer, "M") not in context_done:
                ctx = {n: rec.acts[n] for n in spec.context if n in rec.acts}
                for phase, M in mixing_tensors(model, layer, spec.dynamic, ctx, n_pos).items():
                    if M is not None:
                        rec.mixing[(layer, phase)] = M.detach()
                context_done.add((layer, "M"))
            M = rec.mixing[(layer, spec.phase)]
            if edits:
                delta = reference.acts[spec.source] - rec.acts[spec.source]
                t = t.clone()
                for n, m, c in edits:
                    t[:, m] = t[:, m] + c * M[..., n, m] * delta[:, n]
            return fresh(hook.name, t)
        return hook_fn

    context_done: set = set()
    hooks = [("blocks.0.hook_resid_pre", on_resid_pre)]
    hooks += [(f"blocks.{layer}.hook_resid_pre", on_resid_pre) for layer in
              graph.shared_input_layers if layer != 0]
    for name, (hook, _) in graph.outputs.items():
        if name != "input" and (hook, capture) not in hooks:
            hooks.append((hook, capture))
    hooks = list(dict.fromkeys(hooks))
    for (_dst, port), (hook, _) in graph.inputs.items():
        fn = on_shared_input if port == "attn_in" else on_input
        if (hook, fn) not in hooks:
            hooks.append((hook, fn))
    for hook in graph.subnodes.values():
        hooks.append((hook, on_sub))
    for (layer, _phase), spec in graph.mixing.items():
        for name in spec.context:
            if (name, capture) not in hooks:
                hooks.append((name, capture))
        hooks.append((spec.source, on_mix_source))
        hooks.append((spec.target, on_mix_target(spec, layer)))
    with graph_switches(model), torch.set_grad_enabled(grads):
        logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
        if metric is not None:
            value = metric(logits)
            rec.metric = float(value.detach())
            if grads:
                names = list(keep)
                got = torch.autograd.grad(value, [keep[n] for n in names], allow_unused=True)
                rec.grads = {n: torch.zeros_like(keep[n]) if g is None else g.detach()
                             for n, g in zip(names, got, strict=True)}
    return rec
