"""Ring attention measured per process: time, peak memory, bytes sent, and the work each rank does.

`measure_ring` is what a benchmark sweep calls on every rank of a process group (under `torchrun`, or
`attention.distributed.launch.run_on_processes` on one machine); it returns a plain dict per rank. The
bytes a rank sends are counted where they leave (`count_sent_bytes`: every tensor handed to
`torch.distributed.batch_isend_irecv` to send) and set beside what the ring should send
(`expected_sent_bytes`, from the shapes alone). `ring_work` counts the score entries each rank computes at
each step, from the same `chunk_pairs` the ring runs, to show the causal imbalance and the zigzag fix.
"""

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from attention.distributed.ring import chunk_pairs, padded_length, ring_attention, shard_sequence


def expected_sent_bytes(batch, num_kv_heads, local_len, head_dim, dtype, world_size):
    """The bytes one rank should send at each exchange of one call, from the shapes alone.

    Forward: one K/V block `2 * B * H_kv * L * D` elements at each of the first `P - 1` steps (the last
    block needs sending nowhere). Forward + backward: those, then in the backward pass the K/V block again
    at each of the first `P - 1` steps and, at every step, the block's gradients `dK, dV` (in float32 at
    least, the precision they are summed in), the last hop taking them home.

    Returns:
        `{"forward": [bytes per exchange], "forward_backward": [...]}`, in the order the ring sends them.
    """
    elements = 2 * batch * num_kv_heads * local_len * head_dim  # K and V
    block = elements * torch.empty((), dtype=dtype).element_size()
    gradients = elements * torch.empty((), dtype=torch.promote_types(dtype, torch.float32)).element_size()
    forward = [block] * (world_size - 1)
    backward = [] if world_size == 1 else [block, gradients] * (world_size - 1) + [gradients]
    return {"forward": forward, "forward_backward": forward + backward}


@contextlib.contextmanager
def count_sent_bytes():
    """Count what this process sends with `torch.distributed.batch_isend_irecv` inside the block.

    Yields a list that receives, for each call, the bytes of the tensors it was given to send (`isend`
    operations): the payload, without the transport's own headers.
    """
    sent = []
    original = dist.batch_isend_irecv

    def counting(operations):
        sent.append(sum(op.tensor.numel() * op.tensor.element_size() for op in operations if op.op is dist.isend))
        return original(operations)

    dist.batch_isend_irecv = counting
    try:
        yield sent
    finally:
        dist.batch_isend_irecv = original


def ring_work(world_size, seq_len, layout="zigzag", causal=True):
    """Score entries (query-key pairs, masked ones inside a computed tile included) each rank computes at
    each step of the ring: `[rank][step]`, per batch element and head. From `chunk_pairs`, as the ring runs."""
    local_len = padded_length(seq_len, world_size, layout) // world_size
    return [[sum(q_len * k_len for (_, _, q_len), (_, _, k_len)
                 in chunk_pairs(rank, (rank - step) % world_size, world_size, local_len, layout, causal, seq_len))
             for step in range(world_size)]
            for rank in range(world_size)]


def measure_ring(batch, num_heads, num_kv_heads, seq_len, head_dim, *, causal=True, layout="zigzag",
                 dtype=torch.float32, device="cpu", group=None, repeats=3, seed=0):
    """Time, peak memory and bytes sent of ring attention on this rank; call it on every rank of `group` at once.

    Every rank draws the whole sequence's inputs from `seed` and keeps its shard, so nothing is sent to set
    up. Each call is timed between barriers, and its time is the slowest rank's (`all_reduce` of the
    maximum): the ring advances at the pace of its slowest member.

    Peak memory is what one call needed beyond what was allocated before it (the inputs): on CPU the peak
    of live tensor bytes in a profile of the call, on CUDA `max_memory_allocated`, both through the
    benchmark's measuring core (`attention.bench.metrics`).

    Returns:
        A dict: the sizes and settings, `world_size`, `rank`, `local_len`, `threads`; `shard_bytes` (this rank's
        `q, k, v` and output gradient); per mode (`"forward"`, `"forward_backward"`): `seconds` (median over
        `repeats` of the slowest rank's time), `all_seconds`, `peak_bytes`, `sent_bytes` (counted, per exchange)
        and `expected_sent_bytes`.
    """
    from attention.bench import metrics  # the one measuring core: peak memory on CPU (profiler) and CUDA

    if group is None and not (dist.is_available() and dist.is_initialized()):
        rank, world_size = 0, 1
    else:
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, num_heads, seq_len, head_dim), (batch, num_kv_heads, seq_len, head_dim),
              (batch, num_kv_heads, seq_len, head_dim), (batch, num_heads, seq_len, head_dim)]
    q, k, v, grad_out = (shard_sequence(torch.randn(shape, generator=generator), rank, world_size, layout)
                         .to(device=device, dtype=dtype) for shape in shapes)
    local_len = q.shape[2]

    def forward():
        return ring_attention(q, k, v, causal, layout=layout, seq_len=seq_len, group=group)

    def forward_backward():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        ring_attention(*leaves, causal, layout=layout, seq_len=seq_len, group=group).backward(grad_out)

    expected = expected_sent_bytes(batch, num_kv_heads, local_len, head_dim, dtype, world_size)
    result = {"batch": batch, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "seq_len": seq_len,
              "head_dim": head_dim, "causal": causal, "layout": layout, "dtype": str(dtype).removeprefix("torch."),
              "device": str(device), "world_size": world_size, "rank": rank, "local_len": local_len,
              "threads": torch.get_num_threads(),
              "shard_bytes": sum(t.numel() * t.element_size() for t in (q, k, v, grad_out))}
    for mode, call in (("forward", forward), ("forward_backward", forward_backward)):
        call()  # warm-up
        with count_sent_bytes() as sent:
            call()
        if torch.device(device).type == "cpu":
            peak = metrics.profile_call(call, device)["cpu_tensor_peak_bytes"]
        else:
            peak = metrics.device_peak_memory(call, device)
        seconds = []
        for _ in range(repeats):
            if world_size > 1:
                dist.barrier(group=group)
            started = time.perf_counter()
            call()
            metrics.synchronize(device)
            seconds.append(time.perf_counter() - started)
        if world_size > 1:  # the slowest rank's time, call by call
            slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
            seconds = slowest.tolist()
        result[mode] = {"seconds": statistics.median(seconds), "all_seconds": seconds, "peak_bytes": peak,
                        "sent_bytes": sent, "expected_sent_bytes": expected[mode]}
    return result


def measure_here(configs):
    """On every process at once: `measure_ring(**config)` for each config, on this process's group of
    `config["world_size"]` consecutive ranks (`launch.subgroup`). For
    `launch.run_on_processes(measure_here, P, configs)`; returns this rank's dicts."""
    from attention.distributed import launch

    groups = {size: launch.subgroup(size) for size in sorted({config["world_size"] for config in configs})}
    return [measure_ring(**{name: value for name, value in config.items() if name != "world_size"},
                         group=groups[config["world_size"]])
            for config in configs]


def check_and_measure_here(case, repeats=3):
    """On every process of a launch at once, for one case of `check.py` on the whole group: this rank's shards
    of the output and gradients (`check.run_case`, for the caller to join and compare with the reference),
    then `measure_ring` on the same sequence. The benchmark's ring sweep runs it with
    `launch.run_on_processes(check_and_measure_here, P, case, repeats)`; returns `{"shards", "measured"}`."""
    from attention.distributed import check

    shards = check.run_case(case)
    measured = measure_ring(case["batch"], case["num_heads"], case["num_kv_heads"], case["seq_len"], case["head_dim"],
                            causal=case["causal"], layout=case["layout"], dtype=check.DTYPES[case["dtype"]],
                            repeats=repeats, seed=case["seed"])
    return {"shards": shards, "measured": measured}
