"""`DCMHAOptions`: the options of the "dcmha" attention, with the official code's names as aliases
(validated on construction: a bad value raises ValueError naming it).
"""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("pre", "post")
# Order of the generator's C axis (dw1, qkw, dd), as in the release.
CHANNELS = (("pre", "q"), ("pre", "k"), ("post", "q"), ("post", "k"))
# Release window patterns (`window_types`); L = local (windowed), G = global.
WINDOW_ALIASES = {"LG": "LG", "LGLL": "LGLL", "LGL6": "LGLLLLLL"}
NORM_EPS = 1e-6  # RMSnormNoscale epsilon of the release
W_SHAPE = "batch pos group rank head_index"
DD_SHAPE = "batch pos group head_index"


@dataclass
class DCMHAOptions:
    """Options of the "dcmha" variant.

    Attributes:
        rank: R, rank of the dynamic projections (released: 2).
        groups: G, heads are composed within groups of n_heads / G (released: 1).
        dw_hidden_dim: K, hidden size of the generator (None: 4 * heads per group, as released).
        query_wise: drop the key-wise terms W_k(s) (the release's `query_wise=True`).
        static_proj: learn B = I + W_static (talking heads) instead of B = I (released: False).
        qk_norm: RMS-normalise q and k over d_head with a learned scale, before rotary.
        qk_norm_eps: epsilon of the QK-norm (released: 1e-6).
        window_size: local layers attend to keys with q_pos - k_pos <= window_size (w + 1 keys,
            the release's `make_window_mask`); None makes every layer global.
        window_type: which layers are local, repeated over layers: a string of "L"/"G" or a
            release name ("LG": even layers local, odd global, the released default; "LGLL";
            "LGL6").
    """

    rank: int = 2
    groups: int = 1
    dw_hidden_dim: int | None = None
    query_wise: bool = False
    static_proj: bool = False
    qk_norm: bool = False
    qk_norm_eps: float = 1e-6
    window_size: int | None = None
    window_type: str = "LG"

    def validate(self, cfg) -> None:
        for name in ("rank", "groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"dcmha option {name} must be a positive int, got {value!r}")
        if cfg.n_heads % self.groups:
            raise ValueError(f"dcmha groups={self.groups} must divide n_heads={cfg.n_heads}")
        if self.dw_hidden_dim is not None and (
                not isinstance(self.dw_hidden_dim, int) or self.dw_hidden_dim <= 0):
            raise ValueError(f"dcmha dw_hidden_dim must be a positive int or None, "
                             f"got {self.dw_hidden_dim!r}")
        if self.window_size is not None and (
                not isinstance(self.window_size, int) or self.window_size < 0):
            raise ValueError(f"dcmha window_size must be a non-negative int or None, "
                             f"got {self.window_size!r}")
        pattern = WINDOW_ALIASES.get(self.window_type, self.window_type)
        if not isinstance(pattern, str) or not pattern or set(pattern) - {"L", "G"}:
            raise ValueError(f"dcmha window_type must be one of {sorted(WINDOW_ALIASES)} or a "
                             f"string of 'L'/'G', got {self.window_type!r}")

    def hidden_dim(self, n_heads: int) -> int:
        return self.dw_hidden_dim or 4 * (n_heads // self.groups)

    def layer_window(self, layer: int) -> int | None:
        """The window of `layer` (None: global attention)."""
        if self.window_size is None:
            return None
        pattern = WINDOW_ALIASES.get(self.window_type, self.window_type)
        return self.window_size if pattern[layer % len(pattern)] == "L" else None
