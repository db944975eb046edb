"""Rotary position embeddings (RoFormer, Su et al., https://arxiv.org/abs/2104.09864), rotate-half layout.

Queries and keys are rotated, pair by pair, by an angle proportional to their position:
`theta[t, i] = t * base ** (-2i / head_dim)`. The pair is `(x[i], x[i + D/2])` (the "rotate-half"
layout of GPT-NeoX and Hugging Face's Llama code, not the interleaved `(x[2i], x[2i + 1])` of the paper
and of Meta's reference Llama code); both give the same attention scores up to a fixed permutation of
the query and key projection rows (docs: Position encodings). A rotation keeps norms, and
`R(t_q) q . R(t_k) k` depends only on `t_q - t_k`: relative position enters through the scores.

`rotary_cos_sin`, `rotate_half` and `apply_rotary` are the same code as in `attention/general.py`.
"""

import torch
from torch import nn

from attention.checks import check_int


def rotary_cos_sin(seq_len, head_dim, base, device, dtype):
    """Cosines and sines of the rotary angles `position * base ** (-2i / head_dim)`, each `(seq_len, head_dim)`.

    Computed for the actual `seq_len` on every call, so no cache can truncate a long input.
    """
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)  # (D/2,)
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)  # (T,)
    angles = positions[:, None] * inv_freq[None, :]  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D): the rotate-half convention pairs i with i + D/2
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x):
    """`(x1, x2) -> (-x2, x1)` on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x, cos, sin):
    """Rotate each pair `(x[..., i], x[..., i + D/2])` of `(B, H, T, D)` `x` by its position's angle."""
    return x * cos + rotate_half(x) * sin  # (B, H, T, D)


def rotary_angles(seq_len, head_dim, base=10000.0):
    """The rotation angle in radians of pair i at position t, `t * base ** (-2i / head_dim)`: `(seq_len, head_dim / 2)`, float64."""
    check_head_dim(head_dim)
    check_int("seq_len", seq_len, minimum=0)
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    return torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)


class RotaryEmbedding(nn.Module):
    """Rotates `(B, H, T, head_dim)` queries or keys by their positions `offset .. offset + T - 1`.

    The cosines and sines are cached and the cache grows whenever a longer `offset + T`, another
    device or another dtype arrives, so a long input is never silently truncated. A slice of the
    cache equals `rotary_cos_sin` computed for that length, bit for bit.

    Args:
        head_dim: features per head; must be even.
        base: base of the rotary frequencies (10000 in RoFormer and Llama 2).

    Example:
        >>> rope = RotaryEmbedding(head_dim=8)
        >>> q = torch.randn(1, 2, 5, 8)
        >>> torch.allclose(rope(q).norm(dim=-1), q.norm(dim=-1))
        True
    """

    def __init__(self, head_dim, base=10000.0):
        super().__init__()
        check_head_dim(head_dim)
        if not base > 0:
            raise ValueError(f"base must be positive, got base={base}")
        self.head_dim, self.base = head_dim, float(base)
        self.cos_cached, self.sin_cached = None, None  # (cached_len, head_dim) each; not in the state dict

    def cos_sin(self, seq_len, device, dtype, offset=0):
        """Cosines and sines for positions `offset .. offset + seq_len - 1`, each `(seq_len, head_dim)`."""
        needed = offset + seq_len
        cache = self.cos_cached
        if cache is None or cache.shape[0] < needed or cache.device != torch.device(device) or cache.dtype != dtype:
            with torch.inference_mode(False):  # a cache first built under inference_mode could not be saved for a backward
                self.cos_cached, self.sin_cached = rotary_cos_sin(needed, self.head_dim, self.base, device, dtype)
        return self.cos_cached[offset:needed], self.sin_cached[offset:needed]  # (T, D) each

    def forward(self, x, offset=0):
        """Return `x` `(B, H, T, head_dim)` rotated by positions starting at `offset`."""
        check_int("offset", offset, minimum=0)
        if x.dim() < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(f"x must have shape (..., T, head_dim={self.head_dim}), got x.shape={tuple(x.shape)}")
        cos, sin = self.cos_sin(x.shape[-2], x.device, x.dtype, offset)
        return apply_rotary(x, cos, sin)  # (B, H, T, D)


def check_head_dim(head_dim):
    """Raise a clear error unless `head_dim` is a positive even int (RoPE rotates pairs of features)."""
    check_int("head_dim", head_dim)
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be a positive even int, got head_dim={head_dim!r}")
