"""The tokenizer and an example prompt of each toy task, for the models trained on it.

A paper-task checkpoint (`hooked_models/zoo/<cope|dcmha|infini|mta>-*`) names its task in its
card (`task_args`); `task_tokenizer` builds the tokenizer its task reads (a word vocabulary, the
passkey tokenizer, or find-the-block's characters), and `example_prompt` draws one example of
the task with a fixed seed, as text that this tokenizer reads (BOS left out: `to_tokens` adds
it). The dashboard shows that example by default.

Example:
    >>> card = {"task_args": {"task": "counting", "n_vars": 3}}
    >>> tok = task_tokenizer(card["task_args"])
    >>> text = example_prompt(card)
    >>> text.split()[-3], len(tok.encode(text)) > 3
    ('print', True)
"""

from __future__ import annotations

EXAMPLE_SEED = 0
# The passkey prompt's words: a run of letters, one digit, or one of the marks "." and "?"
# (`PasskeyTokenizer._split` on every text of the task).
PASSKEY_PATTERN = r"\d|[.?]|[^\s\d.?]+"


def _family(task_args: dict) -> str:
    if "task" in task_args:
        return task_args["task"]
    if "block_length" in task_args:
        return "findblock"
    if "length" in task_args or "lengths" in task_args:
        return "passkey"
    raise ValueError(f"task_args {task_args!r} name no known task")


def task_tokenizer(task_args: dict):
    """The tokenizer of the task in `task_args` (a card's or recipe's `task_args`)."""
    from attnlens.hooked_models.tokenizers.vocab import WordTokenizer

    family = _family(task_args)
    if family in ("counting", "flipflop", "selcopy"):
        from attnlens.interp.tasks._batch import PAD
        from attnlens.interp.tasks.counting import VOCAB as COUNTING
        from attnlens.interp.tasks.flip_flop import VOCAB as FLIP_FLOP
        from attnlens.interp.tasks.selective_copy import VOCAB as SELCOPY

        vocab = {"counting": COUNTING, "flipflop": FLIP_FLOP, "selcopy": SELCOPY}[family]
        return WordTokenizer(vocab, pad_token=PAD)
    if family == "conjunction":
        from attnlens.interp.tasks.conjunction import conjunction_vocab

        return WordTokenizer(conjunction_vocab())
    if family == "composition":
        from attnlens.interp.tasks.composition import CompositionVocab

        return WordTokenizer(CompositionVocab().words, pad_token="<pad>")
    if family == "passkey":
        from attnlens.interp.tasks.passkey import PasskeyTokenizer

        return WordTokenizer(PasskeyTokenizer().words, pattern=PASSKEY_PATTERN)
    if family == "findblock":
        return _find_block(task_args).tokenizer()
    raise ValueError(f"no tokenizer for task {family!r}")


def _find_block(task_args: dict):
    from attnlens.interp.tasks.find_block import FindBlockTask

    return FindBlockTask(**task_args)


def _without_bos(words: str) -> str:
    return words[len("<bos>"):].lstrip() if words.startswith("<bos>") else words


def example_prompt(card: dict, seed: int = EXAMPLE_SEED) -> str:
    """One example of the card's task (prompt and answer), drawn with `seed`."""
    args = dict(card.get("task_args") or {})
    family = _family(args)
    if family == "counting":
        from attnlens.interp.tasks.counting import counting_batch

        return counting_batch(1, n_vars=args.get("n_vars", 1), min_steps=3, max_steps=32,
                              seed=seed).texts[0]
    if family == "flipflop":
        from attnlens.interp.tasks.flip_flop import flip_flop_batch

        return flip_flop_batch(1, n_instructions=32, seed=seed).texts[0]
    if family == "selcopy":
        from attnlens.interp.tasks.selective_copy import selective_copy_batch

        return selective_copy_batch(1, n_data=6, n_blanks=32, seed=seed).texts[0]
    if family == "conjunction":
        from attnlens.interp.tasks.conjunction import conjunction_task

        b = conjunction_task(1, seed=seed)
        return _without_bos(" ".join(b.vocab[int(i)] for i in b.tokens[0]))
    if family == "composition":
        from attnlens.interp.tasks.composition import composition_task

        b = composition_task(1, kind="mixed", n_statements=3, seed=seed)
        return _without_bos(b.texts[0]) + " " + b.answers[0]
    if family == "passkey":
        from attnlens.interp.tasks.passkey import PasskeyTokenizer, passkey_task

        tok = PasskeyTokenizer()
        length = args.get("length") or min(args["lengths"])
        b = passkey_task(1, length, 0.5, tok, seed=seed)
        return _without_bos(tok.decode(b.tokens[0]))
    if family == "findblock":
        sample = _find_block(args).generate(1, seed=seed)[0]
        return sample.text + sample.label
    raise ValueError(f"no example prompt for task {family!r}")


__all__ = ["EXAMPLE_SEED", "example_prompt", "task_tokenizer"]
