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
# against the class that writes the scores out and against PyTorch's fused kernel, is measured at
# the end of the page.
#
# API reference: [`attention.causal.tiled`](../../api/causal/tiled/).

# %%
import math

import torch
from matplotlib.figure import Figure

from attention.causal.split_heads import SplitHeadsAttention
from attention.causal.tiled import TiledAttention, tiled_attention
from attention.report import prose
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
# Count what each class keeps for the backward pass, at `T = 1024`, each tensor once (a tensor
# several operations save, such as the input `x` of the three projections, is kept once), split
# into the projections' weights, the module's input and what the attention itself keeps:

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
# (on CPU: the running sum of the allocator's allocations and frees during one profiled call). The
# tables and figures below are read from the recorded run.

# %% tags=["hide-input"]
from attention import report

long_path = report.find_results(report.RESULTS_DIR / "long", device_type="cpu")[0]
long_run = report.load_result(long_path)
show_markdown(f"Recorded run `docs/results/long/{long_path.name}`: {long_run['provenance']['device']['name']}, "
              f"{long_run['dtype']}, recorded {long_run['provenance']['date_utc'][:10]}"
              + (" with older sources than these (the page still shows it)" if report.is_stale(long_run) else "")
              + f"; {report.profile_summary(long_run['config'])}.")
show_markdown(report.memory_slope_table(long_run))

# %% tags=["hide-input"]
show(report.plot_memory_vs_seq_len(long_run, "forward"),
     alt="Forward peak memory against sequence length, log-log: split_heads grows like T squared, tiled and "
         "sdpa_causal like T")
show(report.plot_memory_vs_seq_len(long_run, "forward_backward"),
     alt="Forward + backward peak memory against sequence length, log-log")

# %% tags=["hide-input"]
slopes = {mode: report.memory_slopes(long_run, mode) for mode in ("forward", "forward_backward")}
rows = {(r["label"], r["mode"], r["seq_len"]): r for r in report.sweep_rows(long_run, "forward")
        + report.sweep_rows(long_run, "forward_backward")}
longest = max(long_run["config"]["seq_lens"])
naive_longest = max(t for (label, mode, t), r in rows.items()
                    if label == "split_heads" and mode == "forward_backward" and r["status"] == "ok")
skipped = rows.get(("split_heads", "forward_backward", longest))
show_markdown(
    f"Fitted over `T` ≥ 2048, in forward + backward: `split_heads`' peak grows as "
    f"`T^{slopes['forward_backward']['split_heads']['slope']:.2f}`, `tiled`'s as "
    f"`T^{slopes['forward_backward']['tiled']['slope']:.2f}` and `sdpa_causal`'s as "
    f"`T^{slopes['forward_backward']['sdpa_causal']['slope']:.2f}`. At `T = {naive_longest}`, one training step "
    f"of `split_heads` needs {report.number(rows['split_heads', 'forward_backward', naive_longest]['peak_memory_bytes'] / 2**20)} "
    f"MiB, `tiled` {report.number(rows['tiled', 'forward_backward', naive_longest]['peak_memory_bytes'] / 2**20)} MiB "
    f"and `sdpa_causal` {report.number(rows['sdpa_causal', 'forward_backward', naive_longest]['peak_memory_bytes'] / 2**20)} MiB."
    + (f" At `T = {longest}` the run skipped `split_heads`: {skipped['reason']}." if skipped and skipped["status"] == "skipped" else ""))

# %% [markdown]
# Time is the other side of the trade. `tiled` runs one small matmul per tile from Python, and
# recomputes the scores in its backward pass; `split_heads` does one large matmul per step, but
# writes every `(B, H, T, T)` intermediate out to memory and reads it back, in both passes. That
# memory traffic is FlashAttention's argument (Dao et al., 2022, <https://arxiv.org/abs/2205.14135>,
# section 2): a tile of scores small enough to stay in the processor's caches costs far less to
# write and read than a score matrix that only fits in main memory. The recorded run:

# %% tags=["hide-input"]
show_markdown("Forward + backward, median ms per call:\n\n" + report.sweep_table(long_run, "forward_backward", "ms_median"))
long_label = prose.file_label(f"docs/results/long/{long_path.name}", report.is_stale(long_run))
training = {label: {t: r["ms_median"] for (name, mode, t), r in rows.items()
                    if name == label and mode == "forward_backward" and r["status"] == "ok"}
            for label in ("split_heads", "tiled", "sdpa_causal")}
score_mib = {t: 12 * t * t * 4 / 2**20 for t in training["split_heads"]}  # one (1, 12, T, T) float32 tensor
tile_kib = 12 * TiledAttention(768, 768, 8, 0.0, 12).block_size ** 2 * 4 / 2**10  # one tile of scores, every head
show_markdown(prose.tiled_against_naive_sentence(long_label, training["tiled"], training["split_heads"])
              + f" One `(B, H, T, T)` score tensor of this run is {score_mib[max(score_mib)]:,.0f} MiB at "
              f"`T = {max(score_mib):,}`; one tile of scores of `tiled`, every head, is {tile_kib:,.0f} KiB.")
at = {label: rows.get((label, "forward_backward", longest)) for label in ("tiled", "sdpa_causal")}
if all(r and r["status"] == "ok" for r in at.values()):
    kind, ratio = prose.ratio_words(at["tiled"]["ms_median"], at["sdpa_causal"]["ms_median"])
    show_markdown(f"Against the fused kernel, at `T = {longest:,}`: `tiled` takes {report.number(at['tiled']['ms_median'])} ms "
                  f"and `sdpa_causal` {report.number(at['sdpa_causal']['ms_median'])} ms, "
                  + (f"{prose.times(ratio)} as long, for the same O(T) memory: the algorithm is the same, the "
                     "difference is the kernel (one C++ loop over tiles, against Python's)." if kind == "more"
                     else "about as long or less, for the same O(T) memory."))

compiled_path = report.RESULTS_DIR / "cpu-intel-xeon-2c-float32-compiled.json"
compiled_run = report.load_result(compiled_path)


def compiled_row(label, mode):
    return next(row for row in report.shape_rows(compiled_run, mode) if row["label"] == f"{label} (compiled)")


compiled = {report.MODE_TITLES[mode]: (compiled_row("tiled", mode)["ms_median"], compiled_row("sdpa_causal", mode)["ms_median"])
            for mode in ("forward", "forward_backward")}
from attention.bench.metrics import CONTENDED_BELOW

contended = [f"`{row['label']}`, {report.MODE_TITLES[mode]}, at {row['cpu_utilization']:.0%} of the CPU"
             for mode in ("forward", "forward_backward") for row in (compiled_row(label, mode) for label in ("tiled", "sdpa_causal"))
             if (row["cpu_utilization"] or 1.0) < CONTENDED_BELOW]
show_markdown(prose.compiled_sentence(prose.file_label(compiled_path.name, report.is_stale(compiled_run)),
                                      compiled_run["config"]["seq_len"], compiled)
              + (f" Measured while other processes took the CPU (these times overstate the cost): {'; '.join(contended)}."
                 if contended else ""))

# %% [markdown]
# The whole run, with every length, both modes and the block-sparse measurements, is on
# [Benchmarks](../../benchmarks/#long-context); where skipping blocks pays for other masks is on
# [Masks](../masks/#where-block-sparsity-pays-measured-to-16k).
