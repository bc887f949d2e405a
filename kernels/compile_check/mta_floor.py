"""What the fused MTA forward's factored dots load: the logits' operands, by hand count, on the
H200.

    python -m attnlens.kernels.compile_check.mta_floor [--T 1024] [--d 128]

Both passes of the forward (`mta.triton_fwd`) compute every pre-softmax logit as the factored
dot `sum_a q_{i-a} . kt_a(j)`: per tile or window and head, c_q row taps of q (rows x c_q x
d_head) against c_q folded keys (keys x c_q x d_head), on the tensor cores. No program can keep
those operands across tiles (16 heads of them are 0.4-1.6 MB a tile), so each tile loads its
own; the out pass recomputes the logits of its windows, halo included (windows of AR x AC own
(AR - c_q + 1) x (AC - c_k + 1) outputs, `fwd_out_windows`). The fold writes the c_q folded
keys once. Nothing else (the lse pass's mixing, the out pass's probabilities, post-softmax
taps, head mixing, values and z) is counted, so for the tile shapes named this is the floor of
the compile check's SASS-bytes reading (`calibrate`: SASS global bytes at HBM bandwidth plus
tensor and CUDA-core time) times each pass's finish, up to the diagonal: the kernels read the
tiles that cross it through a Toeplitz band (k once and a band table), which the count treats
as any other tile (within 6% of the compiled operand lines at 1k, docs/benchmarks.md).

The lse pass is weighed two ways: its tiles spread evenly over the SMs (a bound no grid
reaches: `ideal`), and as whole tiles handed out to 132 SMs (each SM's tiles in turn:
ceil(tiles / SMs) over the mean). The out pass takes its plan's finish (`out_plan` with
`persistent_splits`, as `forward_grids` plans it without its memory cap).

The table is the one of docs/benchmarks.md's section "Fused MTA forward at 1k rows: the logits'
operands against the pessimistic reading's budget" (ESTIMATES: a hand count, no compile).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from attnlens.kernels.compile_check.roofline import PEAKS, estimate
from attnlens.kernels.mta.out_plan import item_windows, out_plan, persistent_splits

HEADS, CQ, CK = 16, 6, 11      # the benchmark's MTA: 16 heads, 6 x 11 kernels
ELEMENT = 2                    # bf16 bytes
SMS = PEAKS["H200"].sms


@dataclass(frozen=True)
class PassFloor:
    """One pass's logit operands: `units` tiles or windows, `gbytes` loaded, `ms` at the H200's
    HBM bandwidth plus its factored dots at its tensor peak, `finish` (longest SM over the
    mean), `finished_ms` = ms x finish."""

    name: str
    units: int
    gbytes: float
    ms: float
    finish: float

    @property
    def finished_ms(self) -> float:
        return self.ms * self.finish


def _ms(nbytes: float, flops: float) -> float:
    """The SASS-bytes reading's terms on the H200 (`roofline.estimate`'s time, every SM busy)."""
    return estimate({"mma_flops": flops}, nbytes, PEAKS["H200"], SMS)["time_s"] * 1e3


def _operands(spans, d_head: int, heads: int, q_once: bool) -> tuple[float, float]:
    """(bytes, flops) of the tiles `spans` lists as (first row, end row, first key, end key),
    clipped to the sequence and the diagonal, each head's factored dot: the folded keys c_q x
    keys x d_head; q each row tap's rows in the sequence (row i - a for tap a, as the kernels
    load them) or, with `q_once`, the tile's distinct rows (c_q - 1 above it) once."""
    nbytes = flops = 0.0
    for r0, r1, k0, k1 in spans:
        if q_once:
            q_rows = r1 - max(0, r0 - CQ + 1)
        else:
            q_rows = sum(r1 - max(r0, a) for a in range(CQ) if r1 > max(r0, a))
        nbytes += heads * d_head * ELEMENT * (q_rows + CQ * (k1 - k0))
        flops += heads * 2.0 * (r1 - r0) * (k1 - k0) * CQ * d_head
    return nbytes, flops


def _spans(T: int, rows: int, cols: int, halo_rows: int, halo_keys: int):
    """`_operands`' spans of rows x cols tiles that own (rows - halo_rows) x (cols - halo_keys)
    logits each, causal, on one key split (`item_windows`: row window r owns rows from r x
    its step, key window n keys from n x its step, each with its halo above and to the
    left); rows and keys outside the sequence, and keys past the tile's last row, are not
    loaded."""
    step_r, step_c = rows - halo_rows, cols - halo_keys
    n_rows = math.ceil(T / step_r)
    spans = []
    for i, n in enumerate(item_windows(n_rows, step_r, step_c, T, 0, 1)):
        m0 = (n_rows - 1 - i) * step_r
        r0, r1 = max(0, m0 - halo_rows), min(T, m0 + step_r)
        for j in range(n):
            k0 = j * step_c - halo_keys
            spans.append((r0, r1, max(0, k0), min(k0 + cols, r1)))
    return spans


def causal_tiles(T: int, rows: int, cols: int) -> list[tuple[int, int, int, int]]:
    """The lse pass's rows x cols tiles with a key at or left of the diagonal (query i sees
    keys <= i), as `_operands`' spans (no halo)."""
    return _spans(T, rows, cols, 0, 0)


def out_windows(T: int, rows: int, cols: int) -> list[tuple[int, int, int, int]]:
    """The out pass's rows x cols windows as `_operands`' spans: each owns (rows - c_q + 1) x
    (cols - c_k + 1) outputs, with c_q - 1 halo rows above and c_k - 1 halo keys left."""
    if rows < CQ or cols < CK:
        raise ValueError(f"out windows of {rows} x {cols} own no output at {CQ} x {CK} taps: "
                         f"at least {CQ} rows and {CK} keys")
    return _spans(T, rows, cols, CQ - 1, CK - 1)


def lse_floor(T: int, d_head: int, rows: int, cols: int, heads: int = HEADS,
              ideal: bool = False, q_once: bool = False) -> PassFloor:
    """The lse pass on rows x cols tiles: spread evenly (`ideal`) or whole tiles on SMS;
    `q_once` as `_operands`."""
    spans = causal_tiles(T, rows, cols)
    units = len(spans)
    nbytes, flops = _operands(spans, d_head, heads, q_once)
    finish = 1.0 if ideal else math.ceil(units / SMS) * SMS / units
    name = f"lse {rows} x {cols}{' ideal' if ideal else ''}{', q once' if q_once else ''}"
    return PassFloor(name, units, nbytes / 1e9, _ms(nbytes, flops), finish)


def out_floor(T: int, d_head: int, rows: int, cols: int, heads: int = HEADS,
              q_once: bool = False) -> PassFloor:
    """The out pass on rows x cols windows (halo included), its plan's finish on SMS; `q_once`
    as `_operands`."""
    step_r, step_c = rows - CQ + 1, cols - CK + 1
    n_rows = math.ceil(T / step_r)
    spans = out_windows(T, rows, cols)
    ns = persistent_splits(n_rows, step_r, step_c, T, 0, 1, SMS)
    finish = out_plan(1, n_rows, step_r, step_c, T, 0, ns, SMS).finish_over_even
    nbytes, flops = _operands(spans, d_head, heads, q_once)
    return PassFloor(f"out {rows} x {cols}{', q once' if q_once else ''}", len(spans),
                     nbytes / 1e9, _ms(nbytes, flops), finish)


def fold_floor(T: int, d_head: int, heads: int = HEADS) -> PassFloor:
    """The fold: k read once, its c_q folded copies written once."""
    nbytes = T * heads * d_head * ELEMENT * (1 + CQ)
    return PassFloor("fold", 1, nbytes / 1e9, _ms(nbytes, 0.0), 1.0)


def table(T: int = 1024, d_head: int = 128) -> str:
    """Markdown: each pass's floor at the shapes the forward launches or could."""
    if T < 1 or d_head < 1:
        raise ValueError(f"T and d_head must be positive (got T {T}, d_head {d_head})")
    rows = [fold_floor(T, d_head)]
    for q_once in (False, True):
        rows += [lse_floor(T, d_head, r, c, q_once=q_once)
                 for r, c in ((32, 32), (64, 64), (64, 128))]
        rows += [lse_floor(T, d_head, 128, 128, ideal=True, q_once=q_once)]
        rows += [out_floor(T, d_head, r, c, q_once=q_once) for r, c in ((32, 64), (64, 64))]
    lines = [f"| T {T}, d_head {d_head} | tiles / windows | logit operands GB | ms (even share) "
             "| finish | ms x finish |", "|---|---|---|---|---|---|"]
    lines += [f"| {p.name} | {p.units} | {p.gbytes:.3f} | {p.ms:.4f} | {p.finish:.3f} | "
              f"{p.finished_ms:.4f} |" for p in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m attnlens.kernels.compile_check.mta_floor",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--T", type=int, default=1024)
    p.add_argument("--d", type=int, default=128, help="d_head")
    a = p.parse_args(argv)
    try:
        print(table(a.T, a.d))
    except ValueError as e:
        p.error(str(e))


if __name__ == "__main__":
    main()

__all__ = ["PassFloor", "causal_tiles", "fold_floor", "lse_floor", "out_floor", "out_windows",
           "table"]
