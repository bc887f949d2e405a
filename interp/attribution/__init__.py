"""Attribution graphs on every variant (Ameisen et al. 2025, "Circuit Tracing"): the local
replacement model with transcoders and frozen effective patterns (`replacement`), exact graphs
and their pruning (`graph`, `prune`), why a head attended where it did (`qk`), top contexts
(`contexts`) and the circuit-tracer / Neuronpedia JSON (`export`). See docs/attribution.md."""

from attnlens.interp.attribution.contexts import feature_activations, top_contexts, transcoders_for
from attnlens.interp.attribution.export import graph_to_json, write_graph
from attnlens.interp.attribution.graph import AttributionGraph, attribute
from attnlens.interp.attribution.prune import PrunedGraph, prune
from attnlens.interp.attribution.qk import (
                                   QKAttribution,
                                   attribute_qk,
                                   cope_position_counts,
                                   pattern_sources,
                                   qk_pairs,
)
from attnlens.interp.attribution.replacement import clean_run, float64_copy, frozen_forward

__all__ = ["AttributionGraph", "PrunedGraph", "QKAttribution", "attribute", "attribute_qk",
           "clean_run", "cope_position_counts", "feature_activations", "float64_copy",
           "frozen_forward", "graph_to_json", "pattern_sources", "prune", "qk_pairs",
           "top_contexts", "transcoders_for", "write_graph"]
