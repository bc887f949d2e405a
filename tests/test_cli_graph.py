"""`attnlens graph`: an attribution graph from the command line, on a checkpoint directory with
transcoders; the viewer JSON and the figure written; clear messages otherwise."""

import json

import pytest
from attribution_models import write_cope_checkpoint
from dashboard_common import ALPHABET

from attnlens.cli import main

from helpers import tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_cope_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-cope")


def test_graph_prints_and_writes(checkpoint, tmp_path, capsys):
    out = tmp_path / "graphs"
    assert main(["graph", str(checkpoint), "the cat sat. the cat", "--target", " ",
                 "--out", str(out), "--slug", "cat", "--no-progress", "--show", "3"]) == 0
    text = capsys.readouterr().out
    assert "tiny-cope: 21 tokens" in text and "logit ' ': p=" in text
    assert "error nodes' share of |direct effects|" in text and "most influential features" in text
    data = json.loads((out / "cat.json").read_text())
    assert data["metadata"]["slug"] == "cat" and data["links"]
    assert json.loads((out / "graph-metadata.json").read_text())["graphs"][0]["slug"] == "cat"
    assert (out / "cat.html").is_file()


def test_graph_explains_what_is_missing(checkpoint, tmp_path):
    bare = tmp_path / "bare"
    tiny_model("mha", tokenizer_alphabet=ALPHABET).save_pretrained(bare)
    with pytest.raises(SystemExit, match="has no transcoders .*attnlens.lab.transcoders train"):
        main(["graph", str(bare), "the cat"])
    attn_only = tmp_path / "attn-only"
    tiny_model("mha", tokenizer_alphabet=ALPHABET, attn_only=True).save_pretrained(attn_only)
    with pytest.raises(SystemExit, match="is attention-only"):
        main(["graph", str(attn_only), "the cat"])
    with pytest.raises(SystemExit, match="give one token"):
        main(["graph", str(checkpoint), "the cat", "--target", "cat", "--no-progress"])
    with pytest.raises(SystemExit, match="attnlens graph: .*graph-metadata"):
        main(["graph", str(checkpoint), "the cat", "--no-progress", "--out", str(tmp_path),
              "--slug", "graph-metadata"])
    with pytest.raises(SystemExit, match="neither a checkpoint directory"):
        main(["graph", str(tmp_path / "nowhere"), "x"])


def test_graph_writes_head_loadings_and_qk_on_request(checkpoint, tmp_path, capsys):
    from attnlens.interp.attribution.export import ATTENTION_KEY

    out = tmp_path / "graphs"
    assert main(["graph", str(checkpoint), "the cat sat. the cat", "--target", " ",
                 "--out", str(out), "--slug", "heads", "--no-progress", "--show", "1",
                 "--qk-heads", "1"]) == 0
    assert "head loadings of" in capsys.readouterr().out
    data = json.loads((out / "heads.json").read_text())
    attention = data[ATTENTION_KEY]
    assert attention["loadings"] and attention["qk"], sorted(attention)
    # without them the extension is absent (circuit-tracer's files stay as they were)
    assert main(["graph", str(checkpoint), "the cat", "--out", str(out), "--slug", "plain",
                 "--no-progress", "--show", "1"]) == 0
    assert ATTENTION_KEY not in json.loads((out / "plain.json").read_text())


@pytest.mark.parametrize("flags, message", [
    (["--head-loadings"], "--head-loadings write into the graph's files: give --out"),
    (["--qk-heads", "2", "--feature-pages", "3"], "--qk-heads and --feature-pages write"),
])
def test_graph_extras_without_out_are_refused_first(checkpoint, flags, message, capsys):
    with pytest.raises(SystemExit):
        main(["graph", str(checkpoint), "the cat", "--no-progress", *flags])
    assert message in capsys.readouterr().err


def test_feature_pages_need_validation_windows(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["graph", str(checkpoint), "the cat", "--no-progress", "--out", str(tmp_path),
              "--feature-pages", "2"])
    assert "needs the validation windows" in capsys.readouterr().err
