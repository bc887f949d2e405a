"""The DCMHA tensor-core backward's compiled gradient kernel (`kernels/dcmha/triton_bwd_tc.py`):
its weight-gradient sums stay in-warp.

The key-wise weight gradients are column sums over a tile's 64 query rows. Taken of the
`[rows, keys]` maps (8 warps down the rows) each compiled to 24 shuffles, 24 adds and 4
barriers on sm_90, 249 shuffles per head and key tile in all; taken of the transposed copies
(`_scratch_t`, `_maps_t`: a key's rows in one warp) each is 4 shuffles. Reads the
`H16 official` case for sm_90, bf16, d_head 64 in a subprocess (TRITON_INTERPRET unset, as
tests/test_compile_check_instruments.py) and skips without triton's ptxas / nvdisasm /
cuobjdump.
"""

import pytest
from test_compile_check_instruments import _tools_present

from kernel_common import dcmha_official_sass_rows


@pytest.mark.skipif(not _tools_present(), reason="needs triton with ptxas, nvdisasm, cuobjdump")
def test_gradient_kernel_head_loops_shuffle_little():
    """No head loop of the gradient kernel has more than 32 shuffles per iteration, and all
    of them together at most 100 (before the transposed copies: 52-78 in each of the four
    weight-gradient loops, 249 in all)."""
    rows = dcmha_official_sass_rows()
    grads = rows["dcmha_tc_grads_kernel"]
    assert grads["spill_bytes"] == 0
    heads = [lo for lo in grads["mix"]["loops"] if lo["inner"] and lo["var"] == "n"]
    assert len(heads) == 10
    shuffles = [lo["mix"]["shfl"] for lo in heads]
    assert max(shuffles) <= 32 and sum(shuffles) <= 100, shuffles
