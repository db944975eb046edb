"""Attention masks, each written once as a FlexAttention predicate `mask_mod(b, h, q_idx, kv_idx)`, True = attend.

`dense_mask` turns a predicate into a boolean tensor for the educational and SDPA paths,
`block_mask` into a FlexAttention `BlockMask`; `and_masks` and `or_masks` combine predicates on both.

Example:
    >>> from attention.masks import and_masks, causal, dense_mask, document
    >>> import torch
    >>> mask_mod = and_masks(causal, document(torch.tensor([0, 0, 1, 1])))
    >>> mask_mod.__name__
    'causal_and_document'
    >>> dense_mask(mask_mod, 4, 4).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
"""

from attention.masks.core import and_masks, block_mask, dense_mask, density, or_masks
from attention.masks.patterns import (
    attention_sinks,
    bigbird,
    causal,
    document,
    key_padding,
    local_window,
    prefix_lm,
    sliding_window,
    sparse_transformer_fixed,
    sparse_transformer_strided,
    strided,
)

__all__ = [
    "and_masks",
    "attention_sinks",
    "bigbird",
    "block_mask",
    "causal",
    "dense_mask",
    "density",
    "document",
    "key_padding",
    "local_window",
    "or_masks",
    "prefix_lm",
    "sliding_window",
    "sparse_transformer_fixed",
    "sparse_transformer_strided",
    "strided",
]
