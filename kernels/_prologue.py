"""The program prologue the Triton attention kernels share: which tile a program owns, where its
rows and head dims are, and which of them are valid.

Two grid shapes are in use, one helper each:

- `head_tile`, grid `(cdiv(T, BLOCK), batch * H)`: a program owns BLOCK positions of one
  (batch, head) (FlashAttention forward and backward, hence Infini-attention, and CoPE); with
  `HEADS_INNER` the grid `(batch * H, cdiv(T, BLOCK))`, heaviest tiles first across heads
  (FlashAttention's kernels);
- `heads_tile`, grid `(cdiv(T_Q, BLOCK_M), batch)`: a program owns BLOCK_M query rows of every
  head of one batch element (MTA and DCMHA, whose head mixing needs all heads at once);
- `heads_window`, grid `(cdiv(T_Q, STEP), batch)`: a program owns STEP query rows of every head
  of one batch element, STEP a runtime step (MTA's output pass: windows whose rows overlap by
  the post-softmax convolution's halo);
- `table_tile`, grid `(programs, batch)`: a program does one row of a program table made on
  the host (uneven key splits of the query tiles, longest first: DCMHA's tensor-core forward
  and backward, `dcmha/fwd_plan.py`, `triton_bwd_tc.backward_plan`, whose partial sums are
  merged after the launch).

`load_tile` reads a program's `[BLOCK BLOCK_D]` row tile and `softmax_state` starts the
online-softmax state of the head-tiled forward kernels. `tl.program_id` / `tl.num_programs` are
read here only (`tests/test_triton_prologue.py` checks it), so every kernel splits its program
id the same way. Triton inlines these functions, so a call costs nothing and what a kernel
does not use is dead code: compiled, the kernels keep the registers and spills they had when
each spelled the prologue out (`python -m attnlens.kernels.compile_check`).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def head_tile(T, H, D, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
              HEADS_INNER: tl.constexpr = False, REVERSED: tl.constexpr = False):
    """Prologue of a program of the grid `(cdiv(T, BLOCK), batch * H)` over a length-T axis
    (query rows, or key rows for a key-tiled backward program).

    Returns `(pid, pid_bh, b, h, offs, offs_d, valid, d_valid, mask)`: the tile index
    `pid = program_id(0)`, `pid_bh = program_id(1)` (the row of `[batch * H, T]` buffers such
    as LSE), its batch `b = pid_bh // H` and head `h = pid_bh % H`, the tile's positions
    `offs = pid * BLOCK + arange(BLOCK)` and head dims `offs_d = arange(BLOCK_D)`, their
    validity `valid = offs < T` (the last tile may be ragged) and `d_valid = offs_d < D`
    (BLOCK_D is D rounded up to a power of two), and the `[BLOCK BLOCK_D]` load/store mask
    `valid[:, None] & d_valid[None, :]`.

    HEADS_INNER: the grid is `(batch * H, cdiv(T, BLOCK))` instead, `pid_bh = program_id(0)`,
    so the GPU, which starts programs in the order of their linear index (axis 0 fastest),
    starts a tile index for every head before the next index. REVERSED: the tile index counts
    from the end, `pid = cdiv(T, BLOCK) - 1 - program_id(1)` (with HEADS_INNER). Together they
    start the heaviest programs of a causal launch first across all heads, not per head
    (longest-processing-time-first list scheduling: the light tiles fill the launch's tail):
    REVERSED for query tiles (the last see the most keys), not for key tiles (the first are
    seen by the most queries).
    """
    if HEADS_INNER:
        pid_bh = tl.program_id(0)
        pid = tl.program_id(1)
        if REVERSED:
            pid = tl.num_programs(1) - 1 - pid
    else:
        pid = tl.program_id(0)
        pid_bh = tl.program_id(1)
    # The division first, as the kernels had it: after the offsets, ptxas scheduled it so
    # that `_bwd_preprocess` took 107 registers instead of 95 (fp32, d_head 128).
    b = pid_bh // H
    h = pid_bh % H
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    valid = offs < T
    d_valid = offs_d < D
    return pid, pid_bh, b, h, offs, offs_d, valid, d_valid, valid[:, None] & d_valid[None, :]


@triton.jit
def heads_tile(T, H, D, BLOCK: tl.constexpr, HB: tl.constexpr, BLOCK_D: tl.constexpr):
    """Prologue of a program of the grid `(cdiv(T, BLOCK), batch)` that holds every head of
    BLOCK query rows (HB: H rounded up to a power of two).

    Returns `(b, prog, m0, rows, r_ok, offs_h, h_valid, offs_d, d_valid, hr_mask)`: the batch
    `b = program_id(1)`, the program's index `prog` in the grid, row-major
    (`b * num_programs(0) + program_id(0)`: its slot in per-program staging buffers), the
    first row `m0 = program_id(0) * BLOCK`, the rows `m0 + arange(BLOCK)` and `r_ok = rows < T`
    (the last tile may be ragged), the heads `arange(HB)` and `h_valid = offs_h < H`, the head
    dims `arange(BLOCK_D)` and `d_valid = offs_d < D`, and the `[HB BLOCK]` mask
    `h_valid[:, None] & r_ok[None, :]` of per-(head, row) buffers such as LSE and delta.
    What a kernel does not use costs nothing compiled (dead code).
    """
    pid = tl.program_id(0)
    b = tl.program_id(1)
    offs_h = tl.arange(0, HB)
    h_valid = offs_h < H
    offs_d = tl.arange(0, BLOCK_D)
    d_valid = offs_d < D
    m0 = pid * BLOCK
    prog = b * tl.num_programs(0) + pid
    rows = m0 + tl.arange(0, BLOCK)
    r_ok = rows < T
    return b, prog, m0, rows, r_ok, offs_h, h_valid, offs_d, d_valid, \
        h_valid[:, None] & r_ok[None, :]


@triton.jit
def heads_window(STEP):
    """Prologue of a program of the grid `(cdiv(T, STEP), batch)` whose rows start every STEP
    (a runtime value; `heads_tile` for a constexpr block of rows).

    Returns `(b, prog, m0)`: the batch `b = program_id(1)`, the program's row-major index
    `prog = b * num_programs(0) + program_id(0)` (its slot in per-program staging buffers)
    and its first row `m0 = program_id(0) * STEP`.
    """
    pid = tl.program_id(0)
    b = tl.program_id(1)
    return b, b * tl.num_programs(0) + pid, pid * STEP


@triton.jit
def grid_batches():
    """The batch size of a `(programs, batch)` grid, `num_programs(1)`: the stride of
    per-(split, batch) buffers in a program that started with `heads_window` or `heads_tile`."""
    return tl.num_programs(1)


@triton.jit
def table_tile(PROGS, COLS: tl.constexpr):
    """Prologue of a program of the grid `(programs, batch)` whose work is one row of a
    program table PROGS int32 `[programs, COLS]` made on the host (uneven programs, longest
    first: the DCMHA tensor-core forward's `fwd_plan.forward_plan` and backward's
    `backward_plan`).

    Returns `(b, slot, row)`: the batch `b = program_id(1)`, the program's slot in
    per-program buffers `slot = program_id(0) * num_programs(1) + b`, and `row`, the pointer
    to its row of the table.
    """
    pid = tl.program_id(0)
    b = tl.program_id(1)
    return b, pid * tl.num_programs(1) + b, PROGS + pid * COLS


@triton.jit
def load_tile(ptr, offs, s_t, offs_d, s_d, mask):
    """`[BLOCK BLOCK_D]` rows `offs` of a strided `[pos d_head]` slice at `ptr` (the program's
    (batch, head) already added), 0 where `mask` is off, in the tensor's dtype."""
    return tl.load(ptr + offs[:, None] * s_t + offs_d[None, :] * s_d, mask=mask, other=0.0)


@triton.jit
def softmax_state(BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The online-softmax state of BLOCK_M rows before the first key tile, fp32: running max
    `m_i = -inf` (no key seen), running sum `l_i = 0` and output accumulator `acc = 0`
    `[BLOCK_M BLOCK_D]`."""
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    return m_i, l_i, acc


__all__ = ["grid_batches", "head_tile", "heads_tile", "heads_window", "load_tile", "softmax_state",
           "table_tile"]
