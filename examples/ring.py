# %% [markdown]
# # Context-parallel (ring) attention
#
# A sequence too long for one device is split along its length: each of P processes (GPUs, in practice)
# holds a shard of the queries, keys and values and computes attention for its own queries. Those
# queries need every key, so the key/value blocks travel around a ring of processes, and each process
# merges the partial results as they arrive with the online softmax of the
# [tiled page](../tiled/) (Liu et al., [Ring Attention](https://arxiv.org/abs/2310.01889)). This page
# shows the ring step by step, why causal attention needs a different split (zig-zag), the merge, the
# backward pass, and then runs it on 2 and 4 processes of this machine and checks the result against
# one process's float64 attention on the whole sequence. It assumes the [tiled](../tiled/) page (the
# online softmax) and the [grouped-query](../gqa/) page (fewer key/value heads).
#
# `ring_attention` (`attention/distributed/ring.py`) is one torch-only file; it runs on any
# `torch.distributed` backend with point-to-point operations: gloo on CPUs here, NCCL on GPUs.
#
# API reference: [`attention.distributed.ring`](../../api/ring/).

# %%
import os

import torch
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import attention.distributed.__main__ as cli
import attention.distributed.ring as ring
from attention.report import prose
from attention.bench import core
from attention import report
from attention.bench.sweeps import ring as ring_sweep
from attention.display import show, show_markdown, show_source, show_table
from attention.bench.sweeps.ring import measure_here
from attention.distributed import accounting, check, launch
from attention.reference import reference_kernel

# %% [markdown]
# ## Sharding the sequence
#
# With P processes, the contiguous split gives rank `r` the `r`-th of P consecutive pieces. The
# zig-zag split cuts the sequence into 2P chunks and gives rank `r` chunk `r` and its mirror
# `2P - 1 - r`: one early chunk and one late chunk each (why, below). A length that does not divide
# evenly is padded at the end with zeros; padded keys are never attended to, and the padded positions
# of the output are dropped when the shards are joined again. Positions held by each of 4 ranks for a
# sequence of 14 tokens:

# %%
P, T = 4, 14
for layout in ring.LAYOUTS:
    padded = ring.padded_length(T, P, layout)
    local_len = padded // P
    print(f"{layout} (padded to {padded}, {local_len} per rank):")
    for rank in range(P):
        positions = [p for start, end in ring.chunk_ranges(rank, P, local_len, layout) for p in range(start, end)]
        print(f"  rank {rank}: " + " ".join(f"{p:2d}" if p < T else " -" for p in positions))

# %% [markdown]
# `-` marks padding. `shard_sequence(x, rank, P, layout)` returns a rank's shard (any tensor, along
# its sequence dimension), `unshard_sequence(shards, T, layout)` joins all of them back:

# %%
x = torch.randn(1, 2, T, 8)  # (B, H, T, D)
shards = [ring.shard_sequence(x, rank, P, "zigzag") for rank in range(P)]  # P x (B, H, 4, D): 16 positions
print(f"shards {[tuple(s.shape) for s in shards]}; joined back equals x: "
      f"{torch.equal(ring.unshard_sequence(shards, T, 'zigzag'), x)}")

# %% [markdown]
# ## The ring, step by step
#
# Each rank starts with its own key/value block. At every step it scores its queries against the block
# it holds, and meanwhile sends that block to rank `r + 1` and receives the next one from rank `r - 1`
# (the send is posted before the compute, so the transfer overlaps it). After P steps every rank has
# seen every block once; it never holds more than two (the one it computes with and the one arriving).

# %% tags=["hide-input"]
P = 4
fig = Figure(figsize=(6.6, 3.6), layout="constrained")
ax = fig.subplots()
arrow = dict(arrowstyle="->", color="0.4", lw=1)
for step in range(P):
    for rank in range(P):
        source = (rank - step) % P
        ax.add_patch(Rectangle((rank - 0.4, step - 0.3), 0.8, 0.6, color=f"C{source}", alpha=0.8))
        ax.text(rank, step, f"K/V {source}", ha="center", va="center", fontsize=10, color="white", weight="bold")
        if step < P - 1 and rank < P - 1:  # the block goes on to the next rank for the next step
            ax.annotate("", xy=(rank + 0.62, step + 0.7), xytext=(rank + 0.38, step + 0.3), arrowprops=arrow)
    if step < P - 1:  # the last rank's block wraps around to rank 0
        ax.annotate("", xy=(P - 0.45, step + 0.55), xytext=(P - 0.62, step + 0.3), arrowprops=arrow)
        ax.annotate("", xy=(-0.38, step + 0.7), xytext=(-0.55, step + 0.45), arrowprops=arrow)
ax.set_xlim(-0.6, P - 0.4)
ax.set_ylim(P - 0.5, -0.5)
ax.set_xticks(range(P), [f"rank {rank}" for rank in range(P)])
ax.set_yticks(range(P), [f"step {step}" for step in range(P)])
ax.set_xlabel("process (each keeps its own queries throughout)")
ax.set_ylabel("ring step")
ax.set_title(f"Which key/value block each rank holds, P = {P}:\neach block moves on to the next rank at every step "
             f"(rank {P - 1}'s to rank 0)", fontsize=9)
show(fig, alt="A 4 by 4 grid: at step s, rank r holds the key/value block of rank (r - s) mod 4; arrows show "
              "each block passing to the next rank")

# %% [markdown]
# The exchange is one call to `torch.distributed.batch_isend_irecv` per step, the same on every rank:

# %% tags=["hide-input"]
show_source(ring._exchange)

# %% [markdown]
# ## The merge
#
# A rank's queries see the key blocks one at a time, in ring order, and must end with the softmax over
# all keys. That is exactly the tiled page's problem with the tiles arriving over the network: keep a
# running maximum `m`, sum `l` and unnormalised output per query, rescale them by `exp(m_old - m_new)`
# when a block raises the maximum, and divide at the end. `ring.py` carries the tiled class's update as
# a marked copy (`# Same as attention/causal/tiled.py::_online_softmax_update`, kept identical by a
# test), so the ring is the tiled loop with key tiles that come from other processes:

# %% tags=["hide-input"]
show_source(ring._online_softmax_update)

# %% [markdown]
# In one process, the queries of rank 2 against the four blocks in the order its ring delivers them
# (its own block first, then ranks 1, 0 and 3), merged, against the softmax over the whole sequence:

# %%
torch.manual_seed(0)
P, T, D = 4, 16, 8
q, k, v = (torch.randn(1, 1, T, D) for _ in range(3))  # (B, H, T, D)
rank, local_len = 2, T // P
rows = slice(rank * local_len, (rank + 1) * local_len)  # the contiguous split, for the demonstration
row_max = torch.full((1, 1, local_len), float("-inf"))  # m
row_sum = torch.zeros(1, 1, local_len)  # l
acc = torch.zeros(1, 1, local_len, D)  # unnormalised output
for step in range(P):
    source = (rank - step) % P
    cols = slice(source * local_len, (source + 1) * local_len)
    scores = q[:, :, rows] @ k[:, :, cols].transpose(-2, -1) / D**0.5  # (B, H, L, L)
    row_max, row_sum, acc = ring._online_softmax_update(row_max, row_sum, acc, scores, v[:, :, cols])
merged, _ = ring._finish_rows(row_max, row_sum, acc)  # (B, H, L, D)
whole, _ = reference_kernel(q, k, v)  # (B, H, T, D): float64, all keys at once
print(f"rank {rank}'s output merged from 4 blocks vs the whole softmax: largest difference "
      f"{(merged.double() - whole[:, :, rows]).abs().max().item():.1e}")

# %% [markdown]
# ## Causal attention: the imbalance and the zig-zag fix
#
# Under the causal mask, query `i` needs only keys `<= i`. With the contiguous split, rank 0's queries
# need only its own block, while the last rank's need every block: the ring waits at every step for the
# busiest rank. With the zig-zag split, every rank holds an early chunk and a late one, and from step 1
# on each rank computes exactly half a block. A block from a lower rank is needed by all the rank's
# queries, but only its early chunk (its late chunk comes after both of the rank's chunks); a block from
# a higher rank is needed whole, but only by the rank's late chunk (both of the block's chunks come after
# the rank's early chunk). Each panel is the `T x T` causal score matrix, colored by the rank that
# computes each query's row:

# %% tags=["hide-input"]
P, T = 4, 32
fig = Figure(figsize=(7.2, 3.6), layout="constrained")
axes = fig.subplots(1, 2)
for ax, layout in zip(axes, ring.LAYOUTS):
    local_len = ring.padded_length(T, P, layout) // P
    owner = torch.empty(T)
    for rank in range(P):
        for start, end in ring.chunk_ranges(rank, P, local_len, layout):
            owner[start:end] = rank
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = attend
    image = torch.ones(T, T, 4)  # RGBA, white where masked
    for rank in range(P):
        image[(owner[:, None] == rank) & causal] = torch.tensor(to_rgba(f"C{rank}"))
    ax.imshow(image, interpolation="nearest")
    ax.set_title(f"{layout}: score entries per rank\n" + ", ".join(
        f"{int(((owner[:, None] == rank) & causal).sum())}" for rank in range(P)), fontsize=9)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
fig.suptitle(f"Who computes which causal scores, T = {T}, P = {P} (color = rank)", fontsize=10)
show(fig, alt="Two causal score matrices colored by the rank that owns each query row: contiguous bands of very "
              "unequal area, and zig-zag bands where each rank owns one short early row band and one long late one")

# %% [markdown]
# The ring computes whole tiles: a pair of (query chunk, key chunk) is skipped when every key comes after
# every query, computed in full when every key comes before, and masked inside on the diagonal.
# `ring.chunk_pairs` lists the pairs each step computes; `accounting.ring_work` counts their score entries,
# per rank and step, from the same function the ring runs:

# %% tags=["hide-input"]
P, T = 4, 4096
fig = Figure(figsize=(7.2, 3.2), layout="constrained")
axes = fig.subplots(1, 2, sharey=True)
work = {layout: accounting.ring_work(P, T, layout) for layout in ring.LAYOUTS}
for ax, layout in zip(axes, ring.LAYOUTS):
    bottom = [0.0] * P
    for step in range(P):
        heights = [work[layout][rank][step] / 1e6 for rank in range(P)]
        ax.bar(range(P), heights, bottom=bottom, color=f"C{step}", alpha=0.8, label=f"step {step}")
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(P), [f"rank {rank}" for rank in range(P)])
    ax.set_title(layout, fontsize=9)
    ax.set_xlabel("process")
axes[0].set_ylabel("score entries computed (millions, per head)")
axes[1].legend(fontsize=8)
fig.suptitle(f"Causal work per rank, T = {T}, P = {P}", fontsize=10)
show(fig, alt="Stacked bars of work per rank and step: contiguous grows from rank 0 to rank 3, zig-zag is equal "
              "on every rank")

# %% tags=["hide-input"]
totals = {layout: [sum(row) for row in work[layout]] for layout in ring.LAYOUTS}
per_step = {layout: [max(work[layout][rank][step] for rank in range(P)) for step in range(P)] for layout in ring.LAYOUTS}
show_markdown(
    f"With the contiguous split the last rank computes {totals['contiguous'][-1] / totals['contiguous'][0]:.0f} "
    f"times as many score entries as the first, and since every step waits for its busiest rank, the ring's "
    f"steps cost {sum(per_step['contiguous']) / 1e6:.1f} M entries in all against "
    f"{sum(totals['contiguous']) / P / 1e6:.1f} M of average work per rank. With the zig-zag split every rank "
    f"computes {totals['zigzag'][0] / 1e6:.1f} M ({'equal on all ranks' if len(set(totals['zigzag'])) == 1 else 'unequal'}), "
    f"and the steps cost {sum(per_step['zigzag']) / 1e6:.1f} M in all. (Whole tiles are counted: the masked "
    f"half of a diagonal tile is computed, then discarded.)")

# %% [markdown]
# ## The backward pass runs the ring again
#
# The gradients must be the distributed ones, not a recomputation on one gathered sequence. The backward
# pass (FlashAttention's, one tile at a time: scores recomputed from the saved log-sum-exp of each query)
# sends each key/value block around the ring once more, and with it the running gradient of those keys
# and values: every rank adds its queries' share, `dK += dSᵀ Q` and `dV += Pᵀ dO`, and passes both on. After
# the last step one more hop brings each block's finished gradient home to the rank that owns it. The
# query gradient never travels. With grouped K/V heads only the `H_kv` heads travel, and the gradient of
# a key/value head sums the shares of its `H / H_kv` query heads.

# %% [markdown]
# ## Checked across processes
#
# Below, 4 processes of this machine join one gloo process group (`launch.run_on_processes`, which does
# what `torchrun` does, and brings each process's result back; they meet through a file, and gloo's
# sockets listen on 127.0.0.1 only); a case for 2 processes runs on ranks
# 0-1 and on ranks 2-3 at once. Every process draws the same random whole sequence from a seed, keeps
# its shard, runs `ring_attention` forward and backward, and returns its shard of the output and of
# the query, key and value gradients. Joined, they are compared with `reference_kernel`, the float64
# attention on the whole sequence, in one process. `T = 37` divides by neither 2 nor 4, and 8 query
# heads share 2 key/value heads. The last rows run PyTorch's own ring (below) on the same inputs.

# %%
def case(world_size, causal, layout, engine="ring", heads=8, kv_heads=2, seq_len=37):
    return dict(world_size=world_size, batch=2, num_heads=heads, num_kv_heads=kv_heads, seq_len=seq_len,
                head_dim=16, causal=causal, layout=layout, dtype="float32", seed=world_size, engine=engine)


cases = [case(P, causal, layout) for P in (2, 4) for causal, layout in
         ((True, "zigzag"), (True, "contiguous"), (False, "zigzag"))]
cases += [case(P, True, "zigzag", engine="torch", kv_heads=8, seq_len=32) for P in (2, 4)]
results = check.run_cases(cases, world_size=4)


rows, worst = [], {}
for c, per_group in zip(cases, results):
    expected = check.reference_results(c)  # float64, whole sequence, one process
    errors = {name: max((group[name].double() - expected[name]).abs().max().item() for group in per_group)
              for name in check.RESULTS}
    worst[(c["engine"], c["world_size"])] = max(worst.get((c["engine"], c["world_size"]), 0.0), *errors.values())
    rows.append([c["engine"], c["world_size"], f"{c['num_heads']} / {c['num_kv_heads']}", c["seq_len"],
                 "causal" if c["causal"] else "full", c["layout"], *(f"{errors[name]:.1e}" for name in check.RESULTS)])

# %% tags=["hide-input"]
show_table("Largest difference from the float64 reference on the whole sequence (float32 processes)",
           ["engine", "P", "H / H_kv", "T", "mask", "layout", "output", "dQ", "dK", "dV"], rows)

# %% tags=["hide-input"]
show_markdown(
    f"Every difference is float32 rounding: at most {worst[('ring', 2)]:.1e} on 2 processes and "
    f"{worst[('ring', 4)]:.1e} on 4, output and gradients. The tests (`tests/test_ring.py`) check the same, "
    f"element by element with the project's tolerances, on 1, 2 and 4 processes, in float32, float64 and "
    f"bfloat16, with padding that fills whole chunks; and they make one process crash, and another stop "
    f"answering, in the middle of the ring: the others end with an error that names the step and the "
    f"neighbours (`ring attention stopped at step ...`) within the process group's timeout, instead of "
    f"waiting forever.")

# %% [markdown]
# ## What it costs: memory per process and bytes on the wire
#
# `measure_ring` (the benchmark's ring sweep, `attention/bench/sweeps/ring.py`) runs on every rank of a group and returns, per rank, the time of a call (the
# slowest rank's), its peak tensor memory (beyond the inputs it holds) and the bytes it sent, counted
# where they are handed to `batch_isend_irecv`, beside what the ring should send, computed from the
# shapes: one key/value block per step, `2 · B · H_kv · (T / P) · D` elements. Here for one fixed
# sequence on 1, 2 and 4 processes:

# %%
fixed = dict(batch=1, num_heads=8, num_kv_heads=2, seq_len=512, head_dim=64, repeats=1)
configs = [dict(fixed, world_size=P) for P in (1, 2, 4)]
per_rank = launch.run_on_processes(measure_here, 4, configs)
measured = per_rank[0]  # rank 0's dicts: it belongs to one group of each size

# %% tags=["hide-input"]
MiB = 2**20
rows = []
for m in measured:
    forward, both = m["forward"], m["forward_backward"]
    step_bytes = forward["expected_sent_bytes"][0] if forward["expected_sent_bytes"] else 0
    rows.append([m["world_size"], m["local_len"], f"{m['shard_bytes'] / MiB:.2f}", f"{forward['peak_bytes'] / MiB:.1f}",
                 f"{both['peak_bytes'] / MiB:.1f}", f"{step_bytes / 2**10:.0f}",
                 "yes" if forward["sent_bytes"] == forward["expected_sent_bytes"]
                 and both["sent_bytes"] == both["expected_sent_bytes"] else "NO",
                 f"{sum(forward['sent_bytes']) / 2**10:.0f}"])
show_table(f"One sequence of T = {fixed['seq_len']} (B = 1, H = 8, H_kv = 2, D = 64, float32, causal, zig-zag), "
           "per process", ["P", "T / P", "shard q, k, v, dO (MiB)", "forward peak (MiB)", "forward + backward peak (MiB)",
                           "sent per step (KiB)", "counted = computed", "sent per forward (KiB)"], rows)

# %% tags=["hide-input"]
fig = Figure(figsize=(5.6, 3.3), layout="constrained")
ax = fig.subplots()
world_sizes = [m["world_size"] for m in measured]
for mode, marker in (("forward", "o"), ("forward_backward", "s")):
    ax.plot(world_sizes, [(m[mode]["peak_bytes"] + m["shard_bytes"]) / MiB for m in measured], marker=marker,
            label=mode.replace("_", " + "))
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set_xticks(world_sizes, [str(p) for p in world_sizes])
ax.set_xlabel("processes P (sequence length fixed)")
ax.set_ylabel("shard + call's peak, per process (MiB)")
ax.set_title(f"Tensor memory per process, T = {fixed['seq_len']}, measured at build time", fontsize=9)
ax.legend(fontsize=8)
show(fig, alt="Memory per process against the number of processes, log-log: it falls as processes are added")

# %% tags=["hide-input"]
first, last = measured[0], measured[-1]
sent_total = sum(last["forward"]["sent_bytes"])
backward_ratio = (sum(last["forward_backward"]["sent_bytes"]) - sent_total) / sent_total
peak_ratio = first["forward"]["peak_bytes"] / last["forward"]["peak_bytes"]
kv_whole = 2 * fixed["batch"] * fixed["num_kv_heads"] * fixed["seq_len"] * fixed["head_dim"] * 4
show_markdown(
    f"From 1 to {last['world_size']} processes, the forward call's peak per process falls from "
    f"{first['forward']['peak_bytes'] / MiB:.1f} MiB to {last['forward']['peak_bytes'] / MiB:.1f} MiB "
    f"({peak_ratio:.0f} times less)"
    + (f", more than the {last['world_size']} times of the shards: a score tile is one chunk by one chunk, "
       f"`(T / 2P)²` entries" if peak_ratio > last["world_size"] else "")
    + f". Each rank sends {sent_total / 2**10:.0f} KiB per forward call on {last['world_size']} processes, "
    f"{sent_total / kv_whole:.2f} of the whole sequence's keys and values (`(P - 1) / P`): every block visits "
    f"every other rank once. The backward pass sends {backward_ratio:.1f} times the forward's bytes: the blocks "
    f"again, and at every step their gradients (in float32 at least). The counted bytes equal the computed "
    f"ones on every rank.\n\n"
    f"Time is not shown: on one machine the processes share its CPU cores ({os.cpu_count()} here), so their "
    f"timings show how the cores are shared, not what the ring gains with one device per process. There, "
    f"the transfers hide behind the compute as long as a step's compute, which grows like `(T / P)²`, outlasts "
    f"sending one block, which grows like `T / P`.")

# %% [markdown]
# ### Recorded run
#
# The benchmark's ring profile runs the same measurement on a longer sequence, each call checked against
# the float64 reference on the whole sequence, and records it with its provenance (the machine, the
# versions, the commit, the command); the [Benchmarks](../../benchmarks/#context-parallel-ring-attention)
# page shows every recorded run:
#
# ```bash
# python -m attention.bench --profile ring --device cpu --out docs/results/ring/cpu-ring-float32.json
# ```

# %% tags=["hide-input"]
ring_runs = report.find_results(report.RESULTS_DIR / "ring")
if ring_runs:
    recorded = report.load_result(ring_runs[0])
    by_size = ring_sweep.ring_rows(recorded)
    fewest, most = by_size[min(by_size)]["forward_backward"], by_size[max(by_size)]["forward_backward"]
    recorded_rows = [row for pair in by_size.values() for row in pair.values()]
    load, cores = recorded["provenance"]["load_average_start"], recorded["provenance"]["device"]["cpu_count"]
    busy = (f" Other work ran beside this run (load average {load[0]:.1f} at its start, on {cores} cores): each "
            "time includes the share of a busy machine its processes got, and more processes get a larger share."
            if load and load[0] > cores else "")
    show_markdown(f"{prose.file_label(f'docs/results/ring/{ring_runs[0].name}', report.is_stale(recorded))}: "
                  f"{recorded['provenance']['device']['name']}, {recorded['provenance']['device']['cpu_count']} cores, "
                  f"{recorded['dtype']}, recorded {recorded['provenance']['date_utc'][:10]}; "
                  f"{ring_sweep.sizes_text(recorded['ring'])}. Times are the slowest process's medians, with the "
                  "whole ring's TFLOP/s and its share of a matmul's rate on the same machine:\n\n"
                  + ring_sweep.ring_table(recorded))
    show(ring_sweep.plot_ring(recorded), alt="Memory per process and time per call against the number of processes, "
                                            "from the recorded run")
    show_markdown(
        f"In this run, the forward + backward call's peak per process falls from "
        f"{report.mebibytes(fewest['peak_memory_bytes'])} MiB on {fewest['world_size']} "
        f"{'process' if fewest['world_size'] == 1 else 'processes'} to "
        f"{report.mebibytes(most['peak_memory_bytes'])} MiB on {most['world_size']}, beside shards of "
        f"{report.mebibytes(fewest['shard_bytes'])} and {report.mebibytes(most['shard_bytes'])} MiB; every call "
        f"matched the reference: {'yes' if all(map(core.usable, recorded_rows)) else 'NO'} (largest "
        f"difference {max(row['max_abs_error'] or 0.0 for row in recorded_rows):.1e}). "
        + ring_sweep.bytes_note(recorded) + " " + ring_sweep.cores_note(recorded) + busy)
else:
    show_markdown("No run of the ring profile is recorded in `docs/results/ring/` yet: the command above records one.")

# %% [markdown]
# ## PyTorch's engine: context_parallel
#
# PyTorch ships context parallelism as `torch.distributed.tensor.experimental.context_parallel`
# (prototype): a context manager that shards given buffers along the sequence in place and, inside it,
# replaces `F.scaled_dot_product_attention` with a ring over a `DeviceMesh`. What the installed source
# (`torch/distributed/tensor/experimental/_context_parallel/_attention.py`, PyTorch 2.13) does:
#
# * **Kernels**: it dispatches the flash, memory-efficient and cuDNN attention ops of SDPA (forward and
#   backward), which are CUDA kernels; each ring step calls one of them on a block, and the partial
#   results merge by their log-sum-exp, in float32 (`_cp_options.convert_to_f32`).
# * **Collectives**: by default the key/value shard is *all-gathered* once (`all_gather_single`, functional
#   collectives) and each step reads its block from the gathered copy: one collective, but every rank
#   holds the whole sequence's keys and values. `set_rotate_method("alltoall")` passes blocks from rank to
#   rank instead (`permute_tensor`, an all-to-all), as a ring does. The backward pass always passes the
#   key/value gradients with all-to-all.
# * **Causal balance**: head-tail load balancing (`_HeadTailLoadBalancer`), which is this page's zig-zag
#   split, position for position (a test checks it), when `2P` divides the sequence length; otherwise no
#   balancing. There is no padding.
# * **Masks**: `is_causal` or none. An `attn_mask` raises `NotImplementedError` ("attn_bias is not supported
#   yet"); causal needs equal query and key lengths; with balancing on (the default) and `2P` dividing the
#   length, non-causal attention raises ("Load balancing requires `is_causal=True`") unless
#   `_cp_options.enable_load_balance` is turned off first. (A separate FlexAttention path all-gathers the
#   keys and values, no ring, and needs the length to divide by `P · 128`.)
# * **Grouped K/V heads**: not checked here (no GPU); this page's `torchrun` check runs it with as many
#   key/value heads as query heads.
# * **Dtypes**: those of the CUDA kernels (flash: float16 and bfloat16; memory-efficient: float32 too).
#
# Here, on the CPU with gloo, the public path was tried at build time on 2 processes:

# %%
probe = launch.run_on_processes(check.try_context_parallel, 2, case(2, True, "zigzag", kv_heads=8, seq_len=32))[0]
print("context_parallel on CPU:", "ran" if probe["error"] is None else probe["error"])

# %% [markdown]
# The ring inside it does run here: called directly with the CPU flash kernel
# (`check.torch_ring_attention`, through PyTorch's private `_templated_ring_attention` and its
# backward), it is the `torch` rows of the table above, equal to the reference like ours.

# %% [markdown]
# ## On GPUs, with torchrun
#
# `python -m attention.distributed` is the same check as a `torchrun` script: each process takes GPU
# `LOCAL_RANK` and NCCL (the CPU and gloo where there is no GPU), draws the sequence from the seed, keeps
# its shard, runs forward and backward, and rank 0 prints the largest difference from the float64
# reference on the whole sequence. `--engine context_parallel` runs PyTorch's path instead (GPUs only,
# `--kv-heads` equal to `--heads`), and `--measure` adds `measure_ring`'s dict. On one machine with 4 GPUs:

# %% tags=["hide-input"]
show_markdown("""```bash
torchrun --nproc-per-node 4 -m attention.distributed --seq-len 32768 --heads 16 --kv-heads 4 --dtype bfloat16 --measure
torchrun --nproc-per-node 4 -m attention.distributed --seq-len 32768 --heads 16 --kv-heads 16 --dtype bfloat16 --engine context_parallel
```""")

# %% [markdown]
# **What listens on the network.** `torchrun` serves its rendezvous store on every interface of the
# machine (`[::]:PORT`), without authentication, whatever its options: in PyTorch 2.13, `--standalone`,
# `--master-addr 127.0.0.1`, `--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT` and `--local-addr
# 127.0.0.1` all left it there (checked on the listening sockets of torchrun's processes). That is
# torch's behaviour. The entry point's own process group listens on 127.0.0.1 only on CPUs (gloo) when
# every rank runs on this machine; `launch.run_on_processes`, used above, listens on nothing else. To keep
# a one-machine `torchrun` off the network, run it in a network namespace of its own whose only
# interface is loopback (Linux; checked on CPUs with gloo, not yet with NCCL on GPUs):

# %% tags=["hide-input"]
show_markdown("""```bash
unshare --user --map-root-user --net sh -c 'ip link set lo up && torchrun --nproc-per-node 4 -m attention.distributed'
```""")

# %% [markdown]
# What each process runs, in the entry point's own code: its shard of each input, the ring forward and
# backward, and the shards of the output and gradients gathered on every rank. In a training script the
# same three calls (`shard_sequence`, `ring_attention`, `backward`) replace the attention call, on token
# ids sharded before the model. Padded positions give a zero output and pass no gradient, so a loss over
# the whole shard needs no mask for them:

# %% tags=["hide-input"]
show_source(cli._ring)

# %% [markdown]
# The tests run the `torchrun` entry point on 4 CPU processes; on a machine with at least two GPUs,
# `pytest -m cuda tests/test_ring.py` runs it with NCCL for both engines.
