"""Plausible bugs in ring (context-parallel) attention (attention/distributed/ring.py): the zig-zag shard
order, the ring's direction, the merge of each block into the running softmax, padding, the backward ring.

The fastest checks run in this process: the layouts (chunk ranges, PyTorch's head-tail balance, shard and
unshard), and one process holding the whole sequence (a zig-zag shard of two chunks scored tile by tile,
GQA, padding, forward and gradients against the float64 reference). Bugs that need a ring of several
processes select the launched test: one launch of 4 gloo processes runs every case (P = 1, 2, 4), the
slowest selection here (about a minute).
"""

from mutant import Mutant

RING = "attention/distributed/ring.py"
LAYOUT = "tests/test_ring.py -k 'chunk_ranges or head_tail or shard_then_unshard'"
ONE_PROCESS = "tests/test_ring.py -k without_a_process_group"
PROCESSES = "tests/test_ring.py -k distributed_output"

MUTANTS = [
    # The zig-zag layout.
    Mutant("zigzag_mirror_off_by_one", RING,
           "mirror = 2 * world_size - 1 - rank", "mirror = 2 * world_size - 2 - rank",
           "off by one in the mirrored chunk: two ranks hold the same chunk, one chunk is held by none", LAYOUT),
    Mutant("zigzag_second_chunk_striped", RING,
           "mirror = 2 * world_size - 1 - rank", "mirror = world_size + rank",
           "the second chunk taken in rank order (striped), not mirrored: the causal work is unbalanced again", LAYOUT),
    Mutant("zigzag_padded_to_a_multiple_of_p", RING,
           "parts = world_size * (2 if layout == \"zigzag\" else 1)", "parts = world_size",
           "zig-zag padding to a multiple of P instead of 2P: a shard of odd length cannot split into two chunks", LAYOUT),
    Mutant("unshard_in_rank_order", RING,
           "whole = torch.cat([pieces[start] for start in sorted(pieces)], dim=seq_dim)",
           "whole = torch.cat(list(pieces.values()), dim=seq_dim)",
           "the shards' chunks joined in the order the ranks hold them, not by position", LAYOUT),
    # The ring and the merge.
    Mutant("ring_turns_the_wrong_way", RING,
           "source = (rank - step) % world_size  # whose block we hold", "source = (rank + step) % world_size  # whose block we hold",
           "the block held at step s taken to come from rank r + s while it travels from r - 1: wrong keys masked and scored",
           PROCESSES),
    Mutant("backward_ring_turns_the_wrong_way", RING,
           "            source = (rank - step) % world_size\n", "            source = (rank + step) % world_size\n",
           "the backward pass's ring direction reversed: gradients of the wrong keys", PROCESSES),
    Mutant("merge_without_rescale", RING,
           "row_sum = rescale * row_sum + weights.sum(dim=-1)", "row_sum = row_sum + weights.sum(dim=-1)",
           "a block that raises the running maximum merged without rescaling the sum so far", ONE_PROCESS),
    Mutant("causal_skip_drops_the_diagonal_of_one_position_chunks", RING,
           "if causal and k_start > q_start + q_len - 1:", "if causal and k_start >= q_start + q_len - 1:",
           "off by one in the pairs left out: with chunks of one position the diagonal itself is skipped", PROCESSES),
    Mutant("padded_key_attended", RING,
           "return torch.arange(k_start, k_start + k_len, device=device) < seq_len",
           "return torch.arange(k_start, k_start + k_len, device=device) <= seq_len",
           "off by one in the padding mask: the first padded key is attended", ONE_PROCESS),
    Mutant("padded_queries_keep_their_output", RING,
           "        out[..., padding, :] = 0  # padded queries: a zero output, and with lse = -inf no gradient either\n", "",
           "padded queries left with what they attended to: not zero as documented", ONE_PROCESS),
    Mutant("grouped_key_gradient_of_one_head", RING,
           "grad_k_block[:, :, cols] += grad_k_tile.sum(dim=2)", "grad_k_block[:, :, cols] += grad_k_tile[:, :, 0]",
           "a shared K/V head's gradient taken from its first query head only, not summed over its group", ONE_PROCESS),
    Mutant("ring_scale_by_head_dim", RING,
           "scale, acc_dtype = 1.0 / math.sqrt(D), torch.promote_types(q.dtype, torch.float32)",
           "scale, acc_dtype = 1.0 / D, torch.promote_types(q.dtype, torch.float32)",
           "the softmax scale 1/D instead of 1/sqrt(D) in the forward ring", ONE_PROCESS),
]
