# %% [markdown]
# # Position encodings
#
# This page shows what attention knows about token order by itself, and the four ways
# `attention.positional` adds position: sinusoidal and learned absolute encodings, rotary
# embeddings (RoPE, in both of its feature layouts) and ALiBi. It assumes the multi-head attention
# of the [split-heads](../split_heads/) page and the [SDPA](../../glossary/#sdpa) call of the
# [SDPA page](../sdpa/).
#
# | encoding | where it acts | registered module |
# | --- | --- | --- |
# | sinusoidal (Vaswani et al., 2017) | added to the token embeddings | - |
# | learned absolute (GPT-2) | added to the token embeddings | - |
# | rotary, RoPE (Su et al., 2021) | rotates queries and keys | `rope` (`RoPEAttention`) |
# | ALiBi (Press et al., 2022) | a bias on the scores | `alibi` (SDPA), `alibi_flex` (FlexAttention [`score_mod`](../../glossary/#mask-mod-score-mod)) |
#
# API reference: [`attention.positional`](../../api/positional/), [`attention.causal.rope`](../../api/causal/rope/), [`attention.causal.alibi`](../../api/causal/alibi/), [`attention.causal.alibi_flex`](../../api/causal/alibi_flex/).

# %%
import math

import torch
import torch.nn.functional as F

from attention import IMPLEMENTATIONS
from attention.display import show, show_markdown, show_table
from attention.plotting import (
    plot_alibi,
    plot_attention_weights,
    plot_learned,
    plot_rope_angles,
    plot_sinusoidal,
)
from attention.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    alibi_slopes,
    sinusoidal_table,
)
from attention.reference import kv_heads_state, reference_attention, reference_causal_self_attention

# %% [markdown]
# ## What attention sees of the order
#
# **Without a mask, attention is permutation-equivariant**: shuffle the tokens and the outputs
# shuffle with them. Each output is a weighted sum over *all* tokens, with weights computed from
# the token vectors alone; nothing in the computation knows where a token stands.
#
# **With a [causal mask](../../glossary/#causal-mask), as in every registered class, it is not.**
# Position `t` attends to positions `0 .. t`, so its output is a function of its own token `x_t`
# and of the *set* `{x_0, ..., x_t}`, not of the order within it. Shuffle the tokens before
# position `t` among themselves, and every output from `t` on stays the same while the outputs
# before `t` change (they see other prefixes). The mask is thus a weak position signal of its own:
# how many tokens a position sees grows with its index (Haviv et al., 2022,
# https://arxiv.org/abs/2203.16634). RoPE and ALiBi make the scores depend on distances, so with
# them even the outputs from `t` on change.
#
# Checked below: the float64 reference without a mask; then every registered class, on a full
# shuffle and on a shuffle of the first `t` tokens only.

# %%
torch.manual_seed(0)
B, T, d_model, num_heads, t = 2, 24, 64, 8, 16
x = torch.randn(B, T, d_model)  # (B, T, C)
state = IMPLEMENTATIONS["split_heads"](d_model, d_model, T, 0.0, num_heads).canonical_state_dict()
shuffle = torch.randperm(T)  # a permutation of all positions
prefix_shuffle = torch.cat([torch.randperm(t), torch.arange(t, T)])  # only positions 0..t-1

out, _ = reference_attention(x, x, x, state, num_heads)  # no mask
out_shuffled, _ = reference_attention(x[:, shuffle], x[:, shuffle], x[:, shuffle], state, num_heads)
difference = (out_shuffled - out[:, shuffle]).abs().max().item()
print(f"no mask: max |attention(shuffled x) - shuffled attention(x)| = {difference:.1e}")

# %% tags=["hide-input"]
rows, unchanged_after_t, full_shuffle = [], {}, {}
for name, cls in IMPLEMENTATIONS.items():
    module = cls(d_model, d_model, T, 0.0, num_heads).eval()
    # Grouped-query classes (fewer K/V heads) take the first K/V heads of the shared weights.
    module.load_canonical_state_dict(kv_heads_state(state, num_heads, getattr(module, "num_kv_heads", num_heads)))
    with torch.no_grad():
        out = module(x)  # (B, T, d_out)
        full = (module(x[:, shuffle]) - out[:, shuffle]).abs().max().item()
        prefix = (module(x[:, prefix_shuffle]) - out[:, prefix_shuffle]).abs()  # (B, T, d_out)
    after, before = prefix[:, t:].max().item(), prefix[:, :t].max().item()
    unchanged_after_t[name] = (cls.position_encoding, after < 1e-5)
    full_shuffle[name] = full
    rows.append([f"`{name}`", cls.position_encoding or "none", f"{full:.1e}", f"{after:.1e}", f"{before:.1e}"])
show_table(
    f"Max |f(shuffled x) - shuffled f(x)|, T = {T}, float32",
    ["class", "position encoding", "all positions shuffled", f"first {t} shuffled: outputs at {t}..{T - 1}",
     f"first {t} shuffled: outputs at 0..{t - 1}"], rows)
without = [name for name, (encoding, same) in unchanged_after_t.items() if encoding is None]
with_encoding = [name for name, (encoding, same) in unchanged_after_t.items() if encoding is not None]
show_markdown(
    f"A full shuffle changes the outputs of {sum(full > 1e-5 for full in full_shuffle.values())} of the "
    f"{len(full_shuffle)} classes beyond float32 rounding (by {min(full_shuffle.values()):.2g} to "
    f"{max(full_shuffle.values()):.2g}){': none is equivariant' if min(full_shuffle.values()) > 1e-5 else ''}. "
    f"Shuffling the first {t} tokens leaves the outputs "
    f"at positions {t}..{T - 1} unchanged (up to float32 rounding, below 1e-5) for "
    f"{sum(unchanged_after_t[n][1] for n in without)} of the {len(without)} classes without a position encoding, "
    f"and for {sum(unchanged_after_t[n][1] for n in with_encoding)} of the {len(with_encoding)} with one "
    f"({', '.join(f'`{n}`' for n in with_encoding)}).")

# %% [markdown]
# ## Sinusoidal
#
# `PE[t, 2i] = sin(t / 10000^(2i/d))`, `PE[t, 2i+1] = cos(t / 10000^(2i/d))`: fast-turning
# features at low `i`, slow ones at high `i`. It needs no parameters and is defined at any position.

# %% tags=["hide-input"]
show(plot_sinusoidal(num_positions=64, dim=32))

# %%
table = sinusoidal_table(64, 32)
position, i = 10, 3
print("table shape (positions, features):", tuple(table.shape))
print(f"PE[{position}, {2 * i}] =", table[position, 2 * i].item(), " closed form:", math.sin(position / 10000 ** (2 * i / 32)))

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

# %% tags=["hide-input"]
show(plot_learned(learned))

# %% [markdown]
# ## Rotary (RoPE)
#
# RoPE rotates pairs of query and key features, pair `i` of position `t` by the angle
# `t * 10000^(-2i/D)`. A rotation keeps lengths, and the dot product of a query rotated by `t_q`
# with a key rotated by `t_k` depends on `t_q - t_k` only: the scores see relative positions. The
# angles are computed for the actual length on every call (or the cache grows), so long inputs
# are never silently truncated.

# %% tags=["hide-input"]
show(plot_rope_angles(seq_len=64, head_dim=32))

# %%
torch.manual_seed(0)
rope = RotaryEmbedding(head_dim=16)
q, k = torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16)  # (B, H, T, D)
same_vector_q = q[:, :, :1].expand(1, 1, 40, 16)  # one query vector at every position
same_vector_k = k[:, :, :1].expand(1, 1, 40, 16)
rq, rk = rope(same_vector_q), rope(same_vector_k)  # (B, H, T, D)
print("norms kept:", torch.allclose(rq.norm(dim=-1), same_vector_q.norm(dim=-1), atol=1e-5))
score_5_2 = (rq[0, 0, 5] * rk[0, 0, 2]).sum().item()
score_35_32 = (rq[0, 0, 35] * rk[0, 0, 32]).sum().item()
print(f"score(q at 5, k at 2) = {score_5_2:.5f}   score(q at 35, k at 32) = {score_35_32:.5f}   (same offset 3)")

# %% [markdown]
# ### Two layouts of the pairs
#
# Which features form a pair is a convention, and two are in use:
#
# * **Rotate-half**: pair `i` is `(x[i], x[i + D/2])`. GPT-NeoX and Hugging Face's Llama code
#   (`rotate_half`) use it, and so does this package (`RotaryEmbedding`, `RoPEAttention`).
# * **Interleaved**: pair `i` is the adjacent `(x[2i], x[2i + 1])`, as in the RoFormer paper and
#   Meta's reference Llama code, which views each adjacent pair as one complex number and
#   multiplies it by `e^(i * angle)` (`apply_rotary_emb`).
#
# The two compute the same attention up to a fixed reordering of each head's query and key
# features: feature `2i + j` of the interleaved layout (`j` = 0 or 1) is feature `i + j * D/2` of
# the rotate-half one. So interleaved weights run in a rotate-half model once the rows of the query
# and key weights are reordered within each head; Hugging Face's Llama conversion script does
# exactly this (`permute` in `convert_llama_weights_to_hf.py`). The value and output weights stay
# as they are. A short interleaved RoPE, and that reordering:

# %%
def rotary_interleaved(x, base=10000.0):
    """Rotate the adjacent pairs `(x[..., 2i], x[..., 2i + 1])` of `(B, H, T, D)` `x` (Meta's Llama)."""
    B, H, T, D = x.shape
    inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)  # (D/2,): same frequencies
    angles = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    rotation = torch.polar(torch.ones_like(angles), angles)  # (T, D/2): e^(i * angle)
    pairs = torch.view_as_complex(x.float().reshape(B, H, T, D // 2, 2))  # (B, H, T, D/2) complex
    return torch.view_as_real(pairs * rotation).reshape(B, H, T, D).to(x.dtype)  # (B, H, T, D)


def interleaved_to_rotate_half(weight, num_heads):
    """Reorder the rows of a query or key weight `(H*D, d_in)` (or bias `(H*D,)`) within each head:
    row `2i + j` of a head moves to row `i + j * D/2`. Hugging Face's Llama conversion `permute`."""
    rows = weight.shape[0]
    per_head = weight.view(num_heads, rows // num_heads // 2, 2, -1)  # (H, D/2, 2, d_in): pair i, j
    return per_head.transpose(1, 2).reshape(weight.shape)  # (H, 2, D/2, d_in) -> (H*D, d_in)


D = 16
q = torch.randn(1, 1, 40, D)  # (B, H, T, D)
interleaved_order = torch.arange(D).view(D // 2, 2).T.reshape(D)  # [0, 2, 4, ..., 1, 3, 5, ...]
rotated_half = RotaryEmbedding(head_dim=D)(q[..., interleaved_order])
print(f"max |rotate-half(reordered q) - reordered interleaved(q)| = "
      f"{(rotated_half - rotary_interleaved(q)[..., interleaved_order]).abs().max().item():.1e}")

# %% [markdown]
# The same on a whole model: an interleaved-RoPE causal attention written out below, with one set
# of weights, against the package's `RoPEAttention` (rotate-half) given the same weights with the
# query and key rows reordered, and once more without reordering them.

# %%
def interleaved_rope_attention(x, state, num_heads):
    """Causal multi-head self-attention with Meta-style interleaved RoPE, from canonical weights."""
    B, T, _ = x.shape

    def heads(name):  # (B, T, d_in) -> (B, T, d_out) -> (B, H, T, D)
        projected = F.linear(x, state[f"{name}.weight"], state.get(f"{name}.bias"))  # (B, T, d_out)
        return projected.view(B, T, num_heads, -1).transpose(1, 2)  # (B, H, T, D)

    q, k = rotary_interleaved(heads("query")), rotary_interleaved(heads("key"))  # (B, H, T, D) each
    v = heads("value")  # (B, H, T, D)
    context = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
    context = context.transpose(1, 2).reshape(B, T, -1)  # (B, T, H*D)
    return F.linear(context, state["out.weight"], state["out.bias"])  # (B, T, d_out)


torch.manual_seed(0)
x = torch.randn(2, 24, 64)
rope_module = IMPLEMENTATIONS["rope"](64, 64, 64, 0.0, 4, qkv_bias=True).eval()
meta_state = rope_module.canonical_state_dict()  # weights we read as an interleaved model's
converted = dict(meta_state)
for name in ("query.weight", "query.bias", "key.weight", "key.bias"):
    converted[name] = interleaved_to_rotate_half(meta_state[name], num_heads=4)
with torch.no_grad():
    expected = interleaved_rope_attention(x, meta_state, num_heads=4)
    for label, weights in (("reordered", converted), ("not reordered", meta_state)):
        rope_module.load_canonical_state_dict(weights)
        print(f"RoPEAttention, q/k rows {label:<13}: max |out - interleaved model| = "
              f"{(rope_module(x) - expected).abs().max().item():.1e}")

# %% [markdown]
# Loading interleaved weights into a rotate-half model without the reordering raises no error:
# the shapes match, and the model silently computes something else.
#
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

# %% tags=["hide-input"]
show(plot_alibi(num_heads=8, seq_len=12, causal=True))

# %% tags=["hide-input"]
show(plot_alibi(num_heads=4, seq_len=12, causal=False,
                title="Symmetric ALiBi (bidirectional encoders only): -m |i - j|"))

# %% [markdown]
# ## The modules, checked against the float64 reference
#
# `RoPEAttention`, `ALiBiAttention` and `ALiBiFlexAttention` keep the causal family's constructor
# and [canonical state dict](../../glossary/#canonical-state-dict). The reference applies its own
# RoPE rotation and ALiBi bias in float64.
#
# What the bias costs: `ALiBiAttention` hands SDPA a dense `(1, H, T, T)` bias, `H * T * T` numbers
# built in float64 and rounded once. It depends only on the length, dtype and device, so it is built
# once and kept while they stay the same (`ALiBiAttention.score_bias`), but SDPA still reads all of
# it and, given a bias instead of `is_causal=True`, cannot skip the blocks above the diagonal.
# `ALiBiFlexAttention` computes the bias inside the kernel and skips those blocks.

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
# large slope look at the last few tokens, heads with a small slope spread out. The slopes differ by
# factors of 2, so the weights they leave far from the diagonal differ by orders of magnitude: the
# colours are on a log scale, which keeps those heads apart (on a linear scale every head past the
# first two looks the same, near black away from the diagonal). The masked future is grey, apart
# from the smallest weights, which are black.

# %% tags=["hide-input"]
slopes = alibi_slopes(8).tolist()
show(plot_attention_weights(weights[0].float(), title="ALiBi attention weights per head (reference, batch 0)",
                            log_scale=True, head_titles=[f"head {h}: slope 1/{round(1 / s)}" for h, s in enumerate(slopes)]))
span = x.shape[1] - 1  # the largest distance between a query and a key here
gentle = [h for h, slope in enumerate(slopes) if slope * span < 1]
show_markdown(f"Over these {x.shape[1]} tokens the largest penalty, `slope * {span}`, is {slopes[0] * span:.1f} logits "
              f"for head 0 and {slopes[-1] * span:.2f} for head {len(slopes) - 1}"
              + (f"; heads {gentle[0]} to {gentle[-1]} never subtract even 1 logit, so their weights follow the scores' "
                 "content and look alike: their slopes matter over thousands of tokens, not dozens." if gentle else "."))
