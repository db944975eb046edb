"""Kimi delta attention (KDA: Kimi Linear's linear layers), the gated delta rule with a gate per key channel, in its
four forms.

The gated delta rule (`gated_delta.py`, whose docstring derives the chunk algorithm) decays the whole state by one
number per head and position. Kimi delta attention (Kimi Team, "Kimi Linear", 2025) decays each key channel by its own
`a_t = exp(g_t)`, `g_t` a vector of `Dk` log-decays `<= 0`, as GLA does for linear attention:

    S_t = diag(a_t) S_{t-1} + k_t u_tᵀ,    u_t = beta_t (v_t - (diag(a_t) S_{t-1})ᵀ k_t),    o_t = S_tᵀ (scale q_t)

The forms (`"recurrent"`, `"chunked"`, `"quadratic"` and the decode step `kimi_delta_step`) are the gated delta rule's
with every decay `exp(G_t - G_j)` taken per channel: in a chunk, `A[t, j] = beta_t sum_d k_t[d] k_j[d]
exp(G_t[d] - G_j[d])` for `j < t`, the scores `sum_d q_t[d] k_j[d] exp(G_t[d] - G_j[d])` for `j <= t`, and the
chunk's start and end decays `exp(G_t)` and `exp(G_C - G_t)` applied per channel. The pairwise decays form a
`(C, C, Dk)` tensor per head, which keeps every exponent at most 0 (no overflow) at the cost of memory: the quadratic
form (one chunk of the whole length) suits short sequences only. With every channel's gate equal, KDA is the gated
delta rule (tested).

Imports only torch (and this package's `checks.py`). Shapes: q, k and g `(B, H, T, Dk)`, v `(B, H, T, Dv)`, beta `(B, H, T)`, the state
`(B, H, Dk, Dv)`. q is scaled inside (`scale`, default `Dk ** -0.5`); nothing is normalised inside (the layers
L2-normalise q and k). Anchors: flash-linear-attention's `naive_recurrent_kda` and transformers'
`chunk_kimi_delta_attention` fallback.
"""

import torch

from attention.linear.checks import FORMS, check_inputs, run_form


def kimi_delta_rule(q, k, v, g, beta, *, form, initial_state=None, scale=None, chunk_size=64):
    """`(out, final_state)`: out `(B, H, T, Dv)`, the state after the last position `(B, H, Dk, Dv)`.

    `form` is one of `FORMS`, each the same function (see the module docstring); `chunk_size` is the chunked form's.
    `initial_state` (default zeros) is the state before the first position: a sequence in two calls, the first's
    final state passed to the second, gives the same outputs as one call. `ValueError` naming any argument whose
    shape, dtype or values disagree (a positive log-decay, a `beta` outside [0, 1], a chunk size below 1)."""
    scale = check_inputs(q, k, v, form=form, initial_state=initial_state, scale=scale, chunk_size=chunk_size, g=g,
                         g_per_channel=True, beta=beta)
    return run_form(form, kimi_delta_step, chunk, (q, k, v, g, beta), initial_state, scale, chunk_size)


def kimi_delta_step(q, k, v, g, beta, state, scale):
    """One position (a decode step): q, k and g `(B, H, Dk)`, v `(B, H, Dv)`, beta `(B, H)`, the state
    `(B, H, Dk, Dv)`; returns `(out (B, H, Dv), the new state)`."""
    state = state * g.exp()[..., :, None]  # decay each key channel's row of the state: diag(a_t) S_{t-1}
    predicted = torch.einsum("bhk,bhkv->bhv", k, state)  # what the state returns for k_t: (a_t S_{t-1})ᵀ k_t
    correction = beta[..., None] * (v - predicted)  # u_t
    state = state + k[..., :, None] * correction[..., None, :]  # write u_t under k_t: S_t
    return torch.einsum("bhk,bhkv->bhv", q * scale, state), state


def chunk(q, k, v, g, beta, state):
    """One chunk of C positions from the state before it (q already scaled): `(out (B, H, C, Dv), the state after)`."""
    C = q.shape[2]
    G = g.cumsum(dim=2)  # (B, H, C, Dk): log of each channel's decay from the chunk's start to each position
    strictly_lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    lower = strictly_lower | torch.eye(C, dtype=torch.bool, device=q.device)
    exponent = (G[:, :, :, None] - G[:, :, None, :]).masked_fill(~lower[..., None], float("-inf"))
    decay = exponent.exp()  # (B, H, C, C, Dk): exp(G_t[d] - G_j[d]) for j <= t, else 0
    A = beta[..., None] * torch.einsum("bhtd,bhjd,bhtjd->bhtj", k, k, decay).masked_fill(~strictly_lower, 0)
    identity = torch.eye(C, dtype=q.dtype, device=q.device)
    right = beta[..., None] * (v - (k * G.exp()) @ state)  # (B, H, C, Dv): diag(beta)(V - (K ⊙ e^G) S_0)
    U = torch.linalg.solve_triangular(identity + A, right, upper=False, unitriangular=True)  # (B, H, C, Dv)
    scores = torch.einsum("bhtd,bhjd,bhtjd->bhtj", q, k, decay)  # (B, H, C, C)
    out = (q * G.exp()) @ state + scores @ U  # (B, H, C, Dv)
    to_end = (G[:, :, -1:] - G).exp()  # (B, H, C, Dk): each channel's decay from each position to the chunk's end
    state = G[:, :, -1].exp()[..., :, None] * state + (k * to_end).transpose(-1, -2) @ U
    return out, state
