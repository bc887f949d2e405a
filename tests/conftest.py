import os
import sys

import torch

# Kernels run on the Triton CPU interpreter when there is no GPU; it must be set before import.
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))

# Tiny test models run fastest single-threaded; several threads on 2 shared cores
# oversubscribe the CPU and make each small forward many times slower.
torch.set_num_threads(1)
