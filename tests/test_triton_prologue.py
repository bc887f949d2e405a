"""The Triton programs share one prologue, `kernels/_prologue.py` (issue 46): the source reads
`tl.program_id` / `tl.num_programs` there only and every launched program starts by calling
`head_tile`, `heads_tile`, `heads_window` or `table_tile`; and the helpers'
tiles, offsets and masks are the plain-torch ones, a ragged last tile included (under the
interpreter, or on a GPU). Without triton the module is skipped: the kernels cannot be imported
there either."""

import ast
import math
from pathlib import Path

import pytest
import torch

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
PROLOGUE = KERNELS / "_prologue.py"
HELPERS = {"head_tile", "heads_tile", "heads_window", "table_tile"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _jit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """The module's `@triton.jit` functions by name."""
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(ast.unparse(d) == "triton.jit" for d in node.decorator_list)}


def _launched(tree: ast.Module, jit: dict) -> set[str]:
    """The jit functions the module launches: `kernel[grid](...)` or `LazyAutotune(kernel, ...)`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in jit:
            names.add(node.func.value.id)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "LazyAutotune" \
                and node.args and isinstance(node.args[0], ast.Name):
            names.add(node.args[0].id)
    return names


def _kernel_files() -> list[Path]:
    return sorted(KERNELS.glob("*/triton_*.py"))


def test_program_ids_are_read_in_the_prologue_only():
    readers = []
    for path in sorted(KERNELS.rglob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and node.attr in ("program_id", "num_programs"):
                readers.append(f"{path.relative_to(KERNELS.parent)}:{node.lineno}")
    assert readers and all(r.startswith("kernels/_prologue.py:") for r in readers), readers


def test_every_launched_program_starts_with_the_shared_prologue():
    programs = []
    for path in _kernel_files():
        tree = _tree(path)
        jit = _jit_functions(tree)
        for name in sorted(_launched(tree, jit)):
            body = jit[name].body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]                                   # the docstring
            first = body[0]
            assert isinstance(first, ast.Assign) and isinstance(first.value, ast.Call) \
                and ast.unparse(first.value.func) in HELPERS, \
                f"{path.name}:{name} does not start with a prologue helper ({sorted(HELPERS)})"
            programs.append(f"{path.parent.name}/{path.name}:{name}")
    # Every op's forward and backward programs (Infini launches flash_attention's; CoPE's
    # backward is two since issue 57: query tiles, and the clamped pairs' dK / dV; DCMHA's
    # tensor-core forward two more since issue 58: its lse and output passes; and its
    # tensor-core backward two: delta and gradients; flash's TMA forward one more since
    # 2026-12-05, `triton_fwd_tma.attn_fwd_tma_kernel`; MTA's folded keys one, issue 58).
    assert len(programs) == 22, programs


# -- the helpers against plain torch (interpreter, or compiled on a GPU) --------------------

triton = pytest.importorskip("triton")

from attnlens.kernels._prologue import (  # noqa: E402
    head_tile,
    heads_tile,
    heads_window,
    load_tile,
    table_tile,
)

from kernel_common import DEVICE, KERNEL_MARKS  # noqa: E402

tl = triton.language


def _kernel_test(fn):
    """The marks of the kernel test modules (`kernels`; skipped without a GPU or interpreter)."""
    for mark in KERNEL_MARKS:
        fn = mark(fn)
    return fn


@triton.jit
def _head_tile_probe(X, sx_b, sx_t, sx_h, sx_d, PID, B_H, OFFS, VALID, OFFS_D, D_VALID, MASK,
                     TILE, T, H, D, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Writes what `head_tile` returns (and `load_tile` reads) for program (pid, pid_bh) at
    `[pid, pid_bh]` of the outputs, every lane, valid or not."""
    pid, pid_bh, b, h, offs, offs_d, valid, d_valid, mask = head_tile(T, H, D, BLOCK, BLOCK_D)
    prog = pid * tl.num_programs(1) + pid_bh
    lanes = tl.arange(0, BLOCK)
    dims = tl.arange(0, BLOCK_D)
    tl.store(PID + prog * 2 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, pid, pid_bh))
    tl.store(B_H + prog * 2 + tl.arange(0, 2), tl.where(tl.arange(0, 2) == 0, b, h))
    tl.store(OFFS + prog * BLOCK + lanes, offs)
    tl.store(VALID + prog * BLOCK + lanes, valid.to(tl.int8))
    tl.store(OFFS_D + prog * BLOCK_D + dims, offs_d)
    tl.store(D_VALID + prog * BLOCK_D + dims, d_valid.to(tl.int8))
    tile = prog * BLOCK * BLOCK_D + lanes[:, None] * BLOCK_D + dims[None, :]
    tl.store(MASK + tile, mask.to(tl.int8))
    tl.store(TILE + tile, load_tile(X + b * sx_b + h * sx_h, offs, sx_t, offs_d, sx_d, mask))


@triton.jit
def _heads_tile_probe(INTS, ROWS, R_OK, OFFS_H, H_VALID, OFFS_D, D_VALID, HR_MASK, T, H, D,
                      BLOCK: tl.constexpr, HB: tl.constexpr, BLOCK_D: tl.constexpr):
    """Writes what `heads_tile` returns at the program's index `prog` of the outputs."""
    b, prog, m0, rows, r_ok, offs_h, h_valid, offs_d, d_valid, hr_mask = heads_tile(
        T, H, D, BLOCK, HB, BLOCK_D)
    three = tl.arange(0, 4)
    tl.store(INTS + prog * 4 + three, tl.where(three == 0, b, tl.where(three == 1, prog, m0)),
             mask=three < 3)
    lanes = tl.arange(0, BLOCK)
    heads = tl.arange(0, HB)
    dims = tl.arange(0, BLOCK_D)
    tl.store(ROWS + prog * BLOCK + lanes, rows)
    tl.store(R_OK + prog * BLOCK + lanes, r_ok.to(tl.int8))
    tl.store(OFFS_H + prog * HB + heads, offs_h)
    tl.store(H_VALID + prog * HB + heads, h_valid.to(tl.int8))
    tl.store(OFFS_D + prog * BLOCK_D + dims, offs_d)
    tl.store(D_VALID + prog * BLOCK_D + dims, d_valid.to(tl.int8))
    tl.store(HR_MASK + prog * HB * BLOCK + heads[:, None] * BLOCK + lanes[None, :],
             hr_mask.to(tl.int8))


@triton.jit
def _heads_window_probe(INTS, STEP):
    """Writes (b, prog, m0) of `heads_window(STEP)` at the program's index `prog`."""
    b, prog, m0 = heads_window(STEP)
    three = tl.arange(0, 4)
    tl.store(INTS + prog * 4 + three, tl.where(three == 0, b, tl.where(three == 1, prog, m0)),
             mask=three < 3)


@triton.jit
def _table_tile_probe(PROGS, INTS, COLS: tl.constexpr):
    """Writes what `table_tile` returns, and the first value of the row it points to, at the
    program's slot of the output `[programs * batch, 3]`."""
    b, slot, row = table_tile(PROGS, COLS)
    three = tl.arange(0, 4)
    tl.store(INTS + slot * 3 + three,
             tl.where(three == 0, b, tl.where(three == 1, slot, tl.load(row))), mask=three < 3)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# (batch, heads, T, d_head, BLOCK): a ragged last tile (37 = 2 * 16 + 5) with a padded head
# dim (24 -> 32), a single short tile, and exact tiles.
SHAPES = [(2, 3, 37, 24, 16), (1, 1, 5, 16, 16), (1, 4, 32, 64, 16)]


@_kernel_test
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}t{}d{}m{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_head_tile_matches_torch(shape, dtype):
    B, H, T, D, BLOCK = shape
    BLOCK_D = max(16, _pow2(D))
    n_t = math.ceil(T / BLOCK)
    grid = (n_t, B * H)
    n = n_t * B * H
    i32 = dict(dtype=torch.int32, device=DEVICE)
    i8 = dict(dtype=torch.int8, device=DEVICE)
    x = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(0)).to(dtype)
    x = x.to(DEVICE).transpose(1, 2)                    # [b t h d], strided like q after a view
    pid, bh = torch.empty(n, 2, **i32), torch.empty(n, 2, **i32)
    offs, valid = torch.empty(n, BLOCK, **i32), torch.empty(n, BLOCK, **i8)
    offs_d, d_valid = torch.empty(n, BLOCK_D, **i32), torch.empty(n, BLOCK_D, **i8)
    mask = torch.empty(n, BLOCK, BLOCK_D, **i8)
    tile = torch.empty(n, BLOCK, BLOCK_D, dtype=dtype, device=DEVICE)
    _head_tile_probe[grid](x, *x.stride(), pid, bh, offs, valid, offs_d, d_valid, mask, tile,
                           T, H, D, BLOCK=BLOCK, BLOCK_D=BLOCK_D)

    p_t = torch.arange(n_t).repeat_interleave(B * H)            # program (pid, pid_bh) order
    p_bh = torch.arange(B * H).repeat(n_t)
    want_offs = p_t[:, None] * BLOCK + torch.arange(BLOCK)[None, :]
    want_valid = want_offs < T
    want_d_valid = torch.arange(BLOCK_D) < D
    want_mask = want_valid[:, :, None] & want_d_valid[None, None, :]
    assert torch.equal(pid.cpu(), torch.stack([p_t, p_bh], 1).int())
    assert torch.equal(bh.cpu(), torch.stack([p_bh // H, p_bh % H], 1).int())
    assert torch.equal(offs.cpu(), want_offs.int())
    assert torch.equal(valid.cpu().bool(), want_valid)
    assert torch.equal(offs_d.cpu(), torch.arange(BLOCK_D).int().expand(n, BLOCK_D))
    assert torch.equal(d_valid.cpu().bool(), want_d_valid.expand(n, BLOCK_D))
    assert torch.equal(mask.cpu().bool(), want_mask)
    # load_tile: the program's rows of its (batch, head), zero outside the sequence and d_head.
    padded = torch.zeros(B, H, n_t * BLOCK, BLOCK_D, dtype=dtype)
    padded[:, :, :T, :D] = x.transpose(1, 2).cpu()
    want_tile = padded.reshape(B * H, n_t, BLOCK, BLOCK_D).transpose(0, 1).reshape(n, BLOCK,
                                                                                  BLOCK_D)
    assert torch.equal(tile.cpu(), want_tile)


@_kernel_test
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}t{}d{}m{}".format(*s))
def test_heads_tile_matches_torch(shape):
    B, H, T, D, BLOCK = shape
    HB, BLOCK_D = _pow2(H), max(16, _pow2(D))
    n_t = math.ceil(T / BLOCK)
    n = n_t * B
    i32 = dict(dtype=torch.int32, device=DEVICE)
    i8 = dict(dtype=torch.int8, device=DEVICE)
    ints = torch.empty(n, 4, **i32)
    rows, r_ok = torch.empty(n, BLOCK, **i32), torch.empty(n, BLOCK, **i8)
    offs_h, h_valid = torch.empty(n, HB, **i32), torch.empty(n, HB, **i8)
    offs_d, d_valid = torch.empty(n, BLOCK_D, **i32), torch.empty(n, BLOCK_D, **i8)
    hr_mask = torch.empty(n, HB, BLOCK, **i8)
    _heads_tile_probe[(n_t, B)](ints, rows, r_ok, offs_h, h_valid, offs_d, d_valid, hr_mask,
                                T, H, D, BLOCK=BLOCK, HB=HB, BLOCK_D=BLOCK_D)

    prog = torch.arange(n)                         # row-major over the grid: b * n_t + pid
    p_b, p_t = prog // n_t, prog % n_t
    want_rows = p_t[:, None] * BLOCK + torch.arange(BLOCK)[None, :]
    want_h_valid = torch.arange(HB) < H
    assert torch.equal(ints[:, :3].cpu(), torch.stack([p_b, prog, p_t * BLOCK], 1).int())
    assert torch.equal(rows.cpu(), want_rows.int())
    assert torch.equal(r_ok.cpu().bool(), want_rows < T)
    assert torch.equal(offs_h.cpu(), torch.arange(HB).int().expand(n, HB))
    assert torch.equal(h_valid.cpu().bool(), want_h_valid.expand(n, HB))
    assert torch.equal(offs_d.cpu(), torch.arange(BLOCK_D).int().expand(n, BLOCK_D))
    assert torch.equal(d_valid.cpu().bool(), (torch.arange(BLOCK_D) < D).expand(n, BLOCK_D))
    assert torch.equal(hr_mask.cpu().bool(),
                       want_h_valid[None, :, None] & (want_rows < T)[:, None, :])


@_kernel_test
@pytest.mark.parametrize("batch, T, step", [(2, 37, 11), (1, 5, 27), (3, 32, 16)])
def test_heads_window_matches_torch(batch, T, step):
    n_t = math.ceil(T / step)
    ints = torch.full((n_t * batch, 4), -1, dtype=torch.int32, device=DEVICE)
    _heads_window_probe[(n_t, batch)](ints, step)
    prog = torch.arange(n_t * batch)                 # row-major over the grid: b * n_t + pid
    want = torch.stack([prog // n_t, prog, prog % n_t * step], 1).int()
    assert torch.equal(ints[:, :3].cpu(), want)


@_kernel_test
@pytest.mark.parametrize("shape", [(1, 5, 4), (3, 7, 5), (2, 1, 3)],
                         ids=lambda s: "b{}p{}c{}".format(*s))
def test_table_tile_matches_torch(shape):
    """Grid `(programs, batch)`: program (pid, b) is batch b, slot pid * batch + b (the row of
    per-program buffers), and reads row pid of the table."""
    B, P, COLS = shape
    progs = (torch.arange(P * COLS, dtype=torch.int32) * 7 + 3).view(P, COLS).to(DEVICE)
    ints = torch.full((P * B, 3), -1, dtype=torch.int32, device=DEVICE)
    _table_tile_probe[(P, B)](progs, ints, COLS=COLS)
    slot = torch.arange(P * B)                       # pid * B + b
    want = torch.stack([slot % B, slot, (slot // B) * COLS * 7 + 3], 1).int()
    assert torch.equal(ints.cpu(), want)
