"""Sinusoidal absolute position encoding ("Attention Is All You Need", https://arxiv.org/abs/1706.03762, section 3.5).

`PE[t, 2i] = sin(t / base ** (2i / dim))` and `PE[t, 2i + 1] = cos(t / base ** (2i / dim))`, with
base 10000: each pair of features turns at its own frequency, from one radian per position down to
one turn every `2 * pi * base` positions. Nothing is learned, so any length works.
"""

import torch
from torch import nn

from attention.checks import check_int


def sinusoidal_table(num_positions, dim, base=10000.0, device=None, dtype=torch.float32):
    """The sinusoidal encodings of positions `0 .. num_positions - 1`, `(num_positions, dim)`.

    Args:
        num_positions: number of positions T.
        dim: features per position; must be even (sine and cosine pairs).
        base: wavelength scale; the slowest pair has wavelength `2 * pi * base` positions.
        device: device of the result.
        dtype: dtype of the result; the angles are computed in float64.
    """
    check_int("num_positions", num_positions, minimum=0)
    check_int("dim", dim, minimum=2)
    if dim % 2 != 0:
        raise ValueError(f"dim must be even (sine and cosine pairs), got dim={dim}")
    if not base > 0:
        raise ValueError(f"base must be positive, got base={base}")
    positions = torch.arange(num_positions, device=device, dtype=torch.float64)  # (T,)
    inv_freq = base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)  # (dim/2,)
    angles = positions[:, None] * inv_freq[None, :]  # (T, dim/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (T, dim/2, 2)
    return table.reshape(num_positions, dim).to(dtype)  # (T, dim): sin at even features, cos at odd


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding of each position to `x`: `(B, T, dim) -> (B, T, dim)`.

    The table is computed for the actual length on every call (no cap, no truncation).

    Args:
        dim: features of `x`; must be even.
        base: wavelength scale, 10000 in the paper.
    """

    def __init__(self, dim, base=10000.0):
        super().__init__()
        check_int("dim", dim, minimum=2)
        if dim % 2 != 0:
            raise ValueError(f"dim must be even (sine and cosine pairs), got dim={dim}")
        if not base > 0:
            raise ValueError(f"base must be positive, got base={base}")
        self.dim, self.base = dim, float(base)

    def forward(self, x, offset=0):
        """Return `x + PE[offset : offset + T]` for `x` of shape `(B, T, dim)`."""
        check_int("offset", offset, minimum=0)
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (B, T, dim={self.dim}), got x.shape={tuple(x.shape)}")
        T = x.shape[1]
        table = sinusoidal_table(offset + T, self.dim, self.base, x.device, x.dtype)[offset:]  # (T, dim)
        return x + table  # (B, T, dim)
