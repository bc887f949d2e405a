"""Attribution graphs on every variant (Ameisen et al. 2025, "Circuit Tracing"): the local
replacement model with transcoders and frozen effective patterns (`replacement`), exact graphs
and their pruning (`graph`, `prune`), why a head attended where it did (`qk`), top contexts
and feature pages (`contexts`), edges split across heads (`head_loadings`) and the
circuit-tracer / Neuronpedia JSON (`export`). See docs/attribution.md."""

from attnlens.interp.attribution.contexts import (
    feature_activations,
    top_contexts,
    transcoders_for,
    write_feature_pages,
)
from attnlens.interp.attribution.export import graph_to_json, write_graph
from attnlens.interp.attribution.graph import AttributionGraph, attribute
from attnlens.interp.attribution.head_loadings import HeadLoadings, head_loadings, qk_for_top_heads
from attnlens.interp.attribution.prune import PrunedGraph, prune
from attnlens.interp.attribution.qk import (
                                   QKAttribution,
                                   attribute_qk,
                                   cope_position_counts,
                                   pattern_sources,
                                   qk_pairs,
                                   qk_split,
)
from attnlens.interp.attribution.replacement import clean_run, float64_copy, frozen_forward

__all__ = ["AttributionGraph", "HeadLoadings", "PrunedGraph", "QKAttribution", "attribute",
           "attribute_qk", "clean_run", "cope_position_counts", "feature_activations",
           "float64_copy", "frozen_forward", "graph_to_json", "head_loadings", "pattern_sources",
           "prune", "qk_for_top_heads", "qk_pairs", "qk_split", "top_contexts",
           "transcoders_for", "write_feature_pages", "write_graph"]
