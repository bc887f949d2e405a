"""Save each paper-task checkpoint's tokenizer with it (issue 22 item 1), weights unchanged.

The word-vocabulary tasks (counting, Flip-Flop, selective copy, conjunction, composition,
passkey) kept their vocabularies in `attnlens.interp.tasks`; this writes them as the checkpoint's
`tokenizer.json` through `save_checkpoint` (one atomic transaction per checkpoint: the weights'
metadata records the tokenizer's hash). The tensors are written back in the dtype they were
stored in and checked bit for bit; config.json and card.json must come out unchanged.
Find-the-block checkpoints already carry their characters (`tokenizer_alphabet`).

    python scripts/attach_task_tokenizers.py            # every paper-task checkpoint
    python scripts/attach_task_tokenizers.py --check    # only report which lack one
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from attnlens.hooked_models import zoo
from attnlens.hooked_models.checkpoint import (
    CARD_FILE,
    CONFIG_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    read_weights,
    save_checkpoint,
)
from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.interp.tasks.prompts import task_tokenizer


def attach(name: str) -> str:
    directory = zoo.path(name)
    card = json.loads((directory / CARD_FILE).read_text())
    before = {f: (directory / f).read_text() for f in (CONFIG_FILE, CARD_FILE)}
    state, _ = read_weights(directory / WEIGHTS_FILE)
    model = HookedVariantTransformer.from_pretrained(directory, device="cpu")
    if model.tokenizer is not None:
        return "has one"
    model.tokenizer = task_tokenizer(card["task_args"])
    if model.tokenizer.vocab_size != model.cfg.d_vocab:
        raise ValueError(f"{name}: tokenizer has {model.tokenizer.vocab_size} words, the model "
                         f"{model.cfg.d_vocab} ids")
    dtypes = {v.dtype for v in state.values() if v.is_floating_point()}
    if len(dtypes) != 1:
        raise ValueError(f"{name}: weights in several dtypes {dtypes}")
    save_checkpoint(model, directory, card=card, weights_dtype=dtypes.pop())
    after, _ = read_weights(directory / WEIGHTS_FILE)
    if after.keys() != state.keys() or not all(
            after[k].dtype == state[k].dtype and torch.equal(after[k], state[k]) for k in state):
        raise RuntimeError(f"{name}: the weights changed")
    for f, text in before.items():   # only config fields added since, at their None default
        old, new = json.loads(text), json.loads((directory / f).read_text())
        if {k: v for k, v in new.items() if k in old or v is not None} != old:
            raise RuntimeError(f"{name}: {f} changed")
    return "tokenizer saved"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    missing = 0
    for name in zoo.available("paper-task"):
        directory = zoo.path(name)
        has = (directory / TOKENIZER_FILE).is_file() or json.loads(
            (directory / CONFIG_FILE).read_text()).get("tokenizer_alphabet")
        if args.check:
            missing += not has
            print(f"{name}: {'ok' if has else 'NO TOKENIZER'}")
        elif not has:
            print(f"{name}: {attach(name)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
