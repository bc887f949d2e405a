"""General analyses that work on every variant: head detectors and ablations (`heads`), attention
maps to explore (`explore`, `layer_stages`), stage-to-stage change, score spread, head diversity,
gating, outputs and logit attribution, induction studies, text-model metrics, and the scripted
runner (`analyze`)."""
