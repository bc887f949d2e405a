"""Per-layer transcoders for the zoo's MLP models: train (resumable, on the CPU), evaluate, ship.

    python -m attnlens.lab.transcoders train text-mha-l4mlp     # ~11 CPU-minutes per model
    python -m attnlens.lab.transcoders eval text-mha-l4mlp      # recompute the card's metrics
                                                    # (--write: into the card)
    python -m attnlens.lab.transcoders status

Text models: the training data is the model's own training split (the standard library's train
files, which the zoo's text models were trained on), tokenised with the model's tokenizer, cut
into windows of `WINDOW` tokens; files are drawn in a seeded order until `n_tokens` tokens are
read. Evaluation: the model's held-out validation windows (`eval_tokens.safetensors`, files the
model and the transcoders never trained on), first `EVAL_WINDOW` tokens of each.

Paper-task models (`PAPER_MODELS`, e.g. CoPE's counting task): the data is the task's
in-distribution generator, batches seeded from `PAPER_DATA_SEED` (real tokens only, no
padding); evaluation on `EVAL_BATCHES` batches from the card's evaluation seed, which the
model's and the transcoders' training never drew. Their card also gives the task's answer
error with every MLP replaced.

Shipped next to the model: `transcoders/transcoders.safetensors` (fp16, every layer) and
`transcoders/card.json` (settings, per-layer explained variance, nmse, L0, dead features, the
loss with each transcoder in place of its MLP and with all of them, CPU time, machine, date).
Checkpoints of a running job live under `runs_root()/transcoders/<model>/`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from attnlens.hooked_models import zoo
from attnlens.hooked_models.tokenizers.bpe import encode_documents
from attnlens.interp.sae.transcoder import TranscoderConfig
from attnlens.interp.sae.transcoder_train import (
    collect_mlp_io,
    load_transcoders,
    replacement_loss,
    save_transcoders,
    train_transcoder,
    transcoder_hooks,
    transcoder_metrics,
)
from attnlens.interp.tools.text_eval import load_eval_tokens
from attnlens.training.corpus import Corpus
from attnlens.training.train_state import runs_root

TEXT_MODELS = ("text-mha-l4mlp", "text-dcmha-l4mlp", "text-mta-l4mlp", "text-cope-l4mlp",
               "text-infini-l4mlp")
PAPER_MODELS = ("cope-counting-3var-cope-long-s0",)
MLP_MODELS = TEXT_MODELS + PAPER_MODELS
PAPER_DATA_SEED = 7_000_000
EVAL_BATCHES = 4
PAPER_DEFAULTS = dict(d_sae=1024, k=8, steps=3000, n_tokens=150_000)
WINDOW = 256
EVAL_WINDOW = 256
DEFAULTS = dict(d_sae=2048, activation="topk", k=16, steps=4000, lr=1e-3, batch_size=1024,
                n_tokens=300_000, seed=0)


def transcoder_dir(name: str) -> Path:
    return zoo.path(name) / "transcoders"


def training_windows(model, n_tokens: int, seed: int) -> torch.Tensor:
    """`[n, WINDOW]` token windows of the model's training split (seeded file order)."""
    corpus = Corpus.from_stdlib()
    files = corpus.split_files("train")
    order = np.random.default_rng(seed).permutation(len(files))
    stream, total = [], 0
    for start in range(0, len(order), 64):
        chunk = [corpus.read(files[i]) for i in order[start:start + 64]]
        part = encode_documents(model.tokenizer, chunk)
        stream.append(part)
        total += len(part)
        if total >= n_tokens:
            break
    tokens = np.concatenate(stream)[: (min(total, n_tokens) // WINDOW) * WINDOW]
    return torch.from_numpy(tokens.astype(np.int64)).reshape(-1, WINDOW)


def eval_windows(name: str) -> torch.Tensor:
    return load_eval_tokens(zoo.path(name))[:, :EVAL_WINDOW]


def _paper_batch(name: str, seed: int, batch: int = 64):
    from attnlens.lab.paper._registry import get_recipe, module_of

    recipe = get_recipe(name)
    return module_of(recipe).task_batch(recipe.task_args, "id", batch, seed)


def paper_data(name: str, n_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, real-token mask) of task batches seeded from PAPER_DATA_SEED + seed * 10**4."""
    tokens, masks, total, i = [], [], 0, 0
    while total < n_tokens:
        b = _paper_batch(name, PAPER_DATA_SEED + seed * 10_000 + i)
        tokens.append(b.tokens)
        masks.append(b.attention_mask.bool())
        total += int(b.attention_mask.sum())
        i += 1
    width = max(t.shape[1] for t in tokens)
    pad = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tokens]
    mask = [torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in masks]
    return torch.cat(pad), torch.cat(mask)


def paper_eval_batches(name: str) -> list:
    card = json.loads((zoo.path(name) / "card.json").read_text())
    return [_paper_batch(name, int(card["eval_seed"]) + i) for i in range(EVAL_BATCHES)]


@torch.no_grad()
def paper_answer_error(model, transcoders, batches) -> dict:
    """The task's answer error (samples with any wrong answer) clean and with every MLP
    replaced by its transcoder."""
    from attnlens.interp.tasks._batch import answer_error_rate

    out = {}
    for key, fwd_hooks in (("clean", []), ("replaced", transcoder_hooks(transcoders))):
        errors = []
        for b in batches:
            with model.hooks(fwd_hooks=fwd_hooks):
                logits = model(b.tokens, attention_mask=b.attention_mask)
            errors.append(answer_error_rate(logits, b))
        out[key] = round(sum(errors) / len(errors), 4)
    return out


def evaluate(name: str, transcoders=None) -> dict:
    """The card's metrics of `name`'s transcoders (the shipped ones unless given) on the
    model's validation windows (text) or evaluation batches (paper task)."""
    model = zoo.load(name)
    if transcoders is None:
        transcoders = load_transcoders(transcoder_dir(name), dtype=torch.float32)
    if name in PAPER_MODELS:
        batches = paper_eval_batches(name)
        width = max(b.tokens.shape[1] for b in batches)
        tokens = torch.cat([torch.nn.functional.pad(b.tokens, (0, width - b.tokens.shape[1]))
                            for b in batches])
        mask = torch.cat([torch.nn.functional.pad(b.attention_mask.bool(),
                                                  (0, width - b.tokens.shape[1]))
                          for b in batches])
        # the loss of a task model is its answer tokens' (the rest is random program text)
        loss_mask = torch.cat([torch.nn.functional.pad(b.answer_mask.bool(),
                                                       (0, width - b.tokens.shape[1]))
                               for b in batches])
    else:
        tokens, mask = eval_windows(name), None
        loss_mask = None
    io = collect_mlp_io(model, tokens, layers=sorted(transcoders), mask=mask)
    layers = {}
    for layer, tc in sorted(transcoders.items()):
        layers[str(layer)] = {k: round(v, 4) if isinstance(v, float) else v
                              for k, v in transcoder_metrics(tc, *io[layer]).items()}
    losses = replacement_loss(model, transcoders, tokens, mask=loss_mask)
    for layer, loss in losses["per_layer"].items():
        layers[str(layer)]["loss_increase"] = round(loss - losses["clean"], 4)
    out = dict(layers=layers, loss_on="answer tokens" if loss_mask is not None else "all tokens",
               clean_loss=round(losses["clean"], 4),
               all_layers_loss=round(losses["all"], 4),
               all_layers_loss_increase=round(losses["all"] - losses["clean"], 4),
               eval_tokens=int(tokens.numel() if mask is None else mask.sum()))
    if name in PAPER_MODELS:
        out["answer_error"] = paper_answer_error(model, transcoders, paper_eval_batches(name))
    return out


def train(name: str, progress: bool = True, out_dir=None, **overrides) -> dict:
    """Train every layer's transcoder of zoo model `name`, ship them and their card (in the
    model's `transcoders/`, or `out_dir`)."""
    base = {**DEFAULTS, **(PAPER_DEFAULTS if name in PAPER_MODELS else {})}
    settings = {**base, **{k: v for k, v in overrides.items() if v is not None}}
    if settings["activation"] == "jumprelu":
        settings["k"] = None
    model = zoo.load(name)
    run_dir = runs_root() / "transcoders" / name
    cpu0, wall0 = time.process_time(), time.time()
    if name in PAPER_MODELS:
        tokens, mask = paper_data(name, settings["n_tokens"], settings["seed"])
        corpus = (f"the task's in-distribution generator, seeds {PAPER_DATA_SEED} + "
                  f"{settings['seed']} * 10**4 + i (real tokens only)")
    else:
        tokens, mask = training_windows(model, settings["n_tokens"], settings["seed"]), None
        corpus = "python-stdlib train split (the model's own)"
    io = collect_mlp_io(model, tokens, progress=progress, mask=mask)
    transcoders = {}
    for layer, (x, y) in io.items():
        cfg = TranscoderConfig(d_in=x.shape[1], d_sae=settings["d_sae"], d_out=y.shape[1],
                               activation=settings["activation"], k=settings["k"], layer=layer)
        transcoders[layer], _ = train_transcoder(
            x, y, cfg, steps=settings["steps"], lr=settings["lr"],
            batch_size=settings["batch_size"], seed=settings["seed"] + layer,
            checkpoint=run_dir / f"layer{layer}.safetensors", progress=progress)
    out = transcoder_dir(name) if out_dir is None else Path(out_dir)
    save_transcoders(transcoders, out)
    card = dict(model=name, settings=settings,
                training_tokens=int(tokens.numel() if mask is None else mask.sum()),
                window=WINDOW if mask is None else None, corpus=corpus,
                train_command=f"python -m attnlens.lab.transcoders train {name}",
                eval_command=f"python -m attnlens.lab.transcoders eval {name}",
                cpu_time_s=round(time.process_time() - cpu0, 1),
                wall_time_s=round(time.time() - wall0, 1),
                machine=f"{platform.machine()} CPU, torch {torch.__version__}, "
                        f"{torch.get_num_threads()} thread(s)",
                date=datetime.date.today().isoformat(), weights_dtype="float16")
    card["metrics"] = evaluate(name, load_transcoders(out, dtype=torch.float32))   # as shipped
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    return card


def status() -> list[dict]:
    rows = []
    for name in MLP_MODELS:
        card = transcoder_dir(name) / "card.json"
        run_dir = runs_root() / "transcoders" / name
        rows.append(dict(model=name, shipped=card.is_file(),
                         checkpoints=sorted(p.name for p in run_dir.glob("layer*.safetensors"))))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnlens.lab.transcoders",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="train, evaluate and ship a model's transcoders")
    p_train.add_argument("names", nargs="+", choices=MLP_MODELS)
    for key, value in DEFAULTS.items():
        if key != "activation":   # default None: the model kind's default (DEFAULTS, PAPER_...)
            p_train.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=None,
                                 help=f"default {value} (paper tasks: "
                                      f"{PAPER_DEFAULTS.get(key, value)})")
    p_train.add_argument("--activation", choices=("topk", "jumprelu"), default="topk")
    p_eval = sub.add_parser("eval", help="recompute a model's transcoder metrics")
    p_eval.add_argument("names", nargs="+", choices=MLP_MODELS)
    p_eval.add_argument("--write", action="store_true",
                        help="write the metrics into the shipped card")
    sub.add_parser("status", help="which models have shipped transcoders or checkpoints")
    args = parser.parse_args(argv)
    if args.command == "status":
        for row in status():
            print(json.dumps(row))
        return 0
    for name in args.names:
        if args.command == "train":
            overrides = {k: getattr(args, k) for k in DEFAULTS}
            card = train(name, **overrides)
            print(json.dumps(card["metrics"], indent=2))
        else:
            metrics = evaluate(name)
            print(json.dumps(metrics, indent=2))
            if args.write:
                path = transcoder_dir(name) / "card.json"
                card = json.loads(path.read_text())
                card["metrics"] = metrics
                path.write_text(json.dumps(card, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
