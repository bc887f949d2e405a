"""DCMHA vs MHA on text at equal tokens (issue 24 item 3): validation loss over seeds.

    python -m attnlens.lab.text_compare RELEASE_DIR [--zoo hooked_models/zoo] [--csv PATH]
        [--curves PATH]

The DCMHA paper's gains are in language-modelling loss at equal parameters and compute. Here:
the 2-layer attention-only text models (d_model 128, 4 heads of 32, vocabulary 4096; DCMHA has
1.9% more parameters, its dynamic-weight generator), trained on the same token stream.

- Three seeds of each at 10M tokens (`text-{mha,dcmha}-l2-short-s{0,1,2}`,
  `attnlens.lab.text_recipes.COMPARISON_RECIPES`: `attnlens train --zoo text --only ...` writes
  them to RELEASE_DIR), which measure the seed spread;
- the zoo's `text-mha-l2` and `text-dcmha-l2` (one seed each, 41M tokens), read from the zoo;
- when both are shipped, `text-mha-l2-pkgs` and `text-dcmha-l2-pkgs` (one seed each, 41M tokens
  of the standard library followed by the installed packages' sources, none of it read twice),
  the same pair without the repetition of 4.5 passes over the standard library.

Every model is evaluated on the same held-out windows (the zoo's stored validation windows,
`eval_tokens.safetensors` of `text-mha-l2`, cut to the context each was trained at last), and
DCMHA also with Compose knocked out (its dynamic weights zeroed: the same weights as plain MHA).
`--csv` writes one row per model and condition (`FIELDS`), `--curves` each run's validation
loss against tokens from its training log; the reproduction report reads both
(`attnlens.reports.reproduction.dcmha.extra_sections`) and a test recomputes the zoo models' rows.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import torch

from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.interp.tools.text_eval import chunk_losses, load_eval_tokens
from attnlens.interp.variants.dcmha import knockout_hooks

FIELDS = ("model", "variant", "seed", "steps", "tokens", "parameters", "ctx", "compose",
          "val_loss", "cpu_time_s")
CURVE_FIELDS = ("model", "variant", "seed", "step", "tokens", "val_loss")
SHORT = tuple(f"text-{v}-l2-short-s{s}" for s in (0, 1, 2) for v in ("mha", "dcmha"))
FULL = ("text-mha-l2", "text-dcmha-l2")
PKGS = ("text-mha-l2-pkgs", "text-dcmha-l2-pkgs")
GROUPS = ("short", "full", "pkgs")   # the 10M-token seeds, the zoo's pair, the package-corpus pair
WINDOWS_FROM = "text-mha-l2"       # whose stored validation windows every model is scored on


def window_losses(model, windows: torch.Tensor, fwd_hooks=(), batch: int = 8) -> torch.Tensor:
    """`[n_windows]` mean next-token loss of each window (every position after BOS)."""
    model.eval()
    return torch.cat([per.mean(-1).cpu() for per in chunk_losses(model, windows, batch,
                                                                   fwd_hooks)])


def trained_ctx(card: dict, model) -> int:
    """The context length a model's training ended at: its curriculum's last stage (the stage
    lengths of `ctx_schedule` are read against the steps it ran), else its n_ctx."""
    ctx = model.cfg.n_ctx
    elapsed = 0
    for steps, length in card.get("ctx_schedule") or ():
        elapsed += steps
        if card.get("steps", 0) <= elapsed:
            return int(length)
    return ctx


def read_card(directory) -> dict:
    return json.loads((Path(directory) / "card.json").read_text())


def model_rows(name: str, directory, windows: torch.Tensor, card: dict) -> list[dict]:
    """Rows of `FIELDS` for one released model (`card`: its card.json): validation loss at the
    context it ended training at (and at 256 when that is longer, to line up with the short
    runs), DCMHA also with Compose off."""
    directory = Path(directory)
    model = HookedVariantTransformer.from_pretrained(directory, device="cpu")
    variant = model.cfg.attention
    end_ctx = trained_ctx(card, model)
    if windows.shape[1] < end_ctx:
        raise ValueError(f"{name}: the validation windows have {windows.shape[1]} tokens, "
                         f"fewer than the {end_ctx} it was trained at")
    conditions = [("on", ())] + ([("off", knockout_hooks(model))] if variant == "dcmha" else [])
    rows = []
    for ctx in sorted({end_ctx, min(end_ctx, 256)}):
        for compose, hooks in conditions:
            loss = window_losses(model, windows[:, :ctx], hooks).mean()
            rows.append({"model": name, "variant": variant, "seed": card.get("seed", 0),
                         "steps": card["steps"], "tokens": card["tokens"],
                         "parameters": card["parameters"], "ctx": ctx, "compose": compose,
                         "val_loss": round(float(loss), 4),
                         "cpu_time_s": card.get("cpu_time_s")})
    return rows


def curve_rows(name: str, directory, card: dict) -> list[dict]:
    """Rows of `CURVE_FIELDS`: the validation loss each evaluation of the training log
    recorded (16 windows at the run's context of that moment)."""
    rows = []
    for line in (Path(directory) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "val_loss" in rec:
            rows.append({"model": name, "variant": name.split("-")[1],
                         "seed": card.get("seed", 0), "step": rec["step"],
                         "tokens": rec["tokens"], "val_loss": rec["val_loss"]})
    return rows


def group(model: str) -> str:
    """Which of `GROUPS` a comparison model belongs to, by its name."""
    return "short" if "-short-" in model else "pkgs" if model in PKGS else "full"


def find_models(release_dir, zoo_dir, partial: bool = False) -> dict[str, Path]:
    """`{name: directory}` of the comparison's models: the short runs in `release_dir`, the
    2-layer pair in `zoo_dir`, and the package-corpus pair in `zoo_dir` when both of it are
    shipped (one alone is left out, with a warning); a missing short run or zoo model is an
    error naming it. With `partial`, missing short runs are left out (a warning names them; the
    report then has fewer seeds), as long as each variant has one."""
    found = {n: Path(release_dir) / n for n in SHORT} | {n: Path(zoo_dir) / n for n in FULL}
    pkgs = {n: Path(zoo_dir) / n for n in PKGS}
    shipped = [n for n, d in pkgs.items() if (d / "card.json").is_file()]
    if len(shipped) == len(PKGS):
        found |= pkgs
    elif shipped:
        print(f"left out {shipped[0]}: its twin of the package-corpus pair is not shipped yet",
              file=sys.stderr)
    missing = [n for n, d in found.items() if not (d / "card.json").is_file()]
    if partial and not set(missing) & set(FULL):
        kept = {n: d for n, d in found.items() if n not in missing}
        if all(any(f"text-{v}-l2-short-" in n for n in kept) for v in ("mha", "dcmha")):
            if missing:
                print("left out (not released yet): " + ", ".join(missing), file=sys.stderr)
            return kept
    if missing:
        raise FileNotFoundError("not released yet: " + ", ".join(f"{n} ({found[n]})"
                                                                for n in missing)
                                + " (attnlens train --zoo text --only NAME)")
    return found


def write_csv(rows: list[dict], path, fields=FIELDS) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path) -> list[dict]:
    """Rows with numbers parsed back (the inverse of `write_csv`)."""
    ints = {"seed", "steps", "tokens", "parameters", "ctx", "step"}
    out = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            out.append({k: (int(v) if k in ints else float(v) if k in ("val_loss", "cpu_time_s")
                            and v not in ("", None) else v) for k, v in row.items()})
    return out


def losses(rows: list[dict], variant: str, of: str, compose: str = "on",
           ctx: int = 256) -> list[float]:
    """Validation losses of `variant`'s models in group `of` (`GROUPS`: "short" runs, the
    zoo's "full" model, the "pkgs" twin), at `ctx`."""
    if of not in GROUPS:
        raise ValueError(f"group {of!r}: choose from {GROUPS}")
    return [r["val_loss"] for r in rows if r["variant"] == variant and r["compose"] == compose
            and r["ctx"] == ctx and group(r["model"]) == of]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m attnlens.lab.text_compare",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("release_dir", help="where the short runs were released "
                        "(RUNS/release of attnlens train --zoo text)")
    parser.add_argument("--zoo", default="hooked_models/zoo", help="the zoo's directory")
    parser.add_argument("--csv", default="docs/figures/reproduction/dcmha-text-lm.csv")
    parser.add_argument("--curves", default="docs/figures/reproduction/dcmha-text-lm_curves.csv")
    parser.add_argument("--partial", action="store_true",
                        help="leave out the short runs not released yet (fewer seeds)")
    args = parser.parse_args(argv)
    models = find_models(args.release_dir, args.zoo, partial=args.partial)
    windows = load_eval_tokens(models[WINDOWS_FROM])
    rows, curves = [], []
    for name, directory in models.items():
        card = read_card(directory)
        rows += model_rows(name, directory, windows, card)
        curves += curve_rows(name, directory, card)
        print(name, [(r["ctx"], r["compose"], r["val_loss"]) for r in rows if r["model"] == name],
              flush=True)
    write_csv(rows, args.csv)
    write_csv(curves, args.curves, CURVE_FIELDS)
    print(args.csv, args.curves)


if __name__ == "__main__":
    main()
