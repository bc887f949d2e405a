"""Whether anyone is looking at a HookPoint: the test behind "pay for what you look at".

docs/design.md contract 5: a layer takes its fast path only while none of its map stages is
observed,
and a hook from any client counts. TransformerLens registers through `HookPoint.add_hook` (which
lands in `fwd_hooks` / `bwd_hooks` *and* in torch's own hook dicts); pyvene and plain
`register_forward_hook` callers land only in torch's dicts. Checking torch's dicts therefore sees
those clients; `fwd_hooks` / `bwd_hooks` are checked too for HookPoints built by older
TransformerLens releases that kept their own lists only. nnsight installs no torch hook (it
replaces a module's `forward` with its own controller): the model's forward attaches no-op hooks
to the map stages while an nnsight trace runs (`attnlens.hooked_models.interop`'s
`client_observation`), which this test then sees.
"""

from __future__ import annotations

from torch import nn


def is_observed(point: nn.Module) -> bool:
    """True while any forward, forward-pre, backward or backward-pre hook is on `point`.

    Example:
        >>> from transformer_lens.hook_points import HookPoint
        >>> hp = HookPoint()
        >>> is_observed(hp)
        False
        >>> handle = hp.register_forward_hook(lambda m, i, o: None)   # e.g. pyvene
        >>> is_observed(hp)
        True
    """
    return bool(point._forward_hooks or point._forward_pre_hooks or point._backward_hooks
                or getattr(point, "_backward_pre_hooks", None)
                or getattr(point, "fwd_hooks", None) or getattr(point, "bwd_hooks", None))


def is_edited_forward(point: nn.Module) -> bool:
    """True while a forward hook (of any client) could change the value `point` passes on."""
    return bool(point._forward_hooks or point._forward_pre_hooks
                or getattr(point, "fwd_hooks", None))
