"""Triton kernels for attnlens, one folder per op (docs/design.md, "pay for what you look at").

Each op folder holds `reference.py` (the op's one plain-torch spec, which the layers' readable
paths and the tests share), `triton_*.py` (the kernels),
`function.py` (an autograd.Function) and the dispatch that decides when the fused path applies:

- `kernels.flash_attention`: fused causal softmax attention returning the row log-sum-exp
  (the "mha" fast path; also key padding, KV-cache offsets and block-diagonal segments).
- `kernels.cope`: fused CoPE (gates, contextual positions, interpolated position logits
  in-kernel; no `[T, T]` tensor in forward or backward), with every official option: separate
  gate keys, value gates, CoPE+rel relative logits (rel_extend too).
- `kernels.infini`: Infini-attention: segment-causal local attention with the gate in the
  kernel epilogue, plus a batched compressive-memory pass.
- `kernels.dispatch`: backend resolution for `cfg.backend` and `patterns_for`, which recomputes
  chosen pattern rows from the saved log-sum-exp.
- `attnlens.benchmarks.kernels`: `python -m attnlens.benchmarks.kernels` prints time / memory /
TFLOP/s tables.

Importing `kernels` does not import triton; the op modules do. Kernels run compiled on CUDA, or
on the CPU interpreter when `TRITON_INTERPRET=1` is set before they are imported.
"""

# The import name `kernels` is also Hugging Face's `kernels` distribution (PyPI). With both
# installed, whichever comes first on sys.path shadows the other: `hooked_models` refuses a
# `kernels` without this marker, and here we warn when Hugging Face's is installed but shadowed.
__attnlens__ = True


def _warn_if_hf_kernels_installed() -> None:
    import importlib.metadata
    import warnings

    try:
        dist = importlib.metadata.distribution("kernels")
    except importlib.metadata.PackageNotFoundError:
        return
    warnings.warn(
        f"the distribution 'kernels' {dist.version} (Hugging Face's kernel hub) is installed "
        f"beside attnlens; both use the import name `kernels`, and `import kernels` gives "
        f"attnlens's ({__file__}), so code that expects Hugging Face's (e.g. transformers' hub "
        f"kernels) breaks. Keep them in separate environments, or `pip uninstall kernels`.",
        stacklevel=3)


_warn_if_hf_kernels_installed()
