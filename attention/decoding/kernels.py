"""What attends over a cache: SDPA, or grouped matmuls that read each cached K/V head once for its query heads.

A decoding step reads the whole cache for very little arithmetic, so its speed is the rate at which it reads the
cached keys and values. `cached_attention` is the one entry the layers on SDPA (`GroupedQueryAttention`, the model
families with `decode_kernel`) attend through; `grouped_scores` and `per_head_matmul` also serve the model families'
written-out attentions (Gemma 2's soft-cap, gpt-oss's sinks). Each performance choice names the measurement
behind it. Imports only torch.
"""

import torch
import torch.nn.functional as F

from attention.decoding.tuning import fastest

DECODE_KERNELS = ("auto", "sdpa", "matmul")
# decode_kernel="auto" weighs the grouped matmuls for calls of at most this many new tokens (decode steps,
# short chunks); a longer chunk is a prefill, whose (S, group * T) scores SDPA never writes out.
AUTO_MATMUL_MAX_TOKENS = 16


def check_decode_kernel(decode_kernel):
    """`decode_kernel`, checked: `ValueError` naming it unless it is one of `DECODE_KERNELS`."""
    if decode_kernel not in DECODE_KERNELS:
        raise ValueError(f"decode_kernel must be one of {DECODE_KERNELS}, got decode_kernel={decode_kernel!r}")
    return decode_kernel


def row_split_linear(layer, x, chunks=8):
    """`layer(x)` (an `nn.Linear`) for a single row `x` `(1, 1, in)`, as `chunks` matrix-vector products in a batch.

    A matrix-vector product reads every weight once for two FLOPs each, so it runs at the rate memory
    delivers the weights. The CPU's BLAS computes one on a single thread, which reads memory at a
    fraction of what all cores do; `torch.bmm` runs the products of a batch on all threads. Where
    `chunks` does not divide the output features, or in bfloat16 (whose CPU matmul runs a matrix-vector
    product on all threads itself, faster than the split: measured on a 4096² weight, 0.94 ms against 1.47),
    `layer(x)` as it is.
    """
    weight = layer.weight  # (out, in)
    out_features, in_features = weight.shape
    if out_features % chunks != 0 or weight.dtype == torch.bfloat16:
        return layer(x)
    blocks = weight.view(chunks, out_features // chunks, in_features)  # (chunks, out/chunks, in): rows split
    # The column as a transposed row (strides (0, 1, in)): with strides (0, 1, 1), the same product ran 5x slower.
    column = x.reshape(1, in_features).T.unsqueeze(0).expand(chunks, in_features, 1)  # (chunks, in, 1)
    y = torch.bmm(blocks, column)  # (chunks, out/chunks, 1)
    y = y.reshape(*x.shape[:-1], out_features)  # (1, 1, out)
    return y if layer.bias is None else y + layer.bias


def decode_path(decode_kernel, q, keys, values, mask, dropout_p=0.0):
    """`"sdpa"` or `"matmul"` (`grouped_decode_attention`): what attends from `q` `(B, H, T, D)` over a cache's `keys`,
    `values` `(B, H_kv, S, D)` and `mask`. A forced `decode_kernel` is taken as it is; `"auto"` takes SDPA for more
    than `AUTO_MATMUL_MAX_TOKENS` new tokens (a prefill) and otherwise the faster of the two, timed on this machine
    once per shape class (`attention.decoding.tuning.fastest`; the cache's length counts by its power of two). With
    tuning off or dropout on (timing would draw random numbers), the rule tuned on an AMD EPYC: the grouped matmuls
    on CPU, SDPA elsewhere. `ValueError` for another `decode_kernel`."""
    if check_decode_kernel(decode_kernel) != "auto":
        return decode_kernel
    if q.shape[2] > AUTO_MATMUL_MAX_TOKENS:
        return "sdpa"
    rule = "matmul" if q.device.type == "cpu" else "sdpa"
    if dropout_p > 0:
        return rule
    shape_class = ("attention", q.device, q.dtype, *q.shape, keys.shape[1], keys.shape[2].bit_length(), mask is None)
    return fastest(shape_class, {"sdpa": lambda: sdpa_over_cache(q, keys, values, mask),
                                 "matmul": lambda: grouped_decode_attention(q, keys, values, mask)}, rule)


def decode_linear(layer, x, decode_kernel):
    """`layer(x)` (an `nn.Linear`) in a decoding step: for a single row `x` `(1, 1, in)` on the CPU, `row_split_linear`
    where that is faster. `decode_kernel` `"matmul"` forces the split (the grouped matmuls' path), `"sdpa"` the plain
    product, `"auto"` the faster of the two, timed on this machine once per weight shape (the split, with tuning off).
    """
    single_row_on_cpu = x.shape[:-1].numel() == 1 and x.device.type == "cpu"
    if not single_row_on_cpu or check_decode_kernel(decode_kernel) == "sdpa":
        return layer(x)
    if decode_kernel == "auto":
        shape_class = ("projection", x.dtype, *layer.weight.shape, layer.bias is None)
        if fastest(shape_class, {"linear": lambda: layer(x), "row_split": lambda: row_split_linear(layer, x)},
                   "row_split") == "linear":
            return layer(x)
    return row_split_linear(layer, x)


def cached_attention(q, keys, values, mask, scale=None, decode_kernel="auto", *, over_cache=True):
    """Attention of `q` `(B, H, T, D)` over `keys`, `values` `(B, H_kv, S, D)` with `mask` `(T, S)` (True = attend) or
    None, as `GroupedQueryAttention` picks it: the model families' layers on SDPA attend through it. `scale` defaults
    to `1 / sqrt(D)`. Returns `(B, H, T, D)`.

    `over_cache`: `keys` and `values` are what a cache's `update` returned (`mask` None: every key), and
    `decode_kernel` picks SDPA or the grouped matmuls (`decode_path`); False: a call without a cache
    (`S == T`, `mask` None: causal), always SDPA.
    """
    if not over_cache:
        return F.scaled_dot_product_attention(q, keys, values, scale=scale, is_causal=mask is None, attn_mask=mask,
                                              enable_gqa=keys.shape[1] != q.shape[1])  # (B, H, T, D)
    if decode_path(decode_kernel, q, keys, values, mask) == "matmul":
        return grouped_decode_attention(q, keys, values, mask, scale=scale)
    return sdpa_over_cache(q, keys, values, mask, scale=scale)


def sdpa_over_cache(q, keys, values, mask, dropout_p=0.0, scale=None):
    """SDPA of `q` `(B, H, T, D)` over a cache's `keys`, `values` `(B, H_kv, S, D)` and `mask` `(T, S)` or None:
    `(B, H, T, D)`. Never `is_causal`: it would align the mask top-left, wrong once the cache holds a past."""
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=keys.shape[1] != q.shape[1])  # (B, H, T, D)


def grouped_decode_attention(q, k, v, mask=None, dropout_p=0.0, scale=None):
    """Attention of a few queries over many cached keys, each K/V head read once for its group: `(B, H, T, D)`.

    Args:
        q: `(B, H, T, D)` queries; head `h` reads K/V head `h // (H // H_kv)`.
        k, v: `(B, H_kv, S, D)` keys and values (the cache), `S` typically much longer than `T`.
        mask: boolean `(T, S)`, True = attend, or None (every query attends to every key). A query with
            no key to attend to gets zeros.
        dropout_p: dropout on the attention weights.
        scale: the scores' factor; None: `1 / sqrt(D)`.

    A decode step reads the whole cache for very little arithmetic, so its speed is the rate at which
    it reads `k` and `v`: each K/V head's `group * T` queries are one matrix (`grouped_scores`), so the
    cache is read once per K/V head (SDPA's CPU kernel instead takes one query head at a time, reading
    each K/V head `group` times).
    """
    B, H, T, D = q.shape
    H_kv = k.shape[1]
    group = H // H_kv
    scale = D**-0.5 if scale is None else scale
    q_grouped = q.reshape(B, H_kv, group * T, D) * scale  # (B, H_kv, group*T, D): a K/V head's queries together, scaled
    scores = grouped_scores(q_grouped, k)  # (B, H_kv, group*T, S), contiguous
    if mask is not None:
        allowed = mask.repeat(group, 1)  # (T, S) -> (group*T, S), matching the grouped query order
        scores.masked_fill_(~allowed, float("-inf"))  # in place: a fresh tensor that no gradient needs
    attn_weights = torch.softmax(scores, dim=-1)  # over the keys: (B, H_kv, group*T, S)
    if mask is not None:
        attn_weights = attn_weights.nan_to_num(0.0)  # a query with no key: softmax of all -inf is NaN, its weights 0
    attn_weights = F.dropout(attn_weights, p=dropout_p) if dropout_p > 0 else attn_weights
    attn_output = per_head_matmul(attn_weights, v)  # (B, H_kv, group*T, S) @ (B, H_kv, S, D) -> (B, H_kv, group*T, D)
    return attn_output.reshape(B, H, T, D)  # (B, H_kv, group*T, D) -> (B, H, T, D)


def grouped_scores(q, k):
    """`q kᵀ` per K/V head, `(B, H_kv, R, S)` (contiguous), of `q` `(B, H_kv, R, D)` (a K/V head's query rows
    together) and `k` `(B, H_kv, S, D)`: each K/V head read as it lies, never copied per query head.

    For a few rows (a decoding step: a K/V head's `group` query heads of one token) over a long cache, computed
    as `(k qᵀ)ᵀ`: with the cache as the left operand, the CPU's BLAS runs it faster than `q kᵀ` (measured on
    CPUs over 16k keys: the gain shrinks as rows are added and turns into a loss from about 16 rows), and the
    transpose is made contiguous, so that the softmax along the keys reads a contiguous last dim (a copy of the
    small scores). In bfloat16 on the CPU, `q kᵀ` one head at a time (`per_head_matmul`). The model families'
    written-out attentions (soft-cap, sinks) use it too.
    """
    if bfloat16_on_cpu(q):
        return per_head_matmul(q, k.transpose(-1, -2))  # (B, H_kv, R, D) @ (B, H_kv, D, S) -> (B, H_kv, R, S)
    if q.shape[-2] <= 8:
        return (k @ q.transpose(-1, -2)).transpose(-1, -2).contiguous()  # (B, H_kv, S, R) -> (B, H_kv, R, S)
    return q @ k.transpose(-1, -2)  # (B, H_kv, R, D) @ (B, H_kv, D, S) -> (B, H_kv, R, S)


def per_head_matmul(a, b):
    """`a @ b` of `(B, H_kv, M, K)` and `(B, H_kv, K, N)`: on the CPU in bfloat16, one 2-D matmul per sequence and
    K/V head; otherwise one batched matmul.

    A cache's keys and values are a slice of its `(B, H_kv, capacity, D)` buffer: each head's `(S, D)` block is
    contiguous, but the heads lie `capacity` rows apart. The CPU's batched matmul in bfloat16 does not take such a
    batch as it lies and runs a slow kernel instead (measured on a CPU with AVX-512 BF16, a 16k decoding step of 32
    K/V heads over a cache of 32k capacity: 88 ms batched, 21 ms one head at a time); a 2-D matmul per head takes
    each block as it lies. In float32 the batched matmul is the faster (and in float16 the two take as long).

    `b` (the cache) is read as it lies; `a` (queries or attention weights, small) is laid out as `b` is along `K`:
    on a CPU without bfloat16 matmul instructions, a bfloat16 2-D matmul whose operands run along `K` one with
    stride 1 and the other not ran ten times slower than with both alike (measured on an AVX2 CPU, two sequences'
    attention weights `(32, 4096)` @ their latent blocks `(4096, 512)`: 797 ms, against 80 ms with the weights
    laid out `(4096, 32)`).
    """
    if not bfloat16_on_cpu(a):
        return a @ b
    if b.stride(-1) == 1:  # b's K steps by whole rows (a block as it lies): a's K too, a column-major copy of a
        a = a.transpose(-1, -2).contiguous().transpose(-1, -2)  # (B, H_kv, M, K), strides (..., 1, M)
    else:  # b's K has stride 1 (a block transposed, as keys in the scores): a's K too
        a = a.contiguous()  # (B, H_kv, M, K)
    return torch.stack([torch.stack([a[batch, head] @ b[batch, head] for head in range(a.shape[1])])  # (M, K) @ (K, N)
                        for batch in range(a.shape[0])])  # (B, H_kv, M, N)


def bfloat16_on_cpu(tensor):
    """Whether `tensor` is bfloat16 on the CPU, where the batched matmul over a cache's slice copies it
    (`per_head_matmul`)."""
    return tensor.device.type == "cpu" and tensor.dtype == torch.bfloat16
