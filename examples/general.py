# %% [markdown]
# # The general module
#
# `attention.MultiHeadAttention` (`attention/general.py`) is the one general-purpose module of the
# package, with the signature `(d_model, num_heads, dropout=0.0, bias=True, *, rope=False,
# rope_base=10000.0)`. Where the causal family is fixed to self-attention with a causal mask, it
# takes separate `query`, `key` and `value` inputs:
#
# * self-attention (`key` and `value` default to `query`) and cross-attention (queries from one
#   sequence, keys and values from another, of another length);
# * an optional boolean `mask`, True = attend, `(Tq, Tk)` or `(B or 1, H or 1, Tq, Tk)`;
# * the attention weights on request (`need_weights=True`);
# * optional rotary position embeddings on queries and keys (`rope=True`).
#
# ## The idea
#
# The same shell as the [split-heads](../split_heads/) version, with `Tq` query positions and
# `Tk` key positions instead of one `T`. Without `need_weights` the attention runs through
# [`F.scaled_dot_product_attention`](../sdpa/), which picks a fused kernel; with it, the
# `(B, H, Tq, Tk)` weights are computed explicitly so they can be returned.

# %%
import torch

from attention import MultiHeadAttention, masks
from attention.display import show, show_shape, show_source
from attention.general import apply_rotary, rotary_cos_sin
from attention.plotting import plot_attention_weights
from attention.reference import reference_attention

# %% [markdown]
# ## Shapes, step by step
#
# Cross-attention from `Tq = 3` query positions to `Tk = 5` key/value positions, `d_model = 8`,
# `H = 2` heads of `D = 4`, with the weights returned.

# %%
torch.manual_seed(0)
B, Tq, Tk, d_model, H = 2, 3, 5, 8, 2
D = d_model // H
queries, memory = torch.randn(B, Tq, d_model), torch.randn(B, Tk, d_model)
mha = MultiHeadAttention(d_model, H).eval()
with torch.no_grad():
    show_shape("query input", queries, "(B, Tq, d_model)")
    show_shape("key = value input", memory, "(B, Tk, d_model)")
    q = mha.query(queries).view(B, Tq, H, D).transpose(1, 2)
    k = mha.key(memory).view(B, Tk, H, D).transpose(1, 2)
    show_shape("q", q, "(B, H, Tq, D)")
    show_shape("k (v alike)", k, "(B, H, Tk, D)")
    show_shape("scores = q @ k^T / sqrt(D)", q @ k.transpose(-2, -1), "(B, H, Tq, Tk)")
    out, weights = mha(queries, memory, need_weights=True)
    show_shape("out", out, "(B, Tq, d_model)")
    show_shape("weights", weights, "(B, H, Tq, Tk)")

# %% [markdown]
# ## The weights, token by token
#
# `need_weights=True` returns the `(B, H, Tq, Tk)` weights the module computed. Here a module with
# `d_model = 32` and 4 heads reads a six-word sentence padded to 8 tokens, under the mask a decoder
# uses for a padded batch: causal, and no padded key (`and_masks(causal, key_padding(lengths))` from
# [`attention.masks`](../masks/)). The first panel is that mask; then one panel per head, a row per
# query token: each row is a distribution over the key tokens, zero wherever the mask is False.
# The weights of this module are random, not trained, so the patterns show what the mask allows and
# how differently four heads spread their weight, not what a language model learns.

# %%
tokens = ["the", "cat", "sat", "on", "the", "mat", "<pad>", "<pad>"]
vocabulary = sorted(set(tokens))
token_ids = torch.tensor([[vocabulary.index(token) for token in tokens]])  # (B, T) = (1, 8)
T, d_model, H = len(tokens), 32, 4
embedding = torch.nn.Embedding(len(vocabulary), d_model)
mha = MultiHeadAttention(d_model, H).eval()
lengths = torch.tensor([6])  # real tokens per sequence; the rest is padding
mask = masks.dense_mask(masks.and_masks(masks.causal, masks.key_padding(lengths)), T, T, batch=1)  # (1, 1, T, T)
with torch.no_grad():
    x = embedding(token_ids)  # (B, T, d_model)
    out, weights = mha(x, mask=mask, need_weights=True)  # weights: (B, H, T, T)
show(plot_attention_weights(weights[0], tokens=tokens, mask=mask[0, 0], ncols=2,
                            title="MultiHeadAttention(32, 4) weights, causal + key padding (random weights)"))

# %% [markdown]
# With no position encoding, attention cannot tell the two "the" tokens apart: they have the same
# embedding, hence the same key, so every query that sees both gives them exactly the same weight
# (the [position encodings page](../positional/) shows how RoPE and ALiBi break that tie):

# %%
print("weights of 'mat' (query 5) on 'the' at 0 and 'the' at 4, per head:")
print(weights[0, :, 5, [0, 4]])
print("identical:", torch.equal(weights[0, :, 5, 0], weights[0, :, 5, 4]))

# %% [markdown]
# ## The code

# %%
show_source(MultiHeadAttention.forward)
show_source(rotary_cos_sin)
show_source(apply_rotary)

# %% [markdown]
# ## Checked against the float64 reference
#
# Four cases, each against `attention.reference.reference_attention` with the module's weights:
# causal self-attention, cross-attention with a key-padding mask (the second sequence has only 3
# valid keys), the returned weights, and rotary embeddings.

# %%
B, Tq, Tk, d_model, H = 2, 12, 20, 32, 4
mha = MultiHeadAttention(d_model, H).eval()
state = mha.canonical_state_dict()
x, memory = torch.randn(B, Tq, d_model), torch.randn(B, Tk, d_model)

positions = torch.arange(Tq)
causal_mask = positions[:, None] >= positions[None, :]  # (Tq, Tq), True = attend
valid_keys = torch.tensor([Tk, 3])  # per batch element
padding_mask = (torch.arange(Tk)[None, :] < valid_keys[:, None])[:, None, None, :]  # (B, 1, 1, Tk)
padding_mask = padding_mask.expand(B, 1, Tq, Tk)  # (B, 1, Tq, Tk)


def report(label, actual, expected, tolerance=1e-5):
    error = (actual.double() - expected).abs().max().item()
    print(f"{label:<44} max error = {error:.2e}")
    assert error < tolerance, (label, error)


with torch.no_grad():
    expected, expected_weights = reference_attention(x, x, x, state, H, mask=causal_mask)
    out, _ = mha(x, mask=causal_mask)
    report("self-attention, causal mask", out, expected)

    expected, expected_weights = reference_attention(x, memory, memory, state, H, mask=padding_mask)
    out, weights = mha(x, memory, mask=padding_mask, need_weights=True)
    report("cross-attention, padding mask", out, expected)
    report("cross-attention, padding mask: weights", weights, expected_weights)
    out_fused, _ = mha(x, memory, mask=padding_mask)  # need_weights=False: the SDPA path
    report("... same through SDPA (need_weights=False)", out_fused, expected)

    rotary = MultiHeadAttention(d_model, H, rope=True).eval()
    rotary.load_canonical_state_dict(state)
    expected, _ = reference_attention(x, x, x, state, H, mask=causal_mask, rope_base=10000.0)
    out, _ = rotary(x, mask=causal_mask)
    report("self-attention, causal mask, RoPE", out, expected)

# %% [markdown]
# ## Pitfalls
#
# **A query with nothing to attend to.** If a mask row is all False (a padding query, or a window
# that excludes everything), a plain masked softmax is `0 / 0 = NaN`, and the NaN spreads into the
# gradients of every parameter. The module lets such a row attend everywhere, then multiplies its
# attention output by zero: the row's context is 0 (so the module's output there is just the
# output projection's bias), and the gradients stay finite. The reference defines the same.

# %%
empty_rows = torch.ones(Tq, Tq, dtype=torch.bool).tril()
empty_rows[:4] = False  # the first 4 queries may attend to nothing
x_grad = x.clone().requires_grad_()
out, weights = mha(x_grad, mask=empty_rows, need_weights=True)
out.sum().backward()
expected, _ = reference_attention(x, x, x, state, H, mask=empty_rows)
print("outputs of the empty rows equal the output bias:", torch.allclose(out[:, :4], mha.out.bias.expand(B, 4, -1)))
print("weights of the empty rows are all zero:", bool((weights[:, :, :4] == 0).all()))
print("gradients finite:", bool(x_grad.grad.isfinite().all()))
report("empty rows", out.detach(), expected)

# %% [markdown]
# **Mask conventions differ.** Here, in SDPA and in the reference, a boolean mask means True =
# attend; `nn.MultiheadAttention` means True = *masked* (see [its page](../torch_mha/)). A
# floating-point mask is added to the scores in SDPA; this module accepts only boolean masks and
# raises a `TypeError` for anything else:

# %%
try:
    mha(x, mask=causal_mask.float())
except TypeError as error:
    print("TypeError:", error)

# %% [markdown]
# **Causal cross-attention needs an explicit mask.** SDPA's `is_causal=True` aligns the mask to
# the top-left corner, which is wrong when `Tq != Tk` (see the [SDPA page](../sdpa/)). The module
# has no `is_causal` flag: build the mask you mean from index comparisons, e.g. bottom-right
# aligned `q_idx[:, None] + (Tk - Tq) >= kv_idx[None, :]`.
#
# **RoPE positions start at 0 for queries and keys alike.** That is right for self-attention over a
# whole sequence. For decoding with a cache of earlier keys, the new queries' positions must
# continue where the cache ends; this module computes the angles from 0 on every call, so it does
# not support that use. RoPE also needs an even head size:

# %%
try:
    MultiHeadAttention(d_model=12, num_heads=4, rope=True)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# **Weights cost speed.** `need_weights=True` rules out the fused kernels and materialises the
# `(B, H, Tq, Tk)` weights; ask for them only when you use them.
