"""The reproduction report's "DCMHA vs MHA on text" section (issue 24 item 3), from the CSVs
that `python -m attnlens.lab.text_compare` writes (one row per model and condition, and the
training logs' validation curves). Every number in the text is computed from those rows; a test
recomputes the zoo models' rows from their weights."""

from __future__ import annotations

from dataclasses import dataclass

from attnlens.lab.text_compare import losses

PHENOMENON = "dcmha-text-lm"
CSV = "dcmha-text-lm.csv"                 # under the report's figures directory
CURVES_CSV = "dcmha-text-lm_curves.csv"
CLAIM = ("DCFormer (Xiao et al. 2024, Fig. 3 and Table 2): at equal parameters and training "
         "tokens, DCMHA's language-modelling loss is lower than the Transformer++ baseline's at "
         "every size from 405M to 6.9B parameters, matching a baseline with 1.7-2x the compute.")


def loss3(x: float) -> str:
    return f"{x:.3f}"


def curves_figure(curves: list[dict]):
    """Plotly: validation loss against tokens seen, every run (seeds faint, zoo models bold)."""
    import plotly.graph_objects as go

    colours = {"mha": "#1f77b4", "dcmha": "#d62728"}
    fig = go.Figure()
    for name in dict.fromkeys(r["model"] for r in curves):
        rows = [r for r in curves if r["model"] == name]
        short = "-short-" in name
        fig.add_trace(go.Scatter(
            x=[r["tokens"] / 1e6 for r in rows], y=[r["val_loss"] for r in rows], name=name,
            mode="lines", line=dict(color=colours[rows[0]["variant"]], width=1 if short else 3),
            opacity=0.6 if short else 1.0))
    low = min(r["val_loss"] for r in curves) - 0.05     # the first evaluations, far above,
    high = min(max(r["val_loss"] for r in curves), low + 2.0)   # would flatten the rest
    fig.update_layout(title="DCMHA vs MHA on text: validation loss during training",
                      xaxis_title="tokens seen (millions)", yaxis_title="validation loss (nats)",
                      width=760, height=420, yaxis=dict(range=[low, high]))
    return fig


def _table(rows: list[dict]) -> str:
    from attnlens.reports.reproduction.page import markdown_table

    body = [[r["model"], r["variant"], r["seed"], f"{r['tokens'] / 1e6:.1f}M",
             f"{r['parameters']:,}", r["ctx"], r["compose"], loss3(r["val_loss"]),
             "-" if r.get("cpu_time_s") in (None, "") else f"{r['cpu_time_s'] / 3600:.2f}"]
            for r in rows]
    return markdown_table(["model", "variant", "seed", "tokens", "params", "context",
                           "Compose", "val loss", "CPU-h"], body)


@dataclass(frozen=True)
class ShortRuns:
    """The 10M-token runs' validation losses (context 256, Compose on) and, with >= 2 seeds of
    each, the Welch interval of MHA - DCMHA and the larger of the two 95% half-widths."""
    mha: list[float]
    dcmha: list[float]
    welch: tuple[float, float, float] | None = None     # (difference, low, high)
    half: float | None = None

    @classmethod
    def of(cls, rows: list[dict]) -> ShortRuns:
        from attnlens.reports.reproduction.page import t_interval, welch_interval

        mha, dc = losses(rows, "mha", "short"), losses(rows, "dcmha", "short")
        if min(len(mha), len(dc)) < 2:
            return cls(mha, dc)
        half = max(t_interval(x)[2] - t_interval(x)[0] for x in (mha, dc))
        return cls(mha, dc, welch_interval(mha, dc), half)


def compare_text(rows: list[dict], short: ShortRuns | None = None) -> list[str]:
    """The reading's sentences, each number from `rows` (`short`: `ShortRuns.of(rows)`)."""
    from attnlens.reports.reproduction.page import describe

    short = short or ShortRuns.of(rows)
    mha, dc = short.mha, short.dcmha
    if not mha or not dc:
        return ["The short runs are not all evaluated yet: no seed comparison."]
    lines = [f"At 10M tokens (context 256): MHA {describe(mha, fmt=loss3, clip=None)}; DCMHA "
             f"{describe(dc, fmt=loss3, clip=None)} nats."]
    spread = short.half   # the larger 95% half-width of the two variants
    if short.welch is not None:
        d, lo, hi = short.welch
        gap = f"MHA - DCMHA = {d:+.3f} nats (Welch 95% interval {lo:+.3f} to {hi:+.3f})"
        lines.append(f"DCMHA's loss is lower: {gap}, separated from 0 at 95%." if lo > 0 else
                     f"MHA's loss is lower: {gap}, separated from 0 at 95%." if hi < 0 else
                     f"{gap}: the interval includes 0, no difference can be claimed.")
    off = losses(rows, "dcmha", "short", compose="off")
    if len(off) == len(dc) and off:
        cost = [o - c for o, c in zip(off, dc, strict=True)]
        lines.append(f"Zeroing DCMHA's dynamic weights (Compose off, the same weights as plain "
                     f"MHA) raises its loss by {describe(cost, fmt=loss3, clip=None)} nats.")
    for ctx in (256, 512):
        fm, fd = losses(rows, "mha", "full", ctx=ctx), losses(rows, "dcmha", "full", ctx=ctx)
        if fm and fd:
            text = (f"The zoo's text-mha-l2 and text-dcmha-l2 (1 seed each, 41M tokens) at "
                    f"context {ctx}: MHA {loss3(fm[0])}, DCMHA {loss3(fd[0])} "
                    f"(MHA - DCMHA = {fm[0] - fd[0]:+.3f} nats")
            if spread is not None:
                text += (f"; one seed, to be read against the 10M-token runs' seed scale, a "
                         f"95% half-width up to {spread:.3f}")
            lines.append(text + ").")
    for ctx in (256, 512):
        pm, pd_ = losses(rows, "mha", "pkgs", ctx=ctx), losses(rows, "dcmha", "pkgs", ctx=ctx)
        if pm and pd_:
            lines.append(f"On ten times the text (text-mha-l2-pkgs and text-dcmha-l2-pkgs, 1 "
                         f"seed each, 41M tokens, none of it read twice) at context {ctx}: MHA "
                         f"{loss3(pm[0])}, DCMHA {loss3(pd_[0])} (MHA - DCMHA = "
                         f"{pm[0] - pd_[0]:+.3f} nats).")
    return lines


def reading(rows: list[dict], induction: dict[str, float] | None = None,
            short: ShortRuns | None = None,
            pkgs_induction: dict[str, float] | None = None) -> str:
    """Whether the paper's claim reproduces at our scale: the short runs' interval, then
    whether the zoo's one-seed pair at 41M tokens keeps the order (`induction`: the zoo
    models' induction scores from their cards, `{variant: score}`, when known; `short`:
    `ShortRuns.of(rows)`), then the package-corpus pair when its rows are there
    (`pkgs_induction`: its cards' induction scores)."""
    short = short or ShortRuns.of(rows)
    if short.welch is None:
        return "Too few seeds for a reading."
    return _zoo_pair_reading(rows, induction, short) + _pkgs_reading(rows, pkgs_induction,
                                                                     short.half)


def _induction_words(induction: dict[str, float]) -> str:
    from attnlens.lab.text_studies import INDUCTION_THRESHOLD

    return (f"best induction score MHA {induction['mha']:.3f}, DCMHA {induction['dcmha']:.3f}; "
            f"the bar is {INDUCTION_THRESHOLD}")


def _pkgs_reading(rows: list[dict], induction: dict[str, float] | None, half: float) -> str:
    """The package-corpus pair's sentence ("" without its rows): its gap at context 512 read
    against the short runs' seed scale `half`."""
    pm, pd_ = losses(rows, "mha", "pkgs", ctx=512), losses(rows, "dcmha", "pkgs", ctx=512)
    if not (pm and pd_):
        return ""
    gap = pm[0] - pd_[0]
    leader = "MHA" if gap < 0 else "DCMHA"
    verdict = (f"within the 10M-token runs' seed scale (95% half-width up to {half:.3f}): no "
               f"difference can be read from it" if abs(gap) <= half else
               f"beyond the 10M-token runs' seed scale (95% half-width up to {half:.3f}), "
               f"{leader} ahead")
    scores = f"; {_induction_words(induction)}" if induction and {"mha", "dcmha"} <= set(
        induction) else ""
    return (f" On ten times the text, none of it read twice (the `-pkgs` pair, one seed each, "
            f"41M tokens; validation is the standard library's held-out files, and the "
            f"standard library is a small part of their training stream), MHA - DCMHA = "
            f"{gap:+.3f} nats at context 512, {verdict}{scores}.")


def _zoo_pair_reading(rows: list[dict], induction: dict[str, float] | None,
                      short: ShortRuns) -> str:
    text = _short_reading(rows, short.welch)
    fm, fd = losses(rows, "mha", "full", ctx=512), losses(rows, "dcmha", "full", ctx=512)
    if not (fm and fd):
        return text
    half = short.half
    gap = fm[0] - fd[0]
    short_gap, lo, hi = short.welch
    if abs(gap) <= half or (gap > 0) == (short_gap > 0):
        return text + (f" The zoo's pair at 41M tokens (one seed each) gives MHA - DCMHA = "
                       f"{gap:+.3f} nats.")
    separated = lo > 0 or hi < 0
    text += (" At 41M tokens the zoo's pair (one seed each) "
             + ("reverses the order" if separated else
                f"reverses the order of the 10M-token means (MHA - DCMHA {short_gap:+.3f}, "
                f"not separated)")
             + f": MHA - DCMHA = {gap:+.3f} nats, beyond the 10M-token runs' seed scale (95% "
             f"half-width up to {half:.3f})")
    if induction and {"mha", "dcmha"} <= set(induction):
        from attnlens.lab.text_studies import INDUCTION_THRESHOLD

        formed = {v: induction[v] >= INDUCTION_THRESHOLD for v in ("mha", "dcmha")}
        scores = _induction_words(induction)
        if formed["mha"] != formed["dcmha"]:
            ahead = "MHA" if formed["mha"] else "DCMHA"
            behind = "DCMHA" if formed["mha"] else "MHA"
            text += (f", and in between {ahead} formed an induction head where {behind} did "
                     f"not ({scores})")
        else:
            text += f" ({scores})"
    leader = "MHA" if gap > 0 else "DCMHA"
    return text + (f". {leader}'s {'lead' if separated else 'small lead in the means'} at 10M "
                   f"tokens does not last to our full budget; with one seed at 41M tokens that "
                   f"is an observation, not an interval.")


def _short_reading(rows: list[dict], welch) -> str:
    """The short runs' verdict on the paper's direction."""
    _, lo, hi = welch
    params = {r["variant"]: r["parameters"] for r in rows if "-short-" in r["model"]}
    extra = 100 * (params["dcmha"] / params["mha"] - 1)
    scale = (f"~{params['mha'] / 1e6:.1f}M parameters (DCMHA {extra:+.1f}%), 2 attention-only "
             f"layers and 10M tokens")
    if lo > 0:
        return (f"DCMHA reaches a lower validation loss than MHA at equal tokens, beyond the "
                f"seed spread: the direction of the paper's claim holds at {scale}. (Most of "
                f"these parameters are the embeddings; DCMHA's generator is "
                f"{params['dcmha'] - params['mha']:,} of them.)")
    if hi < 0:
        return (f"MHA reaches a lower validation loss than DCMHA at equal tokens: the paper's "
                f"claim does not reproduce at {scale}.")
    return (f"No difference between DCMHA and MHA beyond the seed spread at {scale}: the "
            f"paper's claim is neither reproduced nor contradicted at this scale.")


def _seeds(rows: list[dict]) -> str:
    """"Three seeds of each variant", or how many each has when a run is missing."""
    words = {1: "One seed", 2: "Two seeds", 3: "Three seeds"}
    mha, dc = (len(losses(rows, v, "short")) for v in ("mha", "dcmha"))
    if mha == dc:
        return f"{words.get(mha, f'{mha} seeds')} of each variant"
    return f"{mha} seed(s) of MHA and {dc} of DCMHA"


def zoo_induction(names=None) -> dict[str, float]:
    """`{variant: best induction score}` of the zoo cards (the eval command's) of `names`
    (default: text-mha-l2 / text-dcmha-l2), for the shipped ones."""
    import json

    from attnlens.lab.text_compare import FULL
    from attnlens.reports.reproduction.page import ROOT

    out = {}
    for name in names or FULL:
        card = ROOT / "hooked_models" / "zoo" / name / "card.json"
        if card.is_file():
            out[name.split("-")[1]] = json.loads(card.read_text())["metrics"]["induction_score"]
    return out


def section(figure_dir=None) -> str | None:
    """The report's Markdown for the text comparison, or None when its CSV is not there."""
    from attnlens.lab.text_compare import read_csv
    from attnlens.reports.reproduction.page import FIGURES, save_png

    path = FIGURES / CSV
    if not path.is_file():
        return None
    from attnlens.lab.text_compare import PKGS

    rows = read_csv(path)
    short = ShortRuns.of(rows)
    induction = zoo_induction()
    pkgs = any(r["model"] in PKGS for r in rows)
    curves_path = FIGURES / CURVES_CSV
    figure = ""
    if figure_dir is not None and curves_path.is_file():
        figure = "\n\n" + save_png(curves_figure(read_csv(curves_path)), "dcmha_text_lm_curves",
                                   figure_dir)
    cpu = sum(r["cpu_time_s"] or 0 for r in {r["model"]: r for r in rows}.values()) / 3600
    return (f"**Paper.** {CLAIM}\n\n"
            "**Task here.** Language modelling on the text zoo's corpus (Python standard "
            "library sources, BPE vocabulary 4096): 2-layer attention-only models, d_model 128, "
            "4 heads of 32, rotary positions, trained with the zoo's schedule (lr 3e-3, "
            f"AdamW). {_seeds(rows)} at 10M tokens (`text-{{mha,dcmha}}-l2-short-s*`: "
            "2,500 steps of 16 x 256 tokens, the lr decaying to 0 over the last 500), and the "
            "zoo's two models (41M tokens, 256 then 512 tokens of context)"
            + (", and their twins on ten times the text (`text-{mha,dcmha}-l2-pkgs`: the same "
               "recipe on the standard library followed by the installed packages' sources, "
               "so 41M tokens read no text twice)" if pkgs else "")
            + ". Validation loss on "
            "the zoo's held-out windows (64 x 512 tokens of files the training never saw, cut "
            "to each model's training context); `python -m attnlens.lab.text_compare`.\n\n"
            + _table(rows) + figure + "\n\n" + " ".join(compare_text(rows, short))
            + f"\n\n{len({r['model'] for r in rows})} models, {cpu:.1f} CPU-hours of training."
            + f"\n\n**Our reading.** "
            f"{reading(rows, induction, short, zoo_induction(PKGS) if pkgs else None)}")
