"""The sweep's `attribution` analysis (attnlens.interp.sweep.analyses, rows from
attnlens.interp.attribution.prompt_study): sharded over prompts, its prompt-weighted summary
equals the measures on all prompts at once (float64), the head loadings plus the bypass account
for each layer's whole |edge weight| split, and a model without transcoders is named."""

from __future__ import annotations

import pytest
import torch
from attribution_models import write_checkpoint_with_transcoders
from tiers import EXTENDED

from attnlens.interp.attribution.contexts import transcoders_for
from attnlens.interp.attribution.prompt_study import attribution_measures
from attnlens.interp.sweep import run_sweep
from attnlens.interp.tasks.induction import repeated_tokens

from helpers import EXACT, tiny_model

HALF, COUNT = 3, 5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A float64 MHA checkpoint with MLPs and random TopK transcoders beside it."""
    root = tmp_path_factory.mktemp("attr_sweep") / "mha"
    return write_checkpoint_with_transcoders(tiny_model("mha", dtype="float64", d_mlp=64), root)


def _spec(ckpt, **args):
    return {"models": [{"path": str(ckpt), "name": "mha", "dtype": "float64"}],
            "prompts": [{"name": "rep", "task": "induction", "count": COUNT, "seed": 3,
                         "args": {"half_len": HALF}}],
            "analyses": [{"analysis": "attribution", "args": args}], "shard_size": 2}


def test_sharded_summary_equals_all_prompts_at_once(ckpt, tmp_path):
    from attnlens.hooked_models import HookedVariantTransformer

    result = run_sweep(_spec(ckpt, transcoders=str(ckpt / "transcoders")), out=tmp_path,
                       progress=False, png=False)
    merged = result.of("attribution")
    assert merged["shard"].nunique() == 3
    summary = result.of("attribution", summary=True).set_index(["measure", "layer", "head"])
    model = HookedVariantTransformer.from_pretrained(ckpt).to(torch.float64)
    tokens = repeated_tokens(COUNT, HALF, model.cfg.d_vocab, seed=3)
    want = attribution_measures(model, transcoders_for(ckpt), tokens).set_index(
        ["measure", "layer", "head"])
    got = summary.loc[want.index]
    assert (got["n_prompts"] == COUNT).all()
    torch.testing.assert_close(torch.tensor(got["value"].to_numpy(float)),
                               torch.tensor(want["value"].to_numpy(float)), **EXACT)
    shares = want["value"]
    assert shares[("error_share", -1, -1)] + shares[("embedding_share", -1, -1)] + \
        shares[("feature_share", -1, -1)] == pytest.approx(1.0, abs=1e-12)
    heads = shares.xs("head_loading", level="measure")
    assert len(heads) == model.cfg.n_layers * model.cfg.n_heads and heads.max() > 0.01
    # per layer, |heads| + |bypass| >= the |edges| split (= 1): the triangle inequality
    for layer in range(model.cfg.n_layers):
        assert heads.xs(layer, level="layer").sum() + shares[("bypass_share", layer, -1)] \
            >= 1.0 - 1e-12


def test_missing_transcoders_are_named(ckpt, tmp_path):
    with pytest.raises(ValueError, match="sweep shard .*no transcoders"):
        run_sweep(_spec(ckpt, transcoders=str(tmp_path)), out=tmp_path / "out",
                  progress=False, png=False)
    with pytest.raises(ValueError, match="needs transcoders: give args.transcoders"):
        run_sweep(_spec(ckpt), out=tmp_path / "out2", progress=False, png=False)


@EXTENDED   # starts a ray cluster (~20 s); the in-process sweep: the tests above
def test_on_ray_equals_in_process(ckpt, tmp_path):
    """The analysis runs on Ray like the others: the same merged table as in process."""
    import pandas as pd
    import ray

    from attnlens.interp.sweep.ray_backend import LOCAL_OBJECT_STORE

    spec = _spec(ckpt, transcoders=str(ckpt))
    local = run_sweep(spec, out=tmp_path / "local", progress=False, figures=False)
    ray.init(num_cpus=2, object_store_memory=LOCAL_OBJECT_STORE, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    try:
        on_ray = run_sweep(spec, out=tmp_path / "ray", ray="local", workers=2, progress=False,
                           figures=False)
    finally:
        ray.shutdown()
    assert on_ray.ran == local.shards == 3
    pd.testing.assert_frame_equal(local.merged, on_ray.merged)
    pd.testing.assert_frame_equal(local.summary, on_ray.summary)
