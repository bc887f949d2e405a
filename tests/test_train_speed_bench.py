"""The training-speed benchmark compares like with like: its plain PyTorch baseline has the
variant models' parameter count at every shape (with and without MLPs), and its tiny shapes run.
No speed is asserted (benchmarks report, tests check)."""

import pytest
import torch

from attnlens.benchmarks import train_speed


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("shape", sorted(n for n in train_speed.SHAPES if n != "tiny"))
def test_the_plain_baseline_has_the_mha_models_parameters(shape):
    s = train_speed.SHAPES[shape]
    plain, mha = _params(train_speed.plain_model(s)), _params(train_speed.variant_model("mha", s))
    assert abs(plain - mha) / mha < 0.01, (plain, mha)
    assert bool(train_speed.plain_model(s).mlps) == (not s["attn_only"])


def test_the_deep_shape_is_the_zoos_l4mlp():
    from attnlens.lab.text_recipes import RECIPES, VOCAB_SIZE

    cfg = RECIPES["text-mha-l4mlp"].config(VOCAB_SIZE)
    model = train_speed.variant_model("mha", train_speed.SHAPES["zoo-l4mlp"])
    for key in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "d_vocab",
                "attn_only", "act_fn", "normalization_type"):
        assert getattr(model.cfg, key) == getattr(cfg, key), key


def test_a_tiny_mlp_shape_runs_every_variant(monkeypatch, capsys):
    tiny = {**train_speed.SHAPES["tiny"], "attn_only": False, "d_mlp": 64}
    monkeypatch.setitem(train_speed.SHAPES, "tiny-mlp", tiny)
    torch.manual_seed(0)
    train_speed.main(["--shapes", "tiny-mlp", "--steps", "1", "--modes", "eager"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| tiny-mlp"))
    cells = [c.strip() for c in row.strip("|").split("|")][2:]
    assert len(cells) == 1 + len(train_speed.VARIANTS)
    assert all(float(c.replace(",", "")) > 0 for c in cells)
