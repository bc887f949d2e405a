"""Names an op package loads on first use, so that importing its plain-torch spec
(`kernels.<op>.reference`, as the model does) never imports triton."""

from __future__ import annotations

import importlib


def lazy_getattr(package: str, where: dict[str, str]):
    """A module `__getattr__` for `package` that imports `package.<where[name]>` when `name` is
    first read and returns its attribute; other names raise AttributeError as usual."""

    def __getattr__(name: str):
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
