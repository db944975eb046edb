# %% [markdown]
# # Context-parallel (ring) attention
#
# A sequence too long for one device is split along its length
# ([context parallelism](../../glossary/#context-parallelism)): each of P processes (GPUs, in practice)
# holds a shard of the queries, keys and values and computes attention for its own queries. Those
# queries need every key, so the key/value blocks travel around a ring of processes, and each process
# merges the partial results as they arrive with the online softmax of the
# [tiled page](../tiled/) (Liu et al., 2023, "Ring Attention with Blockwise Transformers",
# <https://arxiv.org/abs/2310.01889>). This page shows the ring step by step, why causal attention
# needs a different split (zig-zag), the merge, the backward pass, and then runs it on 2 and 4
# processes of this machine and checks the result against one process's float64 attention on the
# whole sequence; what it costs per process comes from a recorded benchmark run. It assumes the
# [tiled](../tiled/) page (the online softmax) and the [grouped-query](../gqa/) page (fewer
# key/value heads).
#
# `ring_attention` (`attention/distributed/ring.py`) is one torch-only file; it runs on any
# `torch.distributed` backend with point-to-point operations: gloo on CPUs here, NCCL on GPUs.
#
# API reference: [`attention.distributed.ring`](../../api/ring/).

# %%
import torch
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

import attention.distributed.ring as ring
from attention.display import show, show_markdown, show_source, show_table
from attention.distributed import accounting, check, launch
from attention.reference import reference_kernel
from attention.report.long import recorded
from attention.report.ring import page, plot_ring

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
#
# ![Four ranks in a ring, each keeping its queries and passing its key/value block to the next rank;
# beside it, the block each rank holds at each step, (r - s) mod P](../../diagrams/ring.svg)
#
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
# `ring.chunk_pairs` lists the pairs each step computes; `accounting.ring_work` counts their score entries
# (the masked half of a diagonal tile included: it is computed, then discarded), per rank and step, from
# the same function the ring runs. Every step waits for its busiest rank, so the ring's time follows the
# sum over steps of the largest entry of each step:

# %%
P, T = 4, 4096
for layout in ring.LAYOUTS:
    work = accounting.ring_work(P, T, layout)  # [rank][step]: score entries per batch element and head
    per_rank = [sum(steps) / 1e6 for steps in work]
    busiest = sum(max(work[rank][step] for rank in range(P)) for step in range(P)) / 1e6
    print(f"{layout:<10} millions of entries per rank: {', '.join(f'{m:.1f}' for m in per_rank)}; the steps' "
          f"busiest ranks: {busiest:.1f} in all, against {sum(per_rank) / P:.1f} of average work per rank")
    assert (busiest == per_rank[-1] if layout == "contiguous"  # the last rank is every step's busiest
            else len(set(per_rank)) == 1 and busiest == per_rank[0]), "the text below says so"

# %% [markdown]
# With the contiguous split the last rank does several times the first rank's work and the ring waits
# for it at every step; with the zig-zag split every rank does the same work, and the steps cost no
# more than the average.

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
# The benchmark's ring profile (`attention/bench/sweeps/ring.py`) runs the ring on a few counts of
# local processes for one fixed sequence and records, per process, the time of a call (the slowest
# process's), its peak tensor memory (beyond the inputs it holds) and the bytes it sent, counted where
# they are handed to `batch_isend_irecv` (`accounting.count_sent_bytes`), beside what the ring should
# send, computed from the shapes alone: one key/value block per step, `2 · B · H_kv · (T / P) · D`
# elements, and in the backward pass the blocks again with their gradients. For 4 processes sharing
# a sequence of 2,048 positions (2 key/value heads of 64, float32):

# %%
expected = accounting.expected_sent_bytes(batch=1, num_kv_heads=2, local_len=512, head_dim=64, dtype=torch.float32,
                                          world_size=4)
for mode, sends in expected.items():
    print(f"{mode:<17} KiB sent at each exchange: {[size // 2**10 for size in sends]}, {sum(sends) // 2**10} in all")

# %% [markdown]
# Each call of the recorded run is checked against the float64 reference on the whole sequence, and the
# file keeps its provenance (the machine, the versions, the commit, the command). It was made with
#
# ```bash
# python -m attention.bench --profile ring --device cpu --out docs/results/ring/cpu-ring-float32.json
# ```
#
# and read here by `attention.report.ring`; the [Benchmarks](../../benchmarks/#context-parallel-ring-attention)
# page shows every recorded run:

# %%
path, ring_run = recorded("ring")

# %% tags=["hide-input"]
show(plot_ring(ring_run))
show_markdown(page(ring_run, images={}, path=path))

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
#
# ```bash
# torchrun --nproc-per-node 4 -m attention.distributed --seq-len 32768 --heads 16 --kv-heads 4 --dtype bfloat16 --measure
# torchrun --nproc-per-node 4 -m attention.distributed --seq-len 32768 --heads 16 --kv-heads 16 --dtype bfloat16 --engine context_parallel
# ```

# %% [markdown]
# **What listens on the network.** `torchrun` serves its rendezvous store on every interface of the
# machine (`[::]:PORT`), without authentication, whatever its options: in PyTorch 2.13, `--standalone`,
# `--master-addr 127.0.0.1`, `--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT` and `--local-addr
# 127.0.0.1` all left it there (checked on the listening sockets of torchrun's processes). That is
# torch's behaviour. The entry point's own process group listens on 127.0.0.1 only on CPUs (gloo) when
# every rank runs on this machine; `launch.run_on_processes`, used above, listens on nothing else. To keep
# a one-machine `torchrun` off the network, run it in a network namespace of its own whose only
# interface is loopback (Linux; checked on CPUs with gloo, not yet with NCCL on GPUs):
#
# ```bash
# unshare --user --map-root-user --net sh -c 'ip link set lo up && torchrun --nproc-per-node 4 -m attention.distributed'
# ```
#
# What each process runs, in the check's own code (the `torchrun` entry point makes the same calls): its
# shard of each input, the ring forward and backward, and its shards of the output and gradients. In a
# training script the same three calls (`shard_sequence`, `ring_attention`, `backward`) replace the
# attention call, on token ids sharded before the model. Padded positions give a zero output and pass no
# gradient, so a loss over the whole shard needs no mask for them (the check gives them a random output
# gradient to prove it):

# %% tags=["hide-input"]
show_source(check.run_case)

# %% [markdown]
# The tests run the `torchrun` entry point on 4 CPU processes; on a machine with at least two GPUs,
# `pytest -m cuda tests/test_ring.py` runs it with NCCL for both engines.
