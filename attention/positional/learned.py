"""Learned absolute position embeddings (GPT-2, BERT): one trained vector per position up to `max_len`.

Unlike sinusoidal or rotary encodings they cannot extrapolate: a position past `max_len` has no
vector, so `LearnedPositionalEmbedding` raises instead of wrapping or truncating.
"""

import torch
from torch import nn

from attention.checks import check_int


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per position to `x`: `(B, T, dim) -> (B, T, dim)`.

    Args:
        max_len: number of positions with a vector; `offset + T` may not exceed it.
        dim: features of `x`.

    Attributes:
        weight: `(max_len, dim)` parameter, initialised from N(0, 0.02^2) as in GPT-2.
    """

    def __init__(self, max_len, dim):
        super().__init__()
        check_int("max_len", max_len)
        check_int("dim", dim)
        self.max_len, self.dim = max_len, dim
        self.weight = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, x, offset=0):
        """Return `x + weight[offset : offset + T]` for `x` of shape `(B, T, dim)`."""
        check_int("offset", offset, minimum=0)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, T, dim={self.dim}), got x.shape={tuple(x.shape)}")
        T = x.shape[1]
        if offset + T > self.max_len:
            raise ValueError(
                f"positions up to offset + T = {offset} + {T} = {offset + T} need a vector each, "
                f"but this embedding has max_len={self.max_len}"
            )
        return x + self.weight[offset:offset + T]  # (B, T, dim)
