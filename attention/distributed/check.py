"""The distributed equality check: ring attention on P processes against one process's float64 attention.

A *case* is a dict: `world_size`, `batch`, `num_heads`, `num_kv_heads`, `seq_len`, `head_dim`, `causal`,
`layout`, `dtype` (a name: "float32", "float64", "bfloat16"), `seed`, and `engine`: `"ring"`
(`attention.distributed.ring.ring_attention`) or `"torch"` (the ring inside PyTorch's `context_parallel`,
`_templated_ring_attention` and its backward, run with the CPU flash kernel: see `torch_ring_attention`).
`case_inputs(case)` draws the whole sequence's `q, k, v` and output gradient from the seed, so every
process and the checking process hold the same tensors without sending them.

`run_cases(cases, world_size)` runs every case on `world_size` local processes at once: a case of
`world_size` P runs on each consecutive group of P processes (so one launch covers P = 1, 2 and 4), each
process on its shard, forward and backward; the shards come back joined into the whole sequence.
`python -m attention.distributed` runs the check under `torchrun` (see `__main__.py`).
"""

import torch
import torch.distributed as dist

from attention.distributed import launch
from attention.distributed.ring import chunk_ranges, ring_attention, shard_sequence, unshard_sequence

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
RESULTS = ("out", "grad_q", "grad_k", "grad_v")


def case_inputs(case):
    """The whole sequence's `q` `(B, H, T, D)`, `k`, `v` `(B, H_kv, T, D)` and output gradient `(B, H, T, D)`
    of a case, drawn from its seed (in float32, then cast to the case's dtype)."""
    generator = torch.Generator().manual_seed(case["seed"])
    B, H, H_kv, T, D = case["batch"], case["num_heads"], case["num_kv_heads"], case["seq_len"], case["head_dim"]
    shapes = [(B, H, T, D), (B, H_kv, T, D), (B, H_kv, T, D), (B, H, T, D)]
    q, k, v, grad_out = (torch.randn(shape, generator=generator).to(DTYPES[case["dtype"]]) for shape in shapes)
    return q, k, v, grad_out


def reference_results(case):
    """The whole sequence's `{"out", "grad_q", "grad_k", "grad_v"}` of a case from the float64 reference
    (`attention.reference.reference_kernel`, causal mask where the case is causal), on the CPU: what the joined
    shards of `run_cases` are compared with.

    One query head at a time, so the float64 score matrix held is `(B, 1, T, T)`, not `(B, H, T, T)` (8 GiB
    with its gradients at T = 4096 and 8 heads); a key/value head's gradient sums its query heads' shares.
    """
    from attention.reference import reference_kernel

    q, k, v, grad_out = (t.double() for t in case_inputs(case))
    T, group = case["seq_len"], case["num_heads"] // case["num_kv_heads"]
    mask = torch.ones(T, T, dtype=torch.bool).tril() if case["causal"] else None  # (T, T), True = attend
    out, grad_q, grad_k, grad_v = (torch.zeros_like(t) for t in (q, q, k, v))
    for head in range(case["num_heads"]):
        kv_head = head // group
        q_head, k_head, v_head = (t[:, h:h + 1].clone().requires_grad_(True)
                                  for t, h in ((q, head), (k, kv_head), (v, kv_head)))  # (B, 1, T, D)
        out_head, _ = reference_kernel(q_head, k_head, v_head, mask=mask)  # (B, 1, T, D)
        out_head.backward(grad_out[:, head:head + 1])
        out[:, head:head + 1] = out_head.detach()
        grad_q[:, head:head + 1] = q_head.grad
        grad_k[:, kv_head:kv_head + 1] += k_head.grad
        grad_v[:, kv_head:kv_head + 1] += v_head.grad
    return dict(zip(RESULTS, (out, grad_q, grad_k, grad_v)))


def run_case(case, group=None, device="cpu"):
    """On every rank of `group` at once: this rank's shard of the output and of each gradient, for one case.

    The output gradient at padded positions is random (a loss that does not mask them): it must change nothing.

    Returns:
        `{"out", "grad_q", "grad_k", "grad_v"}`, each `(B, heads, L, D)` on the CPU.
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if world_size != case["world_size"]:
        raise ValueError(f"the case is for {case['world_size']} processes, the group has {world_size}")
    q, k, v, grad_out = (shard_sequence(t, rank, world_size, case["layout"]).to(device) for t in case_inputs(case))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    # A loss over the whole shard, padding included: the output gradient there is noise, which must change nothing.
    positions = torch.cat([torch.arange(start, end) for start, end in
                           chunk_ranges(rank, world_size, q.shape[2], case["layout"])]).to(device)  # (L,)
    grad_out = torch.where((positions >= case["seq_len"])[:, None], torch.randn_like(grad_out), grad_out)
    if case.get("engine", "ring") == "ring":
        out = ring_attention(q, k, v, case["causal"], layout=case["layout"], seq_len=case["seq_len"], group=group)
        out.backward(grad_out)
        grads = q.grad, k.grad, v.grad
    else:
        if case["seq_len"] % (world_size * (2 if case["layout"] == "zigzag" else 1)):
            raise ValueError(f"PyTorch's ring has no padding: seq_len={case['seq_len']} must split evenly "
                             f"({case['layout']}, {world_size} processes)")
        out, grads = torch_ring_attention(q.detach(), k.detach(), v.detach(), grad_out, case["causal"], case["layout"],
                                          group)
    return {name: tensor.detach().cpu() for name, tensor in zip(RESULTS, (out, *grads))}


def torch_ring_attention(q, k, v, grad_out, causal, layout, group=None):
    """PyTorch's own ring, the engine inside `context_parallel`, called directly with the CPU flash kernel:
    `(out, (grad_q, grad_k, grad_v))`, this rank's shards.

    `context_parallel` itself does not run on CPU (it dispatches only the CUDA kernels' ops); its ring
    (`_templated_ring_attention` and `_templated_ring_attention_backward`, private functions of PyTorch) takes
    the kernel as an argument. Its causal load balancing (`_cp_options.enable_load_balance`) is the zigzag
    layout, so `layout="zigzag"` turns it on; it has no padding and needs `H_kv == H`.
    """
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    previous = cp._cp_options.enable_load_balance
    cp._cp_options.enable_load_balance = layout == "zigzag"
    try:
        group = dist.group.WORLD if group is None else group
        out, lse, *_ = cp._templated_ring_attention(
            group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, is_causal=causal)
        grad_q, grad_k, grad_v, *_ = cp._templated_ring_attention_backward(
            group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default, grad_out=grad_out,
            grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=causal, dropout_p=0.0)
    finally:
        cp._cp_options.enable_load_balance = previous
    return out, (grad_q, grad_k, grad_v)


def context_parallel_attention(case, device):
    """PyTorch's public path on every rank of the default group at once: `context_parallel` around
    `F.scaled_dot_product_attention`, forward and backward; the whole sequence's
    `{"out", "grad_q", "grad_k", "grad_v"}` (`context_parallel_unshard`).

    `context_parallel` shards the buffers in place on entering: zigzag (its head-tail load balancing) for
    causal attention when `2 * P` divides the length, else contiguous. Its balancing refuses non-causal
    attention, so it is turned off for that (`_cp_options.enable_load_balance`, restored after).
    """
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, context_parallel_unshard

    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    buffers = [t.to(device) for t in case_inputs(case)]  # q, k, v, grad_out: whole sequences, sharded in place
    previous = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = case["causal"]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2]):
            q, k, v = (t.detach().requires_grad_(True) for t in buffers[:3])  # (B, H, L, D): this rank's shards
            out = F.scaled_dot_product_attention(q, k, v, is_causal=case["causal"])
            out.backward(buffers[3])
            gathered = context_parallel_unshard(mesh, [out.detach(), q.grad, k.grad, v.grad], [2, 2, 2, 2])
    finally:
        _cp_options.enable_load_balance = previous
    return dict(zip(RESULTS, gathered))


def try_context_parallel(case, device="cpu"):
    """`context_parallel_attention` if it runs here: `{"error": None, **results}`, else `{"error": "Type: message"}`.
    On CPU in PyTorch 2.13 it does not (the CPU attention kernel has no rule for sequence-sharded inputs)."""
    try:
        return {"error": None, **context_parallel_attention(case, device)}
    except Exception as error:  # noqa: BLE001 -- what the installed PyTorch says is the answer
        return {"error": f"{type(error).__name__}: {error}".strip()}


def run_cases(cases, world_size=4, timeout_s=300.0):
    """Run every case on `world_size` local processes (gloo), forward and backward, in one launch.

    Returns:
        `join_shards(cases, ...)`: for each case, one entry per group of `case["world_size"]` processes.
    """
    for case in cases:
        if world_size % case["world_size"]:
            raise ValueError(f"case world_size {case['world_size']} does not divide world_size={world_size}")
    return join_shards(cases, launch.run_on_processes(run_cases_here, world_size, cases, timeout_s=timeout_s))


def run_cases_here(cases):
    """On every process at once: each case on this process's group of `case["world_size"]` (consecutive ranks,
    `launch.subgroup`); this rank's shards, one dict per case."""
    groups = {size: launch.subgroup(size) for size in sorted({case["world_size"] for case in cases})}
    return [run_case(case, groups[case["world_size"]]) for case in cases]


def join_shards(cases, shards_by_rank):
    """The whole sequences from what `run_cases_here` returned on each rank (in rank order): for each case, a
    list with one entry per group of `case["world_size"]` processes (ranks 0..P-1, P..2P-1, ...), each
    `{"out", "grad_q", "grad_k", "grad_v"}` with the shards joined and the padding dropped."""
    world_size, joined = len(shards_by_rank), []
    for index, case in enumerate(cases):
        size = case["world_size"]
        joined.append([{name: unshard_sequence([shards_by_rank[rank][index][name] for rank in range(first, first + size)],
                                               case["seq_len"], case["layout"])
                        for name in RESULTS}
                       for first in range(0, world_size, size)])
    return joined
