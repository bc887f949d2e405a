"""Links into the app's views (used by tables that name a head): the query strings that
`attnlens.dashboards.app` reads back (`_parse_link`)."""

from __future__ import annotations

from urllib.parse import urlencode


def explorer_link(model: str, layer: int, head: int, stage: str = "pattern",
                  prompt: str | None = "") -> str:
    """The explorer on `model`'s head L{layer}H{head} at `stage` (and the prompt)."""
    return "?" + urlencode({"page": "explorer", "models": model, "layer": layer, "head": head,
                            "stage": stage, "prompt": prompt or ""})
