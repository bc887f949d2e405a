"""`attnlens convert`: pickled checkpoints become safetensors, through weights_only=True only.

Checks the layouts (one file, shards + index), that tensors arrive bit-identical, that tied
tensors and nested state dicts convert, that a crafted pickle is refused by weights_only (its
payload never runs; the same file does run it under a plain torch.load, so the payload is
live), that nothing half-written is left behind on errors, and that the importers read the
result without ever calling torch.load themselves.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file

from attnlens.cli import main as cli_main
from attnlens.hooked_models.converters.convert import convert_checkpoint


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(4, 3, generator=g).half(),
            "b.bias": torch.randn(5, generator=g, dtype=torch.float64),
            "c.count": torch.arange(6, dtype=torch.int64).reshape(2, 3),
            "d.flag": torch.tensor([True, False])}


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


class Payload:
    """Unpickling this calls pathlib.Path.touch(marker): arbitrary code in a pickle."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def test_single_file_and_directory(tmp_path):
    sd = tensors()
    (tmp_path / "src").mkdir()
    torch.save(sd, tmp_path / "src" / "pytorch_model.bin")
    (tmp_path / "src" / "config.json").write_text('{"model_type": "x"}')
    (tmp_path / "src" / "modeling_x.py").write_text("raise SystemExit")
    out = convert_checkpoint(tmp_path / "src", tmp_path / "dst")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert_same(load_file(out / "model.safetensors"), sd)
    out = convert_checkpoint(tmp_path / "src" / "pytorch_model.bin", tmp_path / "file")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]


def test_shards_with_index_keep_their_grouping(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    sd = tensors(1)
    groups = {"pytorch_model-00001-of-00002.bin": ["a.weight", "d.flag"],
              "pytorch_model-00002-of-00002.bin": ["b.bias", "c.count"]}
    for file, keys in groups.items():
        torch.save({k: sd[k] for k in keys}, src / file)
    weight_map = {k: f for f, ks in groups.items() for k in ks}
    (src / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert cli_main(["convert", str(src), str(tmp_path / "dst")]) == 0
    dst = tmp_path / "dst"
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"a.weight": "model-00001-of-00002.safetensors",
                                   "d.flag": "model-00001-of-00002.safetensors",
                                   "b.bias": "model-00002-of-00002.safetensors",
                                   "c.count": "model-00002-of-00002.safetensors"}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size()
                                                  for t in sd.values())
    got = {}
    for f in sorted(set(index["weight_map"].values())):
        got |= load_file(dst / f)
    assert_same(got, sd)


def test_tied_and_nested_state_dicts(tmp_path):
    emb = torch.randn(7, 4)
    torch.save({"state_dict": {"embed.weight": emb, "lm_head.weight": emb,
                               "half": emb[:3]}}, tmp_path / "tied.pt")
    out = convert_checkpoint(tmp_path / "tied.pt", tmp_path / "dst")
    got = load_file(out / "model.safetensors")
    assert torch.equal(got["embed.weight"], emb) and torch.equal(got["lm_head.weight"], emb)
    assert torch.equal(got["half"], emb[:3])


def test_malicious_pickle_is_refused_and_its_payload_never_runs(tmp_path):
    marker = tmp_path / "payload-ran"
    torch.save({"w": torch.zeros(2), "evil": Payload(marker)}, tmp_path / "evil.bin")
    with pytest.raises(ValueError, match=r"evil.bin was refused by torch.load\(weights_only"):
        convert_checkpoint(tmp_path / "evil.bin", tmp_path / "dst")
    assert not marker.exists() and not (tmp_path / "dst").exists()
    assert [p.name for p in tmp_path.iterdir() if "attnlens-convert" in p.name] == []
    torch.load(tmp_path / "evil.bin", weights_only=False)   # the unsafe load runs the payload
    assert marker.exists()


def test_bad_inputs_are_named(tmp_path, capsys):
    torch.save([torch.zeros(2)], tmp_path / "list.bin")
    with pytest.raises(ValueError, match="holds a list, not a state dict"):
        convert_checkpoint(tmp_path / "list.bin", tmp_path / "o1")
    torch.save({"a": torch.zeros(1), "n": 3}, tmp_path / "mixed.bin")
    with pytest.raises(ValueError, match=r"entries \['n'\] are not named tensors"):
        convert_checkpoint(tmp_path / "mixed.bin", tmp_path / "o2")
    (tmp_path / "junk.bin").write_bytes(b"definitely not a pickle")
    with pytest.raises(ValueError, match="junk.bin was refused"):
        convert_checkpoint(tmp_path / "junk.bin", tmp_path / "o3")
    with pytest.raises(ValueError, match="does not exist"):
        convert_checkpoint(tmp_path / "absent", tmp_path / "o4")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    torch.save({"a": torch.zeros(1)}, tmp_path / "ok.bin")
    with pytest.raises(ValueError, match="not an empty directory"):
        convert_checkpoint(tmp_path / "ok.bin", taken)
    assert (taken / "keep.txt").read_text() == "mine"
    assert cli_main(["convert", str(tmp_path / "list.bin"), str(tmp_path / "o5")]) == 2
    assert "attnlens convert: error:" in capsys.readouterr().err


def test_index_disagreeing_with_its_shards_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"a": torch.zeros(1)}, src / "one.bin")
    torch.save({"b": torch.ones(1)}, src / "two.bin")
    (src / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"a": "two.bin", "b": "one.bin"}}))
    with pytest.raises(ValueError, match=r"one.bin holds tensors \['a'\] that its index"):
        convert_checkpoint(src, tmp_path / "dst")
    (src / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"a": "one.bin", "b": "two.bin", "c": "two.bin"}}))
    with pytest.raises(ValueError, match=r"lists tensors \['c'\] that no file holds"):
        convert_checkpoint(src, tmp_path / "dst")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_importers_never_call_torch_load(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from attnlens.hooked_models.converters.llama import from_llama

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=24,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      max_position_embeddings=16)
    hf = transformers.LlamaForCausalLM(config).eval()
    src = tmp_path / "pickled"
    config.save_pretrained(src)
    torch.save(hf.state_dict(), src / "pytorch_model.bin")
    assert cli_main(["convert", str(src), str(tmp_path / "st")]) == 0

    def no_unpickling(*args, **kwargs):
        raise AssertionError("an importer called torch.load")

    monkeypatch.setattr(torch, "load", no_unpickling)
    model = from_llama(tmp_path / "st")
    tokens = torch.arange(10)[None]
    torch.testing.assert_close(model(tokens), from_llama(hf)(tokens), atol=0, rtol=0)
