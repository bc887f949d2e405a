"""The model switches circuit discovery needs, turned on for a block and restored after.

Per-edge inputs come from the model's TransformerLens switches (`attnlens.hooked_models.interop`):
`set_use_split_qkv_input` (per-head copies of the residual feeding q, k, v),
`set_use_attn_result` (per-head outputs) and `set_use_hook_mlp_in` (the MLP branch's input).
"""

from __future__ import annotations

import contextlib

SWITCHES = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in")


@contextlib.contextmanager
def graph_switches(model):
    """Within: per-head q/k/v inputs, per-head results and the MLP input are hook points.

    Restores every switch (and `use_attn_in`, which excludes split inputs) on exit.
    """
    saved = {name: bool(getattr(model.cfg, name, False)) for name in SWITCHES + ("use_attn_in",)}
    try:
        if saved["use_attn_in"]:
            model.set_use_attn_in(False)
        model.set_use_split_qkv_input(True)
        model.set_use_attn_result(True)
        model.set_use_hook_mlp_in(True)
        yield model
    finally:
        model.set_use_split_qkv_input(saved["use_split_qkv_input"])
        model.set_use_attn_result(saved["use_attn_result"])
        model.set_use_hook_mlp_in(saved["use_hook_mlp_in"])
        if saved["use_attn_in"]:
            model.set_use_attn_in(True)
