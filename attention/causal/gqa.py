"""Grouped-query and multi-query causal self-attention on SDPA, with KV caches for decoding.

Grouped-query attention (GQA, Ainslie et al., 2023, https://arxiv.org/abs/2305.13245) keeps
`num_heads` query heads but only `num_kv_heads` key/value heads: each K/V head is shared by a group
of `num_heads // num_kv_heads` consecutive query heads. `num_kv_heads == num_heads` is ordinary
multi-head attention; `num_kv_heads == 1` is multi-query attention (MQA, Shazeer, 2019,
https://arxiv.org/abs/1911.02150). Llama 3, Mistral, Gemma 2 and Qwen use GQA: the key and value
projections shrink, and so does the KV cache that decoding reads at every step.

Decoding with a cache: `cache = module.new_cache(batch_size, capacity)`, then `module(x, cache=cache)`
projects `x`'s keys and values, appends them to the cache and attends from `x`'s queries over
everything cached. A prompt goes in one call (prefill), then one token per call, or chunks.
`new_cache(batch_size, window=w, sinks=s)` keeps only the first `s` positions and the last `w`
(a sliding window with attention sinks), so memory stays fixed however long the sequence grows.
"""

import torch
import torch.nn.functional as F
from torch import nn

KV_STRATEGIES = ("enable_gqa", "repeat")
DECODE_KERNELS = ("auto", "sdpa", "matmul")
# decode_kernel="auto" takes the grouped matmuls for calls of at most this many new tokens (decode steps,
# short chunks); a longer chunk is a prefill, whose (S, group * T) scores SDPA never writes out.
AUTO_MATMUL_MAX_TOKENS = 16


class GroupedQueryAttention(nn.Module):
    """Causal grouped-query self-attention on `F.scaled_dot_product_attention`: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict (`attention.causal.CausalSelfAttention`),
    except that `key.weight` and `value.weight` (and biases) have `num_kv_heads * head_dim` rows.

    Keywords:
        num_kv_heads: K/V heads; must divide `num_heads`. `None` takes groups of 4 query heads per K/V
            head (as Llama 3 8B and Mistral 7B do), or of 2 where 4 does not divide `num_heads`, or
            plain multi-head attention where neither does.
        kv_strategy: how SDPA meets the smaller K/V: `"enable_gqa"` (SDPA's own `enable_gqa=True`,
            PyTorch >= 2.5: the kernel maps each query head to its K/V head without copying) or
            `"repeat"` (copy each K/V head `num_heads // num_kv_heads` times, then plain SDPA).
        decode_kernel: what attends over a cache: `"sdpa"`, `"matmul"` (`grouped_decode_attention`: two
            matmuls that read each cached K/V head once for its whole group of query heads; they write
            out the `(S, group * T)` scores, so they suit few new tokens) or `"auto"` (`"matmul"` on CPU
            for calls of at most `AUTO_MATMUL_MAX_TOKENS` new tokens, where SDPA's kernel reads the
            cache once per query head; `"sdpa"` otherwise). Without a cache, SDPA runs.
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, *, num_kv_heads=None,
                 kv_strategy="enable_gqa", decode_kernel="auto"):
        super().__init__()
        init_sizes(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        num_kv_heads = resolve_kv_heads(num_heads, num_kv_heads)
        if kv_strategy not in KV_STRATEGIES:
            raise ValueError(f"kv_strategy must be one of {KV_STRATEGIES}, got kv_strategy={kv_strategy!r}")
        if decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel must be one of {DECODE_KERNELS}, got decode_kernel={decode_kernel!r}")
        self.num_kv_heads, self.kv_strategy, self.decode_kernel = num_kv_heads, kv_strategy, decode_kernel
        kv_dim = num_kv_heads * self.head_dim
        self.query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.key = nn.Linear(d_in, kv_dim, bias=qkv_bias)  # num_kv_heads heads, not num_heads
        self.value = nn.Linear(d_in, kv_dim, bias=qkv_bias)
        self.out = nn.Linear(d_out, d_out)
        self.dropout_p = dropout  # a probability: SDPA applies it itself

    def forward(self, x, cache=None):
        """`x` `(B, T, d_in)` -> `(B, T, d_out)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        H, H_kv, D = self.num_heads, self.num_kv_heads, self.head_dim
        grouped_matmuls = cache is not None and uses_grouped_matmuls(self.decode_kernel, x.device, T)
        # One token of one sequence: each projection is a matrix-vector product, which the CPU's BLAS runs on
        # one thread; split into a batch of them (`row_split_linear`), it reads the weights on every core.
        project = row_split_linear if grouped_matmuls and B * T == 1 else (lambda layer, inputs: layer(inputs))
        q = project(self.query, x).view(B, T, H, D).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)
        k = project(self.key, x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        v = project(self.value, x).view(B, T, H_kv, D).transpose(1, 2)  # (B, H_kv, T, D)
        if cache is None:
            keys, values, mask, is_causal = k, v, None, True
        else:
            check_cache(cache, self, x)
            keys, values, mask = cache.update(k, v)  # (B, H_kv, S, D) each; mask (T, S) or None
            is_causal = False  # is_causal=True would align the mask top-left: wrong once the cache holds a past
        dropout_p = self.dropout_p if self.training else 0.0  # SDPA has no train/eval switch of its own
        if grouped_matmuls:
            context = grouped_decode_attention(q, keys, values, mask, dropout_p)  # (B, H, T, D)
        else:
            if self.kv_strategy == "repeat" and H_kv != H:
                keys = keys.repeat_interleave(H // H_kv, dim=1)  # (B, H_kv, S, D) -> (B, H, S, D): head h reads K/V head h // group
                values = values.repeat_interleave(H // H_kv, dim=1)  # (B, H, S, D)
            context = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout_p,
                                                     is_causal=is_causal, enable_gqa=keys.shape[1] != H)  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return project(self.out, context)  # (B, T, d_out)

    def new_cache(self, batch_size, capacity=None, *, window=None, sinks=0):
        """An empty KV cache for `batch_size` sequences, on the module's device and dtype.

        `capacity` positions in all (a `KVCache`, at most `context_length`), or, with `window`, the first
        `sinks` positions and the last `window` (a `SlidingWindowKVCache`, for any length).
        """
        weight = self.key.weight
        sizes = dict(batch_size=batch_size, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                     dtype=weight.dtype, device=weight.device)
        if window is None:
            if capacity is None:
                raise ValueError("new_cache needs capacity (a full cache) or window (a sliding-window cache)")
            if isinstance(capacity, int) and capacity > self.context_length:
                raise ValueError(f"capacity must be at most context_length={self.context_length}, got capacity={capacity}")
            if sinks:
                raise ValueError(f"sinks apply to a sliding-window cache: pass window too, got sinks={sinks}")
            return KVCache(capacity=capacity, **sizes)
        if capacity is not None:
            raise ValueError(f"pass capacity or window, not both: got capacity={capacity}, window={window}")
        return SlidingWindowKVCache(window=window, sinks=sinks, **sizes)

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict
    def canonical_state_dict(self):
        """The weights under the names every implementation shares (`attention.causal.CausalSelfAttention`)."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    def load_canonical_state_dict(self, state):
        """Load the canonical state dict, with `num_kv_heads * head_dim` rows in `key.*` and `value.*`."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias, kv_dim=self.num_kv_heads * self.head_dim)
        self.load_state_dict(state)


class MultiQueryAttention(GroupedQueryAttention):
    """Causal multi-query self-attention: grouped-query attention with one K/V head for all query heads."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, *, kv_strategy="enable_gqa",
                 decode_kernel="auto"):
        super().__init__(d_in, d_out, context_length, dropout, num_heads, qkv_bias, num_kv_heads=1,
                         kv_strategy=kv_strategy, decode_kernel=decode_kernel)


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


def uses_grouped_matmuls(decode_kernel, device, new_tokens):
    """Whether a call with a cache attends through `grouped_decode_attention`: `decode_kernel` `"matmul"`, or `"auto"`
    on CPU for at most `AUTO_MATMUL_MAX_TOKENS` new tokens; else SDPA."""
    if decode_kernel not in DECODE_KERNELS:
        raise ValueError(f"decode_kernel must be one of {DECODE_KERNELS}, got decode_kernel={decode_kernel!r}")
    return decode_kernel == "matmul" or (decode_kernel == "auto" and device.type == "cpu"
                                         and new_tokens <= AUTO_MATMUL_MAX_TOKENS)


def cached_attention(q, keys, values, mask, scale=None, decode_kernel="auto", *, over_cache=True):
    """Attention of `q` `(B, H, T, D)` over `keys`, `values` `(B, H_kv, S, D)` with `mask` `(T, S)` (True = attend) or
    None, as `GroupedQueryAttention` picks it: the model families' layers on SDPA attend through it. `scale` defaults
    to `1 / sqrt(D)`. Returns `(B, H, T, D)`.

    `over_cache`: `keys` and `values` are what a cache's `update` returned (`mask` None: every key), and
    `decode_kernel` picks SDPA or the grouped matmuls (`uses_grouped_matmuls`); False: a call without a cache
    (`S == T`, `mask` None: causal), always SDPA.
    """
    if over_cache and uses_grouped_matmuls(decode_kernel, q.device, q.shape[2]):
        return grouped_decode_attention(q, keys, values, mask, scale=scale)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                          is_causal=not over_cache and mask is None,
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
    context = per_head_matmul(attn_weights, v)  # (B, H_kv, group*T, S) @ (B, H_kv, S, D) -> (B, H_kv, group*T, D)
    return context.reshape(B, H, T, D)  # (B, H_kv, group*T, D) -> (B, H, T, D)


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
    """
    if not bfloat16_on_cpu(a):
        return a @ b
    return torch.stack([torch.stack([a[batch, head] @ b[batch, head] for head in range(a.shape[1])])  # (M, K) @ (K, N)
                        for batch in range(a.shape[0])])  # (B, H_kv, M, N)


def bfloat16_on_cpu(tensor):
    """Whether `tensor` is bfloat16 on the CPU, where the batched matmul over a cache's slice copies it
    (`per_head_matmul`)."""
    return tensor.device.type == "cpu" and tensor.dtype == torch.bfloat16


class KVCache:
    """The keys and values of every position so far, in preallocated `(B, H_kv, capacity, D)` tensors.

    `update(k, v)` appends a chunk and returns what its queries attend over. Queries of a chunk of
    `T` tokens after `length` cached ones sit at positions `length .. length + T - 1`, so query `i` of
    the chunk attends to keys `0 .. length + i`: the causal mask aligned to the lower right.
    """

    def __init__(self, batch_size, num_kv_heads, head_dim, capacity, dtype=torch.float32, device=None):
        sizes = {"batch_size": batch_size, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "capacity": capacity}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        self.capacity, self.length = capacity, 0
        self.keys = torch.zeros(batch_size, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)  # (B, H_kv, capacity, D)

    @property
    def nbytes(self):
        """Bytes the cache holds: keys and values."""
        return self.keys.nbytes + self.values.nbytes

    def update(self, k, v):
        """Append `k`, `v` `(B, H_kv, T, D)`; return `(keys, values, mask)` over positions `0 .. length + T - 1`.

        `mask` `(T, length + T)`, True = attend, or `None` when every query attends to every key (one query).
        Past capacity: `ValueError`, and the cache is left unchanged.
        """
        T, start = k.shape[2], self.length
        if start + T > self.capacity:
            raise ValueError(f"KV cache is full: {start} cached + {T} new positions exceed capacity={self.capacity}")
        self.keys[:, :, start:start + T] = k
        self.values[:, :, start:start + T] = v
        self.length = start + T
        keys, values = self.keys[:, :, :self.length], self.values[:, :, :self.length]  # (B, H_kv, length, D)
        if T == 1:
            return keys, values, None
        query_pos = torch.arange(start, start + T, device=k.device)  # (T,)
        key_pos = torch.arange(self.length, device=k.device)  # (length,)
        return keys, values, query_pos[:, None] >= key_pos[None, :]  # (T, length): lower-right causal

    def rewind(self, length):
        """Forget every position from `length` on: the next chunk starts at position `length`."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise ValueError(f"length must be an int in [0, {self.length}] (the positions cached), got length={length!r}")
        self.length = length


class SlidingWindowKVCache:
    """The first `sinks` positions and the last `window` positions, in `(B, H_kv, sinks + window, D)` slots.

    The window slots are a ring buffer: position `p >= sinks` lives in slot `sinks + (p - sinks) % window`.
    Query `i` attends to keys `j <= i` with `i - j < window` (`attention.masks.sliding_window(window)`)
    or `j < sinks` (attention sinks, Xiao et al., 2023, https://arxiv.org/abs/2309.17453). Memory stays
    `sinks + window` positions whatever the length.
    """

    def __init__(self, batch_size, num_kv_heads, head_dim, window, sinks=0, dtype=torch.float32, device=None):
        sizes = {"batch_size": batch_size, "num_kv_heads": num_kv_heads, "head_dim": head_dim, "window": window}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks must be a non-negative int, got sinks={sinks!r}")
        self.window, self.sinks, self.length = window, sinks, 0
        self.keys = torch.zeros(batch_size, num_kv_heads, sinks + window, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)  # (B, H_kv, sinks + window, D)
        self.positions = torch.full((sinks + window,), -1, device=device)  # position held in each slot; -1: empty

    @property
    def nbytes(self):
        """Bytes the cache holds: keys and values."""
        return self.keys.nbytes + self.values.nbytes

    def slots(self, positions):
        """The slot of each position `(N,)`: itself among the sinks, else its place in the ring."""
        return torch.where(positions < self.sinks, positions, self.sinks + (positions - self.sinks) % self.window)

    def update(self, k, v):
        """Append `k`, `v` `(B, H_kv, T, D)`; return `(keys, values, mask)` for the chunk's queries.

        `mask` `(T, S)`, True = attend, or `None` when every query attends to every key.
        """
        T, start = k.shape[2], self.length
        query_pos = torch.arange(start, start + T, device=k.device)  # (T,)
        if T == 1:  # the slot overwritten held position start - window, which the query no longer sees
            self._write(k, v, query_pos)
            keys, values, key_pos = self.keys, self.values, self.positions  # (B, H_kv, slots, D)
        else:  # a later query's write must not evict a key an earlier query of the chunk still needs
            keys = torch.cat([self.keys, k], dim=2)  # (B, H_kv, slots + T, D)
            values = torch.cat([self.values, v], dim=2)
            key_pos = torch.cat([self.positions, query_pos])  # (slots + T,)
            self._write(k, v, query_pos)
        recent = (query_pos[:, None] - key_pos[None, :] < self.window) | (key_pos[None, :] < self.sinks)
        mask = (key_pos[None, :] >= 0) & (key_pos[None, :] <= query_pos[:, None]) & recent  # (T, S)
        return keys, values, (None if bool(mask.all()) else mask)

    def rewind(self, length):
        """Forget every position from `length` on: the next chunk starts at position `length`.

        `ValueError` if a position the next query needs (the sinks, and the `window - 1` before `length`)
        was already evicted: the ring no longer holds it.
        """
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise ValueError(f"length must be an int in [0, {self.length}] (the positions seen), got length={length!r}")
        needed = [p for p in range(length) if p < self.sinks or p > length - self.window]
        evicted = sorted(set(needed) - set(self.positions.tolist()))
        if evicted:
            raise ValueError(f"cannot rewind to length={length}: position(s) {evicted[:5]} were evicted from the window")
        self.positions[self.positions >= length] = -1  # those slots are empty again
        self.length = length

    def _write(self, k, v, positions):
        keep = (positions < self.sinks) | (positions >= positions[-1] + 1 - self.window)  # the rest would be evicted
        slots = self.slots(positions[keep])
        self.keys[:, :, slots] = k[:, :, keep]
        self.values[:, :, slots] = v[:, :, keep]
        self.positions[slots] = positions[keep]
        self.length = int(positions[-1]) + 1


def resolve_kv_heads(num_heads, num_kv_heads):
    """`num_kv_heads` checked against `num_heads` (a clear error unless it divides it); `None` picks the default."""
    if num_kv_heads is None:
        return num_heads // next(group for group in (4, 2, 1) if num_heads % group == 0)
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int):
        raise TypeError(f"num_kv_heads must be an int, got num_kv_heads={num_kv_heads!r}")
    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"num_kv_heads must be a positive divisor of num_heads, got num_kv_heads={num_kv_heads}, "
                         f"num_heads={num_heads}")
    return num_kv_heads


def check_cache(cache, module, x):
    """Raise a clear error unless `cache` keeps the KV-cache contract (`attention.causal.DecodingCache`: `length`,
    `nbytes`, `update`, `rewind`), fits `module` and `x` where it shows its tensors, and gradients are off."""
    missing = [name for name in ("length", "nbytes", "update", "rewind") if not hasattr(cache, name)]
    if missing:
        raise TypeError(f"cache must come from new_cache() or keep the KV-cache contract (length, nbytes, update, "
                        f"rewind), got {type(cache).__name__} without {', '.join(missing)}")
    keys = getattr(cache, "keys", None)  # this file's caches show their tensors; a cache of the contract alone need not
    if isinstance(keys, torch.Tensor):
        B, H_kv, _, D = keys.shape
        if (H_kv, D) != (module.num_kv_heads, module.head_dim):
            raise ValueError(f"cache holds {H_kv} K/V heads of size {D}, the module has num_kv_heads="
                             f"{module.num_kv_heads}, head_dim={module.head_dim}")
        if x.shape[0] != B:
            raise ValueError(f"x has batch size {x.shape[0]}, the cache was made for batch_size={B}")
        if keys.dtype != x.dtype or keys.device != x.device:
            raise ValueError(f"cache is {keys.dtype} on {keys.device}, x is {x.dtype} on {x.device}")
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters())):
        raise ValueError("a KV cache is for inference: call the module under torch.no_grad() or torch.inference_mode()")


# Same as attention/causal/split_heads.py::init_sizes
def init_sizes(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias):
    """Check the family's constructor arguments (clear errors) and keep the sizes on `module`."""
    check_init_args(d_in, d_out, context_length, dropout, num_heads)
    module.d_in, module.d_out, module.context_length = d_in, d_out, context_length
    module.num_heads, module.head_dim, module.qkv_bias = num_heads, d_out // num_heads, qkv_bias


# Same as attention/causal/split_heads.py::check_init_args
def check_init_args(d_in, d_out, context_length, dropout, num_heads):
    """Raise a clear error for constructor arguments that cannot build the module."""
    sizes = {"d_in": d_in, "d_out": d_out, "context_length": context_length, "num_heads": num_heads}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {name}={value!r}")
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {name}={value}")
    if d_out % num_heads != 0:
        raise ValueError(f"d_out must be divisible by num_heads, got d_out={d_out}, num_heads={num_heads}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
        raise TypeError(f"dropout must be a float, got dropout={dropout!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got dropout={dropout}")


# Same as attention/causal/split_heads.py::check_input
def check_input(x, d_in, context_length):
    """Raise a clear error unless `x` is a floating `(B, T, d_in)` tensor with 0 < T <= context_length."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got x.dtype={x.dtype}")
    if x.dim() != 3 or x.shape[-1] != d_in:
        raise ValueError(f"x must have shape (B, T, d_in={d_in}), got x.shape={tuple(x.shape)}")
    if not 0 < x.shape[1] <= context_length:
        raise ValueError(f"sequence length T must be in [1, context_length={context_length}], got T={x.shape[1]}")


def check_canonical_state(state, d_in, d_out, qkv_bias, kv_dim):
    """Raise a clear error unless `state` holds exactly the canonical keys with the right shapes (K/V: `kv_dim` rows)."""
    shapes = {"query.weight": (d_out, d_in), "key.weight": (kv_dim, d_in), "value.weight": (kv_dim, d_in),
              "out.weight": (d_out, d_out), "out.bias": (d_out,)}
    if qkv_bias:
        shapes.update({"query.bias": (d_out,), "key.bias": (kv_dim,), "value.bias": (kv_dim,)})
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(f"canonical state dict: missing keys {missing}, unexpected keys {extra}")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"canonical state dict: {name} must have shape {shape}, got {tuple(state[name].shape)}")
