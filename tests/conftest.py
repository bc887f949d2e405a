import os
import sys

import torch

# Kernels run on the Triton CPU interpreter when there is no GPU; it must be set before import.
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

# Tiny test models run fastest single-threaded; several threads on 2 shared cores
# oversubscribe the CPU and make each small forward many times slower. ATTNLENS_TEST_THREADS
# picks another count so the suite can be checked to give the same results with 2 threads.
_THREADS = os.environ.get("ATTNLENS_TEST_THREADS", "1")
if not _THREADS.isdigit() or int(_THREADS) < 1:
    raise ValueError(f"ATTNLENS_TEST_THREADS={_THREADS!r}: must be a positive integer thread count")
torch.set_num_threads(int(_THREADS))
