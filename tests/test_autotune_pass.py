"""The autotuning pass's record (issue 57 item 4; attnlens.kernels.autotune_pass and
_triton.LazyAutotune): a launch whose key a pass recorded for the GPU's architecture takes that
config alone, a stale record (no longer a candidate) is ignored, the autotuner's cache is named
by the same keys, and a pass merges into the file without touching other architectures. The
pass itself needs a GPU (scripts/gpu_validate.sh runs it); without one it refuses."""

from __future__ import annotations

import json

import pytest
import torch

from attnlens.kernels import _triton, autotune_pass

pytestmark = pytest.mark.skipif(not _triton.available(), reason="needs triton")

TABLE = ((64, 64, 4, 3, 0, 128), (128, 64, 8, 3, 0, 128), (64, 32, 4, 2, 0, 256))
KEY = ["T_BUCKET", "BLOCK_D"]


def _tuner():
    configs, prune = _triton.head_dim_configs(TABLE)
    tuner = _triton.LazyAutotune(lambda: None, configs, KEY, prune=prune, name="fake_kernel")
    _triton.LazyAutotune.instances.remove(tuner)
    return tuner, configs


def _launch():
    nargs = {"Q": torch.zeros(2, dtype=torch.bfloat16), "L": torch.zeros(2)}
    return nargs, {"T_BUCKET": 4096, "BLOCK_D": 64}


def test_the_tuning_key_names_the_key_values_and_dtypes():
    nargs, meta = _launch()
    assert _triton.tuning_key(KEY, nargs, meta) == \
        "T_BUCKET=4096,BLOCK_D=64|torch.bfloat16,torch.float32"
    assert _triton.triton_cache_key(KEY, nargs, meta) == \
        (4096, 64, "torch.bfloat16", "torch.float32")


def test_a_recorded_config_is_taken_alone():
    tuner, configs = _tuner()
    nargs, meta = _launch()
    key = _triton.tuning_key(KEY, nargs, meta)
    tuned = {key: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}}
    (only,) = tuner.choose(configs(), nargs, meta, tuned)
    assert _triton.config_tuple(only) == (128, 64, 8, 3)
    # no record: every candidate for BLOCK_D 64 (the 256-only row too, it covers 64)
    assert len(tuner.choose(configs(), nargs, meta, {})) == 3


def test_a_stale_record_is_ignored():
    tuner, configs = _tuner()
    nargs, meta = _launch()
    key = _triton.tuning_key(KEY, nargs, meta)
    stale = {key: {"BLOCK_M": 256, "BLOCK_N": 256, "num_warps": 8, "num_stages": 5}}
    assert len(tuner.choose(configs(), nargs, meta, stale)) == 3
    wide = dict(meta, BLOCK_D=256)   # a recorded tile that no longer fits this BLOCK_D
    fits_128_only = {_triton.tuning_key(KEY, nargs, wide):
                     {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}}
    kept = tuner.choose(configs(), nargs, wide, fits_128_only)
    assert [_triton.config_tuple(c) for c in kept] == [(64, 32, 4, 2)]


def test_the_autotuners_cache_is_named_by_tuning_keys():
    tuner, configs = _tuner()
    nargs, meta = _launch()
    tuner.choose(configs(), nargs, meta, {})     # what the autotuner calls on a cache miss
    best = configs()[1]

    class FakeAutotuner:
        cache = {_triton.triton_cache_key(KEY, nargs, meta): best}

    tuner._tuned = FakeAutotuner()
    assert tuner.chosen() == {"T_BUCKET=4096,BLOCK_D=64|torch.bfloat16,torch.float32":
                              {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}}


def test_a_pass_merges_one_architecture():
    existing = {"sm_80": {"k": {"a|b": {"BLOCK_M": 64}}}, "_about": {"sm_80": {"date": "x"}}}
    merged = autotune_pass.merge(existing, "sm_90", {"k": {"c|d": {"BLOCK_M": 128}}},
                                 {"date": "2026-12-05"})
    assert merged["sm_80"] == existing["sm_80"] and merged["_about"]["sm_80"] == {"date": "x"}
    assert merged["sm_90"] == {"k": {"c|d": {"BLOCK_M": 128}}}
    again = autotune_pass.merge(merged, "sm_90", {"k": {"e|f": {"BLOCK_M": 32}}}, {})
    assert set(again["sm_90"]["k"]) == {"c|d", "e|f"}
    assert existing == {"sm_80": {"k": {"a|b": {"BLOCK_M": 64}}},
                        "_about": {"sm_80": {"date": "x"}}}   # not changed in place


@pytest.mark.skipif(_triton.on_gpu(), reason="checks the refusal without a GPU")
def test_without_a_gpu_the_pass_refuses_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "tuned.json"
    assert autotune_pass.main(["--out", str(out)]) == 2
    assert not out.exists()
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_shipped_file_if_any_is_well_formed():
    tuned = _triton.load_tuned()
    for arch, kernels in tuned.items():
        if arch == "_about":
            continue
        assert arch.startswith("sm_")
        for entries in kernels.values():
            for key, config in entries.items():
                assert "|" in key
                # HEAD_STAGES: the DCMHA forward's head loops (`fwd_tiles.record_of`)
                assert set(config) - {"HEAD_STAGES"} == {"BLOCK_M", "BLOCK_N", "num_warps",
                                                         "num_stages"}
    json.dumps(tuned)


def test_the_pass_times_both_dcmha_tiles_and_records_the_faster():
    """The DCMHA forward's tiles are chosen on the host (`dcmha.fwd_tiles`): the pass runs
    the forward with each candidate, both tiles with the plain head loops and sm_90's own
    tile with them pipelined (here on the interpreter, which takes sm_90's; 2 lengths), and
    records the fastest in total, in the form `fwd_blocks` and `fwd_head_stages` read back
    for that key."""
    from attnlens.kernels.dcmha import fwd_tiles
    cands = [((64, 64), 1), ((64, 32), 1), ((64, 64), 3)]
    assert fwd_tiles.fwd_candidates("sm_90") == cands
    assert fwd_tiles.fwd_candidates("sm_80") == [((64, 64), 1), ((64, 32), 1)]
    # at T 8, then at T 16: (64, 64) with 3 stages the least in total (1.0 + 1.5)
    times = iter([3.0, 2.0, 1.0, 1.0, 2.5, 1.5])
    ran = []

    def timer(fn):
        ran.append((fn.keywords["tiles"], fn.keywords["head_stages"]))
        if len(ran) <= 3:                    # each candidate runs (once: interpreter time)
            out, lse = fn()
            assert out.shape == (1, 8, 2, 16) and not lse.isnan().any()
        return next(times)

    chosen = autotune_pass.tune_dcmha_tiles([8, 16], [16], [torch.float16], heads=2,
                                                device="cpu", timer=timer)
    assert ran == cands * 2
    key = fwd_tiles.fwd_key(2, 16, torch.float16)
    assert chosen == {fwd_tiles.TUNED_NAME: {key: fwd_tiles.record_of((64, 64), 3)}}
    tuned = chosen[fwd_tiles.TUNED_NAME]
    assert fwd_tiles.fwd_blocks(2, 16, torch.float16, arch="sm_90", tuned=tuned) == (64, 64)
    assert fwd_tiles.fwd_head_stages(2, 16, torch.float16, arch="sm_90", tuned=tuned) == 3
    # a record's stages outside the architecture's candidates fall back to its launch's
    assert fwd_tiles.fwd_head_stages(2, 16, torch.float16, arch="sm_80", tuned=tuned) == 1
    assert fwd_tiles.fwd_head_stages(2, 16, torch.float16, arch="sm_90", tuned={}) == 1
    # and on another tile than the architecture's own (never compile-checked pipelined)
    narrow = {key: fwd_tiles.record_of((64, 32), 3)}
    assert fwd_tiles.fwd_head_stages(2, 16, torch.float16, arch="sm_90", tuned=narrow) == 1
    # or launched on another tile than the record's (a caller's block_m / block_n)
    assert fwd_tiles.fwd_head_stages(2, 16, torch.float16, arch="sm_90", tuned=tuned,
                                     blocks=(64, 64)) == 3
    assert fwd_tiles.fwd_head_stages(2, 16, torch.float16, arch="sm_90", tuned=tuned,
                                     blocks=(32, 64)) == 1
