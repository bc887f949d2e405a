"""Per-layer transcoders (attnlens.interp.sae.transcoder, attnlens.interp.sae.transcoder_train):
activations, training on a planted dictionary, bit-exact resume, fp16 shipping, metrics and
replacement loss."""

import pytest
import torch

from attnlens.interp.sae.transcoder import Transcoder, TranscoderConfig, mlp_hooks
from attnlens.interp.sae.transcoder_train import (
    _JumpReLU,
    _Step,
    collect_mlp_io,
    load_transcoders,
    replacement_loss,
    save_transcoders,
    train_transcoder,
    transcoder_metrics,
)

from helpers import random_tokens, tiny_model


def planted(n=4096, d=16, m=12, active=2, seed=0):
    """x -> y through a sparse code: y = relu-sparse(x A) B, so a transcoder can fit it."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.zeros(n, m)
    idx = torch.stack([torch.randperm(m, generator=g)[:active] for _ in range(n)])
    codes.scatter_(1, idx, torch.rand(n, active, generator=g) + 0.5)
    x = codes @ torch.randn(m, d, generator=g) / m ** 0.5
    y = codes @ torch.randn(m, d, generator=g)
    return x, y


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="d_sae must be a positive int"):
        TranscoderConfig(d_in=4, d_sae=0, d_out=4)
    with pytest.raises(ValueError, match="activation must be one of"):
        TranscoderConfig(d_in=4, d_sae=8, d_out=4, activation="relu")
    with pytest.raises(ValueError, match="needs 0 < k <= d_sae=8"):
        TranscoderConfig(d_in=4, d_sae=8, d_out=4, activation="topk", k=9)
    with pytest.raises(ValueError, match="k is for activation='topk' only"):
        TranscoderConfig(d_in=4, d_sae=8, d_out=4, k=2)
    cfg = TranscoderConfig(d_in=4, d_sae=8, d_out=4, layer=2)
    assert (cfg.hook_name, cfg.hook_name_out) == mlp_hooks(2) == (
        "blocks.2.ln2.hook_normalized", "blocks.2.hook_mlp_out")
    assert TranscoderConfig.from_dict(cfg.to_dict()) == cfg


def test_activations_and_hooks():
    tc = Transcoder(TranscoderConfig(d_in=6, d_sae=20, d_out=5, activation="topk", k=3), seed=1)
    x = torch.randn(7, 6)
    pre = tc.pre_acts(x)
    f = tc.encode(x)
    assert ((f != 0).sum(-1) <= 3).all()
    top = pre.topk(3, -1)
    torch.testing.assert_close(f.gather(-1, top.indices), top.values.relu())
    _, cache = tc.run_with_cache(x)
    torch.testing.assert_close(cache["hook_sae_recons"], f @ tc.W_dec + tc.b_dec)
    jr = Transcoder(TranscoderConfig(d_in=6, d_sae=20, d_out=5), seed=1)
    with torch.no_grad():
        jr.threshold.copy_(torch.linspace(-1, 1, 20))
    pre = jr.pre_acts(x)
    torch.testing.assert_close(jr.encode(x), pre * (pre > jr.threshold))


def test_jumprelu_straight_through_gradients():
    """d/d threshold of pre * H(pre - t): -(t / eps) per pre within eps/2 of t (rectangle
    kernel); of H: -(1 / eps). d/d pre: H (the jump is not differentiated)."""
    pre = torch.tensor([[0.5, 0.98, 1.02, 2.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64, requires_grad=True)
    out = _JumpReLU.apply(pre, t, 0.1)
    out.sum().backward()
    torch.testing.assert_close(pre.grad, torch.tensor([[0, 0, 1, 1]], dtype=torch.float64))
    torch.testing.assert_close(t.grad, torch.tensor([0, -10, -10, 0], dtype=torch.float64))
    t.grad = None
    _Step.apply(pre, t, 0.1).sum().backward()
    torch.testing.assert_close(t.grad, torch.tensor([0, -10, -10, 0], dtype=torch.float64))


@pytest.mark.parametrize("activation, k, max_l0", [("topk", 4, 4), ("jumprelu", None, 12)])
def test_training_fits_a_planted_dictionary(activation, k, max_l0):
    """2 of 12 planted codes active per row; 96 features (observed: EV 0.98, L0 9 for JumpReLU
    with sparsity 1e-2; its L0 starts near 50)."""
    x, y = planted()
    cfg = TranscoderConfig(d_in=16, d_sae=96, d_out=16, activation=activation, k=k)
    tc, history = train_transcoder(x, y, cfg, steps=400, lr=3e-3, batch_size=256,
                                   sparsity_coefficient=1e-2, log_every=100)
    metrics = transcoder_metrics(tc, x, y)
    assert history.nmse.iloc[-1] < 0.5 * history.nmse.iloc[0]
    assert metrics["explained_variance"] > 0.9, metrics
    assert metrics["l0"] <= max_l0, metrics
    assert list(history.columns) == ["step", "nmse", "l0", "loss"]


def test_resume_is_bit_exact(tmp_path):
    x, y = planted(n=512)
    cfg = TranscoderConfig(d_in=16, d_sae=32, d_out=16, activation="jumprelu")
    kw = dict(steps=30, batch_size=64, log_every=5)
    whole, h_whole = train_transcoder(x, y, cfg, **kw)
    ckpt = tmp_path / "tc.safetensors"
    # a run stopped after 12 steps (checkpoint after every step), then resumed to 30
    _interrupted(x, y, cfg, kw, ckpt, stop_after=12)
    resumed, h_resumed = train_transcoder(x, y, cfg, **kw, checkpoint=ckpt)
    pairs = zip(whole.state_dict().items(), resumed.state_dict().items(), strict=True)
    for (name, a), (_, b) in pairs:
        assert torch.equal(a, b), name
    assert h_whole.equals(h_resumed)
    with pytest.raises(ValueError, match="other settings .*steps"):
        train_transcoder(x, y, cfg, **dict(kw, steps=31), checkpoint=ckpt)


def _interrupted(x, y, cfg, kw, ckpt, stop_after):
    """Train with a checkpoint at every step and stop (as a kill would) after `stop_after`."""
    import attnlens.interp.sae.transcoder_train as tt

    class Stop(Exception):
        pass

    original = tt._save
    calls = []

    def save_then_maybe_stop(path, tc, opt, gen, step, settings, log):
        original(path, tc, opt, gen, step, settings, log)
        calls.append(step)
        if step >= stop_after:
            raise Stop

    tt._save = save_then_maybe_stop
    try:
        with pytest.raises(Stop):
            train_transcoder(x, y, cfg, **kw, checkpoint=ckpt, checkpoint_every_s=-1)
    finally:
        tt._save = original
    assert calls[-1] == stop_after


def test_fp16_shipping_round_trip(tmp_path):
    tcs = {layer: Transcoder(TranscoderConfig(d_in=8, d_sae=16, d_out=8, activation="topk", k=2,
                                              layer=layer), seed=layer) for layer in (0, 1)}
    path = save_transcoders(tcs, tmp_path)
    assert path.name == "transcoders.safetensors"
    back = load_transcoders(tmp_path, dtype=torch.float32)
    for layer, tc in tcs.items():
        assert back[layer].cfg.hook_name_out == tc.cfg.hook_name_out
        for name, value in tc.state_dict().items():
            torch.testing.assert_close(back[layer].state_dict()[name], value.half().float())
    with pytest.raises(FileNotFoundError, match="no transcoders at"):
        load_transcoders(tmp_path / "missing")


def test_metrics_by_hand():
    tc = Transcoder(TranscoderConfig(d_in=2, d_sae=3, d_out=2, activation="topk", k=1))
    with torch.no_grad():
        tc.W_enc.copy_(torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]))
        tc.b_enc.zero_()
        tc.W_dec.copy_(torch.tensor([[1.0, 0], [0, 1.0], [5, 5]]))
        tc.b_dec.zero_()
    x = torch.tensor([[2.0, 0], [0, 3.0]])
    y = torch.tensor([[2.0, 0], [0, 2.0]])
    m = transcoder_metrics(tc, x, y)
    # predictions (2, 0) and (0, 3): SSE 1; SST = 2 * (1 + 1) = 4
    assert m["nmse"] == pytest.approx(0.25) and m["explained_variance"] == pytest.approx(0.75)
    assert m["l0"] == 1 and m["dead_fraction"] == pytest.approx(1 / 3)


def test_collect_and_replacement_loss():
    model = tiny_model("mha", d_mlp=32)
    tokens = random_tokens(model, batch=3, pos=9)
    io = collect_mlp_io(model, tokens, layers=[1], batch_size=2)
    _, cache = model.run_with_cache(tokens)
    d = model.cfg.d_model
    torch.testing.assert_close(io[1][0], cache["blocks.1.ln2.hook_normalized"].reshape(-1, d))
    torch.testing.assert_close(io[1][1], cache["blocks.1.hook_mlp_out"].reshape(-1, d))
    tcs = {layer: Transcoder(TranscoderConfig(d_in=d, d_sae=16, d_out=d, activation="topk", k=2,
                                              layer=layer), seed=layer)
           for layer in range(model.cfg.n_layers)}
    losses = replacement_loss(model, tcs, tokens, batch_size=2)
    assert losses["clean"] == pytest.approx(model(tokens, return_type="loss").item())
    assert set(losses["per_layer"]) == set(range(model.cfg.n_layers))
    # the transcoder really replaces the MLP: one that outputs zeros gives the loss of a zeroed MLP
    with torch.no_grad():
        tcs[0].W_dec.zero_()

    def zero_mlp(act, hook):
        return torch.zeros_like(act)

    with model.hooks(fwd_hooks=[("blocks.0.hook_mlp_out", zero_mlp)]):
        expected = model(tokens, return_type="loss").item()
    assert replacement_loss(model, {0: tcs[0]}, tokens)["per_layer"][0] == pytest.approx(expected)
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        collect_mlp_io(model, tokens, layers=[5])
