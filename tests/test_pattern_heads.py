"""Head-selective `hook_pattern` (`pattern_heads=`): one head's pattern on the fused path costs one
head's map, recomputed exactly from the kernel's log-sum-exp (docs/design.md contract 5;
TransformerLens issue 378).

- float64: the fused path with each kernel replaced by its float64 reference (the kernels have no
  float64; the reference returns the same `(z, lse)`), so dispatch, the saved state, the blocked
  recomputation, the hook and an edit are checked exactly against the hooked torch path;
- float32: the real kernels on the Triton CPU interpreter (TRITON_INTERPRET=1, set by conftest);
- memory: every tensor created during a forward with one head asked is at most that head's map,
  while the materialising path builds the layer's `[H, T, T]`.
"""

import pytest
import torch
from tiers import extended_cases
from torch.utils._python_dispatch import TorchDispatchMode

from attnlens.kernels import _triton

from helpers import EXACT, random_tokens, tiny_model
from kernel_common import DEVICE, spy

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.skipif(not (_triton.available() and (_triton.interpreting()
                                                     or torch.cuda.is_available())),
                       reason="needs triton with a GPU or TRITON_INTERPRET=1"),
]

FUSED = ["mha", "mta", "cope", "dcmha"]          # variants whose fused path keeps an lse state
SMALL = dict(positional_embedding_type="rotary", device=DEVICE)
PATTERN = "blocks.{}.attn.hook_pattern"


def pair(variant, dtype=torch.float32, **cfg):
    """(backend "triton" model, backend "torch" model) with the same weights."""
    fused = tiny_model(variant, backend="triton", dtype=dtype, **SMALL, **cfg)
    ref = tiny_model(variant, backend="torch", dtype=dtype, **SMALL, **cfg)
    ref.load_state_dict(fused.state_dict())
    return fused, ref


@pytest.fixture
def float64_kernels(monkeypatch):
    """Each fused op's kernel replaced by its float64 reference, float64 admitted by dispatch."""
    import attnlens.kernels.cope.dispatch as cd
    import attnlens.kernels.dcmha.dispatch as dd
    import attnlens.kernels.flash_attention.dispatch as fd
    import attnlens.kernels.mta.dispatch as md
    from attnlens.kernels.cope.reference import cope_attention_reference
    from attnlens.kernels.dcmha.reference import dcmha_attention_reference
    from attnlens.kernels.flash_attention.reference import attention_reference
    from attnlens.kernels.mta.reference import mta_attention_reference

    monkeypatch.setattr(_triton, "can_run", lambda t: True)
    log = []
    for module, name, ref in [(fd, "flash_attention", attention_reference),
                              (md, "mta_attention", mta_attention_reference),
                              (cd, "cope_attention", cope_attention_reference),
                              (dd, "dcmha_attention", dcmha_attention_reference)]:
        monkeypatch.setattr(module, "SUPPORTED_DTYPES", (*module.SUPPORTED_DTYPES, torch.float64))
        monkeypatch.setattr(module, name, ref)
        spy(monkeypatch, module, name, log, "fused")
    return log


def attends(monkeypatch, model):
    """Log of `model`'s layers that took the materialising `attend` (other models' calls are
    logged as None and left out when the log is read through `taken`)."""
    mine = {id(block.attn) for block in model.blocks}
    cls = type(model.blocks[0].attn)       # infini decides inside `attend` whether to materialise
    method = "_attend_materialised" if model.cfg.attention == "infini" else "attend"
    return spy(monkeypatch, cls, method, [],
               lambda self, *a, **kw: self.layer if id(self) in mine else None)


def taken(log):
    return [entry for entry in log if entry is not None]


@pytest.mark.parametrize("variant", FUSED)
def test_float64_one_head_is_exactly_the_torch_pattern_on_the_fused_path(
        variant, float64_kernels, monkeypatch):
    fused, ref = pair(variant, torch.float64)
    tokens = random_tokens(fused, batch=2, pos=12)
    materialised = attends(monkeypatch, fused)
    logits, cache = fused.run_with_cache(tokens, names_filter=PATTERN.format(1),
                                         pattern_heads={1: [3, 1]})
    assert taken(materialised) == [] and len(float64_kernels) == 2      # both layers fused
    want_logits, want = ref.run_with_cache(tokens, names_filter=PATTERN.format(1))
    assert cache["pattern", 1].shape == (2, 2, 12, 12)
    torch.testing.assert_close(cache["pattern", 1], want["pattern", 1][:, [3, 1]], **EXACT)
    torch.testing.assert_close(logits, want_logits, **EXACT)


@pytest.mark.parametrize("variant", FUSED)
def test_float64_editing_one_head_on_the_fused_path_is_the_torch_edit(
        variant, float64_kernels, monkeypatch):
    fused, ref = pair(variant, torch.float64)
    tokens = random_tokens(fused, batch=2, pos=10, seed=1)

    def halve_in_place(pattern, hook):          # a TransformerLens-style in-place edit
        pattern[:, 0] *= 0.5

    def halve_head_2(pattern, hook):            # the same edit on the full map
        pattern = pattern.clone()
        pattern[:, 2] *= 0.5
        return pattern

    materialised = attends(monkeypatch, fused)
    with torch.no_grad():
        got = fused.run_with_hooks(tokens, fwd_hooks=[(PATTERN.format(0), halve_in_place)],
                                   pattern_heads={0: 2})
        want = ref.run_with_hooks(tokens, fwd_hooks=[(PATTERN.format(0), halve_head_2)])
        plain = ref(tokens)
    assert taken(materialised) == []
    torch.testing.assert_close(got, want, **EXACT)
    assert (got - plain).abs().max() > 1e-3            # the edit did something


def test_editing_on_the_fused_path_with_gradients_on_raises(float64_kernels):
    fused, _ = pair("mha", torch.float64)
    tokens = random_tokens(fused, batch=1, pos=6)
    with pytest.raises(ValueError, match="gradients are on"):
        fused.run_with_hooks(tokens, fwd_hooks=[(PATTERN.format(0), lambda p, hook: p * 0)],
                             pattern_heads={0: [1]})


def test_reading_keeps_the_kernel_output_and_its_gradients(float64_kernels):
    fused, ref = pair("mha", torch.float64)
    tokens = random_tokens(fused, batch=1, pos=8)
    seen = []
    fused.add_hook(PATTERN.format(1), lambda p, hook: seen.append(p.shape))
    loss = fused(tokens, return_type="loss", pattern_heads={1: [0]})
    loss.backward()
    ref(tokens, return_type="loss").backward()
    assert seen == [(1, 1, 8, 8)]
    for (name, p), (_, p_ref) in zip(fused.named_parameters(), ref.named_parameters(),
                                     strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, **EXACT, msg=name)


# MTA's one head in float64 on the fused path: the tests above
@pytest.mark.parametrize("variant", extended_cases([*FUSED, "infini"], ["mta"]))
def test_float32_kernels_one_head_matches_the_torch_pattern(variant, monkeypatch):
    fused, ref = pair(variant)
    tokens = random_tokens(fused, batch=2, pos=12)
    materialised = attends(monkeypatch, fused)
    logits, cache = fused.run_with_cache(tokens, names_filter=PATTERN.format(1),
                                         pattern_heads={1: [2]})
    want_logits, want = ref.run_with_cache(tokens, names_filter=PATTERN.format(1))
    # infini's fused path is its segment pass (no lse state): it materialises, then slices
    assert taken(materialised) == ([1] if variant == "infini" else [])
    torch.testing.assert_close(cache["pattern", 1], want["pattern", 1][:, [2]], atol=1e-6,
                               rtol=1e-5)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-5)


class Allocations(TorchDispatchMode):
    """Records the bytes of the largest tensor any torch op allocates (views of an input are
    not allocations), and the most elements of a map-shaped one (last two dims `[n, n]`)."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.largest, self.largest_map = n, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves(
            (args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.largest = max(self.largest, t.numel() * t.element_size())
                if t.shape[-2:] == (self.n, self.n):
                    self.largest_map = max(self.largest_map, t.numel())
        return out


@pytest.mark.parametrize("variant", FUSED)
def test_only_the_asked_heads_maps_are_materialised(variant, monkeypatch):
    import attnlens.kernels.dispatch as dispatch

    # T = 40 > n_heads * d_head = 32, so that a copy of q or k is smaller than one head's map
    T, asked = 40, [1]
    model = tiny_model(variant, backend="triton", n_layers=1, n_ctx=T, **SMALL)
    n_heads = model.cfg.n_heads
    tokens = random_tokens(model, batch=1, pos=T)
    recompute = Allocations(T)

    def head_maps_watched(*args, **kwargs):       # the hook's own work: rebuild asked maps
        with recompute:
            return head_maps(*args, **kwargs)

    head_maps = dispatch.head_maps
    monkeypatch.setattr(dispatch, "head_maps", head_maps_watched)
    shapes = []
    model.add_hook(PATTERN.format(0), lambda p, hook: shapes.append(tuple(p.shape)))
    with torch.no_grad(), Allocations(T) as fused:
        model(tokens, pattern_heads={0: asked})
    with torch.no_grad(), Allocations(T) as materialised:
        model(tokens)                                 # the same hook on every head
    assert shapes == [(1, 1, T, T), (1, n_heads, T, T)]
    # the forward's only [T, T] maps are the asked head's; the materialising path builds [H, T, T]
    assert fused.largest_map == len(asked) * T * T < n_heads * T * T <= materialised.largest_map
    # recomputing it: DCMHA's all-heads row blocks (Compose mixes heads) stay within one head's
    # map; MTA recomputes a row from a band of every head's rows, c_q + c_q' - 1 of them plus
    # c_q - 1 of convolution padding, over T + c_k - 1 padded keys: O(T), not a [T, T] map
    bound = len(asked) * T * T * 4
    if variant == "mta":
        o = model.cfg.attn_cfg
        rows = o.query_kernel_size + o.after_sm_query_kernel_size - 1 + o.query_kernel_size - 1
        bound = max(bound, n_heads * rows * (T + o.key_kernel_size - 1) * 4)
    assert 0 < recompute.largest <= bound < n_heads * T * T * 4


@pytest.mark.parametrize("variant", ["mha", "infini"])
def test_torch_backend_hook_sees_the_asked_heads_and_its_edit_lands(variant):
    model = tiny_model(variant, backend="torch", dtype=torch.float64)
    tokens = random_tokens(model, batch=2, pos=8)

    def zero(pattern, hook):
        assert pattern.shape == (2, 1, 8, 8)
        pattern.zero_()

    def zero_head_3(pattern, hook):
        pattern[:, 3] = 0

    got = model.run_with_hooks(tokens, fwd_hooks=[(PATTERN.format(1), zero)],
                               pattern_heads={-1: 3})
    want = model.run_with_hooks(tokens, fwd_hooks=[(PATTERN.format(1), zero_head_3)])
    torch.testing.assert_close(got, want, **EXACT)
    assert model.blocks[1].attn.hook_pattern.heads is None      # reset after the forward


def test_heads_for_every_layer_and_no_hook_means_no_cost(monkeypatch):
    model = tiny_model("mha", backend="torch", dtype=torch.float64)
    tokens = random_tokens(model, batch=1, pos=5)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"),
                                    pattern_heads=[0, 2])
    assert [cache["pattern", layer].shape for layer in range(2)] == [(1, 2, 5, 5)] * 2
    torch.testing.assert_close(model(tokens, pattern_heads=1), model(tokens), **EXACT)


@pytest.mark.parametrize("pattern_heads, match", [
    ({2: [0]}, r"layer 2 is not an int in \[-2, 2\)"),
    ({0: [4]}, r"head 4 is not an int in \[0, 4\)"),
    ({0: [1, 1]}, "repeat"),
    ({0: []}, "non-empty"),
    ({"0": [1]}, "layer '0'"),
    ({0: "1"}, "must be a head index"),
    (True, "head True is not an int"),
])
def test_bad_pattern_heads_raise_before_any_layer_runs(pattern_heads, match, monkeypatch):
    model = tiny_model("mha", backend="torch")
    ran = attends(monkeypatch, model)
    with pytest.raises(ValueError, match=match):
        model.run_with_cache(random_tokens(model, batch=1, pos=4), pattern_heads=pattern_heads)
    assert taken(ran) == []
