"""The CPU training path (docs/design.md, contract 5): with nothing observed a layer takes its
fastest exact formulation, and that path equals the hooked, materialising one, gradients included.

Every check runs in float64 against the same model with an identity hook on each map stage
(which forces the materialising path), so the only difference is the formulation.
"""

from __future__ import annotations

import pytest
import torch
from tiers import EXTENDED

from attnlens.hooked_models import HookedVariantTransformer
from attnlens.hooked_models.attention.base import VariantAttention, is_plain_causal
from attnlens.hooked_models.attention.observe import is_observed
from attnlens.training.trainer import TrainConfig, fit

from helpers import EXACT, random_tokens, tiny_cfg

CONFIGS = {
    "mha": dict(positional_embedding_type="rotary"),
    "mta": dict(positional_embedding_type="rotary"),
    "mta-pre-only": dict(positional_embedding_type="rotary",
                         attn_cfg=dict(after_sm_query_kernel_size=None,
                                       after_sm_key_kernel_size=None, head_kernel_size=None)),
    "mta-left-pad": dict(positional_embedding_type="rotary", attn_cfg=dict(pad_key="left")),
    "mta-right-pad-grouped": dict(positional_embedding_type="rotary",
                                  attn_cfg=dict(pad_key="right", key_kernel_size=4,
                                                pre_sm_head_kernel_size=2, head_kernel_size=2)),
    "mta-post-only": dict(positional_embedding_type="rotary",
                          attn_cfg=dict(query_kernel_size=None, pre_sm_head_kernel_size=None,
                                        after_sm_query_kernel_size=3)),
    "cope": dict(positional_embedding_type="none"),
    "cope-clamped-rotary": dict(positional_embedding_type="rotary", attn_cfg=dict(npos_max=5)),
    "cope-sep-keys-paper": dict(positional_embedding_type="none",
                                attn_cfg=dict(sep_keys=True, scaling="paper", npos_max=9)),
    "cope-val-gates-every-2": dict(positional_embedding_type="none",
                                   attn_cfg=dict(val_gates=True, every=2)),
    "dcmha": dict(positional_embedding_type="rotary"),
    "dcmha-window": dict(positional_embedding_type="rotary",
                         attn_cfg=dict(window_size=3, window_type="LG", qk_norm=True)),
    "dcmha-query-wise-static": dict(positional_embedding_type="rotary",
                                    attn_cfg=dict(query_wise=True, static_proj=True, groups=2)),
    "dcmha-static-groups-rank3-window": dict(positional_embedding_type="rotary",
                                             attn_cfg=dict(static_proj=True, groups=2, rank=3,
                                                           window_size=6, window_type="GL")),
    "infini": dict(positional_embedding_type="rotary", attn_cfg=dict(segment_len=4)),
}
# Variants whose layers override `fast_attend` (the others are fast through other means: Infini's
# segment loop, or only through torch.compile's fusion of their map ops).
HAS_FAST_ATTEND = ("mha", "mta", "cope", "dcmha")


def model_for(name: str) -> HookedVariantTransformer:
    variant = name.split("-")[0]
    cfg = tiny_cfg(variant, dtype=torch.float64, n_ctx=16, **CONFIGS[name])
    model = HookedVariantTransformer(cfg)
    if variant == "mta":  # identity kernels read one entry: make every tap and head count
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name_, p in model.named_parameters():
                if "kernel" in name_.split(".")[-1]:
                    p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    if variant == "dcmha":  # the init composes near the identity: make every term count
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name_, p in model.named_parameters():
                if name_.split(".")[-1] in ("dw1", "qkw", "dd", "W_pre_static", "W_post_static"):
                    p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return model


def identity_hooks(model) -> list:
    """An identity forward hook on every map stage of every layer."""
    return [(model.stage_hook_name(layer, s), lambda x, hook: x)
            for layer in range(model.cfg.n_layers) for s in model.stages(layer) if s.is_map]


def loss_and_grads(model, tokens, hooks=(), **kw):
    model.zero_grad(set_to_none=True)
    with model.hooks(fwd_hooks=list(hooks)):
        loss = model(tokens, return_type="loss", **kw)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


def count_fast_calls(monkeypatch) -> list:
    taken = []
    for cls in {type(a) for a in VariantAttention.__subclasses__()} | set(
            VariantAttention.__subclasses__()):
        if "fast_attend" not in cls.__dict__:
            continue
        original = cls.__dict__["fast_attend"]

        def spy(self, *args, _original=original, **kwargs):
            z = _original(self, *args, **kwargs)
            taken.append(z is not None)
            return z

        monkeypatch.setattr(cls, "fast_attend", spy)
    return taken


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_path_equals_hooked_path(name, monkeypatch):
    model = model_for(name)
    tokens = random_tokens(model, batch=3, pos=16)
    taken = count_fast_calls(monkeypatch)
    fast_loss, fast_grads = loss_and_grads(model, tokens)
    n_fast = sum(taken)
    hooked_loss, hooked_grads = loss_and_grads(model, tokens, identity_hooks(model))
    assert sum(taken) == n_fast, "a hooked layer took the fast path"
    if name.split("-")[0] in HAS_FAST_ATTEND:
        assert n_fast == model.cfg.n_layers, "the unobserved forward did not take the fast path"
    torch.testing.assert_close(fast_loss, hooked_loss, **EXACT)
    assert fast_grads.keys() == hooked_grads.keys()
    for n in fast_grads:
        torch.testing.assert_close(fast_grads[n], hooked_grads[n], **EXACT, msg=n)


@pytest.mark.parametrize("name", [n for n in sorted(CONFIGS) if n.startswith("cope")])
def test_cope_fast_path_in_row_blocks(name, monkeypatch):
    """The CoPE path split into blocks of 5 query rows (the zoo shape runs blocks of 32)."""
    from attnlens.hooked_models.attention.cope import ops as _cope_ops

    monkeypatch.setattr(_cope_ops, "FAST_BLOCK_ELEMENTS", 1)
    monkeypatch.setattr(_cope_ops, "MIN_FAST_ROWS", 5)
    test_fast_path_equals_hooked_path(name, monkeypatch)


@pytest.mark.parametrize("name", [n for n in sorted(CONFIGS) if n.startswith("mta")])
def test_mta_fast_path_in_row_blocks(name, monkeypatch):
    """The MTA path in blocks of 5 query rows, fewer than the query kernels' history (the zoo
    shape runs blocks of 32)."""
    from attnlens.hooked_models.attention.mta import ops as _mta_ops

    monkeypatch.setattr(_mta_ops, "FAST_BLOCK_ROWS", 5)
    test_fast_path_equals_hooked_path(name, monkeypatch)


# (c_q, c_k, top, left, right, rows, keys, Mask_0 diagonal of the input, of the output): first
# blocks (top = c_q - 1) and later ones (top = 0), both / one-sided / no key padding, masks on
# either side (None: off) at diagonals inside and beyond the block, 1x1 kernels.
BLOCK_CONV_CASES = [(6, 11, 5, 5, 5, 7, 9, 0, None), (6, 11, 0, 5, 5, 12, 20, 8, None),
                    (6, 11, 0, 5, 5, 12, 20, None, 13), (3, 2, 2, 1, 0, 5, 7, None, None),
                    (2, 4, 1, 0, 3, 4, 3, 1, 1), (4, 3, 3, 2, 0, 2, 5, None, 0),
                    (1, 1, 0, 0, 0, 3, 4, 2, 2)]


@pytest.mark.parametrize("case", BLOCK_CONV_CASES)
def test_mta_block_conv_backward_gradcheck(case):
    """The block convolution with its causal masks folded in, in float64: the forward equals a
    masked, padded aten convolution; gradcheck of the hand-written backward (flipped-kernel map
    gradient, correlation kernel gradient); the kernel gradient equals aten's own depthwise
    convolution backward."""
    from attnlens.hooked_models.attention.mta import block_conv as conv

    c_q, c_k, top, left, right, rows, keys, in_diag, out_diag = case
    g = torch.Generator().manual_seed(sum(case[:7]))
    maps = torch.randn(2, 3, rows, keys, generator=g, dtype=torch.float64, requires_grad=True)
    kernel = torch.randn(3, 1, c_q, c_k, generator=g, dtype=torch.float64, requires_grad=True)
    run = lambda m, w: conv.block_conv(m, w, top, left, right, in_diag, out_diag)  # noqa: E731
    assert torch.autograd.gradcheck(run, (maps, kernel))
    source = maps.detach() if in_diag is None else maps.detach().tril(in_diag)
    padded = torch.nn.functional.pad(source, (left, right, top, 0))
    expected = torch.nn.functional.conv2d(padded, kernel.detach(), groups=3)
    expected = expected if out_diag is None else expected.tril(out_diag)
    torch.testing.assert_close(run(maps, kernel).detach(), expected, **EXACT)
    if in_diag is not None:   # the mask really removes something
        assert not torch.equal(source, maps.detach())
    grad = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    _, expected_w, _ = torch.ops.aten.convolution_backward(
        grad, padded, kernel.detach(), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 3,
        [False, True, False])
    got = conv.depthwise_weight_grad(grad, source, c_q, c_k, top, left, right)
    torch.testing.assert_close(got, expected_w, **EXACT)


@pytest.mark.parametrize("name", [n for n in sorted(CONFIGS) if n.startswith("dcmha")])
def test_dcmha_fast_path_in_row_blocks(name, monkeypatch):
    """The DCMHA path in blocks of 5 query rows, narrower than the window's reach (the zoo
    shape runs blocks of 32)."""
    from attnlens.hooked_models.attention.dcmha import ops as _dcmha_ops

    monkeypatch.setattr(_dcmha_ops, "FAST_BLOCK_ROWS", 5)
    test_fast_path_equals_hooked_path(name, monkeypatch)


def test_cope_declines_relative_logits(monkeypatch):
    model = HookedVariantTransformer(tiny_cfg("cope", dtype=torch.float64, n_ctx=16,
                                              attn_cfg=dict(relative=True)))
    taken = count_fast_calls(monkeypatch)
    with torch.no_grad():
        model(random_tokens(model, batch=2, pos=10))
    assert taken and not any(taken)


@pytest.mark.parametrize("name", ["mha", "mta", "cope", "dcmha"])
def test_padding_and_cache_fall_back_to_the_exact_path(name, monkeypatch):
    """A padding mask or a KV cache is not a plain causal mask: `fast_attend` declines."""
    model = model_for(name)
    taken = count_fast_calls(monkeypatch)
    tokens = random_tokens(model, batch=2, pos=10)
    mask = torch.ones_like(tokens)
    mask[0, :3] = 0
    with torch.no_grad():
        model(tokens, attention_mask=mask)
    assert taken and not any(taken)


def test_plain_causal_mark_only_on_unpadded_uncached_masks():
    model = model_for("mha")
    seen = []
    model.blocks[0].attn.hook_pattern.add_hook(lambda x, hook: x)
    orig = model.blocks[0].attn.forward

    def spy(x, allowed, *args, **kwargs):
        seen.append(is_plain_causal(allowed))
        return orig(x, allowed, *args, **kwargs)

    model.blocks[0].attn.forward = spy
    tokens = random_tokens(model, batch=2, pos=8)
    with torch.no_grad():
        model(tokens)
        model(tokens, attention_mask=torch.ones_like(tokens))
    assert seen == [True, False]


@pytest.mark.parametrize("variant", ["mha", "mta", "cope", "dcmha", "infini"])
def test_module_hooks_of_any_client_count_as_observing(variant):
    """nnsight and pyvene call `register_forward_hook` on the HookPoint directly: the layer
    must then take the materialising path and the hook must see the `[b h q k]` map."""
    model = model_for(variant)
    point = model.blocks[1].attn.hook_pattern
    assert not is_observed(point)
    seen = []
    handle = point.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    try:
        assert is_observed(point)
        with torch.no_grad():
            model(random_tokens(model, batch=2, pos=9))
    finally:
        handle.remove()
    assert seen == [torch.Size([2, model.cfg.n_heads, 9, 9])]
    assert not is_observed(point)


@EXTENDED   # torch.compile's first build is most of its cost; the eager resume: tests above
def test_compiled_training_equals_eager_and_resumes_exactly(tmp_path):
    """`TrainConfig(compile=True)`: torch.compile of the whole model (one graph per block) gives
    the eager losses to float tolerance, and a compiled run stopped mid-way and resumed
    reproduces the uninterrupted compiled run's losses exactly."""
    tokens = torch.randint(0, 50, (64, 16), generator=torch.Generator().manual_seed(1))

    def sample(batch, gen):
        idx = torch.randint(0, len(tokens), (batch,), generator=gen)
        return tokens[idx], None

    def config(compiled):
        return TrainConfig(steps=6, batch_size=4, warmup=1, compile=compiled, progress=False,
                           checkpoint_every=3)

    eager = fit(model_for("mta"), sample, config(False), run_dir=tmp_path / "eager")
    full = fit(model_for("mta"), sample, config(True), run_dir=tmp_path / "full")
    assert len(full) == 6
    torch.testing.assert_close(torch.tensor(full), torch.tensor(eager), atol=1e-9, rtol=0)

    calls = []

    def interrupted(batch, gen):
        calls.append(batch)
        if len(calls) == 5:
            raise KeyboardInterrupt   # stopped during step 5, after the step-3 checkpoint
        return sample(batch, gen)

    with pytest.raises(KeyboardInterrupt):
        fit(model_for("mta"), interrupted, config(True), run_dir=tmp_path / "resumed")
    rest = fit(model_for("mta"), sample, config(True), run_dir=tmp_path / "resumed")
    assert rest == full[3:]
