import os
import sys

# Kernels run on the Triton CPU interpreter when there is no GPU; it must be set before import.
os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))
