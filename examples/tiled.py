# %% [markdown]
# # Tiled attention (FlashAttention's algorithm)
#
# This page shows why FlashAttention is exact and yet needs memory that grows only linearly with
# the sequence length: the online softmax, step by step, then the tiles, then the backward pass
# that recomputes instead of storing. It assumes the [split-heads](../split_heads/) page (the
# `(B, H, T, D)` layout). The fused kernels of the next pages,
# [scaled_dot_product_attention](../sdpa/) and [FlexAttention](../flex/), run this algorithm in
# compiled code; this page is where it is written out.
#
# `TiledAttention` (`attention/causal/tiled.py`, registered as `tiled`) is the algorithm written
# in PyTorch operations, a tile at a time: it is checked against the float64 reference like every
# class, and its tiles run from a Python loop, because its point is to be read. How fast that is,
# against the class that writes the scores out and against PyTorch's fused kernel, a recorded
# benchmark run shows at the end of the page.
#
# API reference: [`attention.causal.tiled`](../../api/causal/tiled/).

# %%
import math

import torch

from attention.causal import tiled
from attention.causal.split_heads import SplitHeadsAttention
from attention.causal.tiled import TiledAttention
from attention.display import show, show_markdown, show_source, show_table
from attention.reference import reference_causal_self_attention
from attention.report.long import memory_chart, recorded, tiled_section

# %% [markdown]
# ## What the naive version stores
#
# Written out, attention builds the scores `Q Kᵀ` for every pair of positions: `(B, H, T, T)`
# numbers, before the softmax and again after it. At GPT-2 small's 12 heads and batch 1, in float32:

# %%
B, H, D = 1, 12, 64
sizes = [(f"{T:,}", f"{B * H * T * T * 4 / 2**20:,.0f} MiB", f"{B * H * T * D * 4 / 2**20:,.1f} MiB")
         for T in (1024, 4096, 16384, 32768)]  # float32: 4 bytes a number
show_table(f"One (B, H, T, T) score matrix against one (B, H, T, D) tensor, float32, B = {B}, H = {H}, D = {D}",
           ["T", "scores (B, H, T, T)", "queries (B, H, T, D)"], sizes)

# %% [markdown]
# ## The online softmax, one row at a time
#
# The softmax of a row of scores `s` is `exp(s - m) / l`, with `m = max(s)` (subtracted so the
# exponentials cannot overflow) and `l = Σ exp(s - m)`. Both seem to need the whole row first. They
# do not: read the row in blocks and keep a running maximum `m`, a running sum `l` and a running,
# unnormalised output `acc = Σ exp(s_j - m) v_j`. When a block brings a larger maximum `m_new`, every
# term summed so far was scaled by `exp(-m)` instead of `exp(-m_new)`, so multiply `l` and `acc` by
# `exp(m - m_new)` and add the new block's terms. After the last block, `acc / l` is the exact
# softmax-weighted sum of the values.
#
# One query, 8 keys in blocks of 2, values of dimension 1 so the output is a number:

# %%
torch.manual_seed(0)
scores = torch.linspace(-1, 3, 8) + torch.randn(8) * 0.5  # one query's scores against 8 keys: rising, so the max moves
values = torch.randn(8)  # D = 1
running_max, running_sum, acc = float("-inf"), 0.0, 0.0
steps = []
for start in range(0, 8, 2):
    block_scores, block_values = scores[start:start + 2], values[start:start + 2]
    new_max = max(running_max, block_scores.max().item())
    rescale = math.exp(running_max - new_max)  # exp(-inf) = 0 on the first block
    weights = torch.exp(block_scores - new_max)
    running_sum = rescale * running_sum + weights.sum().item()
    acc = rescale * acc + (weights * block_values).sum().item()
    running_max = new_max
    steps.append((f"keys {start}-{start + 1}", f"{running_max:.3f}", f"{rescale:.3f}", f"{running_sum:.4f}",
                  f"{acc:.4f}", f"{acc / running_sum:.4f}"))

# %% tags=["hide-input"]
show_table("Running statistics after each block", ["block", "m", "rescale exp(m_old - m)", "l", "acc", "acc / l"], steps)

# %%
exact = (torch.softmax(scores, dim=0) * values).sum().item()
print(f"softmax over the whole row, then the weighted sum: {exact:.6f}; online: {acc / running_sum:.6f}; "
      f"difference {abs(exact - acc / running_sum):.1e}")

# %% [markdown]
# Each row of the table is what the algorithm keeps: three numbers per query (for `D`-dimensional
# values, `acc` has `D`), never the row of scores.

# %% [markdown]
# ## Tiles
#
# The same works for a block of queries at once: a tile of `block_size` queries against
# `block_size` keys is one small matmul, `(block_size, D) @ (D, block_size)`, and every query of the
# tile keeps its own `m`, `l` and `acc`. Under the causal mask, query `i` sees keys `<= i`, so every
# tile wholly above the diagonal is skipped and tiles on the diagonal are masked inside:
#
# ![The tile loop: query tile Q2 visits key tiles K0, K1 and K2 in turn, updating its running maximum,
# sum and output; tiles above the causal diagonal are skipped](../../diagrams/tile-loop.svg)
#
# ## The code
#
# `tiled_attention(q, k, v, block_size)` runs an `autograd.Function` whose forward is that loop, from
# the installed package: for each query tile, the key tiles it needs (`_tiles` lists them, the
# diagonal's last), the tile's scores (`_tile_scores` masks the diagonal tile inside), the update
# of the running statistics, and at the end the output and each query's log-sum-exp `m + log l`,
# saved for the backward pass.

# %% tags=["hide-input"]
show_source(tiled._TiledAttention.forward)
show_source(tiled._online_softmax_update)

# %% [markdown]
# ## Checked against the reference
#
# The module is the [split-heads](../split_heads/) shell with `tiled_attention` as its core. Its
# output and gradients match the float64 reference, like every registered class, whether or not
# `block_size` divides `T`:

# %%
torch.manual_seed(0)
module = TiledAttention(64, 64, 100, 0.0, 4, block_size=16)
x = torch.randn(2, 100, 64)  # T = 100: the last tile holds 4 queries
expected, _ = reference_causal_self_attention(x.double(), module.canonical_state_dict(), 4)
print(f"T = 100, block_size = 16: largest difference from the float64 reference "
      f"{(module(x).double() - expected).abs().max().item():.1e}")

# %% [markdown]
# ## The backward pass recomputes
#
# Autograd would keep every tile's attention weights for the backward pass: the `(T, T)` matrix
# again, in pieces. FlashAttention keeps only the output `O` and, per query, the log-sum-exp
# `m + log l`. In the backward pass it recomputes each tile's weights as `exp(s - lse)` from `Q`
# and `K`, and uses `Σ_j P_ij dP_ij = dO_i · O_i` to finish the softmax's gradient without the
# full row. That costs one more `Q Kᵀ` per tile, and saves all the memory the weights would need.
# The backward pass, one tile at a time (FlashAttention's Algorithm 2):

# %% tags=["hide-input"]
show_source(tiled._TiledAttention.backward)
show_source(tiled._tile_gradients)

# %% [markdown]
# What each class keeps for the backward pass, counted with autograd's saved-tensor hooks at
# `T = 1024`, each tensor once (a tensor several operations save, such as the input `x` of the three
# projections, is kept once), split into the projections' weights, the module's input and what the
# attention itself keeps:

# %%
def saved_tensors(module, x):
    """The tensors autograd keeps for the backward pass of one forward call: {storage address: (bytes, shape)}."""
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved.setdefault(storage.data_ptr(), (storage.nbytes(), tuple(tensor.shape)))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(x)
    return saved


B, T, C, H = 1, 1024, 768, 12
x = torch.randn(B, T, C, requires_grad=True)
split = SplitHeadsAttention(C, C, T, 0.0, H)
tiled = TiledAttention(C, C, T, 0.0, H)
tiled.load_canonical_state_dict(split.canonical_state_dict())
kept = {}
for name, module in (("split_heads", split), ("tiled", tiled)):
    weights = {parameter.untyped_storage().data_ptr() for parameter in module.parameters()}
    saved = saved_tensors(module, x)
    parts = {"weights": 0, "input x": 0, "attention": 0}
    for address, (nbytes, shape) in saved.items():
        part = "weights" if address in weights else "input x" if address == x.untyped_storage().data_ptr() else "attention"
        parts[part] += nbytes
    kept[name] = parts

# %% tags=["hide-input"]
show_table(f"Tensors kept for the backward pass, B = {B}, T = {T:,}, d_model {C}, {H} heads, float32 (MiB, each tensor once)",
           ["class", "projection weights", "input x", "the attention's own", "total"],
           [(f"`{name}`", *(f"{parts[key] / 2**20:.2f}" for key in parts), f"{sum(parts.values()) / 2**20:.2f}")
            for name, parts in kept.items()])
D = C // H
qkvo_lse = (4 * B * H * T * D + B * H * T) * 4  # Q, K, V, O (B, H, T, D) and the log-sum-exp (B, H, T), float32
assert kept["tiled"]["attention"] == qkvo_lse, "tiled keeps exactly Q, K, V, O and the log-sum-exp"
weights_bytes = B * H * T * T * 4
show_markdown(
    f"The projection weights and the input are the same for both classes. Of its own, `tiled` keeps exactly `Q`, `K`, "
    f"`V`, `O` and one log-sum-exp per query and head: {qkvo_lse / 2**20:.2f} MiB. `split_heads` keeps "
    f"{kept['split_heads']['attention'] / 2**20:.2f} MiB, of which the `(B, H, T, T)` attention weights are "
    f"{weights_bytes / 2**20:.0f} MiB, a share that grows like `T²`.")

# %% [markdown]
# ## Measured: peak memory and time against T
#
# The long profile of the benchmark (`python -m attention.bench --profile long`) runs the naive
# class `split_heads`, `tiled` and `sdpa_causal` (PyTorch's fused kernel) at batch 1 and GPT-2
# small's widths for `T` from 128 to 16,384, forward and forward + backward. Each row is checked
# against the float64 reference before it is timed, and each call's peak tensor memory is measured
# (on CPU: the running sum of the allocator's allocations and frees during one profiled call).
#
# Time is the other side of the trade. `tiled` runs one small matmul per tile from Python, and
# recomputes the scores in its backward pass; `split_heads` does one large matmul per step, but
# writes every `(B, H, T, T)` intermediate out to memory and reads it back, in both passes. That
# memory traffic is FlashAttention's argument (Dao et al., 2022, <https://arxiv.org/abs/2205.14135>,
# section 2): a tile of scores small enough to stay in the processor's caches costs far less to
# write and read than a score matrix that only fits in main memory. The recorded run, read by
# `attention.report.long`:

# %%
path, long_run = recorded("long")
show(memory_chart(long_run))
show_markdown(tiled_section(path, long_run))

# %% [markdown]
# Every length, both modes and the block-sparse measurements of the run are on
# [Benchmarks](../../benchmarks/#long-context); where skipping blocks pays for other masks is on
# [Masks](../masks/#where-block-sparsity-pays-measured-to-16k).
