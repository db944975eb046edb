"""Multi-head attention implementations, interchangeable and verified against one float64 reference."""

from attention.general import MultiHeadAttention
from attention.registry import IMPLEMENTATIONS

__all__ = ["IMPLEMENTATIONS", "MultiHeadAttention"]
__version__ = "0.1.0"
