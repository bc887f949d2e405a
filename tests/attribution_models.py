"""Small float64 models of every variant with random transcoders, for the attribution tests.

Every variant's own machinery is switched on and moved off its (often identity) init: MTA with
both convolutions, both head mixings, group norm and gate; CoPE; DCMHA's Compose; Infini with
segments of 4 tokens so the memory carries the prompt (both update rules); MHA with rotary and
with learned positions, and grouped-query attention.
"""

from __future__ import annotations

import torch

from attnlens.interp.sae.transcoder import Transcoder, TranscoderConfig

from helpers import tiny_model

MTA_SMALL = dict(query_kernel_size=2, key_kernel_size=3, after_sm_query_kernel_size=2,
                 after_sm_key_kernel_size=3, pre_sm_head_kernel_size=2, head_kernel_size="all",
                 mta_layers="all", group_norm=True, add_gating=True)

CASES = {
    "mha-rotary": dict(attention="mha", positional_embedding_type="rotary", rotary_dim=8),
    "mha-standard-gqa": dict(attention="mha", n_key_value_heads=2),
    "mta": dict(attention="mta", attn_cfg=MTA_SMALL),
    "cope": dict(attention="cope"),
    "dcmha": dict(attention="dcmha"),
    "infini-linear": dict(attention="infini", attn_cfg=dict(segment_len=4)),
    "infini-delta": dict(attention="infini", attn_cfg=dict(segment_len=4, update="delta")),
}
def write_cope_checkpoint(directory):
    """A tiny CoPE checkpoint (character tokenizer, MLPs) with random TopK transcoders in
    `directory/transcoders`, as `attnlens graph` reads one; returns `directory`."""
    from dashboard_common import ALPHABET

    model = tiny_model("cope", tokenizer_alphabet=ALPHABET, n_ctx=48, d_mlp=64)
    return write_checkpoint_with_transcoders(model, directory)


def write_checkpoint_with_transcoders(model, directory):
    """`model` saved in `directory` with random TopK transcoders (one per layer, 32 features,
    k 3) in `directory/transcoders`, as `attnlens graph` and the sweep read them; returns
    `directory`."""
    from attnlens.interp.sae.transcoder_train import save_transcoders

    model.save_pretrained(directory)
    d = model.cfg.d_model
    save_transcoders({layer: Transcoder(TranscoderConfig(d_in=d, d_sae=32, d_out=d,
                                                         activation="topk", k=3, layer=layer),
                                        seed=layer) for layer in range(model.cfg.n_layers)},
                     directory / "transcoders")
    return directory


PROMPT_TOKENS = [3, 17, 5, 3, 17, 9, 3, 17, 5, 41, 3]


def model_and_transcoders(case: str, d_sae: int = 48, k: int = 4, activation: str = "topk"):
    model = tiny_model(dtype=torch.float64, d_mlp=64, **CASES[case])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".attn." in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    d = model.cfg.d_model
    transcoders = {}
    for layer in range(model.cfg.n_layers):
        cfg = TranscoderConfig(d_in=d, d_sae=d_sae, d_out=d, activation=activation,
                               k=k if activation == "topk" else None, layer=layer,
                               dtype=torch.float64)
        tc = Transcoder(cfg, seed=10 + layer)
        with torch.no_grad():
            tc.b_dec.normal_(0, 0.1, generator=g)
            tc.b_enc.normal_(0, 0.1, generator=g)
            tc.W_dec.mul_(5)
        transcoders[layer] = tc.eval().requires_grad_(False)
    return model, transcoders


def prompt(model) -> torch.Tensor:
    return torch.tensor([PROMPT_TOKENS]) % model.cfg.d_vocab
