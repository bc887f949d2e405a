"""What every Triton-kernel test module shares: marks, device, NaN-poisoned allocations."""

import pytest
import torch

from kernels import _triton

KERNEL_MARKS = [
    pytest.mark.kernels,
    pytest.mark.skipif(not (_triton.available() and (_triton.interpreting()
                                                     or torch.cuda.is_available())),
                       reason="needs triton with a GPU or TRITON_INTERPRET=1"),
]

DEVICE = "cpu" if _triton.interpreting() else "cuda"


@pytest.fixture(autouse=True)
def nan_empty(monkeypatch):
    """Poison uninitialised float allocations with NaN (as FLA's conftest does), so any output
    element a kernel forgets to write shows up."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))
