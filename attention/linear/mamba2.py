"""Mamba-2's state-space duality (SSD) as linear attention: one decay per head and position.

Mamba-2 (Dao and Gu, 2024) writes its layer as a state-space model, `h_t = a_t h_{t-1} + B_t x_tᵀ`, `y_t = C_tᵀ h_t`,
with a scalar `a_t = exp(dt_t A)` per head: in attention's names `C` is the query, `B` the key and `dt_t x_t` the
value, and the recurrence is gated linear attention (`gla.py`) with every key channel decayed alike:

    S_t = a_t S_{t-1} + k_t v_tᵀ,    o_t = S_tᵀ (scale q_t),    a_t = exp(g_t), g_t <= 0 per head and position

Its "duality" is the quadratic form: the same outputs as `(Q Kᵀ ⊙ L) V` with the decay mask
`L[t, j] = exp(g_{j+1} + ... + g_t)`, a masked attention. Forms and shapes as `gla.py`'s, with g `(B, H, T)`
(Mamba-2 itself leaves q unscaled: pass `scale=1.0`). Imports only torch and this package.
"""

import torch

from attention.linear.checks import check_inputs
from attention.linear.gla import gated_linear_attention


def ssd(q, k, v, g, *, form, initial_state=None, scale=None, chunk_size=64):
    """`(out (B, H, T, Dv), final_state (B, H, Dk, Dv))`: gated linear attention with one log-decay `g` `(B, H, T)`
    for every key channel. `ValueError` naming a bad argument."""
    scale = check_inputs(q, k, v, form=form, initial_state=initial_state, scale=scale, chunk_size=chunk_size, g=g)
    return gated_linear_attention(q, k, v, g[..., None].expand(q.shape), form=form, initial_state=initial_state,
                                  scale=scale, chunk_size=chunk_size)


def ssd_step(q, k, v, g, state, scale):
    """One position (a decode step): q, k `(B, H, Dk)`, v `(B, H, Dv)`, g `(B, H)`; `(out (B, H, Dv), new state)`."""
    state = state * g.exp()[..., None, None] + k[..., :, None] * v[..., None, :]  # a_t S_{t-1} + k_t v_tᵀ
    return torch.einsum("bhk,bhkv->bhv", q * scale, state), state
