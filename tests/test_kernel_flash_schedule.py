"""The order the flash kernels' causal programs start in: heaviest tiles first across heads.

`head_tile(..., HEADS_INNER, REVERSED)` maps grid `(batch * H, tiles)` programs to tiles
(checked on the interpreter), the launchers use that grid for causal attention (and the old one
otherwise), with the right tile order per kernel (the outputs then still match the reference:
`test_kernel_flash_attention.py`), and the list-scheduling model that motivates it
(`kernels/flash_attention/schedule.py`).
"""

import math

import pytest
import torch

from attnlens.kernels import _triton
from attnlens.kernels.flash_attention import schedule

from kernel_common import DEVICE, KERNEL_MARKS, nan_empty  # noqa: F401


# -- the model (pure Python) --------------------------------------------------------------------
def test_makespan_is_greedy_list_scheduling():
    assert schedule.makespan([4, 1, 1, 1, 1], 2) == 4     # the heavy one first: no tail
    assert schedule.makespan([1, 1, 1, 1, 4], 2) == 6     # the heavy one last: a long tail


def test_tile_costs_count_the_tiles_each_program_sweeps():
    # 4 query tiles of 64 over 64-key tiles: 1..4 key tiles, plus 2 (prologue, epilogue)
    assert schedule.tile_costs(256, 64, 64, "q") == [3, 4, 5, 6]
    # key tiles of dK/dV: key tile 0 is seen by all 4 query tiles (heaviest, listed last)
    assert schedule.tile_costs(256, 64, 64, "k") == [3, 4, 5, 6]
    assert schedule.tile_costs(100, 64, 32, "q") == [2 + 2, 4 + 2]   # ragged last tile


@pytest.mark.parametrize("case", schedule.CASES, ids=lambda c: f"{c[0]}-T{c[2]}-d{c[3]}")
def test_heavy_first_across_heads_is_never_worse(case):
    """Never worse than either per-head order by more than 0.2% (at 16k with 16 waves every
    order is within 1% of the ideal: 1.002 against 1.001 per head)."""
    _, kind, T, _, bm, bn, per_sm = case
    got = {o: schedule.over_ideal(T, bm, bn, 16, per_sm, o, kind) for o in schedule.ORDERS}
    assert got["heavy first"] <= min(got["light first"], got["heavy first per head"]) + 0.002
    assert got["heavy first"] < 1.13


def test_a_persistent_kernel_gains_little_over_heavy_first():
    """Strided persistent programs are worse than the GPU's own dispatch of a heavy-first
    launch; a work queue with the prologue paid once gains its saved prologue (2-6%)."""
    assert schedule.persistent_vs_launch(4096, 64, 64, 16, 3) > 1.2
    assert 0.94 < schedule.persistent_vs_launch(4096, 64, 64, 16, 3, dynamic=True) < 1.0


def test_heavy_first_fixes_the_4k_forward_tail():
    """The 2026-12-04 schedule left 30-45% in the last wave at T 4096; across heads, 2-12%."""
    per_head = schedule.over_ideal(4096, 64, 64, 16, 3, "heavy first per head")
    across = schedule.over_ideal(4096, 64, 64, 16, 3, "heavy first")
    assert per_head > 1.4 and across < 1.13


# -- the prologue and the launch grids (interpreter, or compiled on a GPU) ----------------------
if _triton.available():
    from attnlens.kernels._prologue import head_tile
    from attnlens.kernels._triton import tl, triton

    @triton.jit
    def _heavy_first_probe(OUT, T, H, D, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
                           REVERSED: tl.constexpr):
        """Writes (tile, pid_bh, b, h, first offset) of program (program_id 0, 1) at its
        linear index."""
        pid, pid_bh, b, h, offs, offs_d, valid, d_valid, mask = head_tile(
            T, H, D, BLOCK, BLOCK_D, True, REVERSED)
        slot = pid_bh + (tl.num_programs(1) - 1 - pid if REVERSED else pid) * \
            tl.num_programs(0)
        five = tl.arange(0, 8)
        vals = tl.where(five == 0, pid, tl.where(five == 1, pid_bh, tl.where(
            five == 2, b, tl.where(five == 3, h, tl.sum(tl.where(
                tl.arange(0, BLOCK) == 0, offs, 0))))))
        tl.store(OUT + slot * 8 + five, vals, mask=five < 5)


@pytest.mark.kernels
@pytest.mark.skipif(not (_triton.available() and (_triton.interpreting()
                                                  or torch.cuda.is_available())),
                    reason="needs triton with a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("reversed_", [False, True])
def test_head_tile_heads_inner(reversed_):
    B, H, T, BLOCK = 2, 3, 37, 16
    n_t = math.ceil(T / BLOCK)
    out = torch.full((n_t * B * H, 8), -1, dtype=torch.int32, device=DEVICE)
    _heavy_first_probe[(B * H, n_t)](out, T, H, 16, BLOCK=BLOCK, BLOCK_D=16,
                                     REVERSED=reversed_)
    out = out.cpu()
    for x in range(n_t):                              # launch order: axis 0 (heads) fastest
        for bh in range(B * H):
            tile = n_t - 1 - x if reversed_ else x
            slot = bh + x * B * H
            assert out[slot, :5].tolist() == [tile, bh, bh // H, bh % H, tile * BLOCK]


@pytest.mark.parametrize("causal", [True, False])
def test_launch_grids_put_heads_inner_for_causal_attention(monkeypatch, causal):
    from attnlens.kernels.flash_attention import triton_bwd, triton_fwd

    grids = {}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **meta):
                grids[self.name] = (grid, meta.get("HEAVY_FIRST"))
            return launch

    for module, name in ((triton_fwd, "attn_fwd_kernel"), (triton_bwd, "_bwd_dkdv"),
                         (triton_bwd, "_bwd_dq"), (triton_bwd, "_bwd_preprocess")):
        monkeypatch.setattr(module, name, Recorder(name))
    monkeypatch.setattr(triton_fwd, "on_gpu", lambda: False)
    monkeypatch.setattr(triton_bwd, "on_gpu", lambda: False)
    B, T, H, D = 2, 40, 3, 16
    q = torch.zeros(B, T, H, D)
    triton_fwd.attn_fwd(q, q, q, 0.25, causal=causal, block_m=16, block_n=8)
    out, lse = torch.zeros_like(q), torch.zeros(B, H, T)
    triton_bwd.attn_bwd(q, q, q, q, out, lse, 0.25, causal=causal, block_m=16, block_n=8)
    want = {"attn_fwd_kernel": (3, B * H), "_bwd_dkdv": (5, B * H), "_bwd_dq": (3, B * H)}
    for name, grid in want.items():
        assert grids[name] == ((grid[::-1] if causal else grid), causal), name


def test_tiles_of_128x128_keep_the_per_head_grid(monkeypatch):
    """128 x 128 forward tiles spill with the heads-inner grid on sm_80: they keep the old one,
    except the wide tile of the sm_90 paths (`wide_tile`: d <= 64, no padding), heaviest
    first like the smaller tiles."""
    from attnlens.kernels.flash_attention import triton_fwd

    assert triton_fwd.heavy_grid(True, 128, 64) and not triton_fwd.heavy_grid(True, 128, 128)
    grids = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **meta: grids.append(grid)

    monkeypatch.setattr(triton_fwd, "attn_fwd_kernel", Recorder())
    q = torch.zeros(1, 300, 2, 16)
    monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: False)
    triton_fwd.attn_fwd(q, q, q, 0.25, block_m=128, block_n=128)
    triton_fwd.attn_fwd(q, q, q, 0.25, block_m=128, block_n=64)
    assert grids == [(3, 2), (2, 3)]
    grids.clear()
    monkeypatch.setattr(triton_fwd, "hopper_paths", lambda: True)
    wide_d = torch.zeros(1, 300, 2, 128)
    padding = torch.ones(1, 300, dtype=torch.bool)
    triton_fwd.attn_fwd(q, q, q, 0.25, block_m=128, block_n=128)              # wide
    triton_fwd.attn_fwd(wide_d, wide_d, wide_d, 0.25, block_m=128, block_n=128)
    triton_fwd.attn_fwd(q, q, q, 0.25, padding, block_m=128, block_n=128)
    assert grids == [(2, 3), (3, 2), (3, 2)]


@pytest.mark.kernels
@pytest.mark.skipif(not (_triton.available() and (_triton.interpreting()
                                                  or torch.cuda.is_available())),
                    reason="needs triton with a GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("blocks", [(128, 128), (32, 16)])
def test_the_kernel_and_its_grid_agree_on_the_order(blocks):
    """With the grid and the kernel's tile mapping out of step the rows would land in the
    wrong tiles or heads; checked against the reference at both sides of MAX_HEAVY_TILE."""
    from attnlens.kernels.flash_attention import attention_reference
    from attnlens.kernels.flash_attention.triton_fwd import attn_fwd

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 150, 2, 16, generator=g).to(DEVICE) for _ in range(3))
    out, lse = attn_fwd(q, k, v, 0.25, block_m=blocks[0], block_n=blocks[1])
    ref_out, ref_lse = attention_reference(q, k, v, 0.25)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-5, rtol=1e-5)


def test_lengths_past_the_grid_limit_keep_the_per_head_grid(monkeypatch):
    """CUDA grid axis 1 takes at most 65,535 programs: past 16 x 65,535 positions the tiles go
    back to axis 0 (no limit there)."""
    from attnlens.kernels.flash_attention import triton_fwd

    assert triton_fwd.fits_heads_inner(16 * 65535) and not triton_fwd.fits_heads_inner(
        16 * 65535 + 1)
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **meta: launches.append((grid, meta["HEAVY_FIRST"]))

    monkeypatch.setattr(triton_fwd, "attn_fwd_kernel", Recorder())
    T = 16 * 65535 + 1
    q = torch.zeros(1, 1, 1, 16).expand(1, T, 1, 16)
    triton_fwd.attn_fwd(q, q, q, 0.25, block_m=16, block_n=16)
    assert launches == [((65536, 1), False)]
