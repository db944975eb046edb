# %% [markdown]
# # Position encodings
#
# Attention by itself is permutation-equivariant: shuffle the tokens and the outputs shuffle with
# them. Position encodings break that symmetry. `attention.positional` holds one definition of each:
#
# | encoding | where it acts | registered module |
# | --- | --- | --- |
# | sinusoidal (Vaswani et al., 2017) | added to the token embeddings | - |
# | learned absolute (GPT-2) | added to the token embeddings | - |
# | rotary, RoPE (Su et al., 2021) | rotates queries and keys | `rope` (`RoPEAttention`) |
# | ALiBi (Press et al., 2022) | a bias on the scores | `alibi` (SDPA), `alibi_flex` (FlexAttention `score_mod`) |

# %%
import math

import torch

from attention import IMPLEMENTATIONS
from attention.display import show
from attention.plotting import plot_alibi, plot_attention_weights, plot_learned, plot_rope_angles, plot_sinusoidal
from attention.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    alibi_slopes,
    sinusoidal_table,
)
from attention.reference import reference_causal_self_attention

# %% [markdown]
# ## Sinusoidal
#
# `PE[t, 2i] = sin(t / 10000^(2i/d))`, `PE[t, 2i+1] = cos(t / 10000^(2i/d))`: fast-turning
# features at low `i`, slow ones at high `i`. It needs no parameters and is defined at any position.

# %%
show(plot_sinusoidal(num_positions=64, dim=32))

# %%
table = sinusoidal_table(64, 32)
t, i = 10, 3
print("table shape (positions, features):", tuple(table.shape))
print("PE[10, 6] =", table[t, 2 * i].item(), " closed form:", math.sin(t / 10000 ** (2 * i / 32)))

# %% [markdown]
# ## Learned absolute
#
# One trained vector per position (GPT-2, BERT). It cannot go past the longest position it was
# built for, and says so instead of indexing out of range or wrapping around:

# %%
torch.manual_seed(0)
learned = LearnedPositionalEmbedding(max_len=16, dim=8)
try:
    learned(torch.zeros(1, 20, 8))
except ValueError as error:
    print("ValueError:", error)
show(plot_learned(learned))

# %% [markdown]
# ## Rotary (RoPE)
#
# RoPE rotates each pair of query/key features `(x[i], x[i + D/2])` (the "rotate-half" layout of
# GPT-NeoX and Llama) by the angle `t * 10000^(-2i/D)`. A rotation keeps lengths, and the dot
# product of a query rotated by `t_q` with a key rotated by `t_k` depends on `t_q - t_k` only: the
# scores see relative positions. The angles are computed for the actual length on every call (or the
# cache grows), so long inputs are never silently truncated.

# %%
show(plot_rope_angles(seq_len=64, head_dim=32))

# %%
rope = RotaryEmbedding(head_dim=16)
q, k = torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16)
same_vector_q = q[:, :, :1].expand(1, 1, 40, 16)
same_vector_k = k[:, :, :1].expand(1, 1, 40, 16)
rq, rk = rope(same_vector_q), rope(same_vector_k)
print("norms kept:", torch.allclose(rq.norm(dim=-1), same_vector_q.norm(dim=-1), atol=1e-5))
score_5_2 = (rq[0, 0, 5] * rk[0, 0, 2]).sum().item()
score_35_32 = (rq[0, 0, 35] * rk[0, 0, 32]).sum().item()
print(f"score(q at 5, k at 2) = {score_5_2:.5f}   score(q at 35, k at 32) = {score_35_32:.5f}   (same offset 3)")

# %% [markdown]
# ## ALiBi
#
# ALiBi adds no vector at all: head `h` adds `-m_h * (i - j)` to the score of query `i` and key
# `j <= i`, a penalty growing with distance, with a different slope `m_h` per head. For a power
# of two `n` heads the slopes are `2^(-8/n), 2^(-16/n), ..., 2^-8`; for other counts the paper takes
# the slopes of the closest smaller power of two, then every other slope of twice that power.
#
# The causal form is the paper's, for decoders: the bias is defined for keys at or before the query,
# and the causal mask hides the rest. A symmetric bias `-m * |i - j|` coincides with it wherever
# the causal mask lets attention through, which is how it ends up inside causal models; the trap
# is code that builds the symmetric bias and leaves out the mask, trusting the bias to hide the
# future. It does not: it only penalises future keys, so information leaks backwards. Here the
# symmetric form exists only behind `causal=False`, labelled as the variant for bidirectional
# encoders, and the causal form always carries `-inf` above the diagonal.

# %%
print("slopes, 8 heads: ", [f"1/{round(1 / s)}" for s in alibi_slopes(8).tolist()])
print("slopes, 6 heads: ", [round(s, 5) for s in alibi_slopes(6).tolist()])
show(plot_alibi(num_heads=8, seq_len=12, causal=True))

# %%
show(plot_alibi(num_heads=4, seq_len=12, causal=False,
                title="Symmetric ALiBi (bidirectional encoders only): -m |i - j|"))

# %% [markdown]
# ## The modules, checked against the float64 reference
#
# `RoPEAttention`, `ALiBiAttention` and `ALiBiFlexAttention` keep the causal family's constructor and
# canonical state dict. The reference applies its own RoPE rotation and ALiBi bias in float64.

# %%
x = torch.randn(2, 24, 64)
for name in ("rope", "alibi", "alibi_flex"):
    module = IMPLEMENTATIONS[name](64, 64, 64, 0.0, 8).eval()
    with torch.no_grad():
        out = module(x)
    reference, weights = reference_causal_self_attention(x, module.canonical_state_dict(), 8, module.position_encoding)
    print(f"{name:<11} max |out - reference| = {(out.double() - reference).abs().max().item():.1e}")

# %% [markdown]
# The attention weights of the ALiBi model (from the reference) show the recency bias: heads with a
# large slope look at the last few tokens, heads with a small slope spread out.

# %%
show(plot_attention_weights(weights[0].float(), title="ALiBi attention weights per head (reference, batch 0)"))
