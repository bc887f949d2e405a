"""The DCMHA tensor-core forward's compiled kernels (`kernels/dcmha/triton_fwd_tc.py`): few
barriers in the head loops, and the masked key tiles load as the unmasked ones do.

Each head loop of the two passes runs H times per key tile, and a barrier there is usually a
layout conversion through shared memory. Kept as `[channels, rows, keys]` tensors, the hidden
maps took a 3-D layout of their own, and every use converted a head's map into it and the
channel sum back; read in the scratch's layout while the maps stayed in the score dot's, each
head's map went to the dot layout and back. Before (sm_90, bf16, d_head 64, barriers per
iteration of the head loops): lse pass 10 + 6, out pass 10 + 4 + 2 + 16; after: at most 12
in each pass. Compiles the `H16 official` case in a subprocess (TRITON_INTERPRET unset, as
tests/test_compile_check_instruments.py) and skips without triton's ptxas / nvdisasm /
cuobjdump.
"""

import pytest
from test_compile_check_instruments import _tools_present
from tiers import EXTENDED

from kernel_common import dcmha_official_sass_rows


def _key_tile_loops(name, row):
    """A pass's two key-tile loops (`n0`) in code order: the unmasked tiles, then the masked
    ones (`_unmasked_end`)."""
    tiles = sorted((lo for lo in row["mix"]["loops"] if lo["var"] == "n0"),
                   key=lambda lo: lo["start"])
    assert len(tiles) == 2, (name, len(tiles))
    return tiles


@EXTENDED   # compiles the H16 official case; the compile check's own barrier test: make test
@pytest.mark.skipif(not _tools_present(), reason="needs triton with ptxas, nvdisasm, cuobjdump")
def test_forward_head_loops_have_few_barriers():
    """Both forward kernels compile spill-free, and the barriers of all the head loops
    (`n`, `m`) of one key-tile loop together are at most 12 per pass (32 in the out pass
    before). Each pass has two key-tile loops (`n0`), the unmasked tiles and the masked
    ones (`_unmasked_end`), each with its own copy of the head loops."""
    rows = dcmha_official_sass_rows()
    for name in ("dcmha_tc_lse_kernel", "dcmha_tc_out_kernel"):
        row = rows[name]
        assert row["spill_bytes"] == 0, name
        loops = row["mix"]["loops"]
        for tile in _key_tile_loops(name, row):
            heads = [lo for lo in loops if lo["inner"] and lo["var"] in ("n", "m")
                     and tile["start"] <= lo["start"] and lo["end"] <= tile["end"]]
            assert heads, name
            barriers = [lo["mix"].get("bar", 0) for lo in heads]
            assert sum(barriers) <= 12, (name, barriers)


@EXTENDED   # the same compile as above
@pytest.mark.skipif(not _tools_present(), reason="needs triton with ptxas, nvdisasm, cuobjdump")
def test_masked_key_tiles_load_their_weights_as_vectors_as_the_unmasked_ones_do():
    """The masked key-tile loop (`range(mid, end)`) issues as many global loads per tile as the
    unmasked one. Its first key n0 is a multiple of BLOCK_N only if the compiler can see that
    `mid` is (`_unmasked_end`); `end` comes from the program table, and when `mid` was a
    `min` with it, each key's weights loaded one at a time there (sm_90: 64 against 34 loads
    per tile in the lse pass, 124 against 64 in the out pass; 246 / 251 registers)."""
    rows = dcmha_official_sass_rows()
    for name in ("dcmha_tc_lse_kernel", "dcmha_tc_out_kernel"):
        unmasked, masked = _key_tile_loops(name, rows[name])
        assert masked["mix"]["ldg"] == unmasked["mix"]["ldg"], (
            name, unmasked["mix"]["ldg"], masked["mix"]["ldg"])
