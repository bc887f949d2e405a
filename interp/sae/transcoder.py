"""Per-layer transcoders: a sparse map from an MLP's input to its output (Dunefsky et al. 2024;
the replacement MLPs of Ameisen et al. 2025, "Circuit Tracing").

The names follow SAELens's transcoders and circuit-tracer's: `W_enc [d_in d_sae]`, `b_enc`,
`W_dec [d_sae d_out]`, `b_dec`, `threshold` (JumpReLU only); `cfg.hook_name` is the hook read
(the MLP's input, `blocks.{l}.ln2.hook_normalized`) and `cfg.hook_name_out` the hook replaced
(`blocks.{l}.hook_mlp_out`). Two activations:

- "jumprelu": `f = pre * (pre > threshold)` with a learned per-feature threshold (trained with a
  straight-through estimator of the L0 penalty, Rajamanoharan et al. 2024);
- "topk": the k largest pre-activations pass through ReLU, the rest are 0 (Gao et al. 2024).

Unlike `SparseAutoencoder` the input is not centred by `b_dec` (input and output live in
different spaces): `pre = x W_enc + b_enc`, `y_hat = f W_dec + b_dec`.

Example:
    >>> tc = Transcoder(TranscoderConfig(d_in=8, d_sae=32, d_out=8, activation="topk", k=4),
    ...                 seed=0)
    >>> f = tc.encode(torch.randn(5, 8))
    >>> int((f != 0).sum(-1).max()) <= 4
    True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

ACTIVATIONS = ("jumprelu", "topk")


def mlp_hooks(layer: int) -> tuple[str, str]:
    """The (input, output) hooks of layer `layer`'s MLP, which its transcoder reads and replaces."""
    return f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out"


@dataclass
class TranscoderConfig:
    """Shape, activation and placement of a `Transcoder`.

    Attributes:
        d_in, d_out: widths of the MLP's input and output (both d_model for a transformer MLP).
        d_sae: number of features.
        activation: "jumprelu" or "topk".
        k: active features per token ("topk" only).
        layer: the transformer layer whose MLP it replaces (sets the hook names when given).
        hook_name, hook_name_out: the hooks read and replaced.
        dtype: parameter dtype.
    """

    d_in: int
    d_sae: int
    d_out: int
    activation: str = "jumprelu"
    k: int | None = None
    layer: int | None = None
    hook_name: str = ""
    hook_name_out: str = ""
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae", "d_out"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.activation == "topk":
            if isinstance(self.k, bool) or not isinstance(self.k, int) or not \
                    0 < self.k <= self.d_sae:
                raise ValueError(f"a topk transcoder needs 0 < k <= d_sae={self.d_sae}, "
                                 f"got k={self.k!r}")
        elif self.k is not None:
            raise ValueError("k is for activation='topk' only")
        if self.layer is not None:
            hook_in, hook_out = mlp_hooks(self.layer)
            self.hook_name = self.hook_name or hook_in
            self.hook_name_out = self.hook_name_out or hook_out

    def to_dict(self) -> dict:
        out = asdict(self)
        out["dtype"] = str(self.dtype).removeprefix("torch.")
        return out

    @classmethod
    def from_dict(cls, d: dict) -> TranscoderConfig:
        d = dict(d)
        if isinstance(d.get("dtype"), str):
            d["dtype"] = getattr(torch, d["dtype"])
        return cls(**d)


class Transcoder(HookedRootModule):
    """`f = act(x W_enc + b_enc)`, `y_hat = f W_dec + b_dec`, with SAELens's hook points."""

    def __init__(self, cfg: TranscoderConfig, seed: int | None = None):
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        W_dec = torch.randn(cfg.d_sae, cfg.d_out, generator=gen, dtype=torch.float64)
        W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True) * 0.1
        W_enc = torch.randn(cfg.d_in, cfg.d_sae, generator=gen, dtype=torch.float64)
        W_enc = W_enc / W_enc.norm(dim=0, keepdim=True)
        self.W_enc = nn.Parameter(W_enc.to(cfg.dtype))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, dtype=cfg.dtype))
        self.W_dec = nn.Parameter(W_dec.to(cfg.dtype))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_out, dtype=cfg.dtype))
        if cfg.activation == "jumprelu":
            self.threshold = nn.Parameter(torch.full((cfg.d_sae,), 1e-3, dtype=cfg.dtype))
        for name in ("input", "acts_pre", "acts_post", "recons"):
            setattr(self, f"hook_sae_{name}", HookPoint())
        self.setup()

    def pre_acts(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        return x @ self.W_enc + self.b_enc

    def activate(self, pre: Tensor) -> Tensor:
        """The feature activations of pre-activations `pre` (no hook, no gradient trick)."""
        if self.cfg.activation == "jumprelu":
            return pre * (pre > self.threshold)
        top = pre.topk(self.cfg.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        pre = self.hook_sae_acts_pre(self.pre_acts(x))
        return self.hook_sae_acts_post(self.activate(pre))

    def decode(self, f: Float[Tensor, "... d_sae"]) -> Float[Tensor, "... d_out"]:
        return self.hook_sae_recons(f @ self.W_dec + self.b_dec)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        return self.decode(self.encode(self.hook_sae_input(x)))

    def config_dict(self) -> dict:
        return self.cfg.to_dict()


__all__ = ["ACTIVATIONS", "Transcoder", "TranscoderConfig", "mlp_hooks"]
