"""Multi-head attention implementations, interchangeable and verified against one float64 reference."""

import os
import sys

import torch

# Without a GPU, Triton's kernels (attention/kernels/) run only in its interpreter, which Triton picks when it is first
# imported; the classes below import FlexAttention, which imports Triton where it is installed: choose it first.
if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from attention.general import MultiHeadAttention  # noqa: E402
from attention.registry import IMPLEMENTATIONS  # noqa: E402

__all__ = ["IMPLEMENTATIONS", "MultiHeadAttention"]
__version__ = "0.1.0"
