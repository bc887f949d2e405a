"""The models a dashboard serves, by name, with a lock each and a guarded way from user text to
tokens. The browser only ever names a model of the store, never a path.

Example:
    >>> store = load_store(["induction-mha", "runs/my-ckpt"])     # doctest: +SKIP
    >>> prompt = store.prompt("induction-mha", "")                 # doctest: +SKIP
    >>> prompt.note
    'the prompt is empty: showing the default text'
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlens.interp.plots.views import shown_text

# Requests are refused before tokenising beyond this many characters: a tokenizer's memory
# grows with its input (a 50 MB prompt once cost 1.8 GB), while the largest context served
# is a few thousand tokens.
MAX_PROMPT_CHARS = 20_000
MAX_PROMPTS = 32             # prompts averaged at once (one per line)


@dataclass
class Prompt:
    """`tokens` `[batch pos]`, position `labels` ("3:c", "4:␣def", "5:↵": from the first
    prompt, spaces and line breaks shown), a `note` for the user ("" when nothing to say)."""

    tokens: torch.Tensor
    labels: list[str]
    note: str = ""


@dataclass
class ModelStore:
    """Named models (`HookedVariantTransformer`) plus each one's default input text."""

    models: dict = field(default_factory=dict)
    default_text: dict = field(default_factory=dict)
    directories: dict = field(default_factory=dict)   # name -> checkpoint directory, if any
    reads_line_breaks: dict = field(default_factory=dict)   # name -> its prompts span lines
    _locks: dict = field(default_factory=dict, repr=False)

    @contextmanager
    def using(self, name: str):
        """Hold model `name` for one computation. Hooks are attached to the model object, so
        two requests on one model must not interleave their forward passes (one would cache
        the other's activations); requests on different models run in parallel."""
        model = self.get(name)
        with self._locks[name]:
            yield model

    def add(self, name: str, model, text: str, directory: Path | None = None) -> None:
        if name in self.models:
            raise ValueError(f"model name {name!r} is given twice")
        self.models[name] = model.eval()
        self.default_text[name] = text
        self.reads_line_breaks[name] = _reads_line_breaks(model)
        if directory is not None:
            self.directories[name] = Path(directory)
        self._locks[name] = threading.RLock()

    @property
    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name) -> object:
        if not isinstance(name, str) or name not in self.models:
            raise ValueError(f"unknown model {name!r}; available: {self.names}")
        return self.models[name]

    def prompt(self, name: str, text) -> Prompt:
        """Tokens of `text`: one prompt per non-empty line (several are averaged, cut to the
        shortest), except for a model whose tokenizer reads line breaks (a text model: source
        code spans lines) and for the model's default text, each one prompt; the default text
        when empty. ValueError (shown to the user) for text over `MAX_PROMPT_CHARS`, characters
        outside the tokenizer, or more tokens than the context.
        """
        model = self.get(name)
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise ValueError(f"the prompt must be text, got {type(text).__name__}")
        if len(text) > MAX_PROMPT_CHARS:
            raise ValueError(f"the prompt is {len(text):,} characters; the dashboard accepts at "
                             f"most {MAX_PROMPT_CHARS:,}")
        check_text(text)
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) > 1 and (self.reads_line_breaks[name] or text == self.default_text[name]):
            lines = [text]   # one text (the Gating page's box starts with the default text)
        note = ""
        if not lines:
            lines, note = [self.default_text[name]], "the prompt is empty: showing the default text"
        if len(lines) > MAX_PROMPTS:
            raise ValueError(f"{len(lines)} prompts given; at most {MAX_PROMPTS} are averaged")
        rows = []
        for line in lines:
            tokens = model.to_tokens(line)
            if tokens.shape[1] > model.cfg.n_ctx:
                raise ValueError(f"the prompt is {tokens.shape[1]} tokens; {name} reads at most "
                                 f"{model.cfg.n_ctx}")
            rows.append(tokens[0])
        n = min(len(r) for r in rows)
        if len(rows) > 1:
            note = (f"averaged over {len(rows)} prompts, each cut to the shortest "
                    f"({n} tokens)")
        labels = [f"{i}:{shown_text(s)}" for i, s in enumerate(model.to_str_tokens(rows[0][:n]))]
        return Prompt(torch.stack([r[:n] for r in rows]), labels, note)

    def tokens(self, name: str, text) -> tuple[torch.Tensor, list[str]]:
        """`[batch pos]` tokens and labels of `text` (see `prompt`)."""
        p = self.prompt(name, text)
        return p.tokens, p.labels


def check_text(text: str, what: str = "the prompt") -> str:
    """`text` when every character is text a tokenizer can read; ValueError naming the first
    that is not (a lone surrogate, U+D800 .. U+DFFF: no UTF-8 for it, and a tokenizer fails on
    it instead of refusing it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{what} holds a character that is not text (U+{ord(text[err.start]):04X}"
                         f", half of a surrogate pair, at character {err.start}): remove it"
                         ) from None
    return text


def _reads_line_breaks(model) -> bool:
    """Whether `model`'s tokenizer encodes a line break as one (a text model's BPE does; the
    toy alphabets refuse it, word vocabularies read it as a space)."""
    try:
        return model.to_string(model.to_tokens("\n", prepend_bos=False)[0]) == "\n"
    except ValueError:
        return False


def _fallback_text(model) -> str:
    """Some text every tokenizer can encode: the decoded first ids of the vocabulary."""
    ids = torch.arange(1, min(16, model.cfg.d_vocab))
    return model.to_string(ids)


# A text model's default prompt: this many tokens of its first held-out validation window (a
# source file the training never saw), leaving room under n_ctx = 512 for re-tokenisation.
TEXT_PROMPT_TOKENS = 480


def default_prompt(model, directory: Path | None = None) -> str:
    """A model's default input: for a text language model, about 500 tokens of held-out source
    code (its stored validation windows); an example of its own task drawn with a fixed seed
    (paper-task models name it in their card); else the bundled induction models' letters."""
    from attnlens.hooked_models.zoo.recipes import default_text
    from attnlens.interp.tasks.prompts import example_prompt

    card = getattr(model, "card", None) or {}
    if card.get("kind") == "text-lm" and directory is not None:
        from attnlens.interp.tools.text_eval import load_eval_tokens

        window = load_eval_tokens(directory)[0]
        bos = model.tokenizer.bos_token_id
        start = next(i for i, t in enumerate(window.tolist()) if t != bos)   # the file's text
        return model.to_string(window[start:start + min(TEXT_PROMPT_TOKENS,
                                                        model.cfg.n_ctx - 32)])
    if card.get("task_args"):
        try:
            return example_prompt(card)
        except (ValueError, KeyError, TypeError):
            pass   # a task this version does not know: the generic text below
    return default_text()


def load_store(sources: list[str]) -> ModelStore:
    """A store of the checkpoint directories and zoo names in `sources` (each model named after
    its zoo name or its directory's name). ValueError naming a source that is neither."""
    from attnlens.hooked_models import zoo
    from attnlens.hooked_models.model import HookedVariantTransformer
    store = ModelStore()
    for source in sources:
        path = Path(source)
        if (path / "config.json").is_file():
            name, model = path.resolve().name, HookedVariantTransformer.from_pretrained(
                path, device="cpu")
            directory = path.resolve()
        elif source in zoo.available():
            name, model = source, zoo.load(source, device="cpu")
            directory = zoo.path(source)
        else:
            bundled = zoo.unknown_model_message(source, zoo.available())
            raise ValueError(f"{source!r} is neither a checkpoint directory (with config.json) "
                             f"nor a bundled model: {bundled}")
        text = default_prompt(model, directory)
        try:
            ok = model.to_tokens(text).shape[1] <= model.cfg.n_ctx
        except ValueError:
            ok = False
        store.add(name, model, text if ok else _fallback_text(model), directory)
    return store
