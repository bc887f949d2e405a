"""Per-layer transcoders for the zoo's MLP models: train (resumable, on the CPU), evaluate, ship.

    python -m attnlens.zoo.transcoders train text-mha-l4mlp     # ~15 CPU-minutes per model
    python -m attnlens.zoo.transcoders eval text-mha-l4mlp      # recompute the card's metrics
    python -m attnlens.zoo.transcoders status

Training data: the model's own training split (the standard library's train files, which the
zoo's text models were trained on), tokenised with the model's tokenizer, cut into windows of
`WINDOW` tokens. Files are drawn in a seeded order until `n_tokens` tokens are read. Evaluation:
the model's held-out validation windows (`eval_tokens.safetensors`, files the model and the
transcoders never trained on), first `EVAL_WINDOW` tokens of each.

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

from attnlens.training.corpus import Corpus
from attnlens.training.train_state import runs_root
from hooked_models import zoo
from hooked_models.checkpoint import read_weights
from hooked_models.tokenizers.bpe import encode_documents
from interp.sae.transcoder import TranscoderConfig
from interp.sae.transcoder_train import (
    collect_mlp_io,
    load_transcoders,
    replacement_loss,
    save_transcoders,
    train_transcoder,
    transcoder_metrics,
)

MLP_MODELS = ("text-mha-l4mlp", "text-dcmha-l4mlp", "text-mta-l4mlp", "text-cope-l4mlp",
              "text-infini-l4mlp")
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
    tensors, _ = read_weights(zoo.path(name) / "eval_tokens.safetensors")
    return tensors["val_windows"][:, :EVAL_WINDOW].long()


def evaluate(name: str, transcoders=None) -> dict:
    """The card's metrics of `name`'s transcoders (the shipped ones unless given) on the
    model's validation windows."""
    model = zoo.load(name)
    if transcoders is None:
        transcoders = load_transcoders(transcoder_dir(name), dtype=torch.float32)
    tokens = eval_windows(name)
    io = collect_mlp_io(model, tokens, layers=sorted(transcoders))
    layers = {}
    for layer, tc in sorted(transcoders.items()):
        layers[str(layer)] = {k: round(v, 4) if isinstance(v, float) else v
                              for k, v in transcoder_metrics(tc, *io[layer]).items()}
    losses = replacement_loss(model, transcoders, tokens)
    for layer, loss in losses["per_layer"].items():
        layers[str(layer)]["loss_increase"] = round(loss - losses["clean"], 4)
    return dict(layers=layers, clean_loss=round(losses["clean"], 4),
                all_layers_loss=round(losses["all"], 4),
                all_layers_loss_increase=round(losses["all"] - losses["clean"], 4),
                eval_tokens=int(tokens.numel()))


def train(name: str, progress: bool = True, **overrides) -> dict:
    """Train every layer's transcoder of zoo model `name`, ship them and their card."""
    settings = {**DEFAULTS, **overrides}
    model = zoo.load(name)
    run_dir = runs_root() / "transcoders" / name
    cpu0, wall0 = time.process_time(), time.time()
    tokens = training_windows(model, settings["n_tokens"], settings["seed"])
    io = collect_mlp_io(model, tokens, progress=progress)
    transcoders = {}
    for layer, (x, y) in io.items():
        cfg = TranscoderConfig(d_in=x.shape[1], d_sae=settings["d_sae"], d_out=y.shape[1],
                               activation=settings["activation"], k=settings["k"], layer=layer)
        transcoders[layer], _ = train_transcoder(
            x, y, cfg, steps=settings["steps"], lr=settings["lr"],
            batch_size=settings["batch_size"], seed=settings["seed"] + layer,
            checkpoint=run_dir / f"layer{layer}.safetensors", progress=progress)
    out = transcoder_dir(name)
    save_transcoders(transcoders, out)
    card = dict(model=name, settings=settings, training_tokens=int(tokens.numel()),
                window=WINDOW, corpus="python-stdlib train split (the model's own)",
                train_command=f"python -m attnlens.zoo.transcoders train {name}",
                eval_command=f"python -m attnlens.zoo.transcoders eval {name}",
                cpu_time_s=round(time.process_time() - cpu0, 1),
                wall_time_s=round(time.time() - wall0, 1),
                machine=f"{platform.machine()} CPU, torch {torch.__version__}, "
                        f"{torch.get_num_threads()} thread(s)",
                date=datetime.date.today().isoformat(), weights_dtype="float16")
    card["metrics"] = evaluate(name)   # from the shipped (fp16) weights
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
    parser = argparse.ArgumentParser(prog="python -m attnlens.zoo.transcoders",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="train, evaluate and ship a model's transcoders")
    p_train.add_argument("names", nargs="+", choices=MLP_MODELS)
    for key, value in DEFAULTS.items():
        if key != "activation":
            p_train.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    p_train.add_argument("--activation", choices=("topk", "jumprelu"), default="topk")
    p_eval = sub.add_parser("eval", help="recompute a model's transcoder metrics")
    p_eval.add_argument("names", nargs="+", choices=MLP_MODELS)
    sub.add_parser("status", help="which models have shipped transcoders or checkpoints")
    args = parser.parse_args(argv)
    if args.command == "status":
        for row in status():
            print(json.dumps(row))
        return 0
    for name in args.names:
        if args.command == "train":
            overrides = {k: getattr(args, k) for k in DEFAULTS}
            if overrides["activation"] == "jumprelu":
                overrides["k"] = None
            card = train(name, **overrides)
            print(json.dumps(card["metrics"], indent=2))
        else:
            print(json.dumps(evaluate(name), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
