"""docs/zoo.md's calibration section (issue 26 item 2): when each text run formed induction heads,
from the trajectories `python -m attnlens.lab.calibration` writes
(docs/figures/zoo/calibration.csv),
with the findings on learning-rate schedule, context, data mix and corpus in words."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnlens.lab.text_studies import COPY_RATIO_THRESHOLD, INDUCTION_THRESHOLD
from attnlens.reports.docs_figures import figure_markdown

CALIBRATION_INTRO = """\
How many tokens a 2-layer model needs before it forms induction heads, from the training logs
(`python -m attnlens.lab.calibration RUNS/runs/* --keep docs/figures/zoo/calibration.csv --csv
docs/figures/zoo/calibration.csv --png docs/figures/zoo/calibration.png`; `--keep` carries the
rows of earlier sessions' runs, whose logs are gone). A run meets the bar at its first
evaluation with a best induction score >= 0.3 and a second-copy loss below half the first-copy
loss (random tokens); the 1-layer runs are the controls. Each run is one training seed (0), so
no row has an interval; the probe's seed (20261125) is one no training run uses. Runs stopped
early are shown as they stood ("tokens seen"). Earlier measurement (issue 26, a plain PyTorch
model of d_model 128, 4 heads x 32, n_ctx 256, batch 16, on the same text; its code is not in
the repository): lr 1e-3 with a cosine formed no induction head by 19.5M tokens; lr 3e-3 held
constant did, the second-copy loss falling from 0.95x the first copy at 20M tokens to 0.70x at
31M, and with a quarter of the contexts carrying a repeated span about twice as early (0.86x at
14M). The zoo's first natural-text `text-mha-l2` (`-v1` below: n_ctx 512, batch 16) had
formed none by 41M tokens, nor its data-mix twin by 20.5M (2026-11-25). The runs of
2026-11-27 (the 2-layer MHA, batch 8 x 512, lr 3e-3, sized to finish in one session,
`SESSION_CALIBRATION` in `attnlens/lab/text_recipes.py`) ask what brings the heads within about
10M tokens; `ctx256` and the curriculum that the zoo now trains with ran to 41M."""

CALIBRATION_FINDINGS = """\
What the 2026-11-27 runs show (2-core AMD EPYC VM, shared; one seed each, so single
trajectories, not intervals; every score and ratio below is the table's):

- **At n_ctx 256 our MHA forms an induction head on natural text; the copy-ratio bar is not
  met.** `ctx256` (the issue's plain set-up: natural text, batch 16 x 256, lr 3e-3 constant)
  went through the phase change: its best induction score left the floor at about 14M tokens
  and first reached 0.3 at {ctx256_first:.1f}M; over its whole 41M tokens the best score was
  {ctx256_score:.3f} and the lowest copy ratios {ctx256_ratio:.2f} (random tokens) /
  {ctx256_text:.2f} (text). From 25M tokens on the random-token ratio stayed at 0.74-0.78 and
  the score at 0.27-0.32: a plateau, not a slow approach to the bar. The plain PyTorch model of
  issue 26 got to 0.86x (random) and 0.70x (text) in the same set-up by 31M tokens, so our model
  trains as a plain one does.
- **The context-length curriculum keeps the head at 512 tokens and strengthens it.** The zoo's
  recipe is now `ctx256`'s first 6,250 steps (25.6M tokens) followed by 3,750 steps of 8 x 512
  with the lr decayed linearly to 0 over the last 2,000 (`text-mha-l2`; its first 6,250
  steps are `ctx256`'s own checkpoint, see Training above). At 512 tokens the best score
  rose to {cur_score:.3f} and the copy ratios fell to {cur_ratio:.2f} / {cur_text:.2f}; the
  validation loss on 512-token windows ended at {cur_val:.3f}, against {v1_val:.3f} for the
  first recipe's `text-mha-l2-v1` (16 x 512 from the first step, the same 41M tokens, no
  induction head). The copy-ratio bar (< 0.5) is still not met: at this size (d_model 128,
  4 heads, 1.2M parameters of which 1.05M are the embedding and unembedding) the second copy
  of 150 random ids costs about 8.3 nats against 12.1 for the first. Evaluations before step
  6,250 read 256-token windows, after it 512 (the validation-loss step at 25.6M tokens is that
  change). Whether n_ctx 512 from the first step would form the head in 10,000 steps of 4,096
  tokens (`text-mha-l2-b8`) was not run: the curriculum was taken because it is known to work.
- **No data mix at n_ctx 512 brought induction within 10M tokens.** Repeated spans of the
  context's own text in every context (`rep100`, 20-100 tokens; `rep100-long`, 50-250 tokens,
  to 10.2M) or in half of them (`rep50`), and random-token spans pasted twice into half the
  contexts (`rand50`; `rand50-long`, 100-254 tokens, to 9.2M): best score at most
  {mix_score:.3f}, copy ratios at least {mix_ratio:.2f}.
- **The embedding's initialisation is not the obstacle.** With the token embedding at
  PyTorch's N(0, 1) instead of N(0, 0.02) (`rep100-e1`) the run looked like `rep100`.
- **A toy warm-up at one copy distance teaches a positional shortcut, not induction.** On
  `[BOS] r r` at 128 tokens with |r| = 64 (`toy128`) the training loss fell from ln 4096 = 8.32
  to 4.20 by step 400 (the second copy predicted), yet the 512-token probe (halves of 150)
  found nothing, and nothing carried over to text: a head that attends 64 tokens back solves a
  fixed-length task, and its "induction stripe" is the same diagonal.
- **With copy distances varied per context, the pure toy task has a long plateau at this
  size.** Ids 1-4095 at 128 tokens (`toyonly`): the training loss stayed at ln 4096 = 8.32 for
  all 3,000 steps (12.3M tokens). Ids 1-255 (`toyonly-v256`): at ln 255 = 5.54 for 1,500
  steps. The bundled toy models' task, 26 letters in 41-token contexts (`toyonly-v27`), inside
  this model: 3.26 (ln 26) to 2.77 in 1,000 steps, no sharp phase change (the toy models,
  d_model 64 with a second-copy loss mask, learn it in 1,500 steps of 32 contexts).

Runs keep their checkpoints outside the work tree (RUNS above), so a run continues in the next
session when the machine is kept (this session's were). `text-mha-l2` took 1.35 CPU-hours
for its 41M tokens (its card); the other variants' costs per token relative to MHA are in
[benchmarks.md](benchmarks.md)."""


def calibration_numbers(traj: pd.DataFrame) -> dict | None:
    """The numbers CALIBRATION_FINDINGS quotes, from the trajectories (None when a run it
    quotes is not among them)."""
    from attnlens.lab.calibration import onset_table

    runs = onset_table(traj).set_index("run")
    mixes = [f"text-mha-l2-{m}" for m in ("rep50", "rep100", "rep100-long", "rand50",
                                           "rand50-long")]
    if not {"text-mha-l2-ctx256", "text-mha-l2", "text-mha-l2-v1", *mixes} <= set(runs.index):
        return None
    ctx, cur = runs.loc["text-mha-l2-ctx256"], runs.loc["text-mha-l2"]
    ctx_log = traj[traj.run == "text-mha-l2-ctx256"].sort_values("tokens")
    first = ctx_log[ctx_log.induction_score >= INDUCTION_THRESHOLD].tokens.min()
    return {"ctx256_score": ctx.best_induction_score, "ctx256_ratio": ctx.lowest_copy_loss_ratio,
            "ctx256_text": ctx.lowest_text_copy_ratio, "ctx256_first": first / 1e6,
            "cur_score": cur.best_induction_score, "cur_ratio": cur.lowest_copy_loss_ratio,
            "cur_text": cur.lowest_text_copy_ratio, "cur_val": cur.last_val_loss,
            "v1_val": runs.loc["text-mha-l2-v1", "last_val_loss"],
            "mix_score": runs.loc[mixes, "best_induction_score"].max(),
            "mix_ratio": runs.loc[mixes, "lowest_copy_loss_ratio"].min()}


# Calibration rows of runs under a zoo recipe's name trained before the recipe changed (the
# context curriculum of 2026-11-27) carry this suffix in calibration.csv.
LEGACY_SUFFIX = "-v1"


def _run_recipe(name: str):
    """`(recipe, train config, n_ctx, legacy)` of a calibration run (a "-v1" run is its
    recipe's first version), or None for a run without a recipe."""
    from attnlens.lab.text_recipes import ARCH, get_recipe, train_config

    try:
        recipe = get_recipe(name.removesuffix(LEGACY_SUFFIX))
    except ValueError:
        return None
    n_ctx = {**ARCH, **(recipe.arch_overrides or {})}["n_ctx"]
    return recipe, train_config(recipe.train_overrides), n_ctx, name.endswith(LEGACY_SUFFIX)


def run_budget_tokens(name: str) -> int | None:
    """The tokens a calibration run's recipe trains for (None for a run without a recipe), so a
    finished run that never met the bar reads "not met" rather than "not yet". Every curriculum
    stage keeps the tokens per step (16 x 256 = 8 x 512); the zoo's first recipe ("-v1") was
    ZOO_TRAIN at n_ctx 512."""
    from attnlens.lab.text_recipes import ARCH, ZOO_TRAIN

    found = _run_recipe(name)
    if found is None:
        return None
    _, tcfg, n_ctx, legacy = found
    if legacy:
        return ZOO_TRAIN["steps"] * ZOO_TRAIN["batch_size"] * ARCH["n_ctx"]
    return tcfg.steps * tcfg.batch_size * n_ctx


def run_setup(name: str) -> str:
    """What a calibration run trains on, in a few words, from its recipe ("-" if none)."""
    from attnlens.lab.text_recipes import ZOO_TRAIN

    found = _run_recipe(name)
    if found is None:
        return "-"
    recipe, tcfg, n_ctx, legacy = found
    mix = dict(recipe.data_mix or {})
    schedule = mix.pop("ctx_schedule", ())
    if legacy:
        parts, schedule = [f"{recipe.shape}, 16 x 512 (the zoo's first recipe, 2026-11-25)"], ()
    else:
        parts = [" then ".join([f"{tcfg.batch_size * n_ctx // ctx} x {ctx} for {steps:,} steps"
                                for steps, ctx in schedule] + [f"{tcfg.batch_size} x {n_ctx}"])]
        parts[0] = f"{recipe.shape}, {parts[0]}"
        if tcfg.lr != ZOO_TRAIN["lr"]:
            parts.append(f"lr {tcfg.lr:g} (the zoo's: {ZOO_TRAIN['lr']:g})")
        if tcfg.cooldown:
            parts.append(f"lr decayed over the last {tcfg.cooldown:,} steps")
    if mix.get("toy_schedule"):
        phases = ", ".join(f"{steps} at {ctx}" for steps, ctx in mix["toy_schedule"])
        parts.append(f"toy `[BOS] r r` steps first ({phases} tokens; "
                     f"{mix.get('toy_copy', 'varied')} copy distance)")
    if mix.get("repeat_fraction"):
        lo, hi = mix["span"]
        kind = "random-token" if mix.get("span_tokens") == "random" else "text"
        parts.append(f"{mix['repeat_fraction']:.0%} of contexts with a {kind} span of "
                     f"{lo}-{hi} tokens repeated")
    if recipe.embed_std is not None:
        parts.append(f"W_E ~ N(0, {recipe.embed_std:g})")
    if not recipe.data_mix or set(recipe.data_mix) == {"ctx_schedule"}:
        parts.append("natural text")
    if recipe.corpus == "stdlib+packages":
        parts.append("the standard library, then the pinned distributions' sources "
                     "(10x the text)")
    return "; ".join(parts)


def mta_calibration_text(traj: pd.DataFrame, run: str = "text-mta-l2") -> str | None:
    """What `run`'s trajectory shows (None when it is not among them): the evaluation where
    its copy ratio first fell below the bar and the one before, and its pattern-stage score,
    which for MTA is not a distribution."""
    log = traj[traj.run == run].sort_values("tokens").reset_index(drop=True)
    met = log.index[log.copy_loss_ratio < COPY_RATIO_THRESHOLD]
    if log.empty or not len(met) or met[0] == 0:
        return None
    before, at = log.loc[met[0] - 1], log.loc[met[0]]
    peak = log.loc[log.induction_score.idxmax()]
    last = log.iloc[-1]
    return (f"- **MTA copies from its first few million tokens.** `{run}` (the zoo's recipe): "
            f"its second-copy loss went from {before.copy_loss_ratio:.2f}x the first at "
            f"{before.tokens / 1e6:.1f}M tokens to {at.copy_loss_ratio:.2f}x at "
            f"{at.tokens / 1e6:.1f}M (held-out text read twice: {before.text_copy_ratio:.2f} "
            f"to {at.text_copy_ratio:.2f}), one evaluation apart, and ended at "
            f"{last.copy_loss_ratio:.2f}x, where MHA's head formed at 14-25M tokens and never "
            f"met the copy-ratio half of the bar. Its induction head is in layer 0, the "
            f"previous-token shift done by its key-query kernel "
            f"([circuit_discovery.md](circuit_discovery.md)). The "
            f"training log's score is read at the `pattern` stage, which for MTA is not a "
            f"distribution (the post-softmax head mixing scales each head's map, and the group "
            f"RMSNorm after it undoes the scale): it peaked at {peak.induction_score:.2f} at "
            f"{peak.tokens / 1e6:.1f}M tokens and drifted to {last.induction_score:.2f} while "
            f"the copying improved; the card also scores the `softmax` stage (see the "
            f"induction section below).")


def stdlib_share(zoo_dir: Path) -> float | None:
    """The standard library's share of a shipped `-pkgs` model's training stream, from its
    card (`extra_corpus`: `stdlib_train_tokens` / `tokens`); None when none is shipped."""
    for card in sorted(zoo_dir.glob("text-*-pkgs/card.json")):
        extra = json.loads(card.read_text()).get("extra_corpus") or {}
        if extra.get("tokens") and extra.get("stdlib_train_tokens") is not None:
            return extra["stdlib_train_tokens"] / extra["tokens"]
    return None


def corpus_calibration_text(traj: pd.DataFrame, share: float | None = None) -> str | None:
    """Each `text-{v}-l2-pkgs` run (the standard library, then the pinned packages' sources)
    beside its zoo twin `text-{v}-l2` (the standard library alone) at the tokens both have
    seen, with the standard library's `share` of that stream when given (`stdlib_share`); None
    when no pair is in `traj`."""
    from attnlens.lab.calibration import onset_table
    from attnlens.lab.text_recipes import PACKAGE_RECIPES

    lines, onsets = [], {}
    for name in sorted(PACKAGE_RECIPES):
        twin = name.removesuffix("-pkgs")
        ours, theirs = traj[traj.run == name], traj[traj.run == twin]
        if ours.empty or theirs.empty:
            continue
        upto = min(ours.tokens.max(), theirs.tokens.max())
        table = onset_table(traj[traj.run.isin([name, twin]) & (traj.tokens <= upto)])
        a, b = (table[table.run == r].iloc[0] for r in (name, twin))

        def first(log, upto=upto) -> float | None:
            reached = log[(log.tokens <= upto) & (log.induction_score >= INDUCTION_THRESHOLD)]
            return None if reached.empty else float(reached.tokens.min())

        def head(log) -> str:
            return _tokens_or_none(first(log))

        def met(row) -> str:
            return "not met" if pd.isna(row.induction_at_tokens) else \
                f"met at {row.induction_at_tokens / 1e6:.1f}M tokens"

        onsets[PACKAGE_RECIPES[name].variant] = (first(ours), first(theirs))
        partial = " (where the `-pkgs` run stood when this page was written)" \
            if ours.tokens.max() < theirs.tokens.max() else ""
        lines.append(
            f"`{name}` against `{twin}` over their first {upto / 1e6:.1f}M tokens{partial}: best "
            f"induction score {a.best_induction_score:.3f} against {b.best_induction_score:.3f}, "
            f"lowest copy ratio {a.lowest_copy_loss_ratio:.2f} / {a.lowest_text_copy_ratio:.2f} "
            f"against {b.lowest_copy_loss_ratio:.2f} / {b.lowest_text_copy_ratio:.2f} (random / "
            f"text), an induction score of {INDUCTION_THRESHOLD} first at {head(ours)} against "
            f"{head(theirs)}, bar {met(a)} against {met(b)}, validation loss "
            f"{a.last_val_loss:.3f} against {b.last_val_loss:.3f}")
    if not lines:
        return None
    return ("- **Ten times the text, none of it read twice.** The `-pkgs` twins train on the "
            "standard library followed by the installed distributions' sources (Corpus above"
            + ("" if share is None else f"; the standard library is {share:.0%} of that stream")
            + "), the zoo's recipe otherwise; one seed "
            "each, so single trajectories. " + "; ".join(lines) + ". The validation windows are "
            "the standard library's held-out files for both, text that is most of the zoo "
            "twin's training stream and a small part of the `-pkgs` run's."
            + _corpus_reading(onsets))


def _tokens_or_none(tokens: float | None) -> str:
    return "none" if tokens is None else f"{tokens / 1e6:.1f}M tokens"


def _corpus_reading(onsets: dict[str, tuple[float | None, float | None]]) -> str:
    """What the pairs say together (`onsets`: `{variant: (tokens at the first score of 0.3
    with the packages, without)}`, None for never): the variants that formed a head only on the
    larger corpus, beside those that formed one on both (and whether at about the same point:
    within 20% of each other's tokens)."""
    only_more = sorted(v for v, (ours, theirs) in onsets.items()
                       if ours is not None and theirs is None)
    both = sorted(v for v, (ours, theirs) in onsets.items() if None not in (ours, theirs))
    if not only_more or not both:
        return ""
    alike = all(abs(a - b) <= 0.2 * min(a, b) for a, b in (onsets[v] for v in both))
    return (f" Read together, one seed each: {', '.join(only_more)} formed an induction head "
            f"only on the larger corpus, while {', '.join(both)} formed one on both"
            + (" at about the same point" if alike else "") + " ("
            + "; ".join(f"{v}: {_tokens_or_none(onsets[v][0])} against "
                        f"{_tokens_or_none(onsets[v][1])}" for v in both)
            + "): the larger corpus, at the same tokens, is what "
            f"{' and '.join(only_more)} lacked.")


def calibration_section(studies: Path, out: Path, share: float | None = None) -> list[str]:
    """The calibration table (and figure) from `studies/calibration.csv`, if it exists; `share`
    is the standard library's share of the `-pkgs` stream (`stdlib_share`)."""
    path = studies / "calibration.csv"
    if not path.is_file():
        return []
    from attnlens.lab.calibration import onset_table

    traj = pd.read_csv(path)
    table = onset_table(traj)
    rows = ["| run | trained on | tokens seen | bar met at | best induction score | "
            "lowest copy ratio (random / text) | last val loss |",
            "|-----|------------|-------------|------------|----------------------|"
            "-------------------------------|---------------|"]
    for r in table.itertuples():
        budget = run_budget_tokens(r.run)
        met = (f"{r.induction_at_tokens / 1e6:.1f}M tokens" if not pd.isna(r.induction_at_tokens)
               else "not met" if budget and r.tokens_seen >= budget else "not yet")
        rows.append(f"| `{r.run}` | {run_setup(r.run)} | {r.tokens_seen / 1e6:.1f}M | {met} | "
                    f"{r.best_induction_score:.3f} | {r.lowest_copy_loss_ratio:.2f} / "
                    f"{r.lowest_text_copy_ratio:.2f} | {r.last_val_loss:.3f} |")
    numbers = calibration_numbers(traj)
    findings = [CALIBRATION_FINDINGS.format(**numbers), ""] if numbers else []
    for text in (mta_calibration_text(traj), corpus_calibration_text(traj, share)):
        findings += [text, ""] if text else []
    return ["### Calibration", "", CALIBRATION_INTRO, "", *rows,
            figure_markdown(studies, out, "calibration"), "", *findings,
            figure_markdown(studies, out, "calibration_curriculum")]
