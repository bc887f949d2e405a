"""Option-name handling shared by the variants' `Options` dataclasses (docs/design.md contract 8).

A variant's `Options` may declare, beside its fields:

- `from_official(values) -> values` (classmethod): rewrite the official code's option names
  (aliases) into our fields, raising ValueError when an alias and its field disagree;
- `aliases`: the official names `from_official` accepts (for "did you mean" suggestions);
- `unsupported`: {official name: why attnlens does not implement it}.

`check_option_names` turns what is left unknown into one ValueError that says, per name, whether
it is a known official option we do not implement or a likely misspelling.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any


def rename_official(values: dict[str, Any], renames: dict[str, tuple[str, Callable[[Any], Any]]],
                    variant: str) -> dict[str, Any]:
    """Replace each official alias in `values` by its field, converted; returns a new dict.

    `renames` maps alias -> (field, convert). An alias given together with its field must
    convert to the same value, else ValueError naming both.

    Example:
        >>> rename_official({"cope_npos": 9}, {"cope_npos": ("npos_max", int)}, "cope")
        {'npos_max': 9}
    """
    out = dict(values)
    for alias, (field, convert) in renames.items():
        if alias not in out:
            continue
        value = convert(out.pop(alias))
        if field in out and out[field] != value:
            raise ValueError(f"{variant} options {alias}={values[alias]!r} (the official name "
                             f"for {field}={value!r}) conflicts with {field}={out[field]!r}; "
                             "give one of them")
        out[field] = value
    return out


def official_bool(name: str) -> Callable[[Any], bool]:
    """A converter that accepts only a bool (the official flags are booleans)."""
    def convert(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"option {name} must be a bool, got {value!r}")
        return value
    return convert


def check_option_names(options_cls: type, values: dict[str, Any], variant: str) -> None:
    """Raise ValueError if `values` holds names that are not fields of `options_cls`.

    The message lists each unknown name as "unsupported" (an official option attnlens does not
    implement, with the reason) or with a close match ("did you mean ...?").
    """
    known = {f.name for f in dataclasses.fields(options_cls)}
    unknown = sorted(set(values) - known)
    if not unknown:
        return
    unsupported: dict[str, str] = getattr(options_cls, "unsupported", {})
    spellable = sorted(known | set(getattr(options_cls, "aliases", ())))
    notes = []
    for name in unknown:
        if name in unsupported:
            notes.append(f"{name!r} is an official option that attnlens does not support "
                         f"({unsupported[name]})")
            continue
        close = difflib.get_close_matches(name, spellable, n=1)
        notes.append(f"{name!r}: did you mean {close[0]!r}?" if close
                     else f"{name!r} is not an option")
    raise ValueError(f"unknown options {unknown} for attention {variant!r}: " + "; ".join(notes)
                     + f". Known: {spellable}")
