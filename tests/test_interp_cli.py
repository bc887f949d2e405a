"""`attnlens analyze`: tables, figures and a manifest from a checkpoint directory."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnlens.cli import main
from attnlens.interp.tools.analyze import ANALYSES, run_analyses

from helpers import tiny_model


def test_analyze_cli_writes_tables_and_figures(tmp_path, capsys):
    model = tiny_model("mta", attn_cfg={"query_kernel_size": 2, "key_kernel_size": 3})
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    model.save_pretrained(ckpt)
    code = main(["analyze", str(ckpt), "--analysis", *ANALYSES, "--out", str(out),
                 "--batch", "2", "--half-len", "5"])
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["analyses"] == list(ANALYSES)
    for analysis in ANALYSES:
        files = manifest["files"][analysis]
        assert any(f.endswith(".csv") for f in files)
        assert any(f.endswith(".html") for f in files)
        assert all((out / f).exists() for f in files)
    heads = pd.read_csv(out / "induction" / "heads.csv", index_col=0)
    assert list(heads.index[:2]) == ["L0H0", "L0H1"]
    assert {"previous_token", "induction", "induction_stripe"} <= set(heads.columns)
    summary = pd.read_csv(out / "diversity" / "summary.csv")
    assert {"k90", "baseline_k90"} <= set(summary.columns)
    assert (out / "views" / "kernels.csv").exists()          # MTA: key-query kernels apply
    assert (out / "plotly.min.js").exists()
    assert not list(out.rglob("*/plotly.min.js"))             # one copy, at the top
    if not manifest["png"]:
        assert "kaleido" in " ".join(manifest["notes"]["figures"])


def test_analyze_notes_what_does_not_apply(tmp_path):
    manifest = run_analyses(tiny_model("mha"), ["gating", "views"], tmp_path, batch=2,
                            half_len=4, progress=False)
    assert "no per-head gate" in manifest["notes"]["gating"][0]
    assert "no variant-specific" in manifest["notes"]["views"][0]
    with pytest.raises(ValueError, match="unknown analyses"):
        run_analyses(tiny_model("mha"), ["bogus"], tmp_path)


def test_analyze_draws_every_png_with_one_browser_start(tmp_path, monkeypatch):
    """One drawing child for all figures (a Chromium start per figure cost ~3.5 s each)."""
    from attnlens.interp import plots
    from attnlens.interp.plots import analyses, png

    batches = []

    def write_pngs(jobs, **_):
        batches.append([path for _, path, _, _ in jobs])
        for _, path, _, _ in jobs:
            path.write_bytes(b"png")
        return [path for _, path, _, _ in jobs]

    def write_png(*_, **__):
        raise AssertionError("a figure drawn with a Chromium start of its own")

    for module in (plots, analyses):      # kaleido or not on this machine
        monkeypatch.setattr(module, "kaleido_available", lambda: True)
    monkeypatch.setattr(png, "write_pngs", write_pngs)
    monkeypatch.setattr(png, "write_png", write_png)
    manifest = run_analyses(tiny_model("mha"), ["induction", "diversity"], tmp_path, batch=2,
                            half_len=4, progress=False)
    assert len(batches) == 1 and len(batches[0]) >= 2
    pngs = [f for fs in manifest["files"].values() for f in fs if f.endswith(".png")]
    assert sorted(tmp_path / f for f in pngs) == sorted(batches[0])
    for analysis in ("induction", "diversity"):
        htmls = {f[:-5] for f in manifest["files"][analysis] if f.endswith(".html")}
        assert htmls == {f[:-4] for f in manifest["files"][analysis] if f.endswith(".png")}
