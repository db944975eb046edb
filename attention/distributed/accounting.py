"""What ring attention should send and compute, and what it sends: the ring's accounting.

The bytes a rank sends are counted where they leave (`count_sent_bytes`: every tensor handed to
`torch.distributed.batch_isend_irecv` to send) and set beside what the ring should send (`expected_sent_bytes`,
from the shapes alone). `ring_work` counts the score entries each rank computes at each step, from the same
`chunk_pairs` the ring runs, to show the causal imbalance and the zigzag fix. The benchmark's ring sweep
(`attention.bench.sweeps.ring.measure_ring`) times the ring with these.
"""

import contextlib

import torch
import torch.distributed as dist

from attention.distributed.ring import chunk_pairs, padded_length


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
