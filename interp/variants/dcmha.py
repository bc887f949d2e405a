"""DCMHA views: knock Compose out, read how much each head borrows, see where a head looks.

Dynamically Composable Multi-Head Attention (Xiao et al. 2024) mixes heads before the softmax
(`pre`, its query/key-side weights `pre_{q,k}{w1,w2,dd}`) and after it (`post`). These analyses
work on any model whose layers have those stages (DCMHA); the two conjunction views read a batch
of `attnlens.interp.tasks.conjunction` lookups (6 records `colour shape value`, then the query's
colour and shape), which is where the paper-task zoo measures them (`attnlens.lab.paper.dcmha`).

Example:
    >>> with model.hooks(fwd_hooks=knockout_hooks(model)):      # doctest: +SKIP
    ...     loss_without_compose = model(tokens, return_type="loss")
"""

from __future__ import annotations

import torch

from attnlens.interp._common import attention_input_name, run_cache
from attnlens.interp.tasks.conjunction import ConjunctionBatch

# DCMHA's dynamic weights of each phase, as its stage catalogue names them
PHASE_STAGES = {phase: [f"{phase}_{side}{w}" for side in "qk" for w in ("w1", "w2", "dd")]
                for phase in ("pre", "post")}


def knockout_hooks(model, phases=("pre", "post")) -> list:
    """Forward hooks zeroing DCMHA's dynamic weights of `phases` in every layer (all zero:
    the layer is exactly MHA with the same W_Q, W_K, W_V, W_O)."""
    unknown = sorted(set(phases) - set(PHASE_STAGES))
    if unknown:
        raise ValueError(f"phases {unknown} are not DCMHA phases; choose from "
                         f"{sorted(PHASE_STAGES)}")

    def zero(x, hook):
        return torch.zeros_like(x)

    return [(f"blocks.{layer}.attn.hook_{stage}", zero) for layer in range(model.cfg.n_layers)
            for phase in phases for stage in PHASE_STAGES[phase]]


@torch.no_grad()
def borrowing_at_answer(model, batch: ConjunctionBatch) -> dict[str, float]:
    """Mean |off-diagonal| and mean diagonal of each layer's pre/post mixing matrices at the
    conjunction answer's query (last input position) and the target record's value (the
    matrices of `attnlens.interp.circuits.composed.mixing_at`, for every question of `batch` from
    one forward pass), as `borrow_{phase}_{offdiag,diag}_L{layer}`, rounded to 4 decimals."""
    tokens = batch.tokens[:, :-1]
    n, t = tokens.shape[0], tokens.shape[1] - 1
    names = [attention_input_name(model, layer) for layer in range(model.cfg.n_layers)]
    store = run_cache(model, tokens, names)
    out = {}
    for layer, name in enumerate(names):
        sums = {}
        for i in range(n):
            s = 3 * int(batch.target_record[i]) + 3       # the target's value token
            mix = model.blocks[layer].attn.head_mixing_at(store[name][i:i + 1], t, s)
            for phase, M in mix.items():
                if M is None:
                    continue
                M = M[0].double()
                eye = torch.eye(M.shape[0], dtype=torch.bool)
                off, diag = float(M[~eye].abs().mean()), float(M[eye].mean())
                a, d = sums.get(phase, (0.0, 0.0))
                sums[phase] = (a + off / n, d + diag / n)
        for phase, (off, diag) in sums.items():
            out[f"borrow_{phase}_offdiag_L{layer}"] = round(off, 4)
            out[f"borrow_{phase}_diag_L{layer}"] = round(diag, 4)
    return out


@torch.no_grad()
def attention_split(model, batch: ConjunctionBatch, layer: int = 1) -> dict[str, float]:
    """Where each head of `layer` looks from the conjunction answer's query: the mean mass of
    its effective pattern (`hook_pattern`, after Compose for DCMHA) on the target record, on
    the records sharing only the query's colour, and on those sharing only its shape (each
    record's 3 tokens), as `attn_L{layer}H{h}_{target,colour,shape}`. A colour matcher puts
    ~1/3 on the target and ~2/3 on colour records; a conjunction head puts most of it on the
    target. Works on every variant (the effective pattern is the contract)."""
    tokens = batch.tokens[:, :-1]
    n = tokens.shape[0]
    name = f"blocks.{layer}.attn.hook_pattern"
    rows = run_cache(model, tokens, [name])[name][:, :, -1].double()     # [batch head key]
    colour, shape = tokens[:, -2], tokens[:, -1]
    rec = tokens[:, 1:-3].reshape(n, -1, 3)                               # [batch record 3]
    is_c, is_s = rec[:, :, 0] == colour[:, None], rec[:, :, 1] == shape[:, None]
    groups = {"target": is_c & is_s, "colour": is_c & ~is_s, "shape": is_s & ~is_c}
    mass = rows[:, :, 1:-3].reshape(n, rows.shape[1], -1, 3).sum(-1)      # [batch head record]
    out = {}
    for h in range(mass.shape[1]):
        for key, sel in groups.items():
            out[f"attn_L{layer}H{h}_{key}"] = round(float((mass[:, h] * sel).sum(-1).mean()), 4)
    return out


def selectivity(metrics: dict, layer: int = 1, n_pairs: int = 2) -> float:
    """Max over heads of `layer` of (mass on the target record) / (mean mass on one distractor
    record), from `attention_split`'s metrics; 1 means no preference for the target. Heads
    with a non-positive mass (DCMHA's post-composed maps are signed) are skipped; NaN if all."""
    heads = sorted({k.split("_")[1] for k in metrics if k.startswith(f"attn_L{layer}H")})
    out = []
    for h in heads:
        target = metrics[f"attn_{h}_target"]
        distractor = (metrics[f"attn_{h}_colour"] + metrics[f"attn_{h}_shape"]) / (2 * n_pairs)
        if target > 0 and distractor > 1e-9:   # post-Compose rows may be signed: skip those
            out.append(target / distractor)
    return max(out) if out else float("nan")
