"""Attention patterns, each written once as a predicate `mask_mod(b, h, q_idx, kv_idx)`, True = attend.

Every predicate uses only elementwise tensor operations and indexing of captured tensors, so it runs
unchanged inside FlexAttention (scalar index tensors) and in `dense_mask` (broadcast index tensors).
Factories validate their arguments and name the predicate they return (`sliding_window_4`), so a
plot or an error message says which pattern it shows. Query i and key j are both counted from 0 at
the start of the sequence (top-left alignment, as in `F.scaled_dot_product_attention(is_causal=True)`).
"""

import torch

from attention.checks import check_index_tensor, check_int


def causal(b, h, q_idx, kv_idx):
    """Query i attends to keys j <= i (decoder self-attention)."""
    return q_idx >= kv_idx


def sliding_window(window_size):
    """Causal sliding window: query i attends to the `window_size` most recent keys, itself included.

    Keys `i - window_size < j <= i` (Longformer's and Mistral's causal local attention,
    https://arxiv.org/abs/2004.05150). `window_size=1` attends to itself only.
    """
    check_int("window_size", window_size)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window_size)

    mask_mod.__name__ = f"sliding_window_{window_size}"
    return mask_mod


def attention_sinks(num_sinks):
    """Attention sinks: every query attends to the first `num_sinks` keys, `j < num_sinks`.

    Not causal by itself: `or_masks(sliding_window(w), and_masks(causal, attention_sinks(s)))` is
    StreamingLLM's pattern (Xiao et al., 2023, https://arxiv.org/abs/2309.17453), a sliding window
    plus the first tokens, which keeps generation stable once the window has moved past them.
    """
    check_int("num_sinks", num_sinks, minimum=0)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < num_sinks

    mask_mod.__name__ = f"attention_sinks_{num_sinks}"
    return mask_mod


def local_window(radius):
    """Bidirectional local window: query i attends to keys j with `|i - j| <= radius` (encoders).

    `2 * radius + 1` keys away from the edges; `radius=0` attends to itself only.
    """
    check_int("radius", radius, minimum=0)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= radius

    mask_mod.__name__ = f"local_window_{radius}"
    return mask_mod


def strided(stride):
    """Causal strided pattern: query i attends to keys j <= i with `(i - j) % stride == 0`.

    Every `stride`-th key counting back from the query, itself included: the "strided" head of the
    Sparse Transformer (Child et al., 2019, https://arxiv.org/abs/1904.10509, section 4.2).
    """
    check_int("stride", stride)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((q_idx - kv_idx) % stride == 0)

    mask_mod.__name__ = f"strided_{stride}"
    return mask_mod


def sparse_transformer_strided(stride):
    """Sparse Transformer strided attention in one head: the union of its two heads.

    The `stride` most recent keys (`sliding_window(stride)`) or any earlier key a multiple of
    `stride` back (`strided(stride)`). With `stride ~ sqrt(T)` every query reaches every earlier key
    in two steps (Child et al., 2019, https://arxiv.org/abs/1904.10509, figure 3b).
    """
    check_int("stride", stride)

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        return (distance >= 0) & ((distance < stride) | (distance % stride == 0))

    mask_mod.__name__ = f"sparse_transformer_strided_{stride}"
    return mask_mod


def sparse_transformer_fixed(block_size, num_summary=1):
    """Sparse Transformer fixed attention in one head: own block plus each block's summary keys.

    Causal; query i attends to keys j <= i in its own block of `block_size` positions, and to the
    last `num_summary` keys of every block (`j % block_size >= block_size - num_summary`), which carry
    information between blocks (Child et al., 2019, https://arxiv.org/abs/1904.10509, figure 3c).
    """
    check_int("block_size", block_size)
    check_int("num_summary", num_summary)
    if num_summary > block_size:
        raise ValueError(f"num_summary must be at most block_size={block_size}, got num_summary={num_summary}")

    def mask_mod(b, h, q_idx, kv_idx):
        same_block = q_idx // block_size == kv_idx // block_size
        summary = kv_idx % block_size >= block_size - num_summary
        return (q_idx >= kv_idx) & (same_block | summary)

    mask_mod.__name__ = f"sparse_transformer_fixed_{block_size}_{num_summary}"
    return mask_mod


def bigbird(radius, num_global, num_random, max_len, seed=0, device=None, block_size=1):
    """BigBird's pattern: local window + global tokens + random keys (bidirectional).

    Query i attends to key j when `|i - j| <= radius` (window), when i or j is one of the first
    `num_global` positions (global tokens see and are seen by every position), or when j lies in one
    of the `num_random` random key blocks drawn for i's query block (Zaheer et al., 2020,
    https://arxiv.org/abs/2007.14062). With `block_size=1` (the default) blocks are single tokens:
    `num_random` random keys per query. The paper draws blocks (of 64 tokens), and so must a
    block-sparse kernel: single random keys scatter over nearly every `(128 x 128)` tile of a long
    sequence, leaving no tile to skip. The random blocks come from `torch.Generator` seeded with
    `seed`, drawn without replacement for each query block of `range(max_len)` and stored as a lookup
    table (`random_keys`, one row and column per block), so the pattern is the same on every call and
    device. Sequences must be at most `max_len` long; a random key drawn at or past a shorter `kv_len`
    is simply absent. Combine with `causal` through `and_masks` for a decoder.
    """
    check_int("radius", radius, minimum=0)
    check_int("num_global", num_global, minimum=0)
    check_int("num_random", num_random, minimum=0)
    check_int("max_len", max_len)
    check_int("block_size", block_size)
    num_blocks = -(-max_len // block_size)  # ceil: the last block may be short
    if num_random > num_blocks:
        limit = f"max_len={max_len}" if block_size == 1 else f"the {num_blocks} blocks of max_len={max_len}"
        raise ValueError(f"num_random must be at most {limit}, got num_random={num_random}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.rand(num_blocks, num_blocks, generator=generator).argsort(dim=-1)  # (blocks, blocks): a random permutation per query block
    random_keys = torch.zeros(num_blocks, num_blocks, dtype=torch.bool)
    random_keys.scatter_(1, order[:, :num_random], True)  # (blocks, blocks): num_random True per row
    random_keys = random_keys.to(device)

    def mask_mod(b, h, q_idx, kv_idx):
        window = (q_idx - kv_idx).abs() <= radius
        global_tokens = (q_idx < num_global) | (kv_idx < num_global)
        if block_size == 1:
            return window | global_tokens | random_keys[q_idx, kv_idx]
        return window | global_tokens | random_keys[q_idx // block_size, kv_idx // block_size]

    mask_mod.__name__ = f"bigbird_{radius}_{num_global}_{num_random}_seed{seed}" + (
        f"_block{block_size}" if block_size != 1 else "")
    mask_mod.random_keys = random_keys
    return mask_mod


def key_padding(lengths):
    """Key padding: in sequence b, keys j < `lengths[b]` are real, the rest are padding.

    Args:
        lengths: `(B,)` integer tensor of real lengths, on the device the attention runs on.

    Every query, padding queries included, attends to the real keys, so no row is empty when
    every length is positive; padding queries' outputs are meant to be ignored downstream.
    """
    check_index_tensor("lengths", lengths, dims=(1,))
    if (lengths < 0).any():
        raise ValueError(f"lengths must be non-negative, got lengths={lengths.tolist()}")

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    mask_mod.__name__ = "key_padding"
    return mask_mod


def prefix_lm(prefix_length):
    """Prefix LM: bidirectional over the prefix, causal after it (T5 / UniLM prefix language model).

    Query i attends to key j when `j < prefix_length` or `j <= i`
    (Raffel et al., 2020, https://arxiv.org/abs/1910.10683, figure 3).

    Args:
        prefix_length: an int shared by the batch, or a `(B,)` integer tensor, one per sequence.
    """
    if isinstance(prefix_length, torch.Tensor):
        check_index_tensor("prefix_length", prefix_length, dims=(1,))

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx < prefix_length[b]) | (q_idx >= kv_idx)

        mask_mod.__name__ = "prefix_lm"
        return mask_mod
    check_int("prefix_length", prefix_length, minimum=0)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx < prefix_length) | (q_idx >= kv_idx)

    mask_mod.__name__ = f"prefix_lm_{prefix_length}"
    return mask_mod


def document(document_ids):
    """Document mask for packed sequences: query i attends to key j when both lie in one document.

    Args:
        document_ids: `(T,)` integer tensor, one document id per position, or `(B, T)`, one row per
            sequence. Bidirectional within each document; `and_masks(causal, document(ids))` is the
            causal form used to pretrain on packed documents.
    """
    check_index_tensor("document_ids", document_ids, dims=(1, 2))
    if document_ids.dim() == 1:
        def mask_mod(b, h, q_idx, kv_idx):
            return document_ids[q_idx] == document_ids[kv_idx]
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return document_ids[b, q_idx] == document_ids[b, kv_idx]

    mask_mod.__name__ = "document"
    return mask_mod
