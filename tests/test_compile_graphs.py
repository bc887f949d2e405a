"""A training step compiles to one graph in every variant (issue 26 item 1: no syncs on the hot
path). `compiled_forward` moves the token range check out of the graph; nothing else in the
forward may read a tensor's value on the host (a graph break, and a device sync on a GPU)."""

import pytest
import torch
import torch._dynamo as dynamo

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig

VARIANTS = {
    "mha": ("rotary", None),
    "mta": ("rotary", None),
    "cope": ("none", None),
    "dcmha": ("rotary", None),
    # segments shorter than the context, so the memory is written and read
    "infini": ("rotary", {"segment_len": 8, "update": "delta"}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_training_forward_is_one_graph(variant):
    positions, attn_cfg = VARIANTS[variant]
    cfg = VariantConfig(d_model=32, d_head=8, n_heads=4, n_layers=2, n_ctx=32, d_vocab=50,
                        attention=variant, attn_only=False, d_mlp=64,
                        positional_embedding_type=positions, attn_cfg=attn_cfg, seed=0)
    model = HookedVariantTransformer(cfg)
    # as attnlens.training.trainer.compiled_forward arranges it
    model._check_tokens = torch.compiler.disable(model._check_tokens)
    tokens = torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(0))
    dynamo.reset()
    try:
        explained = dynamo.explain(model)(tokens, return_type="loss")
    finally:
        dynamo.reset()
    reasons = [str(b.reason).splitlines()[0] + " at " + " <- ".join(
        f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in b.user_stack[-2:])
        for b in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1
