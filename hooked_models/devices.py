"""Device names checked before anything is built or loaded on them.

torch reports an unusable device late and tersely: `model.to("cuda")` on a CPU-only build raises a
bare `AssertionError: Torch not compiled with CUDA enabled` after the weights were built (or
read). `check_device` says up front, as a ValueError naming the value, what is missing.

Example:
    >>> check_device("cpu")
    >>> check_device("cuda")                                   # doctest: +SKIP
    ValueError: device='cuda': CUDA is not available: this torch build has no CUDA ...
"""

from __future__ import annotations

import torch


def check_device(device) -> None:
    """ValueError when tensors cannot live on `device` here (None passes: the default).

    Covers a malformed name, CUDA without a CUDA build or without a visible GPU, a CUDA index
    beyond the GPUs present, and MPS where it is not available.
    """
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"device={device!r} is not a device name ({err}); use 'cpu', 'cuda' "
                         "or 'cuda:N'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA (torch.version.cuda is None; install a CUDA "
                   "build of torch)" if torch.version.cuda is None else
                   "no CUDA GPU is visible (no driver, or CUDA_VISIBLE_DEVICES hides them)")
            raise ValueError(f"device={device!r}: CUDA is not available: {why}; use "
                             "device='cpu'")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device={device!r}: there are {count} CUDA device(s), "
                             f"cuda:0 to cuda:{count - 1}")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device={device!r}: MPS (Apple GPU) is not available here; use "
                             "device='cpu'")
