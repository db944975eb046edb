# %% [markdown]
# # Masks gallery
#
# Every mask in `attention.masks` is written **once**, as a FlexAttention predicate
# `mask_mod(b, h, q_idx, kv_idx) -> bool` where **True = attend**. The same predicate gives:
#
# * a dense boolean tensor `(Tq, Tk)` for the educational code and for
#   `F.scaled_dot_product_attention` (`dense_mask`, built from index comparisons, no Python loops);
# * a FlexAttention `BlockMask` that lets the kernel skip every fully masked block (`block_mask`).
#
# This page draws each pattern at a small size (dark = attend), reports its density (the share of
# (query, key) pairs attended) at `T = 64`, and checks on every pattern that FlexAttention with the
# `BlockMask` and SDPA with the dense mask give the same output.

# %%
import torch
import torch.nn.functional as F

from attention import masks
from attention.causal.flex import compiled_flex_attention
from attention.display import show
from attention.plotting import plot_mask, plot_masks

# %% [markdown]
# ## Causal and windows
#
# `sliding_window(w)` is causal: query `i` sees keys `i - w + 1 .. i`, itself included (Mistral,
# Longformer's causal form). `local_window(r)` is its bidirectional cousin for encoders: keys with
# `|i - j| <= r`.

# %%
show(plot_masks({
    "causal": masks.causal,
    "sliding_window(4)": masks.sliding_window(4),
    "local_window(2)": masks.local_window(2),
}, q_len=12, title="Causal, sliding window (causal), local window (bidirectional); T = 12"))

# %% [markdown]
# ## Strided and Sparse Transformer
#
# `strided(s)` keeps every `s`-th key behind the query. The Sparse Transformer (Child et al., 2019,
# https://arxiv.org/abs/1904.10509) unions it with a local window of `s` keys (`sparse_transformer_strided`),
# or uses fixed blocks plus summary columns (`sparse_transformer_fixed`).

# %%
show(plot_masks({
    "strided(4)": masks.strided(4),
    "sparse_transformer_strided(4)": masks.sparse_transformer_strided(4),
    "sparse_transformer_fixed(4)": masks.sparse_transformer_fixed(4),
}, q_len=16, title="Strided patterns; T = 16"))

# %% [markdown]
# ## BigBird
#
# BigBird (Zaheer et al., 2020, https://arxiv.org/abs/2007.14062) combines a local window, a few
# global tokens that see and are seen by everything, and random keys per query. Here the random
# keys come from a seed, so the same seed draws the same mask on every run and every path. (The
# paper picks random *blocks*; this token-level version shows the same structure at small sizes.)

# %%
show(plot_mask(masks.bigbird(radius=1, num_global=2, num_random=2, max_len=16, seed=0), q_len=16))

# %%
same_seed = masks.dense_mask(masks.bigbird(1, 2, 2, 16, seed=0), 16, 16)
again = masks.dense_mask(masks.bigbird(1, 2, 2, 16, seed=0), 16, 16)
print("same seed, same mask:", torch.equal(same_seed, again))

# %% [markdown]
# ## Padding, prefix-LM and packed documents
#
# `key_padding(lengths)` hides the padded keys of each sequence in a batch (it reads `b`).
# `prefix_lm(p)` lets the first `p` tokens see each other bidirectionally and the rest decode
# causally (T5's prefix LM, UniLM). `document(ids)` keeps attention inside each packed document;
# combined with `causal` through `and_masks` it is the standard mask for packed pre-training.

# %%
lengths = torch.tensor([5, 8])
document_ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 3, 3])
padding = masks.dense_mask(masks.key_padding(lengths), 8, 8, batch=2)  # (2, 1, 8, 8)
show(plot_masks({
    "key_padding, sequence 0 (length 5)": padding[0, 0],
    "prefix_lm(4)": masks.dense_mask(masks.prefix_lm(4), 8, 8),
    "causal_and_document": masks.dense_mask(masks.and_masks(masks.causal, masks.document(document_ids)), 12, 12),
}, title="Key padding, prefix-LM, packed documents"))

# %% [markdown]
# ## Combinators
#
# `and_masks` and `or_masks` build a new predicate with a telling `__name__`; it works on the
# dense path and on FlexAttention alike.

# %%
combined = masks.or_masks(masks.sliding_window(3), masks.strided(4))
print(combined.__name__)
show(plot_mask(combined, q_len=12))

# %% [markdown]
# ## Density at T = 64
#
# The share of (query, key) pairs each pattern attends to. A fused kernel with block skipping
# (FlexAttention) does work roughly in proportion to the share of non-empty *blocks*, so sparse
# patterns only pay off when the attended pairs cluster into blocks.

# %%
T = 64
patterns = {
    "causal": masks.causal,
    "sliding_window(16)": masks.sliding_window(16),
    "local_window(8)": masks.local_window(8),
    "strided(8)": masks.strided(8),
    "sparse_transformer_strided(8)": masks.sparse_transformer_strided(8),
    "sparse_transformer_fixed(8)": masks.sparse_transformer_fixed(8),
    "bigbird(3, 2, 3, seed=0)": masks.bigbird(3, 2, 3, max_len=T, seed=0),
    "prefix_lm(16)": masks.prefix_lm(16),
    "document (4 x 16)": masks.document(torch.arange(T) // 16),
    "causal_and_document (4 x 16)": masks.and_masks(masks.causal, masks.document(torch.arange(T) // 16)),
}
print(f"{'pattern':<32} density at T = {T}")
for name, mask_mod in patterns.items():
    print(f"{name:<32} {masks.density(mask_mod, T, T):.4f}")
print(f"{'key_padding([48, 64]), batch 2':<32} {masks.density(masks.key_padding(torch.tensor([48, 64])), T, T, batch=2):.4f}")

# %% [markdown]
# ## One predicate, two paths: FlexAttention vs SDPA
#
# For every pattern, FlexAttention (compiled) with the `BlockMask` and SDPA with the dense mask
# run on the same `q, k, v`. The largest difference is printed; both paths read the same predicate,
# so only floating-point rounding could separate them. On CPU both run a blocked softmax in fp32
# and often agree to the last bit; the assertion allows 1e-5.

# %%
torch.manual_seed(0)
B, H, D = 1, 2, 16
q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
for name, mask_mod in patterns.items():
    dense = masks.dense_mask(mask_mod, T, T)  # (T, T)
    sdpa_out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    flex_out = compiled_flex_attention(q, k, v, block_mask=masks.block_mask(mask_mod, T, T, device="cpu"))
    error = (flex_out - sdpa_out).abs().max().item()
    print(f"{name:<32} max |flex - sdpa| = {error:.1e}")
    assert error < 1e-5, name
