"""Multi-head attention implementations, interchangeable and verified against one float64 reference."""

from attention.general import MultiHeadAttention
from attention.registry import IMPLEMENTATIONS, get_implementation

__all__ = ["IMPLEMENTATIONS", "MultiHeadAttention", "get_implementation"]
__version__ = "0.1.0"
