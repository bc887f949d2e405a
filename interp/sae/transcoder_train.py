"""Train per-layer transcoders on a model's MLP inputs and outputs, resumably, and measure them.

`collect_mlp_io` reads every chosen layer's MLP input (`ln2.hook_normalized`) and output
(`hook_mlp_out`) in one forward per batch. `train_transcoder` fits one layer: mean squared error
normalised by the output's variance, plus for JumpReLU `sparsity_coefficient` x L0 through a
straight-through estimator (rectangle kernel of width `bandwidth`, Rajamanoharan et al. 2024);
Adam; decoder rows not renormalised (the L0 penalty does not depend on their norm). With
`checkpoint` (a file path) it saves weights, Adam state and the data order's generator every
`checkpoint_every_s` seconds and resumes from that file bit-exactly.
`transcoder_metrics` and `replacement_loss` give what a card reports.

Example:
    >>> io = collect_mlp_io(model, tokens, layers=[0])                        # doctest: +SKIP
    >>> tc, history = train_transcoder(*io[0], TranscoderConfig(              # doctest: +SKIP
    ...     d_in=128, d_sae=1024, d_out=128, activation="topk", k=16, layer=0), steps=2000)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from attnlens.hooked_models.checkpoint import read_weights, save_tensors
from attnlens.interp.sae.transcoder import Transcoder, TranscoderConfig, mlp_hooks


@torch.no_grad()
def collect_mlp_io(model, tokens: Tensor, layers=None, batch_size: int = 16,
                   progress: bool = False, mask: Tensor | None = None
                   ) -> dict[int, tuple[Tensor, Tensor]]:
    """`{layer: (x [n d_model], y [n d_model])}`: each layer's MLP input and output at every
    position of `tokens` `[batch pos]` (only where `mask` `[batch pos]` is true, e.g. the real
    tokens of a padded batch), as float32."""
    if mask is not None and mask.shape != tokens.shape:
        raise ValueError(f"mask must have the tokens' shape {tuple(tokens.shape)}, got "
                         f"{tuple(mask.shape)}")
    if model.cfg.attn_only:
        raise ValueError("the model is attention-only: it has no MLPs to transcode")
    layers = list(range(model.cfg.n_layers)) if layers is None else list(layers)
    for layer in layers:
        if not 0 <= layer < model.cfg.n_layers:
            raise ValueError(f"layer {layer} is out of range (the model has "
                             f"{model.cfg.n_layers} layers)")
    names = {name for layer in layers for name in mlp_hooks(layer)}
    rows: dict[int, tuple[list, list]] = {layer: ([], []) for layer in layers}
    starts = range(0, tokens.shape[0], batch_size)
    if progress:
        from tqdm.auto import tqdm
        starts = tqdm(starts, desc="collect MLP activations", unit="batch")
    for start in starts:
        _, cache = model.run_with_cache(tokens[start:start + batch_size],
                                        names_filter=lambda n: n in names,
                                        stop_at_layer=max(layers) + 1,
                                        return_cache_object=False)
        keep = None if mask is None else mask[start:start + batch_size].reshape(-1).bool()
        for layer in layers:
            hook_in, hook_out = mlp_hooks(layer)
            for i, name in enumerate((hook_in, hook_out)):
                act = cache[name].reshape(-1, cache[name].shape[-1]).float()
                rows[layer][i].append(act if keep is None else act[keep])
    return {layer: (torch.cat(xs), torch.cat(ys)) for layer, (xs, ys) in rows.items()}


class _JumpReLU(torch.autograd.Function):
    """pre * H(pre - threshold); the threshold's gradient through a rectangle kernel."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        near = ((pre - threshold).abs() < eps / 2).to(grad.dtype)
        d_threshold = -(threshold / eps) * near * grad
        return (pre > threshold) * grad, d_threshold.reshape(-1, pre.shape[-1]).sum(0), None


class _Step(torch.autograd.Function):
    """H(pre - threshold); gradient for the threshold only (rectangle kernel)."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        near = ((pre - threshold).abs() < eps / 2).to(grad.dtype)
        return None, (-(1 / eps) * near * grad).reshape(-1, pre.shape[-1]).sum(0), None


def _training_loss(tc: Transcoder, x: Tensor, y: Tensor, variance: Tensor,
                   sparsity: float, bandwidth: float) -> tuple[Tensor, Tensor, Tensor]:
    pre = tc.pre_acts(x)
    if tc.cfg.activation == "jumprelu":
        f = _JumpReLU.apply(pre, tc.threshold, bandwidth)
        l0 = _Step.apply(pre, tc.threshold, bandwidth).sum(-1).mean()
    else:
        f = tc.activate(pre)
        l0 = (f != 0).sum(-1).float().mean()
    mse = (f @ tc.W_dec + tc.b_dec - y).pow(2).sum(-1).mean() / variance
    loss = mse + (sparsity * l0 if tc.cfg.activation == "jumprelu" else 0)
    return loss, mse, l0


def train_transcoder(x: Tensor, y: Tensor, cfg: TranscoderConfig, steps: int = 2000,
                     lr: float = 1e-3, batch_size: int = 1024, sparsity_coefficient: float = 1e-3,
                     bandwidth: float = 0.05, seed: int = 0, log_every: int = 50,
                     checkpoint=None, checkpoint_every_s: float = 180.0,
                     progress: bool = False) -> tuple[Transcoder, pd.DataFrame]:
    """Fit a transcoder from MLP inputs `x [n d_in]` to outputs `y [n d_out]`.

    Returns `(transcoder, history)`; the history has columns step, nmse (mse / variance of y),
    l0, loss. `checkpoint`: a file this run saves to and resumes from (same config and
    settings, else ValueError).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must be [n, d] with the same n, got {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    if (x.shape[1], y.shape[1]) != (cfg.d_in, cfg.d_out):
        raise ValueError(f"the config reads d_in={cfg.d_in} and writes d_out={cfg.d_out}, "
                         f"the data has {x.shape[1]} and {y.shape[1]}")
    x, y = x.to(cfg.dtype), y.to(cfg.dtype)
    tc = Transcoder(cfg, seed=seed)
    with torch.no_grad():
        tc.b_dec.copy_(y.mean(0))
        if cfg.activation == "jumprelu":   # thresholds start near the typical pre-activation
            tc.threshold.fill_(float((x[:4096] @ tc.W_enc).abs().median()) * 0.5)
    variance = (y - y.mean(0)).pow(2).sum(-1).mean().clamp(min=1e-12)
    optimizer = torch.optim.Adam(tc.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    settings = dict(config=cfg.to_dict(), steps=steps, lr=lr, batch_size=batch_size,
                    sparsity_coefficient=sparsity_coefficient, bandwidth=bandwidth, seed=seed,
                    n=int(x.shape[0]))
    start, log = 0, []
    if checkpoint is not None and Path(checkpoint).is_file():
        start, log = _resume(Path(checkpoint), tc, optimizer, gen, settings)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=steps, initial=start, desc=f"transcoder {cfg.hook_name or ''}".strip(),
                   unit="step")
    last_save = time.monotonic()
    for step in range(start, steps + 1):
        batch = torch.randint(0, x.shape[0], (min(batch_size, x.shape[0]),), generator=gen)
        # L0 penalty warmed up over the first 10% of steps, as in the JumpReLU recipe
        warm = min(1.0, (step + 1) / max(1, steps // 10))
        loss, mse, l0 = _training_loss(tc, x[batch], y[batch], variance,
                                       sparsity_coefficient * warm, bandwidth)
        if step % log_every == 0 or step == steps:
            log.append(dict(step=step, nmse=mse.item(), l0=l0.item(), loss=loss.item()))
            if bar is not None:
                bar.set_postfix(nmse=f"{mse.item():.3f}", l0=f"{l0.item():.1f}")
        if step == steps:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if cfg.activation == "jumprelu":
            with torch.no_grad():
                tc.threshold.clamp_(min=1e-6)
        if bar is not None:
            bar.update(1)
        if checkpoint is not None and time.monotonic() - last_save > checkpoint_every_s:
            _save(Path(checkpoint), tc, optimizer, gen, step + 1, settings, log)
            last_save = time.monotonic()
    if bar is not None:
        bar.close()
    if checkpoint is not None:
        _save(Path(checkpoint), tc, optimizer, gen, steps, settings, log)
    return tc.eval(), pd.DataFrame(log)


def _save(path: Path, tc, optimizer, gen, step: int, settings: dict, log: list) -> None:
    """One safetensors file: weights, Adam moments, the data order's generator state."""
    tensors = {f"param.{k}": v.detach().contiguous() for k, v in tc.state_dict().items()}
    sd = optimizer.state_dict()
    for index, state in sd["state"].items():
        for key, value in state.items():
            tensors[f"adam.{index}.{key}"] = value.detach().reshape(-1).contiguous() \
                if value.ndim == 0 else value.detach().contiguous()
    tensors["rng.generator"] = gen.get_state()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, path, metadata={"step": str(step), "settings": json.dumps(settings),
                                          "log": json.dumps(log)})


def _resume(path: Path, tc, optimizer, gen, settings: dict) -> tuple[int, list]:
    tensors, meta = read_weights(path)
    saved = json.loads(meta.get("settings", "{}"))
    if saved != json.loads(json.dumps(settings)):
        diff = sorted(k for k in settings if saved.get(k) != json.loads(json.dumps(settings))[k])
        raise ValueError(f"{path} was written by a run with other settings (differs in {diff}); "
                         "use another checkpoint path or the same settings")
    tc.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("param.")})
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("adam."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value.reshape(()) if name == "step" else value
    sd = optimizer.state_dict()
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})
    gen.set_state(tensors["rng.generator"])
    return int(meta["step"]), json.loads(meta["log"])


@torch.no_grad()
def transcoder_metrics(tc: Transcoder, x: Tensor, y: Tensor, batch_size: int = 8192) -> dict:
    """explained_variance (1 - SSE / SST of y), nmse, l0 (mean active features per token),
    dead_fraction (features never active on these rows), n (rows)."""
    sse, l0_sum, fired = 0.0, 0.0, torch.zeros(tc.cfg.d_sae, dtype=torch.bool)
    y_mean = y.double().mean(0)
    sst = (y.double() - y_mean).pow(2).sum().item()
    for start in range(0, x.shape[0], batch_size):
        xb = x[start:start + batch_size].to(tc.W_enc.dtype)
        f = tc.activate(tc.pre_acts(xb))
        y_hat = f @ tc.W_dec + tc.b_dec
        sse += (y_hat.double() - y[start:start + batch_size].double()).pow(2).sum().item()
        l0_sum += (f != 0).sum().item()
        fired |= (f != 0).any(0)
    n = x.shape[0]
    return dict(explained_variance=1 - sse / max(sst, 1e-30), nmse=sse / max(sst, 1e-30),
                l0=l0_sum / n, dead_fraction=1 - fired.float().mean().item(), n=n)


def transcoder_hooks(transcoders: dict[int, Transcoder]) -> list:
    """Forward hooks that put each transcoder in place of its layer's MLP (the MLP's input is
    read at `ln2.hook_normalized`, its output replaced at `hook_mlp_out`)."""
    hooks = []
    for layer, tc in transcoders.items():
        store = {}
        hook_in, hook_out = mlp_hooks(layer)

        def read(act, hook, store=store):
            store["x"] = act

        def replace(act, hook, store=store, tc=tc):
            return tc(store["x"].to(tc.W_enc.dtype)).to(act.dtype)

        hooks += [(hook_in, read), (hook_out, replace)]
    return hooks


@torch.no_grad()
def replacement_loss(model, transcoders: dict[int, Transcoder], tokens: Tensor,
                     batch_size: int = 16, mask: Tensor | None = None) -> dict:
    """Next-token loss of the model as is, with each transcoder alone in place of its MLP, and
    with all of them at once: {"clean", "per_layer": {layer: loss}, "all"} (nats per token;
    with `mask` `[batch pos]`, only the targets where it is true count)."""

    def loss_with(layers) -> float:
        hooks = transcoder_hooks({layer: transcoders[layer] for layer in layers})
        total, count = 0.0, 0
        for start in range(0, tokens.shape[0], batch_size):
            batch = tokens[start:start + batch_size]
            with model.hooks(fwd_hooks=hooks):
                loss = model(batch, return_type="loss", loss_per_token=True)
            if mask is not None:
                keep = mask[start:start + batch_size, 1:].bool()
                loss = loss[keep]
            total += loss.double().sum().item()
            count += loss.numel()
        return total / count

    layers = sorted(transcoders)
    return dict(clean=loss_with([]), per_layer={layer: loss_with([layer]) for layer in layers},
                all=loss_with(layers))


def load_transcoders(directory, dtype: torch.dtype | None = None) -> dict[int, Transcoder]:
    """The transcoders saved by `save_transcoders` in `directory` (`transcoders.safetensors`),
    by layer."""
    path = Path(directory) / "transcoders.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no transcoders at {path}")
    tensors, meta = read_weights(path)
    configs = json.loads(meta.get("configs", "null") or "null")
    if not isinstance(configs, dict):
        raise ValueError(f"{path} has no transcoder configs in its metadata")
    out = {}
    for layer, cfg_dict in configs.items():
        cfg = TranscoderConfig.from_dict(cfg_dict)
        if dtype is not None:
            cfg.dtype = dtype
        tc = Transcoder(cfg)
        prefix = f"layer{layer}."
        state = {k[len(prefix):]: v.to(cfg.dtype) for k, v in tensors.items()
                 if k.startswith(prefix)}
        tc.load_state_dict(state)
        out[int(layer)] = tc.eval()
    return out


def save_transcoders(transcoders: dict[int, Transcoder], directory,
                     dtype: torch.dtype = torch.float16) -> Path:
    """Write `transcoders` (by layer) as one safetensors file in `dtype` (fp16 ships small)."""
    tensors, configs = {}, {}
    for layer, tc in sorted(transcoders.items()):
        configs[str(layer)] = tc.cfg.to_dict()
        for key, value in tc.state_dict().items():
            tensors[f"layer{layer}.{key}"] = value.detach().to(dtype).contiguous()
    path = Path(directory) / "transcoders.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_tensors(tensors, path, metadata={"configs": json.dumps(configs)})
    return path


__all__ = ["collect_mlp_io", "load_transcoders", "replacement_loss", "save_transcoders",
           "train_transcoder", "transcoder_hooks", "transcoder_metrics"]
