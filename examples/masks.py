# %% [markdown]
# # Masks gallery
#
# This page draws every attention pattern in `attention.masks`, shows how one predicate drives both
# the dense path and FlexAttention's block-sparse path, and measures what block sparsity saves as
# the sequence grows. It assumes causal self-attention
# ([Attention in five minutes](../five_minutes/)) and the letters of the
# [notation page](../../notation/); the [FlexAttention page](../flex/) shows the kernel itself.
#
# Every mask is written **once**, as a [`mask_mod`](../../glossary/#mask-mod-score-mod) predicate
# `mask_mod(b, h, q_idx, kv_idx) -> bool` where **True = attend**. The same predicate gives:
#
# * a dense boolean tensor `(Tq, Tk)` for the educational code and for
#   [`F.scaled_dot_product_attention`](../../glossary/#sdpa) (`dense_mask`, built from index
#   comparisons, no Python loops);
# * a FlexAttention [`BlockMask`](../../glossary/#blockmask) (`block_mask`): which 128 × 128 blocks
#   of (query, key) pairs hold any attended pair, so that the kernel skips all the others.
#
# API reference: [`attention.masks`](../../api/masks/).

# %%
import torch
import torch.nn.functional as F
from torch.utils import benchmark

from attention import masks
from attention.causal.flex import compiled_flex_attention
from attention.display import show, show_markdown, show_table
from attention.plotting import plot_mask, plot_masks
from attention.report.long import block_sparse_chart, block_sparse_section, recorded

# %% [markdown]
# ## Causal and windows
#
# `causal` is the [causal mask](../../glossary/#causal-mask): query `i` sees keys `j <= i`.
# `sliding_window(w)` is causal too: query `i` sees keys `i - w + 1 .. i`, itself included
# (Mistral, Longformer's causal form). `local_window(r)` is its bidirectional cousin for encoders:
# keys with `|i - j| <= r`.

# %%
show(plot_masks({
    "causal": masks.causal,
    "sliding_window(4)": masks.sliding_window(4),
    "local_window(2)": masks.local_window(2),
}, q_len=12, title="Causal, sliding window (causal), local window (bidirectional); T = 12"))

# %% [markdown]
# ## Strided and Sparse Transformer
#
# `strided(s)` keeps every `s`-th key behind the query, counting back from the query itself. The
# Sparse Transformer (Child et al., 2019, https://arxiv.org/abs/1904.10509) unions it with a local
# window of `s` keys (`sparse_transformer_strided`), or uses fixed blocks plus summary columns
# (`sparse_transformer_fixed`).

# %%
show(plot_masks({
    "strided(4)": masks.strided(4),
    "sparse_transformer_strided(4)": masks.sparse_transformer_strided(4),
    "sparse_transformer_fixed(4)": masks.sparse_transformer_fixed(4),
}, q_len=16, title="Strided patterns; T = 16"))

# %% [markdown]
# ### Pitfall: strided as fixed columns
#
# A tempting shortcut writes the strided pattern as "every `s`-th key column", `kv_idx % s == 0`.
# That predicate reads the key's position only, never the query's, so it is bidirectional: every query sees keys 0, `s`, `2s`, ... up to the end of the
# sequence, including keys in its future. `strided(s)` measures the distance back from the query
# and keeps the causal condition.

# %%
def fixed_columns(stride):
    """The pitfall: every `stride`-th key column, whatever the query's position (True = attend)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx % stride == 0

    mask_mod.__name__ = f"fixed_columns_{stride}"
    return mask_mod


stride, T_small = 4, 16
wrong = masks.dense_mask(fixed_columns(stride), T_small, T_small)  # (T, T), True = attend
ours = masks.dense_mask(masks.strided(stride), T_small, T_small)  # (T, T)
future = masks.dense_mask(masks.causal, T_small, T_small).logical_not()  # (T, T): key after the query
print(f"query 0 attends to keys {wrong[0].nonzero().flatten().tolist()} with fixed columns, "
      f"{ours[0].nonzero().flatten().tolist()} with strided({stride})")
print(f"(query, key) pairs with the key in the query's future: {(wrong & future).sum().item()} with fixed columns, "
      f"{(ours & future).sum().item()} with strided({stride})")

# %% tags=["hide-input"]
show(plot_masks({
    f"fixed columns, kv % {stride} == 0 (wrong)": wrong,
    f"strided({stride}) (causal)": ours,
    "future keys the wrong mask attends to": wrong & future,
}, title=f"Strided as fixed columns lets queries see the future; T = {T_small}"))

# %% [markdown]
# The leak is visible in the outputs: change one token (its key and value) and see which *earlier*
# positions' outputs move. Under a causal mask none may.

# %%
torch.manual_seed(0)
q, k, v = (torch.randn(1, 1, T_small, 8) for _ in range(3))  # (B, H, T, D)
changed = T_small - stride  # a multiple of the stride: a column the wrong mask attends to
k2, v2 = k.clone(), v.clone()
k2[:, :, changed], v2[:, :, changed] = torch.randn(8), torch.randn(8)
for name, mask in {"fixed columns": wrong, f"strided({stride})": ours}.items():
    before = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, D)
    after = F.scaled_dot_product_attention(q, k2, v2, attn_mask=mask)  # (B, H, T, D)
    moved = (after - before)[0, 0, :changed].abs().amax(dim=-1) > 0  # (changed,): earlier positions that moved
    print(f"{name:<14} changing token {changed} moves the outputs of {moved.sum().item()} of the {changed} "
          "earlier positions")

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
# `key_padding(lengths)` is a [padding mask](../../glossary/#padding-mask): it hides the padded
# keys of each sequence in a batch (it reads `b`). `prefix_lm(p)` lets the first `p` tokens see
# each other bidirectionally and the rest decode causally (T5's prefix LM, UniLM).
# `document(ids)` keeps attention inside each packed document; combined with `causal` through
# `and_masks` it is the standard mask for packed pre-training.

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

# %%
show(plot_mask(combined, q_len=12))

# %% [markdown]
# ## One predicate, two paths: FlexAttention against SDPA, block by block
#
# A `BlockMask` cuts the (query, key) matrix into blocks of 128 × 128 pairs (its default size,
# printed with the table), so at `T = 512` into 4 × 4 blocks; up to `T = 128` there is one block
# and nothing to skip. For each pattern, the table gives its density (the share of pairs
# attended), the blocks FlexAttention computes (those holding at least one attended pair; it skips
# the rest), and the largest difference between compiled FlexAttention with the `BlockMask` and
# SDPA with the dense mask on the same `q, k, v` (batch 2, so that `key_padding` can differ per
# sequence). Both paths read the same predicate, so only floating-point rounding could separate
# them; the assertion allows `1e-5`.

# %%
T, B, H, D = 512, 2, 2, 16
patterns = {
    "causal": masks.causal,
    "sliding_window(128)": masks.sliding_window(128),
    "local_window(64)": masks.local_window(64),
    "strided(64)": masks.strided(64),
    "sparse_transformer_strided(64)": masks.sparse_transformer_strided(64),
    "sparse_transformer_fixed(128)": masks.sparse_transformer_fixed(128),
    "bigbird(3, 2, 3, seed=0)": masks.bigbird(3, 2, 3, max_len=T, seed=0),
    "prefix_lm(128)": masks.prefix_lm(128),
    "document (4 x 128)": masks.document(torch.arange(T) // 128),
    "causal_and_document (4 x 128)": masks.and_masks(masks.causal, masks.document(torch.arange(T) // 128)),
    "key_padding([320, 512])": masks.key_padding(torch.tensor([320, 512])),
}
reads_batch = {"key_padding([320, 512])"}  # masks that differ per sequence get a per-sequence BlockMask


def computed_blocks(block_mask):
    """`(computed, total)` blocks of a `BlockMask`: partial blocks (the mask is applied inside them)
    plus full blocks (every pair attended, no mask needed), against all blocks of its shape."""
    computed = block_mask.kv_num_blocks.sum().item()
    if block_mask.full_kv_num_blocks is not None:
        computed += block_mask.full_kv_num_blocks.sum().item()
    batch, heads, q_len, kv_len = block_mask.shape
    q_block, kv_block = block_mask.BLOCK_SIZE
    return computed, batch * heads * -(-q_len // q_block) * -(-kv_len // kv_block)


torch.manual_seed(0)
q, k, v = (torch.randn(B, H, T, D) for _ in range(3))  # (B, H, T, D)
measured = {}  # pattern -> (density, blocks computed, blocks in all, max |flex - sdpa|)
for name, mask_mod in patterns.items():
    batch = B if name in reads_batch else None
    dense = masks.dense_mask(mask_mod, T, T, batch=batch)  # (T, T), or (B, 1, T, T) for a per-sequence mask
    block_mask = masks.block_mask(mask_mod, T, T, device="cpu", B=batch)
    sdpa_out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)  # (B, H, T, D)
    flex_out = compiled_flex_attention(q, k, v, block_mask=block_mask)  # (B, H, T, D)
    error = (flex_out - sdpa_out).abs().max().item()
    assert error < 1e-5, (name, error)
    measured[name] = (dense.float().mean().item(), *computed_blocks(block_mask), error)

# %% tags=["hide-input"]
show_table(f"T = {T}: density, blocks FlexAttention computes (block size {block_mask.BLOCK_SIZE[0]}), "
           "and agreement with SDPA",
           ["pattern", "density", "blocks computed", "max |flex - sdpa|"],
           [[name, f"{density:.3f}", f"{computed} of {total}", f"{error:.1e}"]
            for name, (density, computed, total, error) in measured.items()])
causal_density, causal_blocks, _, _ = measured["causal"]
fewer = [f"`{name}` ({blocks})" for name, (_, blocks, _, _) in measured.items() if blocks < causal_blocks]
as_many = [f"`{name}` ({blocks})" for name, (density, blocks, _, _) in measured.items()
           if density < causal_density and blocks >= causal_blocks]
show_markdown(
    f"Density and blocks tell different stories. `causal` computes {causal_blocks} blocks. Fewer: "
    f"{', '.join(fewer) or 'none'}, whose attended pairs stay near the diagonal. As many or more, although they "
    f"attend to fewer pairs than `causal`: {', '.join(as_many) or 'none'}; their keys reach into most blocks. "
    "A block-sparse kernel pays for blocks, not pairs. (`key_padding` counts the blocks of both sequences.)")

# %% [markdown]
# ## Does sparse attention cost O(T·k) instead of O(T²)?
#
# The claim: if each query attends to `k` keys, attention costs `O(T·k)`. For a block-sparse
# kernel the work is the number of blocks it computes, so the claim holds when each query's keys
# stay in a bounded number of blocks, as a sliding window's do, and fails for the strided pattern
# above. The cell below counts the blocks of a fixed window of 256 keys and of `causal` as `T`
# doubles, and times compiled FlexAttention on both with PyTorch's `torch.utils.benchmark.Timer`
# (batch 1, 4 heads, `D = 64`; the median of blocks of calls over 0.3 s or six calls,
# [IQR](../../glossary/#iqr) in brackets; a shared CPU makes the times noisy).

# %%
def window_in_a_tensor(window_size):
    """`masks.sliding_window`, with the window size held in a tensor. A Python int is baked into the
    compiled kernel (a new window, a new compilation); a captured tensor is an input to it, so one
    compiled kernel per shape serves every window size, and `causal` is the window `T`."""
    window = torch.tensor(window_size)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return mask_mod


WINDOW = 256
timed = {}  # (pattern, T) -> (blocks computed, total blocks, ms median, ms IQR)
for T_long in (1024, 2048, 4096):
    q, k, v = (torch.randn(1, 4, T_long, 64) for _ in range(3))  # (B, H, T, D)
    for pattern, window_size in (("window", WINDOW), ("causal", T_long)):
        block_mask = masks.block_mask(window_in_a_tensor(window_size), T_long, T_long, device="cpu")
        computed, total = computed_blocks(block_mask)
        compiled_flex_attention(q, k, v, block_mask=block_mask)  # compiles for this shape: not timed
        timer = benchmark.Timer("flex(q, k, v, block_mask=block_mask)",
                                globals=dict(flex=compiled_flex_attention, q=q, k=k, v=v, block_mask=block_mask))
        one_call_s = timer.timeit(1).median
        measurement = timer.blocked_autorange(min_run_time=max(0.3, 6 * one_call_s))  # 6 calls at least: an IQR
        timed[pattern, T_long] = (computed, total, measurement.median * 1e3, measurement.iqr * 1e3)
# The window of size T is the causal mask itself:
assert torch.equal(masks.dense_mask(window_in_a_tensor(512), 512, 512), masks.dense_mask(masks.causal, 512, 512))

# %% tags=["hide-input"]
long_lengths = sorted({T_long for _, T_long in timed})
first, last = long_lengths[0], long_lengths[-1]


def per_block_us(pattern, T_long):
    """Microseconds of the median call per computed block and head (4 heads)."""
    computed, _, ms, _ = timed[pattern, T_long]
    return ms * 1e3 / (computed * 4)


show_table(f"Compiled FlexAttention: sliding window of {WINDOW} keys against causal, blocks of 128, 4 heads",
           ["T", "mask", "blocks computed", "ms per call (IQR)", "µs per block and head"],
           [[T_long, pattern, f"{timed[pattern, T_long][0]} of {timed[pattern, T_long][1]}",
             f"{timed[pattern, T_long][2]:.1f} ({timed[pattern, T_long][3]:.1f})",
             f"{per_block_us(pattern, T_long):.0f}"] for T_long in long_lengths for pattern in ("window", "causal")])
show_markdown(
    f"From `T = {first}` to `T = {last}` (×{last // first}), the window's blocks grow "
    f"×{timed['window', last][0] / timed['window', first][0]:.1f} "
    f"({timed['window', last][0] / (last // 128):.1f} key blocks per query block at `T = {last}`) and the causal "
    f"mask's ×{timed['causal', last][0] / timed['causal', first][0]:.1f}; the median time per call grows "
    f"×{timed['window', last][2] / timed['window', first][2]:.1f} and "
    f"×{timed['causal', last][2] / timed['causal', first][2]:.1f}. At `T = {last}` a "
    f"computed block costs {per_block_us('window', last):.0f} µs per head with the window and "
    f"{per_block_us('causal', last):.0f} µs with the causal mask.")

# %% [markdown]
# The window's blocks grow in proportion to `T`, the causal mask's like `T²/2`. Where the cost per
# block stays about level, the time follows the blocks; at short lengths the fixed cost of a call
# weighs more, and a shared CPU adds noise (compare the IQRs). So a sliding window makes the work of
# a block-sparse kernel linear in `T`, `O(T·k)` with `k` the window; a low density alone does not,
# since the kernel pays for blocks, not for pairs.

# %% [markdown]
# ## Where block sparsity pays, measured to 16k
#
# Skipping blocks is one side; a block-sparse kernel also has costs a dense one does not (a
# `BlockMask` to build, the predicate evaluated inside every partial block, a less regular loop).
# The long profile of the benchmark (`python -m attention.bench --profile long`) measures both
# paths for four patterns from `T = 128` to 16,384, on the same queries, keys and values: compiled
# FlexAttention with the pattern's `BlockMask`, and SDPA with the same mask as a dense boolean
# `(T, T)` tensor. Every row is checked against a float64 reference on query rows spread over the
# sequence before it is timed. A `BlockMask` keeps two kinds of computed blocks: full ones, where
# every pair attends and the predicate is never called, and partial ones, where it is evaluated for
# every pair; the section below counts them for each recorded pattern. For plain causal attention
# the alternative to weigh is not a dense mask but SDPA's `is_causal=True`, which skips the blocks
# above the diagonal as well ([SDPA page](../sdpa/)). The recorded run, read by `attention.report.long`:

# %%
path, long_run = recorded("long")

# %% tags=["hide-input"]
show(block_sparse_chart(long_run))
show_markdown(block_sparse_section(path, long_run))

# %% [markdown]
# Block sparsity pays in proportion to the blocks it skips, not the pairs it masks, minus what
# each computed block costs over the dense kernel's. The per-length numbers, with each path's peak
# memory (and the mask's own bytes: `T²` for the dense mask, a few index tensors for the
# `BlockMask`), are on [Benchmarks](../../benchmarks/#long-context).
