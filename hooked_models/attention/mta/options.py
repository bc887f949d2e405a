"""`MTAOptions`: the options of the "mta" attention, with the official code's names and defaults.

Field names follow the official `MTATransformerArgs` (facebookresearch/RAM, projects/mta/
mta_transformer.py); its `pre_sm_linear_head` / `post_sm_linear_head` flags are accepted as
aliases of our head-mixing group sizes, and a whole `MTATransformerArgs` dict builds what the
official code builds from it (`from_official`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from attnlens.hooked_models.attention.mta.ops import INIT_METHODS
from attnlens.kernels.mta.reference import PAD_KEYS

KERNEL_PAIRS = (("query_kernel_size", "key_kernel_size"),
                ("after_sm_query_kernel_size", "after_sm_key_kernel_size"))
# alias -> the group-size field it sets ("all" = one fully connected group of n_heads).
LINEAR_HEAD_ALIASES = {"pre_sm_linear_head": "pre_sm_head_kernel_size",
                       "post_sm_linear_head": "head_kernel_size"}
# Official flags whose value here is fixed by the variant itself: accepted with that value only.
OFFICIAL_CONSTANTS = {"use_mta": True, "curse_norm": False}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class MTAOptions:
    """Options of the "mta" variant; names follow the official `MTATransformerArgs`.

    Defaults are the released `configs/*_mta.yaml` block (both convolutions 6 x 11, both head
    mixings fully connected, group norm with a scalar sigmoid gate), placed as the official code
    places them when `mta_layers` is unset: in every layer.

    Attributes:
        query_kernel_size: c_q of the pre-softmax key-query convolution (Eq. 5); None: off.
        key_kernel_size: c_k of the pre-softmax convolution. As in the official code the
            convolution is off when either size is None (both are then stored as None).
        after_sm_query_kernel_size: c_q of the post-softmax convolution (Eq. 6); None: off.
        after_sm_key_kernel_size: c_k of the post-softmax convolution (off with either None).
        pad_key: zero padding of the key axis: "both" (paper; c_k must be odd), "left", "right".
        mta_layers: layers (0-based) with the key-query convolutions: None or "all" (every layer:
            the official default), "paper" (every 4th layer from layer 2: the paper's 4.2
            placement, layers 2, 6, 10, ... as in the released 20/24-layer configs; needs
            n_layers >= 3), a list of ints, or a string "2,6,10" (official format).
        init_method: pre-softmax kernel init, one of "identity", "zero", "const" (0.3), "uniform",
            "normal", "diagonal". The post-softmax kernel and the head mixings always start at
            identity (the official code asserts this).
        pre_sm_head_kernel_size: c_h of pre-softmax head mixing (Eq. 7 on the logits): an int
            dividing n_heads, "all" (= n_heads; official alias `pre_sm_linear_head=True`) or
            None: off (`pre_sm_linear_head=False`).
        head_kernel_size: c_h of post-softmax head mixing (official name): int, "all" (official
            alias `post_sm_linear_head=True`) or None: off.
        group_norm: RMSNorm of each head's output over d_head (weight shared by heads, official
            `subln`).
        layer_norm_rescale: multiply the group norm by 1 - (0.8 - 0.6 exp(-0.3 layer)) (the
            paper's depth scaling; needs group_norm).
        add_gating: multiply each head's output by a sigmoid gate computed from the (normed) head
            output, with weights shared by the heads of the layer.
        gate_1d: True (official default and released configs): one gate per head and position,
            sigmoid(out . w + b), `W_gate [d_head]`; False: one gate per head, position and
            dimension, sigmoid(out @ W + b), `W_gate [d_head d_head]` (the official
            `Linear(head_dim, head_dim)`, transposed), `b_gate [d_head]`.
        norm_eps: epsilon of the group norm (official 1e-5).
    """

    query_kernel_size: int | None = 6
    key_kernel_size: int | None = 11
    after_sm_query_kernel_size: int | None = 6
    after_sm_key_kernel_size: int | None = 11
    pad_key: str = "both"
    mta_layers: list[int] | str | None = None
    init_method: str = "identity"
    pre_sm_head_kernel_size: int | str | None = "all"
    head_kernel_size: int | str | None = "all"
    group_norm: bool = True
    layer_norm_rescale: bool = False
    add_gating: bool = True
    gate_1d: bool = True
    norm_eps: float = 1e-5

    aliases: ClassVar[tuple[str, ...]] = tuple(LINEAR_HEAD_ALIASES) + tuple(OFFICIAL_CONSTANTS)
    unsupported: ClassVar[dict[str, str]] = {
        "use_mta": "only use_mta=True is accepted: attention='mta' is use_mta=True; "
                   "attention='mha' is plain attention",
        "curse_norm": "only curse_norm=False is accepted: it rescales the block's attention "
                      "and MLP norms, outside the attention",
        "cache_attention_maps": "every map is a hook: use run_with_cache",
        "dropout": "attention dropout is not modelled",
    }

    @classmethod
    def from_official(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Map the official names onto our fields, building what the official code builds.

        `pre_sm_linear_head` / `post_sm_linear_head`: True -> "all" (one linear mixing of every
        head), False -> None (off). Beside its field, as in a full `MTATransformerArgs` dict:
        True with the field None (the official default: no head convolution) or "all" builds
        the linear mixing; True with an int refuses (the official code asserts "linear head can
        not be combined with head conv"); False keeps the field (a head convolution or off),
        except "all", which is the linear head the flag turns off.

        `use_mta=True` (attention="mta" is exactly that) and `curse_norm=False` (no rescaling,
        as here) describe what this variant builds and are dropped; other values of them are
        refused through `unsupported`.
        """
        out = dict(values)
        for name, kept in OFFICIAL_CONSTANTS.items():
            if name in out and out[name] is kept:
                del out[name]
        for alias, field in LINEAR_HEAD_ALIASES.items():
            if alias not in out:
                continue
            linear = out.pop(alias)
            if not isinstance(linear, bool):
                raise ValueError(f"mta option {alias} must be a bool, got {linear!r}")
            given = out.get(field)
            if linear and given not in (None, "all"):
                raise ValueError(f"mta options {alias}=True and {field}={given!r} conflict: the "
                                 f"official code refuses a linear head beside a head "
                                 f"convolution; give {alias}=True alone (one linear mixing of "
                                 f"all heads) or {field}={given!r} alone")
            if not linear and given == "all":
                raise ValueError(f"mta options {alias}=False and {field}='all' conflict: "
                                 f"{field}='all' is the linear head that {alias}=False turns "
                                 "off; give one of them")
            if linear:
                out[field] = "all"
            elif field not in out:
                out[field] = None
        return out

    def __post_init__(self) -> None:
        layers = self.mta_layers
        if isinstance(layers, str) and layers.strip() not in ("all", "paper"):
            try:
                layers = [int(x) for x in layers.split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"mta_layers={self.mta_layers!r}: expected 'all', 'paper' or "
                                 "comma-separated layer indices like '2,6,10'") from None
        elif isinstance(layers, str):
            layers = layers.strip()
        elif isinstance(layers, tuple):
            layers = list(layers)
        self.mta_layers = layers
        # Official semantics: a convolution exists only when both of its sizes are set.
        for q_name, k_name in KERNEL_PAIRS:
            if getattr(self, q_name) is None or getattr(self, k_name) is None:
                setattr(self, q_name, None)
                setattr(self, k_name, None)

    def validate(self, cfg) -> None:
        """Raise ValueError naming the offending option and the allowed values."""
        for q_name, k_name in KERNEL_PAIRS:
            for name in (q_name, k_name):
                size = getattr(self, name)
                if size is not None and (not _is_int(size) or size < 1):
                    raise ValueError(f"{name} must be a positive int or None, got {size!r}")
            ck = getattr(self, k_name)
            if ck is not None and self.pad_key == "both" and ck % 2 == 0:
                raise ValueError(f"{k_name}={ck} must be odd with pad_key='both'")
        if self.pad_key not in PAD_KEYS:
            raise ValueError(f"pad_key={self.pad_key!r}; choose one of {list(PAD_KEYS)}")
        if self.init_method not in INIT_METHODS:
            raise ValueError(f"init_method={self.init_method!r}; choose one of "
                             f"{list(INIT_METHODS)}")
        for name in ("pre_sm_head_kernel_size", "head_kernel_size"):
            size = getattr(self, name)
            if size is None or size == "all":
                continue
            if not _is_int(size) or size < 1 or cfg.n_heads % size:
                raise ValueError(f"{name}={size!r} must be None, 'all' or a positive divisor of "
                                 f"n_heads={cfg.n_heads}")
        self._validate_layers(cfg.n_layers)
        for name in ("group_norm", "layer_norm_rescale", "add_gating", "gate_1d"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"mta option {name} must be a bool, got {getattr(self, name)!r}")
        if self.layer_norm_rescale and not self.group_norm:
            raise ValueError("layer_norm_rescale=True needs group_norm=True (it scales the norm)")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps!r}")

    def _validate_layers(self, n_layers: int) -> None:
        layers = self.mta_layers
        if layers == "paper" and n_layers < 3:
            raise ValueError(f"mta_layers='paper' (every 4th layer from layer 2) leaves no layer "
                             f"among n_layers={n_layers}; use None/'all' or a list")
        if layers is None or layers in ("all", "paper"):
            return
        if not isinstance(layers, list) or not all(_is_int(x) for x in layers):
            raise ValueError(f"mta_layers={layers!r}: expected a list of ints, a string "
                             "'2,6,10', 'all', 'paper' or None")
        bad = [x for x in layers if not 0 <= x < n_layers]
        if bad:
            raise ValueError(f"mta_layers {bad} are outside [0, n_layers={n_layers})")

    def conv_layers(self, n_layers: int) -> list[int]:
        """The layers that get the key-query convolutions (resolves None, "all" and "paper")."""
        if self.mta_layers is None or self.mta_layers == "all":
            return list(range(n_layers))
        if self.mta_layers == "paper":
            return list(range(2, n_layers, 4))
        return sorted(set(self.mta_layers))

    def group_size(self, name: str, n_heads: int) -> int | None:
        """c_h of `name` ("pre_sm_head_kernel_size" or "head_kernel_size"), "all" -> n_heads."""
        size = getattr(self, name)
        return n_heads if size == "all" else size
