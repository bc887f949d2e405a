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


def _hand_the_top_level_name_over() -> None:
    """Imported as the top-level `kernels` (a process started in the repository root has that root
    on sys.path, and this folder is attnlens.kernels' source), this module stands aside: the
    name belongs to Hugging Face's kernel hub, which transformers imports. Its package, found on
    the rest of sys.path, takes the name; without it the import fails as for any missing module.
    """
    import importlib.machinery
    import importlib.util
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent

    def elsewhere(entry: str) -> bool:
        try:
            return Path(entry or ".").resolve() != here
        except OSError:
            return True

    spec = importlib.machinery.PathFinder.find_spec(
        "kernels", [p for p in sys.path if isinstance(p, str) and elsewhere(p)])
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(
            "No module named 'kernels': the folder kernels/ in this repository is "
            "attnlens.kernels (import it by that name), not a top-level package",
            name="kernels")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module   # the import system returns what sys.modules holds
    spec.loader.exec_module(module)


if __name__ == "kernels":
    _hand_the_top_level_name_over()

