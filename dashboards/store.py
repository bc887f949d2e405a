"""The models a dashboard shows, by name, with a way to turn user text into tokens."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class ModelStore:
    """Named models (`HookedVariantTransformer`) plus each one's default input text."""

    models: dict = field(default_factory=dict)
    default_text: dict = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @contextmanager
    def using(self, name: str):
        """Hold the model for one computation. Hooks are attached to the model object itself,
        so two callbacks running at once (Dash serves requests on threads) must not interleave
        their forward passes, or one would cache the other's activations."""
        model = self.get(name)
        with self._lock:
            yield model

    def add(self, name: str, model, text: str) -> None:
        self.models[name] = model.eval()
        self.default_text[name] = text

    @property
    def names(self) -> list[str]:
        return list(self.models)

    def get(self, name: str):
        if name not in self.models:
            raise ValueError(f"unknown model {name!r}; available: {self.names}")
        return self.models[name]

    def tokens(self, name: str, text: str | None) -> tuple[torch.Tensor, list[str]]:
        """`[1 pos]` tokens of `text` (the default text when empty) and their labels.

        Raises ValueError (shown to the user) for characters outside the vocabulary or text
        longer than the model's context.
        """
        model = self.get(name)
        text = text or self.default_text[name]
        tokens = model.to_tokens(text)
        if tokens.shape[1] > model.cfg.n_ctx:
            raise ValueError(f"the text is {tokens.shape[1]} tokens; {name} reads at most "
                             f"{model.cfg.n_ctx}")
        labels = [f"{i}:{s}" for i, s in enumerate(model.to_str_tokens(tokens[0]))]
        return tokens, labels
