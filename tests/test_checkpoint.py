"""save_pretrained / from_pretrained: safetensors + config.json, atomic, clear mismatch errors."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlens.hooked_models import HookedVariantTransformer

from helpers import random_tokens, tiny_model


def test_round_trip(tmp_path):
    model = tiny_model(positional_embedding_type="rotary", tokenizer_alphabet="abc")
    with torch.no_grad():
        model.blocks[0].attn.b_O.add_(0.5)
    model.save_pretrained(tmp_path / "ckpt", card={"task": "demo"})
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == ["card.json", "config.json", "model.safetensors"]
    again = HookedVariantTransformer.from_pretrained(tmp_path / "ckpt")
    tokens = random_tokens(model)
    torch.testing.assert_close(again(tokens), model(tokens), atol=0, rtol=0)
    assert again.card == {"task": "demo"} and again.to_tokens("ab").tolist() == [[0, 1, 2]]
    # Overwriting an existing checkpoint leaves exactly one complete checkpoint behind.
    model.save_pretrained(tmp_path / "ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_mismatch_names_keys_and_shapes(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path / "c")
    state = load_file(str(tmp_path / "c" / "model.safetensors"))
    state["blocks.0.attn.W_Q"] = torch.zeros(4, 32, 7)
    del state["unembed.b_U"]
    state["extra.weight"] = torch.zeros(1)
    save_file(state, str(tmp_path / "c" / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        HookedVariantTransformer.from_pretrained(tmp_path / "c")
    msg = str(err.value)
    assert "unembed.b_U" in msg and "extra.weight" in msg and "blocks.0.attn.W_Q" in msg
    assert "(4, 32, 7)" in msg


def test_missing_files_and_bad_config(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        HookedVariantTransformer.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**tiny_model().cfg.to_dict(), "zz": 1}))
    with pytest.raises(ValueError, match="unknown VariantConfig fields \\['zz'\\]"):
        HookedVariantTransformer.from_pretrained(tmp_path)
