"""The computational graph that circuit discovery scores: nodes, edges and how each is patched.

Nodes (EAP-IG, Hanna et al. 2024): the input (token + position embeddings), every attention head
(with its query, key and value inputs as ports), every MLP, the logits, and extra per-head nodes
declared by the stage catalogue (`SUBNODE_STAGES`: Infini-attention's memory read `a_mem`).

Edges:
- residual edges `u -> d.port`: the output of an upstream node u, as read by one input of a
  downstream node (a head's q/k/v input, an MLP's input, the logits, or a layer's shared
  attention input when the layer reads it besides q/k/v, e.g. DCMHA's dynamic-weight generator);
- within-layer map edges `L{l}H{n} -> L{l}H{m} [pre|post]`: head n's score (pre) or probability
  (post) map as mixed into head m's map (MTA head mixing, DCMHA Compose), read from the layer's
  `head_mixing_at` and the catalogue (`attnlens.interp.circuits.discovery.mixing`);
- sub-node edges `L{l}H{h}.mem -> L{l}H{h}`: a per-head stage that enters the head output
  additively (the memory read of Infini-attention).

Nothing here names a variant: the nodes follow the model's shape, the map edges its mixing seam,
the sub-nodes its catalogue.

Example:
    >>> graph = build_graph(model)                                  # doctest: +SKIP
    >>> len(graph.edges), graph.edges[0].name                       # doctest: +SKIP
    (123, 'input->L0H0.q')
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnlens.interp.circuits.discovery.mixing import MixingSpec, mixing_specs

# A stage named here, when a layer's catalogue has it, becomes a node of its own per head that
# feeds the head's output (the stage must enter z additively and be hooked per head,
# `[batch pos head_index d_head]`). Key: stage name; value: the node suffix.
SUBNODE_STAGES = {"a_mem": "mem"}


@dataclass(frozen=True)
class Node:
    """One node. `kind`: "input", "head", "mlp", "logits" or a sub-node suffix ("mem");
    `layer` is -1 for the input and n_layers for the logits."""

    name: str
    kind: str
    layer: int
    head: int | None = None


@dataclass(frozen=True)
class Edge:
    """One edge. `kind`: "resid" (through the residual stream), "mix" (within-layer map edge) or
    "sub" (sub-node into its head). `port` names the input it reaches ("q", "k", "v", "in",
    "attn_in", "logits") or the mixing phase ("pre", "post") or the sub-node suffix."""

    src: str
    dst: str
    kind: str
    port: str
    layer: int          # the layer of the destination (n_layers for the logits)
    src_head: int | None = None
    dst_head: int | None = None

    @property
    def name(self) -> str:
        if self.kind == "resid":
            return f"{self.src}->{self.dst}" + ("" if self.port in ("in", "logits", "attn_in")
                                                else f".{self.port}")
        if self.kind == "mix":
            return f"{self.src}->{self.dst}[{self.port}]"
        return f"{self.src}->{self.dst}"


@dataclass
class CircuitGraph:
    """Nodes and edges of one model, plus the hook names that realise them.

    Attributes:
        nodes: by name: the input, then per layer its heads, its shared attention input (if
            read), its sub-nodes and its MLP, then the logits.
        edges: residual edges first, then map and sub-node edges.
        outputs: upstream node -> (hook name, head index or None): where its output is read.
        inputs: (dst node, port) -> (hook name, head index or None): where an input is written.
        mixing: (layer, phase) -> MixingSpec for the layers whose heads mix maps.
        subnodes: (layer, suffix) -> hook name of the per-head stage.
        shared_input_layers: layers whose attention reads its shared input besides q/k/v.
    """

    n_layers: int
    n_heads: int
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    outputs: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    inputs: dict[tuple[str, str], tuple[str, int | None]] = field(default_factory=dict)
    mixing: dict[tuple[int, str], MixingSpec] = field(default_factory=dict)
    subnodes: dict[tuple[int, str], str] = field(default_factory=dict)
    shared_input_layers: list[int] = field(default_factory=list)

    def edge_index(self) -> dict[str, int]:
        return {e.name: i for i, e in enumerate(self.edges)}

    def edges_of(self, kind: str) -> list[Edge]:
        return [e for e in self.edges if e.kind == kind]

    def summary(self) -> dict[str, int]:
        """Counts of nodes and edges by kind."""
        out = {"nodes": len(self.nodes), "edges": len(self.edges)}
        for kind in ("resid", "mix", "sub"):
            out[f"{kind}_edges"] = len(self.edges_of(kind))
        return out


def head_node(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def _reads_shared_input(model, layer: int) -> bool:
    """Whether `layer`'s attention reads its (ln1-normalised) input besides q, k, v.

    Decided by autograd on a two-token probe with the per-head q/k/v input forks on: the shared
    input then reaches the output only through such readers (DCMHA's dynamic weights, CoPE's
    separate gate keys). Layers without a norm (no `ln1.hook_normalized`) report False.
    """
    name = f"blocks.{layer}.ln1.hook_normalized"
    if name not in model.hook_dict:
        return False
    kept = {}

    def grab(t, hook):
        t = t.detach().requires_grad_(True)
        kept["x"] = t
        return t

    def touch(t, hook):   # the forks replace q/k/v only while someone hooks their inputs
        return t

    tokens = torch.zeros(1, 2, dtype=torch.long, device=model.W_E.device)
    hooks = [(name, grab)] + [(f"blocks.{layer}.attn.hook_{p}_input", touch) for p in "qkv"]
    with torch.enable_grad():
        out = model.run_with_hooks(tokens, fwd_hooks=hooks, stop_at_layer=layer + 1)
        (grad,) = torch.autograd.grad(out.sum(), kept["x"], allow_unused=True)
    return grad is not None and bool(grad.abs().sum() > 0)


def build_graph(model) -> CircuitGraph:
    """The circuit graph of `model` (call inside `graph_switches(model)` or not: it turns the
    switches it needs on and restores them).

    Returns a `CircuitGraph`; see the module docstring for what it holds.
    """
    from attnlens.interp.circuits.discovery.switches import graph_switches

    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    kv = cfg.n_key_value_heads or H
    has_mlp = not cfg.attn_only
    g = CircuitGraph(n_layers=L, n_heads=H)
    with graph_switches(model):
        g.shared_input_layers = [layer for layer in range(L) if _reads_shared_input(model, layer)]
        specs = mixing_specs(model)
    g.nodes["input"] = Node("input", "input", -1)
    g.outputs["input"] = ("blocks.0.hook_resid_pre", None)
    upstream: list[str] = ["input"]
    for layer in range(L):
        stages = {s.name for s in model.stages(layer)}
        attn = f"blocks.{layer}.attn."
        # residual edges into this layer's heads
        for h in range(H):
            name = head_node(layer, h)
            g.nodes[name] = Node(name, "head", layer, h)
        for port in "qkv":
            n_port = H if port == "q" else kv
            for h in range(n_port):
                dst = head_node(layer, h)
                g.inputs[(dst, port)] = (f"{attn}hook_{port}_input", h)
                g.edges += [Edge(u, dst, "resid", port, layer, dst_head=h) for u in upstream]
        if layer in g.shared_input_layers:
            dst = f"L{layer}.attn_in"
            g.nodes[dst] = Node(dst, "attn_in", layer)
            g.inputs[(dst, "attn_in")] = (f"blocks.{layer}.ln1.hook_normalized", None)
            g.edges += [Edge(u, dst, "resid", "attn_in", layer) for u in upstream]
        # within-layer map edges (head mixing / Compose)
        for (spec_layer, phase), spec in specs.items():
            if spec_layer != layer:
                continue
            g.mixing[(layer, phase)] = spec
            for n, m in spec.pairs:
                g.edges.append(Edge(head_node(layer, n), head_node(layer, m), "mix", phase,
                                    layer, src_head=n, dst_head=m))
        # sub-nodes declared by the catalogue
        for stage, suffix in SUBNODE_STAGES.items():
            if stage not in stages:
                continue
            g.subnodes[(layer, suffix)] = f"{attn}hook_{stage}"
            for h in range(H):
                sub = f"{head_node(layer, h)}.{suffix}"
                g.nodes[sub] = Node(sub, suffix, layer, h)
                g.edges.append(Edge(sub, head_node(layer, h), "sub", suffix, layer, h, h))
        heads = [head_node(layer, h) for h in range(H)]
        for h, name in enumerate(heads):
            g.outputs[name] = (f"{attn}hook_result", h)
        upstream += heads
        if has_mlp:
            name = f"MLP{layer}"
            g.nodes[name] = Node(name, "mlp", layer)
            g.inputs[(name, "in")] = (f"blocks.{layer}.hook_mlp_in", None)
            g.edges += [Edge(u, name, "resid", "in", layer) for u in upstream]
            g.outputs[name] = (f"blocks.{layer}.hook_mlp_out", None)
            upstream.append(name)
    g.nodes["logits"] = Node("logits", "logits", L)
    g.inputs[("logits", "logits")] = (f"blocks.{L - 1}.hook_resid_post", None)
    g.edges += [Edge(u, "logits", "resid", "logits", L) for u in upstream]
    # keep residual edges first (the scorer stacks them), then map and sub-node edges
    g.edges.sort(key=lambda e: e.kind != "resid")
    return g
