"""Sparse autoencoders on any hook of any variant: train (`train_sae`) and splice back
(`run_with_saes`, `saes_spliced`, with or without the error term). See docs/ecosystem.md."""

from attnlens.interp.sae.sae import SAEConfig, SparseAutoencoder
from attnlens.interp.sae.splice import run_with_saes, sae_hook, saes_spliced
from attnlens.interp.sae.train import collect_activations, stop_layer_for, train_sae

__all__ = ["SAEConfig", "SparseAutoencoder", "collect_activations", "run_with_saes", "sae_hook",
           "saes_spliced", "stop_layer_for", "train_sae"]
