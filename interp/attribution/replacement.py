"""The local replacement model: transcoders in place of the MLPs, linear in its sources.

On one prompt, every nonlinearity outside the transcoders is frozen at its value on that prompt
(Ameisen et al. 2025, "Circuit Tracing", section 2.2), through the model's own hooks:

- normalisation scales (`ln1`, `ln2`, `ln_final` `hook_scale`): constants;
- attention: `z = pattern @ v` with `hook_pattern` constant. attnlens's contract that
  `hook_pattern` is the *effective* pattern makes this one rule exact for every variant (MTA's
  convolved and mixed maps, DCMHA's composed probabilities, CoPE's contextual positions,
  Infini's local + memory mix); only `v` stays live;
- MTA's head outputs: the group norm's scale and the gate (`hook_gate`) constant;
- each MLP: replaced by its transcoder's output with the feature activations constant, plus an
  error node `mlp_out - transcoder(mlp_in)` per (layer, position), also constant.

What remains is linear in the *sources*: token embeddings (with their position embedding), the
active features' decoder writes `a_f W_dec[f]`, and the error nodes; everything else (biases,
`b_dec`, LayerNorm offsets) is a constant, the *bias*. Each source is multiplied by a scale
`alpha` (1 on the prompt): the derivative of any target by a source's alpha is that source's
direct effect, and setting alphas to 0 is an exact ablation.

Queries and keys stay live (their layers' normalisation scales frozen), so pre-softmax scores
are quadratic in the sources: `attnlens.interp.attribution.qk` reads them from the same forward. For
that, variants whose scores pass a nonlinearity of their own have it frozen too: DCMHA's dynamic
Compose weights, CoPE's positions (so its position logits are linear in q).

Example:
    >>> run = clean_run(model, transcoders, "def f(x): return x")            # doctest: +SKIP
    >>> out = frozen_forward(model, run, alphas_like(run, batch=1))         # doctest: +SKIP
    >>> torch.testing.assert_close(out.logits, run.logits)                  # doctest: +SKIP
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnlens.interp.sae.transcoder import Transcoder, mlp_hooks

# Per-head transforms between hook_z and W_O (MTA's group norm and gate): frozen like norms.
HEAD_OUTPUT_STAGES = ("hook_gate", "hook_normed")
# Nonlinear side inputs of a variant's scores, frozen at their clean values (see module doc):
# which inputs are nonlinear is a fact about each variant, stated once here.
FROZEN_SCORE_INPUTS = {
    "dcmha": tuple(f"hook_{phase}_{side}{w}" for phase in ("pre", "post") for side in "qk"
                   for w in ("w1", "w2", "dd")),
    "cope": ("hook_positions",),
}


@dataclass
class CleanRun:
    """A prompt's clean forward, with what freezing and the sources need.

    Attributes:
        tokens: `[1 pos]`.
        cache: the clean values of the hooks the replacement model freezes or reads.
        logits: `[1 pos d_vocab]`, the model's (not the replacement's) output.
        features: `{layer: (pos [n], feature [n], activation [n])}` active transcoder features.
        errors: `{layer: [pos d_model]}` transcoder errors (mlp_out - reconstruction).
    """

    tokens: Tensor
    cache: dict[str, Tensor]
    logits: Tensor
    transcoders: dict[int, Transcoder]
    features: dict[int, tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict)
    errors: dict[int, Tensor] = field(default_factory=dict)

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]


def _frozen_names(model) -> list[str]:
    names = []
    for norm in [f"blocks.{l}.ln1" for l in range(model.cfg.n_layers)] + \
            [f"blocks.{l}.ln2" for l in range(model.cfg.n_layers)] + ["ln_final"]:
        if f"{norm}.hook_scale" in model.hook_dict:
            names.append(f"{norm}.hook_scale")
    for layer in range(model.cfg.n_layers):
        attn = f"blocks.{layer}.attn."
        names += [attn + "hook_pattern", attn + "hook_z"]
        if model.blocks[layer].attn.transforms_heads():   # MTA's group norm and gate
            names += [attn + h for h in HEAD_OUTPUT_STAGES if attn + h in model.hook_dict]
        names += [attn + h for h in FROZEN_SCORE_INPUTS.get(model.cfg.attention, ())
                  if attn + h in model.hook_dict]
        if not model.cfg.attn_only:
            names += list(mlp_hooks(layer))
    names.append("hook_embed")
    if "hook_pos_embed" in model.hook_dict:
        names.append("hook_pos_embed")
    return names


def check_transcoders(model, transcoders: dict[int, Transcoder]) -> None:
    """ValueError naming what does not fit: a transcoder per MLP layer, each at the layer it
    was trained for (its `cfg.layer` / `cfg.hook_name`), mapping d_model -> d_model."""
    if model.cfg.attn_only:
        raise ValueError("the model is attention-only: it has no MLPs for transcoders to "
                         "replace (attribution graphs need a model with MLPs)")
    if model.cfg.parallel_attn_mlp:
        raise ValueError("parallel attention + MLP blocks are not supported by the replacement "
                         "model yet")
    if not isinstance(transcoders, dict):
        raise ValueError("transcoders must be a dict {layer: Transcoder}, got "
                         f"{type(transcoders).__name__}")
    n_layers = model.cfg.n_layers
    extra = [k for k in transcoders
             if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < n_layers]
    if extra:
        raise ValueError(f"transcoders has keys {extra} that are not layers of this model "
                         f"(0 .. {n_layers - 1})")
    missing = [layer for layer in range(n_layers) if layer not in transcoders]
    if missing:
        raise ValueError(f"every MLP needs a transcoder: layers {missing} have none "
                         f"(got layers {sorted(transcoders)})")
    for layer, tc in transcoders.items():
        if not isinstance(tc, Transcoder):
            raise ValueError(f"transcoders[{layer}] is a {type(tc).__name__}, not a Transcoder")
        if (tc.cfg.d_in, tc.cfg.d_out) != (model.cfg.d_model, model.cfg.d_model):
            raise ValueError(f"transcoder of layer {layer} maps {tc.cfg.d_in} -> {tc.cfg.d_out}, "
                             f"the model's MLPs map {model.cfg.d_model} -> {model.cfg.d_model}")
        # a transcoder knows the MLP it was trained on: one placed at another layer (swapped
        # dict entries) would run without complaint and explain far less
        hook_in, hook_out = mlp_hooks(layer)
        if tc.cfg.layer is not None and tc.cfg.layer != layer:
            raise ValueError(f"transcoders[{layer}] was trained for layer {tc.cfg.layer} (its "
                             f"cfg.layer): each transcoder must sit at its own layer")
        for field_name, hook in (("hook_name", hook_in), ("hook_name_out", hook_out)):
            stored = getattr(tc.cfg, field_name, "")
            if stored and stored != hook:
                raise ValueError(f"transcoders[{layer}] reads or replaces {stored!r} (its "
                                 f"cfg.{field_name}), not layer {layer}'s {hook!r}")
    if model.cfg.attention == "dcmha" and getattr(model.blocks[0].attn.opts, "qk_norm", False):
        raise ValueError("DCMHA with qk_norm: the QK-norm scale has no hook to freeze, so the "
                         "replacement model would not be linear; not supported yet")


def check_prompt_text(prompt: str, what: str = "the prompt") -> str:
    """`prompt` if every character is a Unicode scalar value; else a ValueError naming the
    position of the first lone surrogate (what a non-UTF-8 byte read from the command line or
    a file with errors="surrogateescape" becomes, U+DC80 .. U+DCFF), which no tokenizer can
    encode. `what` names the text in the message."""
    for i, ch in enumerate(prompt):
        if 0xD800 <= ord(ch) <= 0xDFFF:
            bad = (f"the undecodable byte 0x{ord(ch) - 0xDC00:02x} ({what} is not valid UTF-8)"
                   if 0xDC80 <= ord(ch) <= 0xDCFF else "a lone surrogate")
            raise ValueError(f"{what} has {bad} {ch!r} at character {i}: it must be valid "
                             "Unicode text")
    return prompt


def prompt_tokens(model, prompt) -> Tensor:
    """`[1 pos]` token ids of `prompt`: a str (tokenised with BOS, as `model.to_tokens`) or a
    `[1 pos]` integer tensor; ValueError naming what is wrong otherwise."""
    if isinstance(prompt, str):
        return model.to_tokens(check_prompt_text(prompt))
    if not isinstance(prompt, Tensor):
        hint = " (decode it to str first)" if isinstance(prompt, (bytes, bytearray)) else ""
        raise ValueError("prompt must be a str or a [1, pos] tensor of token ids, got "
                         f"{type(prompt).__name__}{hint}")
    if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
        raise ValueError(f"prompt tokens must be integer token ids, got dtype {prompt.dtype}")
    if prompt.ndim != 2 or prompt.shape[0] != 1:
        raise ValueError(f"one prompt at a time: tokens must be [1, pos], got "
                         f"{tuple(prompt.shape)}")
    if prompt.shape[1] == 0:
        raise ValueError("the prompt has no tokens")
    return prompt


@torch.no_grad()
def clean_run(model, transcoders: dict[int, Transcoder], prompt) -> CleanRun:
    """Run `prompt` (text or `[1 pos]` tokens) and record what the replacement model needs."""
    check_transcoders(model, transcoders)
    tokens = prompt_tokens(model, prompt)
    names = set(_frozen_names(model))
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names,
                                         return_cache_object=False)
    run = CleanRun(tokens=tokens, cache=dict(cache), logits=logits,
                   transcoders=transcoders)
    for layer, tc in transcoders.items():
        hook_in, hook_out = mlp_hooks(layer)
        x = cache[hook_in][0].to(tc.W_enc.dtype)
        acts = tc.activate(tc.pre_acts(x))                       # [pos d_sae]
        pos, feat = acts.nonzero(as_tuple=True)
        run.features[layer] = (pos, feat, acts[pos, feat])
        recon = (acts @ tc.W_dec + tc.b_dec).to(cache[hook_out].dtype)
        run.errors[layer] = cache[hook_out][0] - recon
    return run


@dataclass
class Alphas:
    """Scales of the sources (leaf tensors, 1 on the prompt), one row per batch copy.

    embed `[batch pos]`; errors `[batch n_layers pos]`; features `{layer: [batch n_active]}`.
    """

    embed: Tensor
    errors: Tensor
    features: dict[int, Tensor]

    def tensors(self) -> list[Tensor]:
        return [self.embed, self.errors, *(self.features[k] for k in sorted(self.features))]


def alphas_like(run: CleanRun, batch: int = 1, value: float = 1.0,
                requires_grad: bool = True) -> Alphas:
    dtype = run.errors[0].dtype

    def make(*shape):
        return torch.full(shape, value, dtype=dtype, requires_grad=requires_grad)

    return Alphas(embed=make(batch, run.n_pos), errors=make(batch, len(run.errors), run.n_pos),
                  features={layer: make(batch, len(f[0])) for layer, f in run.features.items()})


@dataclass
class FrozenOutputs:
    """What a frozen forward exposes: logits and the live tensors attribution reads."""

    logits: Tensor | None                # None when the forward stopped early
    mlp_in: dict[int, Tensor]            # ln2.hook_normalized per layer [batch pos d_model]
    live: dict[str, Tensor]              # any extra hook read live (names given to the forward)


def _expand(t: Tensor, batch: int) -> Tensor:
    return t.expand(batch, *t.shape[1:])


def frozen_hooks(model, run: CleanRun, alphas: Alphas, read=(), store=None,
                 detach_scores: bool = False):
    """The forward hooks that turn `model` into the replacement model on `run`'s prompt.

    `read`: extra hook names whose live values are stored in `store` (a dict).
    `detach_scores`: cut queries and keys from the autograd graph. They only reach the
    pattern, which is frozen, so no value and no gradient of a direct effect changes; what
    changes is memory: the backward no longer keeps every head's live scores and
    probabilities (`[batch heads pos pos]` per layer), the largest tensors at long prompts."""
    batch = alphas.embed.shape[0]
    cache = run.cache
    store = {} if store is None else store
    hooks = []
    if detach_scores:
        def detached(act, hook):
            return act.detach()
        hooks += [(f"blocks.{layer}.attn.hook_{side}", detached)
                  for layer in range(model.cfg.n_layers) for side in "qk"
                  if f"blocks.{layer}.attn.hook_{side}" in model.hook_dict]

    def constant(name):
        def hook(act, hook):
            return _expand(cache[name], batch)
        return hook

    for name in _frozen_names(model):
        if name.endswith("hook_scale") or name.endswith("attn.hook_gate") or any(
                name.endswith(h) for h in FROZEN_SCORE_INPUTS.get(model.cfg.attention, ())):
            hooks.append((name, constant(name)))

    for layer, block in enumerate(model.blocks):
        attn = block.attn
        prefix = f"blocks.{layer}.attn."

        def keep_v(act, hook, layer=layer):
            store[("v", layer)] = act

        def frozen_z(act, hook, layer=layer, attn=attn, prefix=prefix):
            v = attn.expand_kv(store[("v", layer)])
            pattern = _expand(cache[prefix + "hook_pattern"], batch).to(v.dtype)
            z = torch.einsum("bhqk,bkhd->bqhd", pattern, v)
            store[("z", layer)] = z
            return z

        hooks += [(prefix + "hook_v", keep_v), (prefix + "hook_z", frozen_z)]
        if getattr(attn, "subln_w", None) is not None and prefix + "hook_normed" in \
                model.hook_dict:
            def frozen_norm(act, hook, layer=layer, attn=attn, prefix=prefix):
                z_clean = cache[prefix + "hook_z"]
                inv = torch.rsqrt(z_clean.pow(2).mean(-1, keepdim=True) + attn.opts.norm_eps)
                return store[("z", layer)] * inv * attn.subln_w * attn.norm_scale
            hooks.append((prefix + "hook_normed", frozen_norm))

    def scaled(name):
        def hook(act, hook):
            return _expand(cache[name], batch) * alphas.embed[..., None]
        return hook

    hooks.append(("hook_embed", scaled("hook_embed")))
    if "hook_pos_embed" in model.hook_dict:
        hooks.append(("hook_pos_embed", scaled("hook_pos_embed")))

    for layer, tc in run.transcoders.items():
        hook_in, hook_out = mlp_hooks(layer)
        pos, feat, act_values = run.features[layer]

        def keep_in(act, hook, layer=layer):
            store[("mlp_in", layer)] = act

        def replace_mlp(act, hook, layer=layer, tc=tc, pos=pos, feat=feat, a=act_values):
            dtype = act.dtype
            writes = (alphas.features[layer] * a.to(dtype))[..., None] * \
                tc.W_dec[feat].to(dtype)                                   # [batch n d]
            out = torch.zeros(batch, run.n_pos, act.shape[-1], dtype=dtype)
            out = out.index_add(1, pos, writes) + tc.b_dec.to(dtype)
            return out + run.errors[layer] * alphas.errors[:, layer, :, None]

        hooks += [(hook_in, keep_in), (hook_out, replace_mlp)]

    for name in read:
        def keep(act, hook, name=name):
            store[name] = act
        hooks.append((name, keep))
    return hooks


def frozen_forward(model, run: CleanRun, alphas: Alphas, read=(),
                   detach_scores: bool = False, stop_at_layer: int | None = None
                   ) -> FrozenOutputs:
    """One forward of the replacement model over `alphas.embed.shape[0]` copies of the prompt
    (`detach_scores`: see `frozen_hooks`). `stop_at_layer`: run only the blocks before it
    (logits None, `mlp_in` of those blocks only): what rows of features need, without the
    later blocks and the unembedding (half the cost of a 512-token row on the zoo models)."""
    batch = alphas.embed.shape[0]
    store: dict = {}
    hooks = frozen_hooks(model, run, alphas, read=read, store=store,
                         detach_scores=detach_scores)
    with model.hooks(fwd_hooks=hooks):
        logits = model(run.tokens.expand(batch, -1), stop_at_layer=stop_at_layer)
    if stop_at_layer is not None:
        logits = None
    return FrozenOutputs(logits=logits,
                         mlp_in={layer: store[("mlp_in", layer)] for layer in run.transcoders
                                 if ("mlp_in", layer) in store},
                         live={name: store[name] for name in read})


def float64_copy(model):
    """A float64 deep copy of `model` (eval mode): the replacement model's identities hold to
    ~1e-12 there, against ~1e-5 in float32. The original is left as it is."""
    return copy.deepcopy(model).to(torch.float64).eval()


__all__ = ["Alphas", "CleanRun", "FrozenOutputs", "alphas_like", "check_prompt_text",
           "check_transcoders", "clean_run", "float64_copy", "frozen_forward", "frozen_hooks",
           "prompt_tokens"]
