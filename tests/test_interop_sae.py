"""Sparse autoencoders on every variant (issue 21 item 2): `attnlens.interp.sae` trains an SAE on a
hook for a few hundred steps, and splices it back with the error term (clean logits kept exactly, in
float64) and without (the model runs on the reconstruction)."""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models import available_variants
from attnlens.interp.sae import (
    SparseAutoencoder,
    collect_activations,
    run_with_saes,
    saes_spliced,
    stop_layer_for,
    train_sae,
)

from helpers import EXACT, random_tokens, tiny_model

VARIANTS = available_variants()
SMALL = {"infini": {"segment_len": 4}}


def perturbed(attention: str):
    model = tiny_model(attention, dtype=torch.float64, attn_cfg=SMALL.get(attention))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("hook, reshape", [("blocks.0.hook_resid_post", "last"),
                                           ("blocks.1.attn.hook_z", "heads")])
def test_training_improves_reconstruction(attention, hook, reshape):
    model = perturbed(attention)
    tokens = random_tokens(model, batch=16, pos=16)
    sae, history = train_sae(model, hook, tokens, d_sae=64, steps=300, reshape=reshape,
                             l1_coefficient=1e-4)
    first, last = history.iloc[0], history.iloc[-1]
    assert list(history.columns) == ["step", "mse", "l1", "l0", "explained_variance"]
    assert last.step == 300 and last.mse < 0.2 * first.mse
    assert last.explained_variance > 0.8, history.tail()
    assert sae.cfg.hook_name == hook and sae.W_enc.dtype == torch.float32
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.ones(64), atol=1e-5, rtol=0)
    # spliced without the error term the model runs on the reconstruction
    clean = model(tokens[:2])
    spliced = run_with_saes(model, tokens[:2], [sae])
    assert 0 < (spliced - clean).abs().max() < (clean.abs().max())


@pytest.mark.parametrize("attention", VARIANTS)
def test_splicing_with_the_error_term_keeps_the_clean_logits_at_every_stage(attention):
    model = perturbed(attention)
    tokens = random_tokens(model, batch=2, pos=9)
    clean, cache = model.run_with_cache(tokens)
    names = [f"blocks.{l}.attn.hook_{s.name}" for l in range(model.cfg.n_layers)
             for s in model.stages(l)] + ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_q"]
    names = [n for n in names if n in cache.cache_dict]
    read_only = {f"blocks.{l}.attn.hook_{s.name}" for l in range(model.cfg.n_layers)
                 for s in model.stages(l) if "read-only" in s.description}
    for name in names:
        act = cache[name]
        sae = SparseAutoencoder(d_in=act.shape[-1], d_sae=16, hook_name=name, seed=0)
        # nobody reads the SAE: the spliced value is the input itself (bit for bit, against a
        # run on the same path: a hook on a map stage makes a layer materialise its maps)
        same_path = model.run_with_hooks(tokens, fwd_hooks=[(name, lambda x, hook: None)])
        assert torch.equal(run_with_saes(model, tokens, [sae], use_error_term=True), same_path)
        # reading its features runs reconstruction + error: clean to float64 rounding
        with sae.hooks(fwd_hooks=[("hook_sae_acts_post", lambda f, hook: None)]):
            if name in read_only:   # Infini's memory records refuse a changed value, even 1 ulp
                try:
                    spliced = run_with_saes(model, tokens, [sae], use_error_term=True)
                except ValueError as err:
                    assert "read-only" in str(err)
                    continue
                torch.testing.assert_close(spliced, clean, **EXACT)
                continue
            torch.testing.assert_close(run_with_saes(model, tokens, [sae], use_error_term=True),
                                       clean, **EXACT, msg=lambda m, n=name: f"{n}: {m}")
        if not torch.isfinite(act).all():   # a masked map: -inf stays where it was
            with saes_spliced(model, [sae]):
                _, spliced = model.run_with_cache(tokens, names_filter=name)
            assert torch.equal(torch.isinf(spliced[name]), torch.isinf(act)), name


def test_feature_edits_move_the_output_by_the_reconstruction_change():
    model = perturbed("dcmha")
    tokens = random_tokens(model, batch=2, pos=8)
    hook = "blocks.0.hook_resid_post"
    sae = SparseAutoencoder(d_in=32, d_sae=24, hook_name=hook, seed=0, dtype=torch.float64)
    with torch.no_grad():
        sae.b_enc.fill_(0.05)   # some features active

    def ablate_3(f, hook):
        f = f.clone()
        f[..., 3] = 0
        return f

    with sae.hooks(fwd_hooks=[("hook_sae_acts_post", ablate_3)]):
        edited = run_with_saes(model, tokens, [sae], use_error_term=True)

    def manual(x, hook):
        f = sae.encode(x)
        return x + (ablate_3(f, None) - f) @ sae.W_dec

    expected = model.run_with_hooks(tokens, fwd_hooks=[(hook, manual)])
    torch.testing.assert_close(edited, expected, **EXACT)
    assert (edited - model(tokens)).abs().max() > 1e-6


def test_activation_collection_and_errors():
    model = perturbed("mta")
    tokens = random_tokens(model, batch=3, pos=5)
    assert stop_layer_for(model, "blocks.0.attn.hook_pattern") == 1
    assert stop_layer_for(model, "hook_embed") == 0
    assert stop_layer_for(model, "ln_final.hook_normalized") is None
    x = collect_activations(model, "blocks.0.attn.hook_attn_scores", tokens, batch_size=2)
    assert x.shape == (3 * 4 * 5, 5) and torch.isfinite(x).all()
    with pytest.raises(ValueError, match="unknown hook name"):
        stop_layer_for(model, "blocks.0.attn.hook_nope")
    with pytest.raises(ValueError, match="d_in=7"):
        run_with_saes(model, tokens, [SparseAutoencoder(7, 4, hook_name="blocks.0.hook_resid_pre")])
    with pytest.raises(ValueError, match="reshape must be"):
        SparseAutoencoder(4, 4, reshape="rows")
    with pytest.raises(ValueError, match="steps must be"):
        train_sae(model, "blocks.0.hook_resid_pre", tokens, d_sae=4, steps=0)
