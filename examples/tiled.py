# %% [markdown]
# # FlashAttention's algorithm in plain PyTorch
#
# This page shows why FlashAttention is exact and yet needs memory that grows only linearly with
# the sequence length: the online softmax, step by step, then the tiles, then the backward pass
# that recomputes instead of storing. It assumes the [split-heads](../split_heads/) page (the
# `(B, H, T, D)` layout) and the [SDPA](../sdpa/) page (what a fused kernel is).
#
# `TiledAttention` (`attention/causal/tiled.py`, registered as `tiled`) is the algorithm written
# in PyTorch operations, a tile at a time: it is checked against the float64 reference like every
# class, and it is slow (a Python loop over tiles), because its point is to be read.
#
# API reference: [`attention.causal.tiled`](../../api/causal/tiled/).

# %%
import math

import torch
from matplotlib.figure import Figure

from attention.causal.split_heads import SplitHeadsAttention
from attention.causal.tiled import TiledAttention, tiled_attention
from attention.display import show, show_markdown, show_table
from attention.reference import reference_causal_self_attention

# %% [markdown]
# ## What the naive version stores
#
# Written out, attention builds the scores `Q Kᵀ` for every pair of positions: `(B, H, T, T)`
# numbers, before the softmax and again after it. At GPT-2 small's 12 heads and batch 1, in float32:

# %% tags=["hide-input"]
rows = []
for T in (1024, 4096, 16384, 32768):
    scores_bytes = 1 * 12 * T * T * 4
    rows.append((f"{T:,}", f"{scores_bytes / 2**20:,.0f} MiB", f"{1 * 12 * T * 64 * 4 / 2**20:,.1f} MiB"))
show_table("One (B, H, T, T) float32 score matrix against one (B, H, T, D) tensor, B = 1, H = 12, D = 64",
           ["T", "scores (B, H, T, T)", "queries (B, H, T, D)"], rows)

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
show_table("Running statistics after each block", ["block", "m", "rescale exp(m_old - m)", "l", "acc", "acc / l"], steps)
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
# `block_size` keys is one small matmul, `(block_size, D) @ (D, block_size)`. Under the causal mask,
# query `i` sees keys `<= i`, so every tile wholly above the diagonal is skipped and tiles on the
# diagonal are masked inside.

# %% tags=["hide-input"]
T, block_size = 512, 64
tiles = T // block_size
state = torch.zeros(tiles, tiles)
for q_tile in range(tiles):
    for k_tile in range(tiles):
        state[q_tile, k_tile] = 0 if k_tile > q_tile else (1 if k_tile == q_tile else 2)
fig = Figure(figsize=(4.6, 4.2))
ax = fig.subplots()
image = ax.imshow(state, cmap="Blues", vmin=0, vmax=2.4)
ax.set_xticks(range(tiles), [f"K{k * block_size}" for k in range(tiles)], rotation=90, fontsize=7)
ax.set_yticks(range(tiles), [f"Q{q * block_size}" for q in range(tiles)], fontsize=7)
ax.set_xlabel(f"key tile (block_size = {block_size})")
ax.set_ylabel("query tile")
for q_tile in range(tiles):
    for k_tile in range(tiles):
        ax.text(k_tile, q_tile, {0: "", 1: "masked\ninside", 2: "full"}[int(state[q_tile, k_tile])],
                ha="center", va="center", fontsize=5.5, color="white" if state[q_tile, k_tile] == 2 else "black")
ax.set_title(f"Causal tiles at T = {T}: {int((state == 2).sum())} full, {int((state == 1).sum())} on the "
             f"diagonal, {int((state == 0).sum())} skipped", fontsize=9)
fig.tight_layout()
show(fig, alt=f"A {tiles} by {tiles} grid of tiles: those above the diagonal are skipped, those on it are masked "
              "inside, those below are computed in full")

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
# Count what each class keeps for the backward pass, at `T = 1024`:

# %%
def saved_bytes(module, x):
    """Bytes of the tensors autograd saves for the backward pass of one forward call."""
    sizes = []

    def pack(tensor):
        sizes.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(x)
    return sum(sizes)


x = torch.randn(1, 1024, 768, requires_grad=True)
split = SplitHeadsAttention(768, 768, 1024, 0.0, 12)
tiled = TiledAttention(768, 768, 1024, 0.0, 12)
tiled.load_canonical_state_dict(split.canonical_state_dict())
for name, module in (("split_heads", split), ("tiled", tiled)):
    print(f"{name:12} saves {saved_bytes(module, x) / 2**20:7.1f} MiB for the backward pass")
