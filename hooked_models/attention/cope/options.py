"""`CoPEOptions`: the options of the "cope" attention, with the official code's names as aliases
(validated on construction: a bad value raises ValueError naming it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from attnlens.hooked_models.attention.options import official_bool, rename_official
from attnlens.kernels.cope.reference import SCALINGS


def _positive_int(name: str, value, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"cope option {name} must be a positive int, got {value!r}")


@dataclass
class CoPEOptions:
    """Options of the "cope" attention (the official repo's flag in brackets).

    Attributes:
        npos_max: number of position embeddings; positions saturate at npos_max - 1
            [--cope-npos]; None: n_ctx + 1, so nothing saturates within the context.
        scaling: "repo" (official default: (q.k + q.e[p]) / sqrt(d)) or "paper" (appendix
            code: q.k/sqrt(d) + q.e[p]; the official --cope-nodiv). Same function family (e
            rescaled by sqrt(d)), but trained weights are not interchangeable.
        sep_keys: gates from a separate key projection W_K_gate [--cope-sep-key].
        val_gates: gates from q.v instead of q.k [--cope-val-gates]; only the gates change,
            the values are still weighted by the softmax alone, so z == pattern @ v stays exact.
            With sep_keys too, the value gates win, as in the official code (which builds the
            separate key projection and never reads it; we do not build W_K_gate then).
        every: CoPE only on layers l with (l + 1) % every == 0 [--cope-layers]; the other
            layers are the model's base positional scheme (plus relative positions if set).
        shared: one e for every CoPE layer [--cope-shared], registered on the first CoPE layer.
        relative: add learned relative-position logits q_i.r[i-j] / sqrt(d) (the repo's
            "cope+rel"; r is `[d_head, rel_npos]`, distances >= rel_npos add 0 unless
            rel_extend).
        rel_npos: number of relative distances; None: n_ctx [--rel-pos-max].
        rel_extend: distances >= rel_npos use the farthest embedding r[rel_npos-1] instead of
            adding 0 [--rel-pos-extend]; needs relative.
        rel_shared: one r for all layers, as the repo does; registered on layer 0.

    Official names accepted (`from_official`): cope_sep_key, cope_val_gates, cope_npos,
    cope_nodiv (True: scaling "paper", False: "repo"), cope_layers, cope_shared, rel_pos_max,
    rel_pos_extend, pos_emb ("cope": relative False, "cope+rel": relative True).
    """

    npos_max: int | None = None
    scaling: str = "repo"
    sep_keys: bool = False
    val_gates: bool = False
    every: int = 1
    shared: bool = False
    relative: bool = False
    rel_npos: int | None = None
    rel_extend: bool = False
    rel_shared: bool = True

    aliases: ClassVar[tuple[str, ...]] = (
        "cope_sep_key", "cope_val_gates", "cope_npos", "cope_nodiv", "cope_layers", "cope_shared",
        "rel_pos_max", "rel_pos_extend", "pos_emb")

    @classmethod
    def from_official(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Rename the official flags (`aliases`) to our fields; a flag given with a disagreeing
        field raises ValueError."""
        return rename_official(values, {
            "cope_sep_key": ("sep_keys", official_bool("cope_sep_key")),
            "cope_val_gates": ("val_gates", official_bool("cope_val_gates")),
            "cope_npos": ("npos_max", lambda n: n),
            "cope_nodiv": ("scaling",
                           lambda b: "paper" if official_bool("cope_nodiv")(b) else "repo"),
            "cope_layers": ("every", lambda n: n),
            "cope_shared": ("shared", official_bool("cope_shared")),
            "rel_pos_max": ("rel_npos", lambda n: n),
            "rel_pos_extend": ("rel_extend", official_bool("rel_pos_extend")),
            "pos_emb": ("relative", _relative_from_pos_emb),
        }, "cope")

    def validate(self, cfg) -> None:
        _positive_int("npos_max", self.npos_max)
        _positive_int("rel_npos", self.rel_npos)
        _positive_int("every", self.every, allow_none=False)
        if self.scaling not in SCALINGS:
            raise ValueError(f"cope option scaling={self.scaling!r}; choose one of "
                             f"{list(SCALINGS)}")
        for name in ("sep_keys", "val_gates", "shared", "relative", "rel_extend", "rel_shared"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"cope option {name} must be a bool, got "
                                 f"{getattr(self, name)!r}")
        if self.rel_extend and not self.relative:
            raise ValueError("cope option rel_extend=True extends relative positions: it needs "
                             "relative=True")
        if self.every > cfg.n_layers:
            raise ValueError(f"cope option every={self.every} leaves no CoPE layer among "
                             f"n_layers={cfg.n_layers}; choose every in [1, {cfg.n_layers}]")


def _relative_from_pos_emb(pos_emb: Any) -> bool:
    """The official --pos-emb choice as our `relative` flag (only the CoPE choices apply)."""
    choices = {"cope": False, "cope+rel": True}
    if pos_emb not in choices:
        raise ValueError(f"cope option pos_emb={pos_emb!r}: attention='cope' takes 'cope' or "
                         "'cope+rel' (other schemes: VariantConfig.positional_embedding_type)")
    return choices[pos_emb]
