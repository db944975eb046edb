"""Decoding with a cache: the caches, and the kernels that attend over them, of every family that decodes.

`DecodingCache` below is the caches' contract, written once; every cache of `caches.py` keeps it (`KVCache`,
`SlidingWindowKVCache`, multi-head latent attention's `LatentCache`; a linear layer's `RecurrentStateCache` is a
state, not a cache of positions), and code that decodes, tests or times a
cache reads nothing else of it. `kernels.py` holds what attends over a cache: `cached_attention` (SDPA, or for a
few new tokens the grouped matmuls of `grouped_decode_attention`, as `decode_kernel` picks: `"auto"` the faster, timed
on this machine by `tuning.py`), and the matmuls the model families' written-out attentions share (`grouped_scores`,
`per_head_matmul`).

The three files import only torch. The causal family's `GroupedQueryAttention` (`attention/causal/gqa.py`) and every
model family (`attention/models/`) import this package and nothing else of the project, so a copy of one of
those files runs with torch and a copy of `attention/decoding/`.
"""

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class DecodingCache(Protocol):
    """What every cache provides (`KVCache`, `SlidingWindowKVCache`, `LatentCache`), so code that decodes, tests or
    times a cache never reads its fields.

    * **`length`**: the positions seen so far; the next chunk's first token sits at position `length`.
    * **`nbytes`**: the bytes the cache holds (its preallocated tensors).
    * **`update(*new)`**: append one chunk (each tensor `(B, heads, T, ...)`: keys and values, or what the
      cache keeps instead) and return what the chunk's queries attend over, ending with a boolean
      `(T, S)` mask (True = attend) or `None` when every query attends to every key.
    * **`rewind(length)`**: forget every position from `length` on, so the next chunk starts there
      (a benchmark times the same step again; a generator backs out of a rejected draft).
      `ValueError` for a length outside `[0, length]`, or where the cache no longer holds a position the
      next query needs (a sliding window that evicted it).
    """

    length: int

    @property
    def nbytes(self) -> int: ...

    def update(self, *new: torch.Tensor) -> tuple: ...

    def rewind(self, length: int) -> None: ...


# The two files import nothing from this one, so importing them here is no cycle.
from attention.decoding.caches import KVCache, LatentCache, RecurrentStateCache, SlidingWindowKVCache  # noqa: E402
from attention.decoding.kernels import (AUTO_MATMUL_MAX_TOKENS, DECODE_KERNELS, cached_attention,  # noqa: E402
                                        check_decode_kernel, decode_linear, decode_path, grouped_decode_attention,
                                        grouped_scores, per_head_matmul, row_split_linear, sdpa_over_cache)
from attention.decoding.tuning import TUNING_ENV, chosen, forget_choices, tuning_mode  # noqa: E402

__all__ = ["AUTO_MATMUL_MAX_TOKENS", "DECODE_KERNELS", "DecodingCache", "KVCache", "LatentCache", "RecurrentStateCache",
           "SlidingWindowKVCache",
           "TUNING_ENV", "cached_attention", "check_decode_kernel", "chosen", "decode_linear", "decode_path",
           "forget_choices", "grouped_decode_attention", "grouped_scores", "per_head_matmul", "row_split_linear",
           "sdpa_over_cache", "tuning_mode"]
