"""`attnlens.interp.variants.infini.memory_source_share` equals the memory's own read weights
(`hook_mem_weights`) in float64, for both update rules, and refuses what it cannot measure."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlens.interp.variants.infini import memory_source_share

from helpers import random_tokens, tiny_model


def _model(update: str):
    model = tiny_model("infini", attn_cfg={"segment_len": 4, "update": update},
                       positional_embedding_type="rotary", dtype="float64")
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.2)
    return model


@pytest.mark.parametrize("update", ["linear", "delta"])
def test_share_is_the_sum_of_the_sources_read_weights(update):
    model = _model(update)
    tokens = random_tokens(model, batch=2, pos=16)
    queries = torch.tensor([[12, 13, 15], [13, 14, 15]])      # the last segment
    sources = torch.tensor([[1, 2], [5, 6]])                    # segments 0 and 1
    table = memory_source_share(model, tokens, queries, sources)
    _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        W = cache[f"blocks.{layer}.attn.hook_mem_weights"].double()    # [b h q k]
        for i in range(2):
            rows = W[i][:, queries[i]][:, :, sources[i]].sum(-1).mean(-1)   # [h]
            got = table[(table.layer == layer) & (table.example == i)].sort_values("head")
            torch.testing.assert_close(torch.tensor(got.share.values), rows,
                                       rtol=1e-10, atol=1e-12)
            if update == "linear":   # nothing erodes: the two shares agree
                torch.testing.assert_close(torch.tensor(got.share_no_erosion.values), rows,
                                           rtol=1e-10, atol=1e-12)
    assert (table.memory_tokens == 12).all() and (table.contrast > 0).all()


def test_streamed_long_input_matches_one_shot():
    """Past n_ctx the q, k come from the stream; within it both agree exactly."""
    model = _model("delta")
    tokens = random_tokens(model, batch=1, pos=20)
    args = (torch.tensor([[17, 18]]), torch.tensor([[2, 9]]))
    one_shot = memory_source_share(model, tokens, *args)
    streamed = memory_source_share(model, tokens, *args, chunk=3)
    model.cfg.n_ctx, n_ctx = 8, model.cfg.n_ctx      # force the streamed path
    try:
        forced = memory_source_share(model, tokens, *args, chunk=3)
    finally:
        model.cfg.n_ctx = n_ctx
    for other in (streamed, forced):
        torch.testing.assert_close(torch.tensor(other.share.values),
                                   torch.tensor(one_shot.share.values), rtol=1e-10, atol=1e-12)


def test_bad_positions_are_refused():
    model = _model("linear")
    tokens = random_tokens(model, batch=1, pos=16)
    with pytest.raises(ValueError, match="earlier 4-token segment"):
        memory_source_share(model, tokens, torch.tensor([[5]]), torch.tensor([[6]]))
    with pytest.raises(ValueError, match=r"positions in \[0, 16\)"):
        memory_source_share(model, tokens, torch.tensor([[16]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="no Infini memory layer"):
        memory_source_share(tiny_model("mha"), tokens, torch.tensor([[9]]), torch.tensor([[1]]))


# -- the diagnosis of the shipped long models (docs/reproduction.md) --------------------------
def test_diagnosis_table_reads_the_csv_as_documented():
    """Reading heads, shares and exact accuracy from a small synthetic CSV."""
    import pandas as pd

    from attnlens.reports.reproduction.infini_diagnosis import diagnosis_table

    rows = []
    for factor, n_mem, shares in ((1, 100, (0.1, 0.5)), (2, 200, (0.05, 0.3))):
        for head, share in enumerate(shares):
            for example, exact in ((0, True), (1, factor == 1)):
                rows.append(dict(model="m-s0", factor=factor, length=10 * factor, depth=0.0,
                                 layer=0, head=head, example=example, share=share,
                                 share_no_erosion=share + 0.01, contrast=9.0 * factor,
                                 memory_tokens=n_mem, gate=0.5, key_tokens=10,
                                 token_accuracy=1.0, exact=exact))
    table = diagnosis_table(pd.DataFrame(rows)).set_index("factor")
    assert table.L0_reader.tolist() == [1, 1]                 # the head reading most at 1x
    assert table.L0_share.tolist() == [0.5, 0.3]
    assert table.exact.tolist() == [1.0, 0.5]
    assert table.L0_contrast.tolist() == [9.0, 18.0] and table.memory_tokens.tolist() == [100, 200]


DIAGNOSIS_CSV = (Path(__file__).resolve().parents[1] / "docs" / "figures" / "reproduction"
                 / "infini-passkey-diagnosis.csv")


@pytest.mark.skipif(not DIAGNOSIS_CSV.is_file(), reason="the diagnosis CSV is not written yet")
def test_the_shipped_diagnosis_csv_recomputes():
    """The committed CSV's 1x rows of seed 0, recomputed on the first 4 prompts of each cell
    (the cells' prompts are drawn in order, so they are the CSV's examples 0-3)."""
    import pandas as pd

    from attnlens.lab.paper.infini_diagnosis import run

    shipped = pd.read_csv(DIAGNOSIS_CSV)
    again = run(["infini-passkey-long-s0"], [1], n=4, progress=False)
    keys = ["model", "factor", "depth", "layer", "head", "example"]
    merged = again.merge(shipped, on=keys, suffixes=("", "_csv"))
    assert len(merged) == len(again) > 0
    for column in ("share", "share_no_erosion", "contrast", "token_accuracy"):
        assert merged[column].to_numpy() == pytest.approx(merged[f"{column}_csv"].to_numpy(),
                                                          rel=1e-5, abs=1e-9), column
    assert (merged.exact == merged.exact_csv).all()
