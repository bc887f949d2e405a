"""Triton kernels for attnlens, one folder per op (docs/design.md, "pay for what you look at").

Each op folder holds `reference.py` (the op's one plain-torch spec, which the layers' readable
paths and the tests share), `triton_*.py` (the kernels),
`function.py` (an autograd.Function) and the dispatch that decides when the fused path applies:

- `attnlens.kernels.flash_attention`: fused causal softmax attention returning the row log-sum-exp
  (the "mha" fast path; also key padding, KV-cache offsets and block-diagonal segments).
- `attnlens.kernels.cope`: fused CoPE (gates, contextual positions, interpolated position logits
  in-kernel; no `[T, T]` tensor in forward or backward), with every official option: separate
  gate keys, value gates, CoPE+rel relative logits (rel_extend too).
- `attnlens.kernels.infini`: Infini-attention: segment-causal local attention with the gate in the
  kernel epilogue, plus a batched compressive-memory pass.
- `attnlens.kernels.dispatch`: backend resolution for `cfg.backend` and `patterns_for`, which
  recomputes chosen pattern rows from the saved log-sum-exp.
- `attnlens.benchmarks.kernels`: `python -m attnlens.benchmarks.kernels` prints time / memory /
TFLOP/s tables.

Importing `attnlens.kernels` does not import triton; the op modules do. Kernels run compiled on
CUDA, or on the CPU interpreter when `TRITON_INTERPRET=1` is set before they are imported.
"""
