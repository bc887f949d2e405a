"""What the Triton-kernel test modules share: marks, device, NaN-poisoned allocations, and for
the model-dispatch tests (which path ran, fused against torch) a call spy and the loss and
gradient comparison."""

import functools
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch

from attnlens.kernels import _triton

KERNEL_MARKS = [
    pytest.mark.kernels,
    pytest.mark.skipif(not (_triton.available() and (_triton.interpreting()
                                                     or torch.cuda.is_available())),
                       reason="needs triton with a GPU or TRITON_INTERPRET=1"),
]

DEVICE = "cpu" if _triton.interpreting() else "cuda"


def to_device(x):
    """`x` (a tensor, or a module such as a test model) on DEVICE, where the kernels run; None
    stays None. Test inputs are drawn with CPU generators (the same values on any machine) and
    moved here, as are models randomised in place with CPU draws (built with device="cpu"
    first), so that fused results and their references (float64, also on DEVICE) meet on one
    device."""
    return None if x is None else x.to(DEVICE)


@pytest.fixture(autouse=True)
def nan_empty(monkeypatch):
    """Poison uninitialised float allocations with NaN (as FLA's conftest does), so any output
    element a kernel forgets to write shows up."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(empty_like(*a, **kw)))


def spy(monkeypatch, owner, name: str, log: list, entry) -> list:
    """Wrap `owner.<name>` (a function of a module, or a method of a class) so that each call
    first appends to `log` `entry(*args, **kwargs)` (a method's args start with self), or
    `entry` itself when it is not callable, then runs the original. Returns `log`."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        log.append(entry(*args, **kwargs) if callable(entry) else entry)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)
    return log


def spy_launches(monkeypatch, module, names, record, run: bool = True) -> None:
    """Replace each Triton kernel `module.<name>` by a stand-in whose `kernel[grid](*args,
    **meta)` first calls `record(kernel, grid, args, meta)` (kernel: the real one), then
    launches the real kernel, or nothing with `run=False`."""
    class Launcher:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **meta):
                record(self.kernel, grid, args, meta)
                return self.kernel[grid](*args, **meta) if run else None
            return launch

    for name in names:
        monkeypatch.setattr(module, name, Launcher(getattr(module, name)))


def assert_same_loss_and_grads(loss_f, loss_r, fused, ref, grad_atol):
    """The fused model's loss `loss_f` and its parameter gradients equal the torch model's
    (`loss_r`, `ref`; same weights).

    float32 is the point (the kernels have no float64; float64 models take the torch path): the
    loss ~4 and gradients are sums over a few dozen positions (batch x pos) of O(0.1) terms, so
    a different float32 order moves them by ~1e-7 (observed <= 1.2e-7); 1e-5 / 2e-5 leave margin.
    """
    torch.testing.assert_close(loss_f, loss_r, atol=1e-5, rtol=1e-5)
    loss_f.backward()
    loss_r.backward()
    for (name, p), (_, p_ref) in zip(fused.named_parameters(), ref.named_parameters(),
                                     strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=grad_atol, rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")


def assert_grads_match_reference(out, lse, ref_out, ref_lse, x, ref_x, names, dtype, tol):
    """The gradients of `x[n]` (n in `names`) through a kernel's `(out, lse)` equal those of
    `ref_x[n]` through the float64 reference's `(ref_out, ref_lse)` within `tol`, under one
    random linear loss on the output and the finite rows of the log-sum-exp; each is `dtype`
    and fully written (no NaN left by `nan_empty`)."""
    live = torch.isfinite(ref_lse)
    g = torch.Generator().manual_seed(1)
    d_out = torch.randn(out.shape, generator=g, dtype=torch.float64).to(DEVICE)
    d_lse = torch.randn(lse.shape, generator=g, dtype=torch.float64).to(DEVICE)
    loss = lambda o, l: (o.double() * d_out).sum() + (l.double()[live] * d_lse[live]).sum()  # noqa: E731
    grads = torch.autograd.grad(loss(out, lse), [x[n] for n in names])
    ref = torch.autograd.grad(loss(ref_out, ref_lse), [ref_x[n] for n in names])
    for n, a, b in zip(names, grads, ref, strict=True):
        assert a.dtype == dtype and not a.isnan().any(), f"d{n} has unwritten (NaN) elements"
        torch.testing.assert_close(a.double(), b, **tol, msg=lambda m, n=n: f"d{n}: {m}")


def assert_fp16_grads_close(fused, reference, q, k, v):
    """The q, k, v gradients of the kernel `fused` (fp16 `q`, `k`, `v` moved to DEVICE) are
    finite fp16 and within 2e-2 of those of `reference` on the same values in float32 (also on
    DEVICE); both are called with (q, k, v) and return (out, lse), so any other tensors they
    close over must be on DEVICE."""
    leaves = [to_device(t).requires_grad_() for t in (q, k, v)]
    out, _ = fused(*leaves)
    ref_leaves = [to_device(t).float().requires_grad_() for t in (q, k, v)]
    ref_out, _ = reference(*ref_leaves)
    d_out = to_device(torch.randn(out.shape, generator=torch.Generator().manual_seed(2)))
    grads = torch.autograd.grad((out.float() * d_out).sum(), leaves)
    ref = torch.autograd.grad((ref_out * d_out).sum(), ref_leaves)
    for a, b in zip(grads, ref, strict=True):
        assert a.dtype == torch.float16 and not a.isnan().any()
        torch.testing.assert_close(a.float(), b, atol=2e-2, rtol=2e-2)


def dcmha_trip_env(block_n: int, **kw) -> dict:
    """Launch constants of a DCMHA tensor-core kernel for its trip model (`compile_check.trips`,
    grid `(2, 2, 1)` in the trip tests): 64-row query tiles over 128 causal keys, 2 key splits,
    16 heads, d_head 128; block_n the pass's key tile (forward 32, backward 16); kw overrides
    or adds constants."""
    env = dict(BLOCK_M=64, BLOCK_N=block_n, NS=2, WINDOW=-1, Q_OFFSET=0, T_K=128, H=16,
               BLOCK_D=128)
    env.update(kw)
    return env


@functools.cache
def dcmha_official_sass_rows() -> dict:
    """The compile check's rows, SASS mix included, of the DCMHA `H16 official` case (sm_90,
    bf16, d_head 64) by kernel name: the forward's and the backward's SASS tests read the
    same compile, made once per test process in a subprocess (TRITON_INTERPRET unset, as
    tests/test_compile_check_instruments.py). Raises with the check's output if it fails."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        proc = subprocess.run([sys.executable, "-m", "attnlens.kernels.compile_check", "--ops",
                               "dcmha", "--options", "H16 official", "--dtypes", "bf16",
                               "--archs", "90", "--d-heads", "64", "--mix", "--json", out,
                               "--no-progress", "--results-cache", os.path.join(tmp, "cache")],
                              cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        with open(out) as f:
            return {r["kernel"]: r for r in json.load(f)}
