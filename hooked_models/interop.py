"""What other toolkits expect of a model, mixed into `HookedVariantTransformer` (docs/design.md 9).

- TransformerLens's `set_use_*` switches, which its patching and attribution tools flip:
  `set_use_attn_result` (per-head `attn.hook_result`), `set_use_split_qkv_input` (per-head
  pre-`ln1` copies of the residual feeding each of Q, K, V: `attn.hook_q_input`,
  `attn.hook_k_input`, `attn.hook_v_input`), `set_use_attn_in` (one per-head copy feeding all
  three: `attn.hook_attn_in`) and `set_use_hook_mlp_in` (`blocks.{l}.hook_mlp_in`, the MLP
  branch's input before `ln2`). Names and shapes are TransformerLens 4's. A switch we cannot
  honour (`set_ungroup_grouped_query_attention(True)`) raises instead of doing nothing.
- `config` and `device`, which Hugging Face-minded clients (pyvene) read.
- Module-hooking clients: nnsight routes a module through a controller installed as its
  `forward` instead of a torch hook, so while an nnsight trace runs, the map stages are marked
  observed for the duration of the forward (every layer takes its materialising path).

The forks are torch hooks installed while a switch is on (as TransformerLens's bridge does):
a pre-hook on `ln1` keeps the block's residual, and hooks on `attn.hook_q/k/v` (run before any
user hook) replace q, k, v by the projections of the per-head copies once a hook reads or edits
them. The per-head copies are normalised with `ln1`'s parameters without firing `ln1`'s hooks
again, and a variant's other readers of the attention input (DCMHA's dynamic weights, CoPE's
separate gate keys) keep reading the shared `ln1` output.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from attnlens.hooked_models.components import LayerNorm, RMSNorm

FORK_POINTS = {  # switch -> hook points it creates, relative to blocks.{l}
    "use_split_qkv_input": ("attn.hook_q_input", "attn.hook_k_input", "attn.hook_v_input"),
    "use_attn_in": ("attn.hook_attn_in",),
    "use_hook_mlp_in": ("hook_mlp_in",),
}


def _hooked(point: nn.Module) -> bool:
    """Whether any client (TransformerLens, torch hooks) has a forward hook on `point`."""
    return bool(point._forward_hooks or point._forward_pre_hooks
                or getattr(point, "fwd_hooks", None))


def _flag(cfg, name: str) -> bool:
    """A switch of `cfg`; TransformerLensConfig lacks use_attn_in and use_hook_mlp_in."""
    return bool(getattr(cfg, name, False))


def norm_without_hooks(norm: nn.Module, x: Tensor) -> Tensor:
    """`norm` (LayerNorm, RMSNorm or Identity) applied over d_model without its hooks."""
    if isinstance(norm, LayerNorm):
        x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.w + norm.b
    if isinstance(norm, RMSNorm):
        return x / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.w
    if isinstance(norm, nn.Identity):
        return x
    raise NotImplementedError(f"split Q/K/V inputs need LN, RMS or no norm; got {type(norm)}")


class _BlockFork:
    """The torch hooks of one block's per-head input forks (see the module docstring)."""

    def __init__(self, model, block):
        self.model, self.block, self.resid = model, block, None
        self.shared: Tensor | None = None
        attn = block.attn
        self.handles = [block.ln1.register_forward_pre_hook(self._keep_resid)]
        for name in ("q", "k", "v"):
            point = getattr(attn, f"hook_{name}")
            self.handles.append(point.register_forward_hook(self._replacer(name), prepend=True))

    def _keep_resid(self, module, args):
        self.resid, self.shared = args[0], None

    def _fork_input(self, name: str, n_heads: int) -> Tensor | None:
        """The hooked per-head copy feeding `name`, or None when nobody looks at it."""
        cfg, attn = self.model.cfg, self.block.attn
        point = (getattr(attn, f"hook_{name}_input") if _flag(cfg, "use_split_qkv_input")
                 else attn.hook_attn_in if _flag(cfg, "use_attn_in") else None)
        if point is None or self.resid is None or not _hooked(point):
            return None
        if _flag(cfg, "use_attn_in"):  # one copy for q, k and v
            if self.shared is None:
                self.shared = point(self.resid[:, :, None].repeat(1, 1, cfg.n_heads, 1))
            fork = self.shared
            if n_heads != cfg.n_heads:  # GQA: group g reads the copy of its first head
                fork = fork[:, :, ::cfg.n_heads // n_heads]
            return fork
        return point(self.resid[:, :, None].repeat(1, 1, n_heads, 1))

    def _replacer(self, name: str):
        def hook(module, args, out):
            attn = self.block.attn
            fork = self._fork_input(name, out.shape[2])
            if name == "v":  # project_qkv fires q, k, v in this order: v is the last reader
                self.resid = self.shared = None
            if fork is None:
                return None
            x = norm_without_hooks(self.block.ln1, fork)
            W = attn.W_Q if name == "q" else attn.kv_param(f"W_{name.upper()}")
            b = attn.b_Q if name == "q" else attn.kv_param(f"b_{name.upper()}")
            return torch.einsum("bphm,hmd->bphd", x, W) + b
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.resid = self.shared = None


class InteropMixin:
    """`set_use_*`, `config`, `device` and the module-hooking client shim (see module doc)."""

    @property
    def config(self):
        """The `VariantConfig` (`cfg`), under the name Hugging Face-minded clients read."""
        return self.cfg

    @property
    def device(self) -> torch.device:
        """Where the weights live (pyvene and Hugging Face code read `model.device`)."""
        return self.W_E.device

    # -- TransformerLens's switches ------------------------------------------------------------
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Fire `blocks.{l}.attn.hook_result` `[batch pos head_index d_model]` (per-head writes)."""
        self.cfg.use_attn_result = bool(use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Per-head pre-`ln1` residual copies for Q, K and V (`attn.hook_{q,k,v}_input`,
        `[batch pos head_index d_model]`, k/v with n_key_value_heads heads under GQA), so each
        head's query, key or value input can be patched alone (TransformerLens's direct path
        patching). Mutually exclusive with `use_attn_in`."""
        if use_split_qkv_input and _flag(self.cfg, "use_attn_in"):
            raise ValueError("use_split_qkv_input and use_attn_in are mutually exclusive; call "
                             "set_use_attn_in(False) first")
        self._set_fork("use_split_qkv_input", use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """One per-head pre-`ln1` residual copy feeding Q, K and V (`attn.hook_attn_in`,
        `[batch pos head_index d_model]`). Mutually exclusive with `use_split_qkv_input`."""
        if use_attn_in and _flag(self.cfg, "use_split_qkv_input"):
            raise ValueError("use_attn_in and use_split_qkv_input are mutually exclusive; call "
                             "set_use_split_qkv_input(False) first")
        self._set_fork("use_attn_in", use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Fire `blocks.{l}.hook_mlp_in` `[batch pos d_model]`, the MLP branch's input before
        `ln2` (an edit reaches the MLP only, not the residual). Attention-only models have no
        MLP: the switch is accepted and no hook point exists."""
        self._set_fork("use_hook_mlp_in", use_hook_mlp_in)

    def set_ungroup_grouped_query_attention(self, ungroup: bool) -> None:
        """Refused when True: hook_k/hook_v carry the n_key_value_heads heads (as HF's cache)."""
        if ungroup:
            raise NotImplementedError(
                "ungroup_grouped_query_attention is not supported: under GQA hook_k/hook_v carry "
                "n_key_value_heads heads; expand them with repeat_interleave(n_heads // "
                "n_key_value_heads, dim=2) after caching")

    def _set_fork(self, flag: str, on: bool) -> None:
        on = bool(on)
        setattr(self.cfg, flag, on)
        self._ensure_fork_points()
        forks = self.__dict__.setdefault("_forks", {})
        want_qkv = _flag(self.cfg, "use_split_qkv_input") or _flag(self.cfg, "use_attn_in")
        for layer, block in enumerate(self.blocks):
            if want_qkv and ("qkv", layer) not in forks:
                forks[("qkv", layer)] = _BlockFork(self, block)
            elif not want_qkv and ("qkv", layer) in forks:
                forks.pop(("qkv", layer)).remove()
            has_mlp = hasattr(block, "ln2")
            if _flag(self.cfg, "use_hook_mlp_in") and has_mlp and ("mlp", layer) not in forks:
                point = block.hook_mlp_in
                forks[("mlp", layer)] = block.ln2.register_forward_pre_hook(
                    lambda module, args, point=point: (point(args[0]),) + tuple(args[1:]))
            elif not _flag(self.cfg, "use_hook_mlp_in") and ("mlp", layer) in forks:
                forks.pop(("mlp", layer)).remove()
        self.setup()

    def _restore_forks(self) -> None:
        """Install the forks a config asks for (e.g. one saved with a switch on)."""
        for flag in FORK_POINTS:
            if getattr(self.cfg, flag, False):
                self._set_fork(flag, True)

    def _ensure_fork_points(self) -> None:
        """Create the fork HookPoints once (first switch flipped), then rebuild hook_dict."""
        if getattr(self, "_fork_points_made", False):
            return
        for block in self.blocks:
            for name in ("hook_q_input", "hook_k_input", "hook_v_input", "hook_attn_in"):
                setattr(block.attn, name, HookPoint())
            if hasattr(block, "ln2"):
                block.hook_mlp_in = HookPoint()
        self.__dict__["_fork_points_made"] = True

    def setup(self) -> None:
        """TransformerLens's setup, keeping out of hook_dict the fork points whose switch is
        off (so run_with_cache does not wait on them and a hook on one says which switch)."""
        super().setup()
        for name in [n for n in self.hook_dict if self._fork_switch_of(n)]:
            if not _flag(self.cfg, self._fork_switch_of(name)):
                del self.hook_dict[name]
                self.mod_dict.pop(name, None)

    def _fork_switch_of(self, name: str) -> str | None:
        """The switch that must be on for hook `name` to fire, if `name` is a fork point."""
        if not (isinstance(name, str) and name.startswith("blocks.")):
            return None
        tail = name.split(".", 2)[-1]
        return next((flag for flag, tails in FORK_POINTS.items() if tail in tails), None)

    def _refuse_switched_off(self, name) -> None:
        flag = self._fork_switch_of(name)
        if flag is not None and not getattr(self.cfg, flag, False):
            raise ValueError(f"hook {name!r} fires only while cfg.{flag} is on: call "
                             f"model.set_{flag}(True) first")

    # -- module-hooking clients ------------------------------------------------------------
    @contextlib.contextmanager
    def client_observation(self):
        """Within: map stages count as observed while an nnsight trace runs on this model.

        nnsight reaches a module through a controller installed as its `forward`, not a torch
        hook, so the attention's "is anyone looking" test cannot see it; during its trace we
        add a no-op hook to every map stage, so the maps are materialised and its `.output`
        handles fire. Outside an nnsight trace this costs one dict lookup.
        """
        if not _nnsight_tracing(self):
            yield
            return
        points = [hp for block in self.blocks for hp in block.attn.map_hooks()]
        points += [hp for name, hp in self.hook_dict.items() if self._fork_switch_of(name)]
        handles = [hp.register_forward_hook(_noop) for hp in points]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _noop(module, args, out):
    return None


def _nnsight_tracing(model: nn.Module) -> bool:
    """Whether an nnsight trace with interventions is running through `model` now."""
    if "nnsight" not in sys.modules:
        return False
    state = model.__dict__.get("__nnsight__")
    if state is None or not hasattr(state, "active"):
        return False
    return state.active()[0] is not None


__all__ = ["InteropMixin", "FORK_POINTS", "norm_without_hooks"]
