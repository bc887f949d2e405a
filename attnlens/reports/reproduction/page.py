"""docs/reproduction.md, generated from the paper-task cards (and figures as PNG beside it).

    python -m attnlens.lab.paper report

For every phenomenon the report quotes the paper's claim (`CLAIMS` of its module), shows our
numbers from the shipped cards (`report_section(cards, figure_dir)` of the module's report
module, e.g. `reproduction.mta` for `zoo.paper.mta`, found by `report_module`; a plain table
of metrics where there is none), adds our reading (its `reading(phenomenon, cards)`, prose
whose every number is computed from the same cards as the tables) and lists the recipes not
trained yet with the command that trains them. Every claim carries its number of seeds and an
interval (`describe`: mean and 95% t-interval over seeds; "1 seed, no interval" otherwise); no
number of ours is typed in by hand, and tests/test_paper_report.py rebuilds the report from the
cards.

Runs trained to early stopping (issue 24's -long/-full recipes) stop at a different step on
each seed: the report treats all of a group's early-stopped seeds as one budget (`budget_of`),
pools them in every mean, interval and comparison, lists each run's steps, stop and time
(`runs_table`) and states the CPU-hours spent (`budget_spent`); fixed-step groups are compared
per step count as before (tests/test_paper_report_long.py).

Figures are PNGs written with kaleido (the `report` extra). Where kaleido is missing the PNGs
already there are kept; `figures.json` beside them records the eval seed each was drawn from,
and the report says so under any figure that predates the cards' evaluation.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from pathlib import Path

from attnlens.hooked_models.zoo import ZOO_DIR
from attnlens.interp.plots.png import write_png
from attnlens.lab.paper import superseded
from attnlens.lab.paper._registry import modules
from attnlens.lab.paper._training import CLI, EVAL_SEED, KIND

ROOT = Path(__file__).resolve().parents[3]
REPORT = ROOT / "docs" / "reproduction.md"
FIGURES = ROOT / "docs" / "figures" / "reproduction"
MANIFEST = "figures.json"   # figure name -> the eval seed of the cards it was drawn from
# Set by build_report: whether save_png may (try to) draw; figures it could not draw.
_DRAW = {"enabled": True, "kept": []}


def shipped_cards() -> dict[str, dict]:
    """The cards of every shipped paper-task model, by recipe name."""
    out = {}
    for d in sorted(ZOO_DIR.iterdir()):
        path = d / "card.json"
        if path.is_file():
            card = json.loads(path.read_text())
            if card.get("kind") == KIND:
                out[card["recipe"]] = card
    return out


def pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def mean_std(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, s


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean over seeds and its two-sided t-interval (needs 2+ values)."""
    from scipy.stats import t

    if len(values) < 2:
        raise ValueError(f"a t-interval needs at least 2 values, got {len(values)}")
    m, s = mean_std(values)
    half = float(t.ppf(0.5 + level / 2, len(values) - 1)) * s / math.sqrt(len(values))
    return m, m - half, m + half


def welch_interval(a: list[float], b: list[float],
                   level: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): Welch's t-interval of the difference of the means."""
    from scipy.stats import t

    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    va, vb = sa ** 2 / len(a), sb ** 2 / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return ma - mb, ma - mb, ma - mb
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(t.ppf(0.5 + level / 2, df)) * se
    return ma - mb, ma - mb - half, ma - mb + half


def acc3(x: float) -> str:
    return f"{x:.3f}"


def acc2(x: float) -> str:
    return f"{x:.2f}"


def _clip(x: float, clip) -> float:
    return x if clip is None else min(max(x, clip[0]), clip[1])


def describe(values: list[float], fmt=pct, per_seed: bool = True, clip=(0.0, 1.0)) -> str:
    """A value over seeds as the report states it: with one seed `"7.4 (1 seed, no
    interval)"`; with more, the mean, its 95% t-interval and the seeds' values
    (`"32.2, 95% t-interval 27.1 to 37.3 over 3 seeds (30.1 / 33.4 / 33.0)"`). `fmt` formats
    a value (default `pct`: a fraction as a percentage with one decimal, as in the tables);
    the interval is clipped to `clip`, the metric's range (None: no clipping)."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{fmt(values[0])} (1 seed, no interval)"
    m, lo, hi = t_interval(values)
    lo, hi = _clip(lo, clip), _clip(hi, clip)
    seeds = f" ({' / '.join(fmt(v) for v in values)})" if per_seed else ""
    return f"{fmt(m)}, 95% t-interval {fmt(lo)} to {fmt(hi)} over {len(values)} seeds{seeds}"


def short(values: list[float], fmt=pct, clip=(0.0, 1.0)) -> str:
    """A table cell: one seed's value, or `mean [low, high] (n=k)` over k seeds (the 95%
    t-interval, clipped to `clip`)."""
    if len(values) == 1:
        return fmt(values[0])
    m, lo, hi = t_interval(values)
    lo, hi = _clip(lo, clip), _clip(hi, clip)
    return f"{fmt(m)} [{fmt(lo)}, {fmt(hi)}] (n={len(values)})"


def span(values: list[float], fmt=pct) -> str:
    """`"a-b"` (min-max), or one value when they are equal once formatted; "-" for none (a
    group whose runs have not all finished)."""
    if not values:
        return "-"
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


EARLY_STOP = "early stopping"   # the budget of runs trained to early stopping


def early_stopped(card: dict) -> bool:
    """Whether `card`'s run was trained to early stopping: its `steps` is where that seed
    stopped (or the ceiling `train["steps"]`), not a budget shared with the other seeds."""
    return bool(card.get("train", {}).get("early_stop_patience")) or "stopped_early" in card


def budget_of(card: dict) -> int | str:
    """The budget a card's run was trained at, the unit the report compares and pools seeds
    in: its step count for a fixed-step run, `EARLY_STOP` for every early-stopped run (each
    seed stops at its own step, and all of them form one group)."""
    return EARLY_STOP if early_stopped(card) else card.get("steps", 0)


def budgets(cards: list[dict]) -> list:
    """The cards' budgets, fixed step counts in increasing order, then `EARLY_STOP`."""
    found = {budget_of(c) for c in cards}
    return sorted(b for b in found if b != EARLY_STOP) + [EARLY_STOP] * (EARLY_STOP in found)


def stopping_text(cards: list[dict]) -> str:
    """Where early-stopped runs ended, e.g. `"steps taken 1750-4250 of a 20000-step ceiling;
    5 of 6 runs stopped early, 1 hit the ceiling"`."""
    steps = [c["steps"] for c in cards]
    ceilings = sorted({c.get("train", {}).get("steps", max(steps)) for c in cards})
    stopped = sum(bool(c.get("stopped_early")) for c in cards)
    at_ceiling = sum(not c.get("stopped_early") and c["steps"] >= c.get("train", {}).get(
        "steps", c["steps"]) for c in cards)
    text = (f"steps taken {span(steps, fmt=str)} of a "
            f"{'/'.join(map(str, ceilings))}-step ceiling; {stopped} of {len(cards)} "
            f"run{'s' * (len(cards) > 1)} stopped early")
    return text + (f", {at_ceiling} hit the ceiling" if at_ceiling else "")


def _stop_cell(card: dict) -> str:
    ceiling = card.get("train", {}).get("steps")
    if card.get("stopped_early"):
        patience = card.get("train", {}).get("early_stop_patience")
        return "stopped early" + (f" (patience {patience})" if patience else "")
    if ceiling is not None and card["steps"] >= ceiling:
        return f"no: hit the {ceiling}-step ceiling"
    return "no"


def runs_table(cards: list[dict], label=lambda c: c.get("variant")) -> str:
    """One row per run: `label(card)`, seed, steps taken, whether it stopped early (or hit
    the ceiling), training wall time and process CPU time in minutes ("-" for cards that
    predate `cpu_seconds`; on a shared machine the wall time also counts the time the run
    waited for a core) and the device."""
    def cpu(card):
        seconds = card.get("cpu_seconds")
        return "-" if seconds is None else f"{seconds / 60:.0f}"

    rows = [[label(c), c.get("seed"), c.get("steps"), _stop_cell(c),
             f"{c.get('train_seconds', 0) / 60:.0f}", cpu(c), c.get("device", "-")]
            for c in cards]
    return markdown_table(["model", "seed", "steps taken", "stopped early", "wall time (min)",
                           "CPU time (min)", "device"], rows)


def _threads(device: str) -> int | None:
    """The thread count of a CPU device string (`"cpu (2 threads)"` -> 2), else None."""
    import re

    found = re.fullmatch(r"cpu \((\d+) threads?\)", device or "")
    return int(found.group(1)) if found else None


def budget_spent(cards: list[dict]) -> str:
    """The training budget the cards spent: the sum of their process CPU times
    (`cpu_seconds`, counted across resumed pieces) in CPU-hours when every card has one, else
    of their wall times (`train_seconds`), with the devices, and core-hours (wall time x
    threads) when a run used several."""
    hours = sum(c.get("train_seconds", 0) for c in cards) / 3600
    devices = ", ".join(sorted({c.get("device", "?") for c in cards}))
    threads = [_threads(c.get("device", "")) for c in cards]
    n = f"{len(cards)} runs'" if len(cards) > 1 else "1 run's"     # possessive
    if all("cpu_seconds" in c for c in cards):
        cpu = sum(c["cpu_seconds"] for c in cards) / 3600
        return (f"Budget spent: {cpu:.1f} CPU-hours of training (the sum of the {n} process "
                f"CPU times, `cpu_seconds`; {hours:.1f} hours of wall time) on {devices}.")
    if all(t is not None for t in threads):
        core = sum(c.get("train_seconds", 0) * t for c, t in zip(cards, threads,
                                                                  strict=True)) / 3600
        cores = f", {core:.1f} core-hours" if max(threads) > 1 else ""
        return (f"Budget spent: {hours:.1f} CPU-hours of training (the sum of the {n} wall "
                f"times, `train_seconds`) on {devices}{cores}.")
    return (f"Budget spent: {hours:.1f} hours of training (the sum of the {n} wall times, "
            f"`train_seconds`) on {devices}.")


def separated(a: list[float], b: list[float]) -> str | None:
    """`"below"` / `"above"` when the 95% t-intervals of `a` and `b` over seeds do not overlap
    (a's high end under b's low end, or the reverse), None when they overlap or a side has
    fewer than 2 seeds (no interval)."""
    if min(len(a), len(b)) < 2:
        return None
    (_, a_lo, a_hi), (_, b_lo, b_hi) = t_interval(a), t_interval(b)
    return "below" if a_hi < b_lo else "above" if a_lo > b_hi else None


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _manifest(figure_dir: Path) -> dict:
    path = Path(figure_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def _can_draw() -> bool:
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return True


def save_png(fig, name: str, figure_dir: Path) -> str:
    """Write `fig` as `figure_dir/name.png` (when drawing is on and kaleido is installed) and
    return the Markdown image link (relative to docs/). A figure that could not be drawn keeps
    its previous PNG, and the link says when that PNG predates the cards' eval seed."""
    figure_dir = Path(figure_dir)
    path = figure_dir / f"{name}.png"
    manifest = _manifest(figure_dir)
    if _DRAW["enabled"] and _can_draw():
        figure_dir.mkdir(parents=True, exist_ok=True)
        fig.update_layout(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50))
        write_png(fig, path, width=fig.layout.width or 800, height=fig.layout.height or 420)
        manifest[name] = EVAL_SEED
        (figure_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    elif _DRAW["enabled"]:
        _DRAW["kept"].append(name)
    if not path.is_file():
        return f"*Figure `{name}` not drawn (kaleido is not installed).*"
    link = f"![{name}]({Path(os.path.relpath(path, REPORT.parent)).as_posix()})"
    if manifest.get(name) != EVAL_SEED:
        link += ("\n\n*This figure was drawn from an earlier evaluation (before the held-out "
                 f"eval seed {EVAL_SEED}) and not redrawn (kaleido was not installed): the "
                 "table above is current.*")
    return link


def generic_section(cards: list[dict]) -> str:
    """A table of every card's metrics (for modules without a report module)."""
    keys = sorted({k for c in cards for k in c["metrics"]})
    rows = [[c["recipe"], c["variant"], c["seed"], c["steps"],
             *(c["metrics"].get(k, "-") for k in keys)] for c in cards]
    return markdown_table(["model", "variant", "seed", "steps", *keys], rows)


def _phenomena(mod) -> dict[str, list]:
    out: dict[str, list] = {}
    for recipe in mod.RECIPES.values():
        out.setdefault(recipe.phenomenon, []).append(recipe)
    return out


def eval_seed_text(cards: dict[str, dict]) -> str:
    seeds = sorted({c.get("eval_seed") for c in cards.values()}, key=str)
    if seeds == [EVAL_SEED]:
        return (f"Every model was evaluated on held-out data drawn from eval seed {EVAL_SEED}, "
                "which no training run used (a test replays every training batch's seed and "
                "checks).")
    return (f"The cards were evaluated on eval seeds {', '.join(map(str, seeds))}; the "
            f"current held-out eval seed is {EVAL_SEED}: re-run `{CLI} eval NAME --write`.")


def report_module(mod):
    """The module that writes `mod`'s sections of the report: `attnlens.reports.reproduction.
    <name>` for the phenomenon module `attnlens.lab.paper.<name>` (its `report_section`,
    `reading` and optional `extra_sections`), or None where there is none (the report then
    shows a plain table)."""
    name = f"{__package__}.{mod.__name__.rsplit('.', 1)[-1]}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name:      # the report module exists but an import inside it fails
            raise
        return None


def build_report(figure_dir: Path = FIGURES, draw: bool = True,
                 cards: dict[str, dict] | None = None) -> str:
    """The Markdown of docs/reproduction.md from the shipped cards. With `draw`, figures are
    (re)drawn where kaleido is installed; without it nothing is written (the text is the same
    whenever the figures and their manifest are unchanged). `cards` defaults to
    `shipped_cards()`."""
    _DRAW.update(enabled=draw, kept=[])
    cards = shipped_cards() if cards is None else cards
    parts = [
        "# Reproduction: each paper's phenomenon on its own task",
        "",
        f"Generated by `{CLI} report` from the cards of the paper-task models in "
        "`hooked_models/zoo/` (issue 15). Every number below, in the tables and in the text, "
        f"is computed from the `metrics` field of a card, written by `{CLI} eval NAME --write` "
        "and re-checked by `tests/test_paper_zoo.py`; `tests/test_paper_report.py` rebuilds "
        "this page from the cards. " + eval_seed_text(cards) + " Every claim states its number "
        "of training seeds and an interval: the mean and its 95% t-interval over seeds, or "
        "\"1 seed, no interval\" where only one seed is trained (then no ordering of settings "
        "can be claimed from it). Our models are tiny and CPU-trained, so each section first "
        "states the paper's claim, then our numbers at our scale, then whether it reproduces. "
        "Error rates are in %.",
    ]
    for mod in modules().values():
        writer = report_module(mod)
        for phenomenon, recipes in _phenomena(mod).items():
            mine = [cards[r.name] for r in recipes if r.name in cards]
            missing = [r.name for r in recipes if r.name not in cards]
            parts += ["", f"## {phenomenon}", ""]
            claim = getattr(mod, "CLAIMS", {}).get(phenomenon)
            if claim:
                parts += [f"**Paper.** {claim}", ""]
            if mine:
                tasks = list(dict.fromkeys(r.task for r in recipes if r.name in cards))
                if len(tasks) == 1:
                    parts += [f"**Task here.** {tasks[0]}", ""]
                else:
                    parts += ["**Tasks here.**", "", *(f"- {t}" for t in tasks), ""]
                section = getattr(writer, "report_section", None)
                parts.append(section(mine, figure_dir) if section else generic_section(mine))
                # Early-stopped runs are listed by the section in a runs table followed by the
                # budget they spent (`budget_spent`); a section of fixed-step runs gets the sum
                # of its wall times here.
                if not all(early_stopped(c) for c in mine):
                    secs = sum(c["train_seconds"] for c in mine)
                    devices = sorted({c["device"] for c in mine})
                    plural = "s" * (len(mine) > 1)
                    parts += ["", f"{len(mine)} model{plural}, {secs / 60:.0f} min of training "
                                  f"(wall time) in all on {', '.join(devices)}."]
            else:
                parts.append("No model of this phenomenon is shipped yet.")
            reading = getattr(writer, "reading", None)
            note = reading(phenomenon, mine) if reading and mine else None
            if note:
                parts += ["", f"**Our reading.** {note}"]
            if missing:
                parts += ["", f"Not trained yet ({len(missing)}): `{CLI} train "
                              + " ".join(missing) + " --resume`"]
        # sections of results whose models live outside the paper zoo (the text zoo's)
        for title, text in getattr(writer, "extra_sections", lambda _: [])(figure_dir):
            parts += ["", f"## {title}", "", text]
    parts += ["", "## Superseded models", "", superseded_section(superseded.comparisons(cards))]
    return "\n".join(parts) + "\n"


def write_report(path: Path = REPORT, figure_dir: Path = FIGURES) -> Path:
    """Write the report (and its figures where kaleido is installed); returns its path."""
    import sys

    cards = shipped_cards()   # read once: for the page and for the zoo's superseded table
    text = build_report(figure_dir, draw=True, cards=cards)
    if _DRAW["kept"]:
        print(f"kaleido is not installed: kept the previous PNGs of {len(_DRAW['kept'])} "
              "figures (pip install -e '.[report]' to redraw them)", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if path == REPORT:   # the zoo's table goes with the committed report, not with a copy
        superseded.write(cards)
    return path


def superseded_section(table: dict[str, dict]) -> str:
    """docs/reproduction.md's list of the superseded models, from `comparisons`, and of the
    old models whose replacements do not score better (kept current)."""
    def value(t, side):
        x = t[side]
        shown = f"{100 * x:.1f}%" if t["score"].startswith("mean error") else f"{x:.3f}"
        return f"{shown} (n={t['seeds'][side == 'new']})"

    def rows(better):
        return [[f"`{old}`", ", ".join(f"`{n}`" for n in t["by"]), t["score"].split(" (")[0],
                 value(t, "old"), value(t, "new")]
                for old, t in table.items() if t["better"] == better]

    header = ["model", "replaced by", "score", "old", "new"]
    if not rows(True):
        text = "No model is superseded yet."
    else:
        text = ("The 1000-step models below stay in the zoo as the baselines of the sections "
                "above, but their larger-budget replacements score better (each side's mean "
                "over its shipped seeds; error: the mean over the splits both report, lower is "
                "better; accuracy: higher is better). `attnlens.hooked_models.zoo.load` warns "
                "when one "
                "is loaded and names its replacements; "
                "`attnlens.hooked_models.zoo.available(superseded=False)` leaves them out.\n\n"
                + markdown_table(header, rows(True)))
    if rows(False):
        text += ("\n\nNot superseded: these old models score better than (or as well as) "
                 "their larger-budget runs so far, so both stay current.\n\n"
                 + markdown_table(["model", "larger-budget runs", "score", "old", "new"],
                                  rows(False)))
    return text
