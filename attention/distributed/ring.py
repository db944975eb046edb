"""Context-parallel (ring) attention on `torch.distributed`, in plain PyTorch.

When one sequence no longer fits one device, it is split along its length: each of the P processes of a
group holds a shard of the queries, keys and values, `(B, H, T_local, D)`. Ring attention (Liu et al., 2023,
https://arxiv.org/abs/2310.01889) passes the key/value blocks around the ring of processes: at step `s`
rank `r` holds the block of rank `(r - s) mod P`, scores its own queries against it, and folds the result
into its running softmax statistics with the online softmax (the update of `attention/causal/tiled.py`,
FlashAttention's), while the next block is already on its way from rank `r - 1`. After P steps every query
has seen every key, and no process ever held more than two K/V blocks: memory per process falls like
`1 / P` (the inputs) and `1 / P²` (the score tiles).

Causal attention needs balancing. Cut into P consecutive shards, the first rank's queries see only its own
keys and the last rank's see all of them: the last rank has about `2P - 1` times the first's unmasked
scores, and the ring waits for it at every step. The zig-zag layout cuts the sequence into 2P chunks and gives rank `r` chunk `r`
and its mirror `2P - 1 - r` (the split of Llama 3's context parallelism, https://arxiv.org/abs/2407.21783,
section 3.3.2; PyTorch's `_HeadTailLoadBalancer`): each rank then holds one early and one late chunk, and
every step past the first costs each rank the same half block. Sequences whose length does not split evenly
are padded at the end (`shard_sequence`); padded keys are never attended to.

The backward pass runs the ring again (as in FlashAttention-2's backward, one K/V block at a time): each
block travels with the gradient of its keys and values, every rank adds its queries' share, and after a
last hop the block's gradient is back on the rank that owns it. Only `H_kv` key/value heads travel
(grouped-query attention): query head `h` reads K/V head `h // (H / H_kv)`.

Blocks move with point-to-point operations (`torch.distributed.batch_isend_irecv`) on any backend that has
them: gloo on CPU, NCCL on GPUs. Before the first one, the ranks compare their calls (an `all_gather` of ten
ints: the shapes, dtype, `causal`, `layout`, `seq_len`, and whether the rank accepted its arguments): ranks
that disagree would exchange blocks of other sizes (gloo aborts the process) or silently compute something
else, so every rank raises a `ValueError` naming the ranks and what differs. If another process fails or
stops answering, sending to it or waiting for its block raises a `RuntimeError` naming the step and the
neighbours, after the process group's timeout at the latest (`init_process_group(timeout=...)`; a group
from `new_group` takes its own `timeout`).
"""

import math

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")
# Every floating dtype of torch, in a fixed order: the ranks compare a dtype by its place here.
_FLOATING_DTYPES = tuple(sorted({value for value in vars(torch).values()
                                 if isinstance(value, torch.dtype) and value.is_floating_point}, key=str))


def padded_length(seq_len, world_size, layout="zigzag"):
    """The length `seq_len` is padded to so it splits evenly over `world_size` processes: the next multiple of
    `world_size` (`"contiguous"`) or of `2 * world_size` (`"zigzag"`, two chunks per process)."""
    _check_layout(layout)
    for name, value in (("seq_len", seq_len), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    parts = world_size * (2 if layout == "zigzag" else 1)
    return -(-seq_len // parts) * parts


def chunk_ranges(rank, world_size, local_len, layout="zigzag"):
    """The global positions held by `rank` when each of `world_size` processes holds `local_len` of them:
    a list of `(start, end)` ranges, in the order they sit in the rank's shard.

    `"contiguous"`: `[(rank * L, (rank + 1) * L)]`. `"zigzag"`: chunk `rank` and chunk `2P - 1 - rank` of the
    `2P` chunks of `L / 2` positions, e.g. P = 2, L = 4: rank 0 holds `[(0, 2), (6, 8)]`, rank 1 `[(2, 4), (4, 6)]`.
    """
    _check_layout(layout)
    if layout == "contiguous":
        return [(rank * local_len, (rank + 1) * local_len)]
    if local_len % 2:
        raise ValueError(f"the zigzag layout holds two chunks per process: local_len must be even, got {local_len}")
    chunk = local_len // 2
    mirror = 2 * world_size - 1 - rank
    return [(rank * chunk, (rank + 1) * chunk), (mirror * chunk, (mirror + 1) * chunk)]


def shard_sequence(x, rank, world_size, layout="zigzag", seq_dim=2):
    """The shard of `x` that `rank` holds: `x` padded with zeros at the end of dimension `seq_dim` to
    `padded_length(T, world_size, layout)`, then the rank's chunks (`chunk_ranges`) joined in order.

    Differentiable (padding and slicing), so a gradient flows back to the full `x`.

    Args:
        x: a tensor whose dimension `seq_dim` is the sequence, e.g. `(B, H, T, D)` (`seq_dim=2`) or `(B, T, C)` (1).
        rank, world_size: this process's rank in the group, and the group's size.

    Returns:
        `x` with `padded_length(T, world_size, layout) // world_size` positions along `seq_dim`.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got rank={rank}")
    seq_len = x.shape[seq_dim]
    padded = padded_length(seq_len, world_size, layout)
    if padded > seq_len:
        pad_shape = list(x.shape)
        pad_shape[seq_dim] = padded - seq_len
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=seq_dim)  # padded along seq_dim
    local_len = padded // world_size
    return torch.cat([x.narrow(seq_dim, start, end - start)
                      for start, end in chunk_ranges(rank, world_size, local_len, layout)], dim=seq_dim)


def unshard_sequence(shards, seq_len, layout="zigzag", seq_dim=2):
    """The whole sequence from the shards of every rank (in rank order), padding dropped: the inverse of
    `shard_sequence`. Differentiable.

    Args:
        shards: one tensor per rank, as `shard_sequence` (or `ring_attention`) returned them.
        seq_len: the length before padding.
    """
    world_size, local_len = len(shards), shards[0].shape[seq_dim]
    if padded_length(seq_len, world_size, layout) != world_size * local_len:
        raise ValueError(f"{world_size} shards of {local_len} positions ({layout}) cannot hold seq_len={seq_len}: "
                         f"it pads to {padded_length(seq_len, world_size, layout)}")
    pieces = {}  # global start -> the positions there
    for rank, shard in enumerate(shards):
        offset = 0
        for start, end in chunk_ranges(rank, world_size, local_len, layout):
            pieces[start] = shard.narrow(seq_dim, offset, end - start)
            offset += end - start
    whole = torch.cat([pieces[start] for start in sorted(pieces)], dim=seq_dim)  # padded length along seq_dim
    return whole.narrow(seq_dim, 0, seq_len)


def gather_sequence(local, seq_len, layout="zigzag", seq_dim=2, group=None):
    """Every rank's shard gathered (`all_gather`) and joined into the whole sequence, on every rank.

    Not differentiable: for reading results (or checking them), not for training through.
    """
    world_size = dist.get_world_size(group)
    shards = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(shards, local.contiguous(), group=group)
    return unshard_sequence(shards, seq_len, layout, seq_dim)


def chunk_pairs(rank, source, world_size, local_len, layout="zigzag", causal=True, seq_len=None):
    """The (query chunk, key chunk) pairs rank `rank` scores when it holds the K/V block of rank `source`.

    Yields `((q_start, q_offset, q_len), (k_start, k_offset, k_len))`: the chunk's first global position, its
    offset inside the shard, its length. A pair is left out where no query may attend to any of its keys:
    under the causal mask when every key comes after every query, and where the keys (or the queries) are
    all padding (positions `>= seq_len`). The forward and backward passes score exactly these pairs.
    """
    seq_len = world_size * local_len if seq_len is None else seq_len
    q_chunks = _with_offsets(chunk_ranges(rank, world_size, local_len, layout))
    k_chunks = _with_offsets(chunk_ranges(source, world_size, local_len, layout))
    for q_start, q_offset, q_len in q_chunks:
        for k_start, k_offset, k_len in k_chunks:
            if k_start >= seq_len or q_start >= seq_len:
                continue  # all padding
            if causal and k_start > q_start + q_len - 1:
                continue  # every key after every query
            yield (q_start, q_offset, q_len), (k_start, k_offset, k_len)


def ring_attention(q, k, v, causal=True, *, layout="zigzag", seq_len=None, group=None):
    """Softmax attention of this rank's queries over the whole sequence's keys and values, which travel
    around the ring of the process group: `(B, H, L, D)`, this rank's shard of the output.

    Call it on every rank of `group` at once, each with its shard (`shard_sequence`). Differentiable: the
    backward pass runs the ring too and returns this rank's shard of each gradient.

    Args:
        q: `(B, H, L, D)` this rank's queries, `L` positions of the sharded (and padded) sequence.
        k, v: `(B, H_kv, L, D)` this rank's keys and values; `H_kv` divides `H` (grouped-query attention:
            only `H_kv` heads travel).
        causal: position `i` attends to positions `<= i` of the whole sequence.
        layout: how the sequence was sharded, `"zigzag"` (balanced causal work) or `"contiguous"`.
        seq_len: the sequence's length before padding (default `P * L`, no padding). Positions `>= seq_len`
            are padding: no query attends to them, their output is zero and no gradient flows from it, so a
            loss over the whole shard needs no mask for them.
        group: the process group (default: every process). Without an initialized process group, one
            process holds the whole sequence.

    Raises:
        TypeError: q, k, v are not floating-point tensors of one dtype.
        ValueError: bad shapes, `layout` or `seq_len` on this rank; or the ranks of the group were not called
            alike (shapes, dtype, `causal`, `layout`, `seq_len`), or another rank refused its arguments: raised
            on every rank, naming the ranks and what differs, before any block travels.
        RuntimeError: another rank failed, or did not send its block within the process group's timeout.
    """
    rank, world_size = _rank_and_size(group)
    try:
        seq_len = _check_arguments(q, k, v, layout, seq_len, world_size)
        refused = None
    except (TypeError, ValueError) as error:
        refused = error  # said to the other ranks first, so that they stop too instead of waiting for this one
    if world_size > 1:
        call = None if refused is not None else [*q.shape, k.shape[1], _FLOATING_DTYPES.index(q.dtype), int(bool(causal)),
                                     LAYOUTS.index(layout), seq_len]
        _check_ranks_agree(call, q.device if isinstance(q, torch.Tensor) else torch.device("cpu"), rank, world_size,
                           group)
    if refused is not None:
        raise refused
    return _RingAttention.apply(q, k, v, causal, layout, seq_len, group)


def _check_arguments(q, k, v, layout, seq_len, world_size):
    """Check this rank's arguments (`TypeError`, `ValueError`); return `seq_len`, `P * L` where it is None."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError(f"q, k, v must be tensors, got {type(q).__name__}, {type(k).__name__}, {type(v).__name__}")
    if not q.is_floating_point() or not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must be floating-point tensors of one dtype, got q.dtype={q.dtype}, "
                        f"k.dtype={k.dtype}, v.dtype={v.dtype}")
    if (q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]
            or 0 in q.shape or 0 in k.shape or q.shape[1] % k.shape[1] != 0):
        raise ValueError(f"q must be (B, H, L, D) and k, v (B, H_kv, L, D) with H_kv dividing H and no size 0, got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    _check_layout(layout)
    local_len = q.shape[2]
    seq_len = world_size * local_len if seq_len is None else seq_len
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not 0 < seq_len <= world_size * local_len:
        raise ValueError(f"seq_len must be an int in [1, {world_size} processes x {local_len} = {world_size * local_len}], "
                         f"got seq_len={seq_len!r}")
    if padded_length(seq_len, world_size, layout) != world_size * local_len:
        raise ValueError(f"shards of {local_len} positions on {world_size} processes do not hold seq_len={seq_len} "
                         f"in the {layout} layout: shard_sequence pads it to "
                         f"{padded_length(seq_len, world_size, layout)}, {world_size} shards of "
                         f"{padded_length(seq_len, world_size, layout) // world_size}")
    return seq_len


# What the ranks compare (q's shape, then H_kv, dtype, causal, layout, seq_len), and how each value reads.
_CALL_FIELDS = {"B": str, "H": str, "L (positions per shard)": str, "D": str, "H_kv": str,
                "dtype": lambda index: str(_FLOATING_DTYPES[index]), "causal": lambda value: str(bool(value)),
                "layout": lambda index: LAYOUTS[index], "seq_len": str}


def _check_ranks_agree(call, device, rank, world_size, group):
    """All-gather every rank's call (`_CALL_FIELDS`, or None where the rank refused its own arguments) and raise
    the same `ValueError` on every rank if they differ: blocks of other sizes or dtypes would abort gloo's
    receiving thread, and another `causal`, `layout` or `seq_len` would compute something else without a word."""
    mine = torch.tensor([call is not None, *(call or [0] * len(_CALL_FIELDS))], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world_size)]  # (1 + fields,) per rank
    try:
        dist.all_gather(gathered, mine, group=group)
    except RuntimeError as error:
        if call is None:
            return  # this rank raises its own error, which says more
        raise RuntimeError(f"ring attention stopped before step 0 of {world_size} on rank {rank}: comparing the "
                           f"ranks' arguments failed. Another process of the group failed, or did not answer within "
                           f"the process group's timeout: {error}") from error
    if call is None:
        return  # this rank raises its own error; the others have learnt that it refused
    calls = [row.tolist() for row in gathered]
    refusing = [other for other, row in enumerate(calls) if not row[0]]
    if refusing:
        several = len(refusing) > 1
        raise ValueError(f"ring_attention: rank{'s' if several else ''} {_listed(refusing)} of the group refused "
                         f"{'their' if several else 'its'} arguments (see {'their' if several else 'its'} own "
                         f"error{'s' if several else ''}); every rank stops before the ring starts")
    differences = []
    for index, (name, show) in enumerate(_CALL_FIELDS.items(), start=1):
        ranks_by_value = {}
        for other, row in enumerate(calls):
            ranks_by_value.setdefault(row[index], []).append(other)
        if len(ranks_by_value) > 1:
            differences.append(f"{name} is " + ", ".join(
                f"{show(value)} on rank{'s' if len(ranks) > 1 else ''} {_listed(ranks)}"
                for value, ranks in ranks_by_value.items()))
    if differences:
        raise ValueError(f"ring_attention needs the same call on every rank of the group (shards of one shape and "
                         f"dtype, the same causal, layout and seq_len), and the {world_size} ranks differ: "
                         + "; ".join(differences))


def _listed(ranks):
    return ", ".join(str(rank) for rank in ranks)


class _RingAttention(torch.autograd.Function):
    """Forward: the K/V blocks go once around the ring, each scored against the local queries and folded in
    with the online softmax. Backward: they go around again, now with their gradients, and the gradients
    take one more hop home."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, seq_len, group):
        rank, world_size = _rank_and_size(group)
        B, H, L, D = q.shape
        H_kv = k.shape[1]
        scale, acc_dtype = 1.0 / math.sqrt(D), torch.promote_types(q.dtype, torch.float32)
        q_groups = q.reshape(B, H_kv, H // H_kv, L, D).to(acc_dtype)  # (B, H_kv, G, L, D): head h reads K/V head h // G
        row_max = torch.full((B, H_kv, H // H_kv, L), float("-inf"), dtype=acc_dtype, device=q.device)  # m
        row_sum = torch.zeros_like(row_max)  # l
        acc = torch.zeros_like(q_groups)  # (B, H_kv, G, L, D): unnormalised output
        k_block, v_block = k.contiguous(), v.contiguous()  # (B, H_kv, L, D): the block held now, first our own
        for step in range(world_size):
            source = (rank - step) % world_size  # whose block we hold
            if step < world_size - 1:  # posted before the compute, so the next block travels while we work
                incoming, works = _exchange([k_block, v_block], "keys and values", step, rank, world_size, group,
                                            first_tag=0)
            for (q_start, q_offset, q_len), (k_start, k_offset, k_len) in chunk_pairs(
                    rank, source, world_size, L, layout, causal, seq_len):
                rows, cols = slice(q_offset, q_offset + q_len), slice(k_offset, k_offset + k_len)
                k_tile = k_block[:, :, None, cols].to(acc_dtype)  # (B, H_kv, 1, bk, D): shared by the G query heads
                v_tile = v_block[:, :, None, cols].to(acc_dtype)  # (B, H_kv, 1, bk, D)
                scores = _tile_scores(q_groups[..., rows, :], k_tile, scale, q_start, k_start, 0, causal,
                                      _padding_mask(k_start, k_len, seq_len, q.device))  # (B, H_kv, G, bq, bk)
                row_max[..., rows], row_sum[..., rows], acc[..., rows, :] = _online_softmax_update(
                    row_max[..., rows], row_sum[..., rows], acc[..., rows, :], scores, v_tile)
            if step < world_size - 1:
                k_block, v_block = _wait(incoming, works, "keys and values", step, rank, world_size)
        out, lse = _finish_rows(row_max, row_sum, acc)  # (B, H_kv, G, L, D), (B, H_kv, G, L)
        padding = _local_positions(rank, world_size, L, layout, q.device) >= seq_len  # (L,)
        out[..., padding, :] = 0  # padded queries: a zero output, and with lse = -inf no gradient either
        lse[..., padding] = float("-inf")
        out = out.reshape(B, H, L, D).to(q.dtype)  # (B, H, L, D)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.layout, ctx.seq_len, ctx.group = causal, layout, seq_len, group
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, layout, seq_len, group = ctx.causal, ctx.layout, ctx.seq_len, ctx.group
        rank, world_size = _rank_and_size(group)
        B, H, L, D = q.shape
        H_kv = k.shape[1]
        scale, acc_dtype = 1.0 / math.sqrt(D), lse.dtype
        q_groups = q.reshape(B, H_kv, H // H_kv, L, D).to(acc_dtype)  # (B, H_kv, G, L, D)
        grad_out_groups = grad_out.reshape(B, H_kv, H // H_kv, L, D).to(acc_dtype)  # (B, H_kv, G, L, D)
        # delta_i = dO_i . O_i: the softmax backward's row term, from the saved output (as in tiled.py).
        delta = (grad_out_groups * out.reshape(B, H_kv, H // H_kv, L, D).to(acc_dtype)).sum(dim=-1)  # (B, H_kv, G, L)
        grad_q = torch.zeros_like(q_groups)  # (B, H_kv, G, L, D)
        k_block, v_block = k.contiguous(), v.contiguous()  # (B, H_kv, L, D)
        grad_k_block = torch.zeros(k.shape, dtype=acc_dtype, device=k.device)  # (B, H_kv, L, D): travels with its block
        grad_v_block = torch.zeros(v.shape, dtype=acc_dtype, device=v.device)  # (B, H_kv, L, D)
        for step in range(world_size):
            source = (rank - step) % world_size
            if step < world_size - 1:
                incoming, works = _exchange([k_block, v_block], "keys and values", step, rank, world_size, group,
                                            first_tag=0)
            for (q_start, q_offset, q_len), (k_start, k_offset, k_len) in chunk_pairs(
                    rank, source, world_size, L, layout, causal, seq_len):
                rows, cols = slice(q_offset, q_offset + q_len), slice(k_offset, k_offset + k_len)
                k_tile = k_block[:, :, None, cols].to(acc_dtype)  # (B, H_kv, 1, bk, D)
                v_tile = v_block[:, :, None, cols].to(acc_dtype)  # (B, H_kv, 1, bk, D)
                q_tile = q_groups[..., rows, :]  # (B, H_kv, G, bq, D)
                scores = _tile_scores(q_tile, k_tile, scale, q_start, k_start, 0, causal,
                                      _padding_mask(k_start, k_len, seq_len, q.device))  # (B, H_kv, G, bq, bk)
                grad_q_tile, grad_k_tile, grad_v_tile = _tile_gradients(
                    q_tile, k_tile, v_tile, grad_out_groups[..., rows, :], scores, lse[..., rows], delta[..., rows], scale)
                grad_q[..., rows, :] += grad_q_tile  # (B, H_kv, G, bq, D)
                grad_k_block[:, :, cols] += grad_k_tile.sum(dim=2)  # (B, H_kv, bk, D): summed over the G query heads
                grad_v_block[:, :, cols] += grad_v_tile.sum(dim=2)  # (B, H_kv, bk, D)
            if world_size > 1:  # the block's gradient follows it; after the last step it reaches its owner
                incoming_grads, grad_works = _exchange([grad_k_block, grad_v_block], "key and value gradients", step,
                                                       rank, world_size, group, first_tag=2)
            if step < world_size - 1:
                k_block, v_block = _wait(incoming, works, "keys and values", step, rank, world_size)
            if world_size > 1:
                grad_k_block, grad_v_block = _wait(incoming_grads, grad_works, "key and value gradients", step, rank,
                                                   world_size)
        grad_q = grad_q.reshape(B, H, L, D)  # (B, H, L, D)
        return grad_q.to(q.dtype), grad_k_block.to(k.dtype), grad_v_block.to(v.dtype), None, None, None, None


def _exchange(tensors, what, step, rank, world_size, group, first_tag):
    """Post sends of `tensors` (`what` they are) to the next rank of the ring and receives of as many from the
    previous one: `(received, works)`; the received tensors hold data once every work is waited for. Posting
    can fail already (a peer that is gone): that error says where the ring stopped too, as `_wait`'s does."""
    received = [torch.empty_like(tensor) for tensor in tensors]
    next_peer = _global_rank(group, (rank + 1) % world_size)
    previous_peer = _global_rank(group, (rank - 1) % world_size)
    operations = [dist.P2POp(dist.isend, tensor, next_peer, group, first_tag + i) for i, tensor in enumerate(tensors)]
    operations += [dist.P2POp(dist.irecv, buffer, previous_peer, group, first_tag + i) for i, buffer in enumerate(received)]
    try:
        return received, dist.batch_isend_irecv(operations)
    except RuntimeError as error:  # gloo and NCCL raise DistBackendError, a RuntimeError
        raise _ring_stopped(what, step, rank, world_size, error) from error


def _wait(received, works, what, step, rank, world_size):
    """Wait for one exchange; a failed or timed-out peer becomes an error that says where the ring stopped."""
    try:
        for work in works:
            work.wait()
    except RuntimeError as error:  # gloo and NCCL raise DistBackendError, a RuntimeError
        raise _ring_stopped(what, step, rank, world_size, error) from error
    return received


def _ring_stopped(what, step, rank, world_size, error):
    """The `RuntimeError` of an exchange of `what` that failed at `step`: where the ring stopped, and why."""
    return RuntimeError(
        f"ring attention stopped at step {step} of {world_size} on rank {rank}: exchanging {what} with rank "
        f"{(rank - 1) % world_size} (receiving) and rank {(rank + 1) % world_size} (sending) failed. Another "
        f"process of the group failed, or did not answer within the process group's timeout: {error}")


def _rank_and_size(group):
    """This process's rank in `group` and the group's size; `(0, 1)` without an initialized process group."""
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _global_rank(group, group_rank):
    """The rank in the default group of rank `group_rank` of `group` (what `P2POp`'s `peer` takes)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _with_offsets(ranges):
    """`[(start, offset in the shard, length)]` for the `(start, end)` ranges a shard holds, in order."""
    chunks, offset = [], 0
    for start, end in ranges:
        chunks.append((start, offset, end - start))
        offset += end - start
    return chunks


def _local_positions(rank, world_size, local_len, layout, device):
    """`(L,)` the global position of each place in the rank's shard."""
    return torch.cat([torch.arange(start, end, device=device)
                      for start, end in chunk_ranges(rank, world_size, local_len, layout)])


def _padding_mask(k_start, k_len, seq_len, device):
    """`(bk,)` True for the keys of a chunk that are in the sequence, or None when none of them is padding."""
    if k_start + k_len <= seq_len:
        return None
    return torch.arange(k_start, k_start + k_len, device=device) < seq_len


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got layout={layout!r}")


# Same as attention/causal/tiled.py::_tile_scores
def _tile_scores(q_tile, k_tile, scale, q_start, k_start, offset, causal, mask_tile):
    """Scaled scores of one tile `(B, H, bq, bk)`, -inf where the query may not attend."""
    scores = (q_tile @ k_tile.transpose(-2, -1)) * scale  # (B, H, bq, bk)
    allowed = None
    if causal and k_start + k_tile.shape[-2] - 1 > q_start + offset:  # the tile crosses the diagonal
        q_pos = torch.arange(q_start, q_start + q_tile.shape[-2], device=q_tile.device) + offset
        k_pos = torch.arange(k_start, k_start + k_tile.shape[-2], device=q_tile.device)
        allowed = q_pos[:, None] >= k_pos[None, :]  # (bq, bk)
    if mask_tile is not None:
        allowed = mask_tile if allowed is None else allowed & mask_tile
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))


# Same as attention/causal/tiled.py::_online_softmax_update
def _online_softmax_update(row_max, row_sum, acc, scores, v_tile):
    """Fold one tile of scores `(B, H, bq, bk)` (-inf where masked) and its values `(B, H, bk, D)` into the
    running maximum `m` and sum `l` `(B, H, bq)` and unnormalised output `acc` `(B, H, bq, D)` of its
    queries; return the three updated. Where the tile raises the maximum, what was summed so far is
    rescaled by `exp(m_old - m_new)` (the online softmax)."""
    new_max = torch.maximum(row_max, scores.amax(dim=-1))  # (B, H, bq)
    safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)  # no -inf - -inf
    weights = torch.exp(scores - safe_max[..., None])  # (B, H, bq, bk): 0 where masked
    rescale = torch.exp(row_max - safe_max)  # (B, H, bq): 0 while nothing was seen yet
    row_sum = rescale * row_sum + weights.sum(dim=-1)
    acc = rescale[..., None] * acc + weights @ v_tile  # (B, H, bq, D)
    return new_max, row_sum, acc


# Same as attention/causal/tiled.py::_finish_rows
def _finish_rows(row_max, row_sum, acc):
    """The output `acc / l` `(B, H, bq, D)` and log-sum-exp `m + log l` `(B, H, bq)` of rows whose keys are all
    folded in; a row that could attend to no key gets a zero output and a log-sum-exp of -inf."""
    seen = row_sum > 0  # False for a query that may attend to no key
    out = torch.where(seen[..., None], acc / row_sum.clamp_min(1e-30)[..., None], torch.zeros_like(acc))
    lse = torch.where(seen, row_max + torch.log(row_sum.clamp_min(1e-30)), torch.full_like(row_max, float("-inf")))
    return out, lse  # (B, H, bq, D), (B, H, bq)


# Same as attention/causal/tiled.py::_tile_gradients
def _tile_gradients(q_tile, k_tile, v_tile, grad_out_tile, scores, lse_tile, delta_tile, scale):
    """One tile's share of the gradients, from its recomputed scores `(B, H, bq, bk)`, the saved log-sum-exp
    `(B, H, bq)` of its queries and their row term `delta = dO . O` `(B, H, bq)`: `(grad_q, grad_k, grad_v)`,
    `(B, H, bq, D)`, `(B, H, bk, D)`, `(B, H, bk, D)` (FlashAttention's Algorithm 2, one tile)."""
    safe_lse = torch.where(torch.isinf(lse_tile), torch.zeros_like(lse_tile), lse_tile)  # rows that saw no key
    weights = torch.exp(scores - safe_lse[..., None])  # (B, H, bq, bk): P, recomputed
    weights = torch.where(torch.isinf(lse_tile[..., None]), torch.zeros_like(weights), weights)  # P = 0 there
    grad_v = weights.transpose(-2, -1) @ grad_out_tile  # (B, H, bk, D)
    grad_weights = grad_out_tile @ v_tile.transpose(-2, -1)  # (B, H, bq, bk): dP
    grad_scores = weights * (grad_weights - delta_tile[..., None])  # (B, H, bq, bk): dS
    grad_q = (grad_scores @ k_tile) * scale  # (B, H, bq, D)
    grad_k = (grad_scores.transpose(-2, -1) @ q_tile) * scale  # (B, H, bk, D)
    return grad_q, grad_k, grad_v
