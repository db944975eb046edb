"""The gated delta rule (gated DeltaNet: Qwen3-Next's and Qwen3.5's linear layers), in its four forms.

Linear attention keeps, per head, a state `S` of shape `(Dk, Dv)` instead of a cache of every past key and value:
reading it with a query costs the same at every position. The delta rule writes to it as a learning step would:
before storing `v_t` under the key `k_t`, it subtracts what the state already returns for that key, so a key
written twice is overwritten rather than summed. Gated DeltaNet (Yang, Kautz and Hatamizadeh, 2024) also decays the
whole state by `a_t = exp(g_t)` (one number per head and position, `g_t <= 0`) before each write:

    S_t = a_t S_{t-1} + k_t u_tᵀ,    u_t = beta_t (v_t - (a_t S_{t-1})ᵀ k_t),    o_t = S_tᵀ (scale q_t)

(`beta_t` in [0, 1] is how much of the correction is written). The same function, four ways:

* `"recurrent"`: the definition, one position at a time (`gated_delta_step`, the decode step, in a loop);
* `"chunked"`: chunks of `chunk_size` positions, each a few matmuls (the WY / UT transform below), the state
  carried from chunk to chunk: what the GPU kernels (flash-linear-attention) and transformers' torch fallback run;
* `"quadratic"`: the whole sequence as one chunk, the attention form `O = (Q Kᵀ ⊙ D) U` with the decay mask
  `D[t, j] = exp(G_t - G_j)` for `j <= t`: quadratic in the length, as softmax attention is.

The chunk algorithm. Within a chunk, with the initial state `S_0` and `G_t = g_1 + ... + g_t` (so the decay from
position `j` to `t` is `exp(G_t - G_j)`), unrolling the recurrence makes every `u_t` a linear function of the
earlier ones: `(I + A) U = diag(beta) (V - diag(exp(G)) K S_0)` with `A[t, j] = beta_t exp(G_t - G_j) k_tᵀ k_j` for
`j < t`, a unit lower-triangular system (solved by substitution). Then `O = diag(exp(G)) Q S_0 + (Q Kᵀ ⊙ D) U` and
the state after the chunk is `exp(G_C) S_0 + Kᵀ diag(exp(G_C - G)) U`. Every exponent is at most 0, so no decay
overflows however close the gates come to 0.

Imports only torch (and this package's `checks.py`). Shapes: q, k `(B, H, T, Dk)`, v `(B, H, T, Dv)`, g and beta `(B, H, T)`, the state
`(B, H, Dk, Dv)`. q is scaled inside (`scale`, default `Dk ** -0.5`); nothing is normalised inside (the layers
L2-normalise q and k). Anchors: flash-linear-attention's `naive_recurrent_gated_delta_rule` and transformers'
`torch_chunk_gated_delta_rule`.
"""

import torch

from attention.linear.checks import FORMS, check_inputs, run_form


def gated_delta_rule(q, k, v, g, beta, *, form, initial_state=None, scale=None, chunk_size=64):
    """`(out, final_state)`: out `(B, H, T, Dv)`, the state after the last position `(B, H, Dk, Dv)`.

    `form` is one of `FORMS`, each the same function (see the module docstring); `chunk_size` is the chunked form's.
    `initial_state` (default zeros) is the state before the first position: a sequence in two calls, the first's
    final state passed to the second, gives the same outputs as one call. `ValueError` naming any argument whose
    shape, dtype or values disagree (a positive log-decay, a `beta` outside [0, 1], a chunk size below 1)."""
    scale = check_inputs(q, k, v, form=form, initial_state=initial_state, scale=scale, chunk_size=chunk_size, g=g,
                         beta=beta)
    return run_form(form, gated_delta_step, chunk, (q, k, v, g, beta), initial_state, scale, chunk_size)


def gated_delta_step(q, k, v, g, beta, state, scale):
    """One position (a decode step): q, k `(B, H, Dk)`, v `(B, H, Dv)`, g and beta `(B, H)`, the state
    `(B, H, Dk, Dv)`; returns `(out (B, H, Dv), the new state)`."""
    state = state * g.exp()[..., None, None]  # decay the whole state: a_t S_{t-1}
    predicted = torch.einsum("bhk,bhkv->bhv", k, state)  # what the state returns for k_t: (a_t S_{t-1})ᵀ k_t
    correction = beta[..., None] * (v - predicted)  # u_t
    state = state + k[..., :, None] * correction[..., None, :]  # write u_t under k_t: S_t
    return torch.einsum("bhk,bhkv->bhv", q * scale, state), state


def chunk(q, k, v, g, beta, state):
    """One chunk of C positions from the state before it (q already scaled): `(out (B, H, C, Dv), the state after)`."""
    C = q.shape[2]
    G = g.cumsum(dim=-1)  # (B, H, C): log of the decay from the chunk's start to each position
    strictly_lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    lower = strictly_lower | torch.eye(C, dtype=torch.bool, device=q.device)
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # (B, H, C, C): D[t, j]
    A = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).masked_fill(~strictly_lower, 0)  # (B, H, C, C)
    identity = torch.eye(C, dtype=q.dtype, device=q.device)
    right = beta[..., None] * (v - G.exp()[..., None] * (k @ state))  # (B, H, C, Dv): diag(beta)(V - diag(e^G) K S_0)
    U = torch.linalg.solve_triangular(identity + A, right, upper=False, unitriangular=True)  # (B, H, C, Dv)
    out = G.exp()[..., None] * (q @ state) + ((q @ k.transpose(-1, -2)) * decay) @ U  # (B, H, C, Dv)
    to_end = (G[..., -1:] - G).exp()  # (B, H, C): decay from each position to the chunk's end
    state = G[..., -1].exp()[..., None, None] * state + (k * to_end[..., None]).transpose(-1, -2) @ U
    return out, state
