"""Model parts shared by every variant: embeddings, norms, MLP and the transformer block.

Hook names and parameter names follow TransformerLens (`W_E`, `W_pos`, `W_U`, `b_U`, `ln1.w`,
`ln1.hook_scale`, `mlp.W_in`, `mlp.hook_post`, ...) so TransformerLens's tools find them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from attnlens.hooked_models.attention import get_attention_class

ACTIVATION_FNS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "tanh": torch.tanh,
}


class Embed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    """Learned absolute positions ("standard")."""

    def __init__(self, cfg):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_pos[positions]


class Unembed(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab, dtype=cfg.dtype))

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return x @ self.W_U + self.b_U


class LayerNorm(nn.Module):
    """LayerNorm with TransformerLens's hook_scale (the divisor) and hook_normalized."""

    def __init__(self, cfg):
        super().__init__()
        self.eps = cfg.eps
        self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)


class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * w, hooks as LayerNorm."""

    def __init__(self, cfg):
        super().__init__()
        self.eps = cfg.eps
        self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=cfg.dtype))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w)


def make_norm(cfg) -> nn.Module:
    return {"LN": LayerNorm, "RMS": RMSNorm, None: lambda cfg: nn.Identity()}[
        cfg.normalization_type](cfg)


class MLP(nn.Module):
    """act(x W_in + b_in) W_out + b_out, or the gated form act(x W_gate) * (x W_in) (SwiGLU)."""

    def __init__(self, cfg):
        super().__init__()
        D, M = cfg.d_model, cfg.d_mlp
        self.act = ACTIVATION_FNS[cfg.act_fn]
        self.W_in = nn.Parameter(torch.empty(D, M, dtype=cfg.dtype))
        self.b_in = nn.Parameter(torch.zeros(M, dtype=cfg.dtype))
        if cfg.gated_mlp:
            self.W_gate = nn.Parameter(torch.empty(D, M, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.empty(M, D, dtype=cfg.dtype))
        self.b_out = nn.Parameter(torch.zeros(D, dtype=cfg.dtype))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()
        if cfg.gated_mlp:
            self.hook_pre_linear = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if hasattr(self, "W_gate"):
            gate = self.hook_pre(x @ self.W_gate)
            linear = self.hook_pre_linear(x @ self.W_in + self.b_in)
            post = self.hook_post(self.act(gate) * linear)
        else:
            post = self.hook_post(self.act(self.hook_pre(x @ self.W_in + self.b_in)))
        return post @ self.W_out + self.b_out


class TransformerBlock(nn.Module):
    """Pre-norm block: attention (the registered variant) then an optional MLP."""

    # TransformerLens's logit lens / accumulated_resid(apply_ln=True) read this flag: each block
    # outputs one [batch pos d_model] residual stream, the one ln_final -> unembed reads.
    hook_out_is_single_residual_stream = True

    def __init__(self, cfg, layer: int):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.ln1 = make_norm(cfg)
        self.attn = get_attention_class(cfg.attention)(cfg, layer)
        if not cfg.attn_only:
            self.ln2 = make_norm(cfg)
            self.mlp = MLP(cfg)
            self.hook_mlp_out = HookPoint()
        self.hook_resid_pre = HookPoint()
        self.hook_attn_out = HookPoint()
        if not cfg.attn_only and not cfg.parallel_attn_mlp:
            self.hook_resid_mid = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, resid: Tensor, allowed: Tensor, q_positions: Tensor, k_positions: Tensor,
                cache=None) -> Tensor:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(
            self.attn(self.ln1(resid), allowed, q_positions, k_positions, cache))
        if self.cfg.attn_only:
            return self.hook_resid_post(resid + attn_out)
        if self.cfg.parallel_attn_mlp:
            mlp_out = self.hook_mlp_out(self.mlp(self.ln2(resid)))
            return self.hook_resid_post(resid + attn_out + mlp_out)
        mid = self.hook_resid_mid(resid + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.ln2(mid)))
        return self.hook_resid_post(mid + mlp_out)
