"""Gated linear attention (GLA), the decayed linear attention the delta rules build on, in its four forms.

Linear attention drops the softmax: `o_t = sum_{j <= t} (q_tᵀ k_j) v_j = S_tᵀ q_t` with the state
`S_t = S_{t-1} + k_t v_tᵀ`, a `(Dk, Dv)` matrix per head that holds every past key and value summed. A sum only
grows, so the rules of the last years decay it before each write:

    S_t = diag(a_t) S_{t-1} + k_t v_tᵀ,    o_t = S_tᵀ (scale q_t),    a_t = exp(g_t)

with `g_t` a vector of `Dk` log-decays `<= 0` per head and position (GLA: Yang, Wang, Shen, Panda and Kim, 2023).
The rungs below it on the ladder are the same recurrence with fewer gates: one number per head and position
(Mamba-2's SSD, `mamba2.py`), one per head for the whole sequence (RetNet, lightning attention: `retnet.py`).

The forms: `"recurrent"` (the definition, `gated_linear_step` in a loop), `"chunked"` (within a chunk of C positions,
with `G_t` the cumulative log-decay from the chunk's start, `O = (Q ⊙ e^G) S_0 + P V` with the decayed scores
`P[t, j] = sum_d q_t[d] k_j[d] exp(G_t[d] - G_j[d])` for `j <= t`, and the state after the chunk
`diag(e^{G_C}) S_0 + (K ⊙ e^{G_C - G})ᵀ V`), and `"quadratic"` (the whole sequence as one chunk: the attention form,
scores times a decay mask, as softmax attention without the softmax). Every exponent is at most 0.

Imports only torch (and this package's `checks.py`). Shapes: q, k and g `(B, H, T, Dk)`, v `(B, H, T, Dv)`, the state
`(B, H, Dk, Dv)`; q is scaled inside (`scale`, default `Dk ** -0.5`). Anchor: flash-linear-attention's
`naive_recurrent_gla`.
"""

import torch

from attention.linear.checks import check_inputs, run_form


def gated_linear_attention(q, k, v, g, *, form, initial_state=None, scale=None, chunk_size=64):
    """`(out (B, H, T, Dv), final_state (B, H, Dk, Dv))`; `form` one of `checks.FORMS`, each the same function.
    `ValueError` naming any argument whose shape, dtype or values disagree (a positive log-decay, a chunk size
    below 1)."""
    scale = check_inputs(q, k, v, form=form, initial_state=initial_state, scale=scale, chunk_size=chunk_size, g=g,
                         g_per_channel=True)
    return run_form(form, gated_linear_step, chunk, (q, k, v, g), initial_state, scale, chunk_size)


def gated_linear_step(q, k, v, g, state, scale):
    """One position (a decode step): q, k and g `(B, H, Dk)`, v `(B, H, Dv)`, the state `(B, H, Dk, Dv)`; returns
    `(out (B, H, Dv), the new state)`."""
    state = state * g.exp()[..., :, None] + k[..., :, None] * v[..., None, :]  # diag(a_t) S_{t-1} + k_t v_tᵀ
    return torch.einsum("bhk,bhkv->bhv", q * scale, state), state


def chunk(q, k, v, g, state):
    """One chunk of C positions from the state before it (q already scaled): `(out (B, H, C, Dv), the state after)`."""
    C = q.shape[2]
    G = g.cumsum(dim=2)  # (B, H, C, Dk)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    decay = (G[:, :, :, None] - G[:, :, None, :]).masked_fill(~lower[..., None], float("-inf")).exp()  # (B, H, C, C, Dk)
    scores = torch.einsum("bhtd,bhjd,bhtjd->bhtj", q, k, decay)  # (B, H, C, C): decayed, zero above the diagonal
    out = (q * G.exp()) @ state + scores @ v  # (B, H, C, Dv)
    state = G[:, :, -1].exp()[..., :, None] * state + (k * (G[:, :, -1:] - G).exp()).transpose(-1, -2) @ v
    return out, state
