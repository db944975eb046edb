"""Linear attention with a fixed decay per head: RetNet's retention and MiniMax's lightning attention.

The first rung of the ladder: every head forgets at its own constant rate `a_h = exp(log_decay_h)`, whatever the
input, so the decay mask of the quadratic form is a fixed Toeplitz matrix, `a_h ** (t - j)` below the diagonal:

    S_t = a_h S_{t-1} + k_t v_tᵀ,    o_t = S_tᵀ (scale q_t)

RetNet (Sun et al., 2023) takes `a_h = 1 - 2 ** (-5 - h)` (`retnet_log_decays`); lightning attention (MiniMax-01, 2025)
takes ALiBi-like slopes, `a_h = exp(-slope_h)`. It is Mamba-2's SSD (`mamba2.py`) with a constant gate. Forms and shapes
as `gla.py`'s, with `log_decay` `(H,)`. Imports only torch and this package.
"""

import torch

from attention.linear.mamba2 import ssd


def retnet_log_decays(num_heads):
    """RetNet's per-head log-decays, `log(1 - 2 ** (-5 - h))` for heads `h = 0 .. num_heads - 1`."""
    return torch.log1p(-torch.exp2(-5.0 - torch.arange(num_heads, dtype=torch.float64)))


def retention(q, k, v, log_decay, *, form, initial_state=None, scale=None, chunk_size=64):
    """`(out (B, H, T, Dv), final_state (B, H, Dk, Dv))` with the fixed per-head `log_decay` `(H,)`, each `<= 0`.
    `ValueError` naming a bad argument."""
    if not isinstance(log_decay, torch.Tensor) or log_decay.shape != q.shape[1:2]:
        raise ValueError(f"log_decay must be a (H,) = {tuple(q.shape[1:2])} tensor, got "
                         f"{tuple(log_decay.shape) if isinstance(log_decay, torch.Tensor) else type(log_decay).__name__}")
    g = log_decay.to(q.dtype)[None, :, None].expand(q.shape[:3])  # (B, H, T): the same decay at every position
    return ssd(q, k, v, g, form=form, initial_state=initial_state, scale=scale, chunk_size=chunk_size)
