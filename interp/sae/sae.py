"""A sparse autoencoder with SAELens's layout and hook names, for any hook of any variant.

SAELens (6.x) cannot be installed beside attnlens: it pins transformer-lens < 4 and imports
`transformer_lens.HookedTransformer`, which TransformerLens 4 removed. This class keeps its
conventions instead: `W_enc [d_in d_sae]`, `b_enc`, `W_dec [d_sae d_in]`, `b_dec` (the keys of
SAELens's StandardSAE state dict), ReLU features, and the hook points `hook_sae_input`,
`hook_sae_acts_pre`, `hook_sae_acts_post`, `hook_sae_recons`, `hook_sae_error`,
`hook_sae_output`, so `sae.run_with_cache` and feature edits work as in SAELens.

Example:
    >>> sae = SparseAutoencoder(d_in=8, d_sae=32, seed=0)
    >>> x = torch.randn(5, 8)
    >>> sae(x).shape
    torch.Size([5, 8])
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


@dataclass
class SAEConfig:
    """Shape and placement of a `SparseAutoencoder`.

    Attributes:
        d_in: width of one input vector (the hooked tensor's feature axis, see `reshape`).
        d_sae: number of features.
        hook_name: the model hook it reads and, when spliced, replaces.
        reshape: "last" (the last axis holds the features; every other axis indexes examples)
            or "heads" (the last two, e.g. `[.. head_index d_head]` of hook_z, merged as in
            SAELens's hook_z SAEs).
        dtype: parameter dtype.
    """

    d_in: int
    d_sae: int
    hook_name: str = ""
    reshape: str = "last"
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.reshape not in ("last", "heads"):
            raise ValueError(f"reshape must be 'last' or 'heads', got {self.reshape!r}")


class SparseAutoencoder(HookedRootModule):
    """ReLU SAE: `f = relu((x - b_dec) W_enc + b_enc)`, `x_hat = f W_dec + b_dec`."""

    def __init__(self, d_in: int | None = None, d_sae: int | None = None, *,
                 cfg: SAEConfig | None = None, seed: int | None = None, **cfg_kwargs):
        super().__init__()
        self.cfg = cfg if cfg is not None else SAEConfig(d_in=d_in, d_sae=d_sae, **cfg_kwargs)
        d_in, d_sae, dtype = self.cfg.d_in, self.cfg.d_sae, self.cfg.dtype
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        # Decoder rows of unit norm, encoder = decoder transposed (SAELens's default init).
        W_dec = torch.randn(d_sae, d_in, generator=gen, dtype=torch.float64)
        W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True)
        self.W_dec = nn.Parameter(W_dec.to(dtype))
        self.W_enc = nn.Parameter(W_dec.T.clone().to(dtype))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_in, dtype=dtype))
        for name in ("input", "acts_pre", "acts_post", "recons", "error", "output"):
            setattr(self, f"hook_sae_{name}", HookPoint())
        self.setup()

    # -- the autoencoder --------------------------------------------------------------------
    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        pre = self.hook_sae_acts_pre((x - self.b_dec) @ self.W_enc + self.b_enc)
        return self.hook_sae_acts_post(torch.relu(pre))

    def decode(self, f: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_in"]:
        return self.hook_sae_recons(f @ self.W_dec + self.b_dec)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        return self.decode(self.encode(self.hook_sae_input(x)))

    def clean_reconstruction(self, x: Tensor) -> Tensor:
        """The reconstruction without firing (or being edited by) any hook."""
        f = torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)
        return f @ self.W_dec + self.b_dec

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Rescale decoder rows to unit norm (after each step, as SAELens does)."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-12))

    # -- between the hooked tensor and SAE vectors --------------------------------------------
    def flatten(self, act: Tensor) -> Tensor:
        """`act` (the hook's shape) as `[..., d_in]` vectors."""
        x = act.flatten(-2) if self.cfg.reshape == "heads" else act
        if x.shape[-1] != self.cfg.d_in:
            raise ValueError(f"the SAE reads vectors of d_in={self.cfg.d_in} from "
                             f"{self.cfg.hook_name or 'its hook'}, got a tensor of shape "
                             f"{tuple(act.shape)} (reshape={self.cfg.reshape!r})")
        return x

    def unflatten(self, x: Tensor, like: Tensor) -> Tensor:
        return x.reshape(like.shape)

    def config_dict(self) -> dict:
        out = asdict(self.cfg)
        out["dtype"] = str(self.cfg.dtype).removeprefix("torch.")
        return out


__all__ = ["SAEConfig", "SparseAutoencoder"]
