"""`attnlens sweep --ray` on a local 2-CPU Ray cluster: the same merged table as in-process.

Ray is installed by the `test` extra (attnlens[ray]); this file does not skip without it. One
cluster serves the module (object store 200 MB, no dashboard); `run_sweep` uses it as it finds
it and leaves it running.
"""

from __future__ import annotations

import pandas as pd
import pytest
import ray
from tiers import EXTENDED

from attnlens.interp.sweep import run_sweep
from attnlens.interp.sweep.ray_backend import LOCAL_OBJECT_STORE, run_ray

from helpers import tiny_model

# a local ray cluster (~20 s to start) per file: the in-process sweeps these equal run in make
# test (tests/test_sweep*.py), these in make test-extended
pytestmark = EXTENDED


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, object_store_memory=LOCAL_OBJECT_STORE, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_ckpts")
    tiny_model("mha", dtype="float64").save_pretrained(root / "mha")
    tiny_model("mta", dtype="float64").save_pretrained(root / "mta")
    return {"models": [str(root / "mha"), str(root / "mta")],
            "prompts": [{"name": "rep", "task": "induction", "count": 10, "seed": 1,
                         "args": {"half_len": 6}},
                        {"task": "flip_flop", "count": 4, "args": {"n_instructions": 6}}],
            "analyses": ["heads", "gates", {"analysis": "composition", "args": {"n_baseline": 4}}],
            "shard_size": 4}


def test_ray_sweep_equals_in_process(cluster, spec, tmp_path):
    local = run_sweep(spec, out=tmp_path / "local", progress=False, figures=False)
    on_ray = run_sweep(spec, out=tmp_path / "ray", ray="local", workers=2, progress=False,
                       figures=False)
    # models x (prompt analyses x (3 + 1) shards + 1 composition shard)
    assert on_ray.ran == on_ray.shards == local.shards == 2 * (2 * (3 + 1) + 1)
    pd.testing.assert_frame_equal(local.merged, on_ray.merged)        # exact, not approximate
    pd.testing.assert_frame_equal(local.summary, on_ray.summary)
    assert len(on_ray.model_loads) == 2 and all(1 <= n <= 2 for n in on_ray.model_loads)
    again = run_sweep(spec, out=tmp_path / "ray", progress=False, figures=False)
    assert (again.ran, again.skipped) == (0, on_ray.shards)          # a Ray run resumes locally
    assert ray.is_initialized()                                       # the cluster is not ours


def test_ray_shard_errors_reach_the_driver_as_value_errors(cluster, spec, tmp_path):
    bad = {**spec, "analyses": [{"analysis": "heads", "args": {"stage": "nosuch"}}]}
    with pytest.raises(ValueError, match="sweep shard .*nosuch"):
        run_sweep(bad, out=tmp_path, ray="local", workers=1, progress=False)
    with pytest.raises(ValueError, match="workers"):
        list(run_ray([{"key": "k", "device": "cpu"}], workers=0))


def test_ray_circuit_analysis_equals_in_process(cluster, spec, tmp_path):
    small = {**spec, "models": spec["models"][:1], "prompts": spec["prompts"][:1],
             "analyses": [{"analysis": "circuit", "args": {"steps": 2}}]}
    local = run_sweep(small, out=tmp_path / "local", progress=False, figures=False)
    on_ray = run_sweep(small, out=tmp_path / "ray", ray="local", workers=2, progress=False,
                       figures=False)
    assert on_ray.ran == local.shards == 3
    pd.testing.assert_frame_equal(local.merged, on_ray.merged)
    pd.testing.assert_frame_equal(local.summary, on_ray.summary)
