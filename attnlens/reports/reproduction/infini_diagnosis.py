"""docs/reproduction.md's diagnosis of why Infini-attention's memory read of the passkey fades
with length (issue 48 item 5), from the CSV of `python -m attnlens.lab.paper.infini_diagnosis`
(`docs/figures/reproduction/infini-passkey-diagnosis.csv`). Every number of the section is
computed from that CSV; the verdicts in its prose are chosen by the numbers."""

from __future__ import annotations

from attnlens.lab.paper.infini import EVAL_SEED

TITLE = "infini-passkey-long: why the memory read fades with length"
DIAGNOSIS_CSV = "infini-passkey-diagnosis.csv"     # python -m attnlens.lab.paper.infini_diagnosis


def diagnosis_table(rows):
    """Per (model, factor): exact-key accuracy and the memory tokens the answer reads, and for
    each layer's reading head (the head whose read takes the largest share from the key at the
    shortest length) the key's share of its read, the share without the delta rule's erosion
    and the contrast (means over prompts, depths and answer positions). `rows` is the
    diagnosis CSV as a DataFrame."""
    import pandas as pd

    prompts = rows.drop_duplicates(["model", "factor", "depth", "example"])
    exact = prompts.groupby(["model", "factor"]).exact.mean()
    heads = rows.groupby(["model", "factor", "layer", "head"])[
        ["share", "share_no_erosion", "contrast", "memory_tokens"]].mean()
    shortest = min(rows.factor)
    out = []
    for (model, factor), acc in exact.items():
        row = {"model": model, "factor": factor, "exact": acc}
        for layer in sorted(rows.layer.unique()):
            reader = int(heads.loc[(model, shortest)].loc[layer].share.idxmax())
            h = heads.loc[(model, factor, layer, reader)]
            row.update({f"L{layer}_reader": reader, f"L{layer}_share": h.share,
                        f"L{layer}_no_erosion": h.share_no_erosion,
                        f"L{layer}_contrast": h.contrast, "memory_tokens": h.memory_tokens})
        out.append(row)
    return pd.DataFrame(out)


def _per_factor(table, column: str) -> dict[int, list[float]]:
    return {f: table[table.factor == f][column].tolist() for f in sorted(table.factor.unique())}


def _growth(table, column: str, lo: int, hi: int) -> list[float]:
    """Per model, `column` at factor `hi` over its value at factor `lo`."""
    by = table.set_index(["model", "factor"])[column]
    return [float(by[(m, hi)] / by[(m, lo)]) for m in sorted(table.model.unique())]


def diagnosis_section(figure_dir=None) -> str | None:
    """docs/reproduction.md's diagnosis of the fading read, or None without its CSV."""
    import pandas as pd

    from attnlens.reports.reproduction.page import FIGURES, markdown_table, short

    path = FIGURES / DIAGNOSIS_CSV
    if not path.is_file():
        return None
    rows = pd.read_csv(path)
    table = diagnosis_table(rows)
    layers = sorted(rows.layer.unique())
    last = f"L{layers[-1]}"
    factors = sorted(table.factor.unique())
    lo, hi = factors[0], factors[-1]
    mid = 8 if 8 in factors else hi
    n_models, n_prompts = table.model.nunique(), int(rows.example.max()) + 1
    depths = "/".join(f"{d:g}" for d in sorted(rows.depth.unique()))
    seeds = ", ".join(m.rsplit("-s", 1)[-1] for m in sorted(table.model.unique()))
    readers = ", ".join(
        f"{m.rsplit('-', 1)[-1]}: " + " and ".join(
            f"L{x}H{int(table[(table.model == m)][f'L{x}_reader'].iloc[0])}" for x in layers)
        for m in sorted(table.model.unique()))

    def ratio(x: float) -> str:
        return f"{x:.0f}" if x >= 10 else f"{x:.1f}"

    def plain(values, fmt=None, clip=(0.0, 1.0)):
        """mean [95% t-interval] over the models, as the table's cells."""
        return short(values, fmt=fmt or (lambda x: f"{100 * x:.1f}%"), clip=clip)

    header = ["length", "memory tokens read", "exact key"] + [
        f"L{x} reader: key share of the read" for x in layers] + [
        f"{last} reader: share without erosion", f"{last} reader: contrast"]
    body = []
    for f in factors:
        sel = table[table.factor == f]
        body.append([f"{f}x ({int(rows[rows.factor == f].length.iloc[0])})",
                     f"{sel.memory_tokens.mean():.0f}", short(sel.exact.tolist())]
                    + [short(sel[f"L{x}_share"].tolist()) for x in layers]
                    + [short(sel[f"{last}_no_erosion"].tolist()),
                       short(sel[f"{last}_contrast"].tolist(), fmt=ratio, clip=None)])
    share = _per_factor(table, f"{last}_share")
    no_erosion = _per_factor(table, f"{last}_no_erosion")
    exact = _per_factor(table, "exact")
    tokens = _growth(table, "memory_tokens", lo, hi)[0]
    contrast_growth = _growth(table, f"{last}_contrast", lo, hi)
    erosion = [a - b for a, b in zip(no_erosion[mid], share[mid], strict=True)]
    by_prompt = rows[rows.layer == layers[-1]].merge(
        table[["model", "factor", f"{last}_reader"]], on=["model", "factor"])
    by_prompt = by_prompt[by_prompt["head"] == by_prompt[f"{last}_reader"]]
    at = by_prompt[by_prompt.factor == mid].groupby(["model", "depth", "example"]).agg(
        share=("share", "mean"), exact=("exact", "first"))
    right, wrong = at[at.exact].share, at[~at.exact].share
    gap = 100 * (right.mean() - wrong.mean()) if len(right) and len(wrong) else float("nan")
    split = ("" if not (len(right) and len(wrong)) else
             f" Within one length the share does not say which prompts succeed: at {mid}x the "
             f"{len(right)} prompts answered exactly had a {last} reader share of "
             f"{100 * right.mean():.1f}% on average, the {len(wrong)} others "
             f"{100 * wrong.mean():.1f}%"
             + (" (no higher for the successes), so the share accounts for the decline with "
                "length but not for every single answer." if gap <= 1.0 else
                f", {gap:.1f} points more for the successes."))
    per_seed = " / ".join(f"{g:.1f}" for g in contrast_growth)
    intro = (
        f"Where the key's information is lost, measured on the {n_models} shipped "
        f"`infini-passkey-long` models (seeds {seeds}) with `python -m "
        f"attnlens.lab.paper.infini_diagnosis`: the {n_prompts} prompts of each evaluation cell "
        f"above (eval seed {EVAL_SEED}, never a training or validation seed), depths {depths} "
        "(the key outside the question's segment), every length. At the positions that predict "
        "the key's digits, `attnlens.interp.variants.infini.memory_source_share` splits each "
        "head's "
        "memory read A_mem = sum_j W_ij v_j (Eq. 7) into the part that comes from the key's "
        "digit tokens, their share of W, and the rest; it equals the model's own "
        "`hook_mem_weights` (tests/test_infini_memory_share.py). Each layer's *reader* is the "
        f"head whose read takes the most from the key at {lo}x ({readers}). *Share without "
        "erosion*: the share had the delta rule (Eq. 9) not eroded the key's stored vectors "
        "since they were written. *Contrast*: the read weight of a key token over that of an "
        "average other stored token, sigma(q).sigma(k_key) / mean sigma(q).sigma(k_other). "
        "Mean [95% t-interval] (n models):")
    reading = (
        f"**Diagnosis.** Not the update rule: the delta rule's erosion of the stored key costs "
        f"{plain(erosion, fmt=lambda x: f'{100 * x:.1f}', clip=None)} points of the {last} "
        f"reader's share at {mid}x (share "
        f"{plain(share[mid])} with it, {plain(no_erosion[mid])} without). Not the gate: the "
        "gates are parameters, the same at every length (and the knock-out rows above show "
        "that the key comes from the memory read). The read's normalisation: A_mem = sigma(q) "
        "M / sigma(q) z with sigma = ELU + 1 > 0 gives every stored token a positive weight, "
        "and the number of "
        f"stored tokens the answer reads grows {tokens:.1f} times from {lo}x to {hi}x while "
        f"the readers' contrast changes only {per_seed} times (per seed). So the key's share "
        f"of the read falls, {plain(share[lo])} at {lo}x, {plain(share[mid])} at {mid}x, "
        f"{plain(share[hi])} at {hi}x, and exact-key accuracy falls with it "
        f"({plain(exact[lo])}, {plain(exact[mid])}, {plain(exact[hi])}).{split} Keeping the "
        f"{lo}x share at {hi}x would take a contrast about {tokens:.0f} times larger, which "
        "a 16-dimensional ELU+1 feature map trained on 160-640-token prompts does not learn "
        "at this scale; the paper's claim (the key read from memory at 1M tokens, by a 1B model "
        "fine-tuned on 5K-token prompts) is not reproduced here. This is a measured "
        "decomposition of the read, not an intervention that removes the filler.")
    return "\n\n".join([intro, markdown_table(header, body), reading])
