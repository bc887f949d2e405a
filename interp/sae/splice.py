"""Splice SAEs into a model's forward: replace a hook's value by its reconstruction.

Without the error term the model runs on the SAE's reconstruction. With it, the hook passes on
`reconstruction + (x - clean reconstruction)`, as SAELens's `use_error_term=True`: an edit of
the SAE's features (a hook on `sae.hook_sae_acts_post`) moves the output by exactly the change
in the reconstruction, and the clean output is kept (to float rounding; exactly when no hook is
on the SAE, since the value passed on is then the input itself). Infini-attention's read-only
memory records (`hook_memory`, `hook_memory_z`) refuse a spliced value that differs at all.

Example:
    >>> logits = run_with_saes(model, tokens, [sae], use_error_term=True)    # doctest: +SKIP
    >>> with saes_spliced(model, [sae]):                                     # doctest: +SKIP
    ...     logits, cache = model.run_with_cache(tokens)   # cache holds the spliced values
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from attnlens.interp.sae.sae import SparseAutoencoder


def sae_hook(sae: SparseAutoencoder, use_error_term: bool = False):
    """A TransformerLens forward hook `(act, hook) -> act'` splicing `sae` in."""

    def hook(act: Tensor, hook=None) -> Tensor:
        x = sae.flatten(act)
        if use_error_term and not _listened(sae):
            # Nobody reads or edits the SAE: reconstruction + error is the input itself.
            return act
        finite = torch.isfinite(x)
        x_in = torch.where(finite, x, torch.zeros_like(x))   # masked map entries are not data
        sae_in = x_in.to(sae.W_enc.dtype)
        recon = sae(sae_in).to(x.dtype)
        if use_error_term:   # in the model's dtype: clean output kept to its rounding
            clean = sae.clean_reconstruction(sae_in).to(x.dtype)
            recon = recon + sae.hook_sae_error(x_in - clean)
        out = sae.hook_sae_output(torch.where(finite, recon, x))   # keep -inf where it was
        return sae.unflatten(out, act)

    return hook


def _listened(sae: SparseAutoencoder) -> bool:
    return any(hp._forward_hooks or hp._forward_pre_hooks or hp.fwd_hooks
               for hp in sae.hook_dict.values())


def _check(model, saes) -> list[SparseAutoencoder]:
    saes = list(saes)
    for sae in saes:
        if not isinstance(sae, SparseAutoencoder):
            raise ValueError(f"expected SparseAutoencoder objects, got {type(sae).__name__}")
        if sae.cfg.hook_name not in model.hook_dict:
            raise ValueError(f"SAE hook {sae.cfg.hook_name!r} is not a hook of this model")
    return saes


@contextlib.contextmanager
def saes_spliced(model, saes, use_error_term: bool = False):
    """Within: every SAE in `saes` replaces its `cfg.hook_name` (hooks removed on exit)."""
    saes = _check(model, saes)
    hooks = [(sae.cfg.hook_name, sae_hook(sae, use_error_term)) for sae in saes]
    with model.hooks(fwd_hooks=hooks):
        yield model


def run_with_saes(model, input, saes, use_error_term: bool = False, **forward_kwargs):
    """`model(input, **forward_kwargs)` with `saes` spliced in."""
    with saes_spliced(model, saes, use_error_term):
        return model(input, **forward_kwargs)


__all__ = ["run_with_saes", "sae_hook", "saes_spliced"]
