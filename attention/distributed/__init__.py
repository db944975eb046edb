"""Attention across processes: one sequence split along its length over the P processes of a group.

`ContextParallelAttention` below is the family's contract, written once; `attention/distributed/ring.py`
(`ring_attention`, torch-only, copy it alone) keeps it, and the tests (tests/test_ring.py) check it on
1, 2 and 4 processes against the float64 reference on the whole sequence.

Beside it: `launch.py` runs a function on P local processes joined by a gloo process group listening on
127.0.0.1 only (the tests and the page use it; under `torchrun` a script needs none of it), `check.py`
the distributed equality check (also `torchrun --nproc-per-node P -m attention.distributed`), `accounting.py`
the bytes the ring should send and sends, and the work each rank does (the benchmark's ring sweep,
`attention/bench/sweeps/ring.py`, times it per process with them).
"""

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ContextParallelAttention(Protocol):
    """What a context-parallel attention function provides.

    * **Called on every rank of a process group at once**, each with its shard of the sequence:
      `q` `(B, H, L, D)`, `k` and `v` `(B, H_kv, L, D)` with `H_kv` dividing `H` (grouped-query heads);
      `L` is the padded length over the group's size (`ring.padded_length`).
    * **Returns this rank's shard of the output** `(B, H, L, D)`; `ring.unshard_sequence` (or
      `ring.gather_sequence`) joins the shards into the whole sequence, which equals one device's
      attention over the whole sequence (checked element by element against `attention.reference`).
    * **`causal`**: position `i` attends to positions `<= i` of the whole sequence, wherever they are held.
    * **`layout`**: how the sequence was sharded (`ring.shard_sequence`): `"contiguous"` (rank `r` holds
      the `r`-th of P consecutive pieces) or `"zigzag"` (chunks `r` and `2P - 1 - r` of 2P, which balances
      causal work); **`seq_len`**: the length before padding, keys past it are never attended to.
    * **Differentiable**: the gradients of each rank's shard come from the distributed backward pass,
      never from gathering the sequence on one process.
    * **Ranks called alike**: shards of one shape and floating dtype, the same `causal`, `layout` and
      `seq_len` on every rank; where they differ (or a rank refuses its own arguments), every rank raises
      `ValueError` naming the ranks and what differs, before any block travels.
    * **Fails, never hangs**: if another rank fails or stops answering, the call raises `RuntimeError`
      within the process group's timeout.
    """

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, *,
                 layout: str = "zigzag", seq_len: int | None = None, group=None) -> torch.Tensor: ...
