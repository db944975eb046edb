"""The delta rule (DeltaNet): linear attention whose write corrects what the state already returns for the key.

DeltaNet (Schlag, Irie and Schmidhuber, 2021; Yang et al., 2024 for its chunked form) stores `v_t` under `k_t` as
one step of gradient descent on `||S^T k_t - v_t||²` with step `beta_t` in [0, 1], with no decay:

    S_t = S_{t-1} + k_t u_tᵀ,    u_t = beta_t (v_t - S_{t-1}ᵀ k_t),    o_t = S_tᵀ (scale q_t)

so a key written twice is overwritten rather than summed, where linear attention's plain sum (`gla.py` with no decay)
blurs the two values together. It is the gated delta rule (`gated_delta.py`) with every gate 1 (`g = 0`), which holds
its forms and their derivation. Shapes: q, k `(B, H, T, Dk)`, v `(B, H, T, Dv)`, beta `(B, H, T)`. Imports only torch
and this package.
"""

import torch

from attention.linear.gated_delta import gated_delta_rule


def delta_rule(q, k, v, beta, *, form, initial_state=None, scale=None, chunk_size=64):
    """`(out (B, H, T, Dv), final_state (B, H, Dk, Dv))`. `ValueError` naming a bad argument."""
    if not isinstance(beta, torch.Tensor):
        raise TypeError(f"beta must be a torch.Tensor, got {type(beta).__name__}")
    g = torch.zeros(beta.shape, dtype=beta.dtype, device=beta.device)  # no decay: a gate of exp(0) = 1
    return gated_delta_rule(q, k, v, g, beta, form=form, initial_state=initial_state, scale=scale, chunk_size=chunk_size)
