"""The shipped transcoders (attnlens.lab.transcoders): each card's metrics are what its eval
command computes from the shipped fp16 weights, and the files are what the card says."""

import json

import pytest
import torch
from tiers import documented_params

from attnlens.interp.sae.transcoder_train import load_transcoders
from attnlens.lab.transcoders import MLP_MODELS, evaluate, transcoder_dir

SHIPPED = [m for m in MLP_MODELS if (transcoder_dir(m) / "card.json").is_file()]


def _close(a, b, path=""):
    """Equal structures, numbers to 2e-4 (4-decimal rounding; float32 sums in another order)."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(a - b) <= 2e-4 + 1e-3 * abs(b), (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.mark.parametrize("name", documented_params(
    "transcoder card", SHIPPED, ids=str, keep=["text-mha-l4mlp"] if "text-mha-l4mlp" in SHIPPED
    else [], size=lambda m: 0))
def test_card_metrics_are_recomputed(name):
    card = json.loads((transcoder_dir(name) / "card.json").read_text())
    _close(evaluate(name), card["metrics"])


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_files_match_their_card(name):
    card = json.loads((transcoder_dir(name) / "card.json").read_text())
    assert card["eval_command"] == f"python -m attnlens.lab.transcoders eval {name}"
    assert card["weights_dtype"] == "float16"
    tcs = load_transcoders(transcoder_dir(name))
    assert sorted(tcs) == [int(k) for k in card["metrics"]["layers"]]
    for layer, tc in tcs.items():
        assert tc.cfg.hook_name == f"blocks.{layer}.ln2.hook_normalized"
        assert tc.cfg.d_sae == card["settings"]["d_sae"]
        assert tc.cfg.activation == card["settings"]["activation"]
        assert tc.W_enc.dtype == torch.float32     # loaded in the config's dtype
    size = (transcoder_dir(name) / "transcoders.safetensors").stat().st_size
    assert size < 8 * 2**20, f"{name}'s transcoders are {size / 2**20:.1f} MiB: ship them small"
