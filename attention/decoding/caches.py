"""The KV caches of decoding: preallocated tensors, positions counted, a mask for each chunk's queries.

Each keeps the `attention.decoding.DecodingCache` contract (`length`, `nbytes`, `update`, `rewind`):

* `KVCache`: every position's keys and values, up to `capacity` (`GroupedQueryAttention.new_cache(batch_size,
  capacity)`, a model family's global layer).
* `SlidingWindowKVCache`: the first `sinks` positions and the last `window` (attention sinks; a model family's
  local layer, Llama 4's chunked one), in fixed memory however long the sequence.
* `LatentCache`: what multi-head latent attention keeps instead of keys and values (`attention.models.deepseek_v3`).
* `RecurrentStateCache`: what a linear attention layer keeps instead (`attention.models.qwen3_next`, `kimi_linear`):
  a state of fixed size, not a `DecodingCache` (it holds no positions to append to or rewind).

Imports only torch.
"""

import torch


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


class LatentCache:
    """What MLA caches: the normalised latent `c^KV` and the rotated key `k^R` of every position so far.

    Preallocated `(B, 1, capacity, kv_lora_rank)` and `(B, 1, capacity, qk_rope_head_dim)` tensors (one
    "head": every query head reads them), so a position takes `kv_lora_rank + qk_rope_head_dim`
    values per sequence and layer. Keeps the `attention.decoding.DecodingCache` contract: a chunk of `T`
    tokens after `length` cached ones sits at positions `length .. length + T - 1`, and its query `i`
    attends to positions `0 .. length + i` (the causal mask aligned to the lower right).
    """

    def __init__(self, batch_size, kv_lora_rank, qk_rope_head_dim, capacity, dtype=torch.float32, device=None):
        sizes = {"batch_size": batch_size, "kv_lora_rank": kv_lora_rank, "qk_rope_head_dim": qk_rope_head_dim,
                 "capacity": capacity}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        self.capacity, self.length = capacity, 0
        self.layer = None  # (class name, layer_idx) of the layer whose new_cache made it
        self.latent = torch.zeros(batch_size, 1, capacity, kv_lora_rank, dtype=dtype, device=device)
        self.rope_keys = torch.zeros(batch_size, 1, capacity, qk_rope_head_dim, dtype=dtype, device=device)

    @property
    def nbytes(self):
        """Bytes the cache holds: `batch_size * capacity * (kv_lora_rank + qk_rope_head_dim) * element size`."""
        return self.latent.nbytes + self.rope_keys.nbytes

    def update(self, latent, rope_keys):
        """Append `latent` `(B, 1, T, kv_lora_rank)` and `rope_keys` `(B, 1, T, qk_rope_head_dim)`.

        Returns `(latent, rope_keys, mask)` over positions `0 .. length + T - 1`: `(B, 1, S, ...)` views
        and a boolean `(T, S)` mask, True = attend, or `None` for one query (it attends to every position).
        Past capacity: `ValueError`, and the cache is left unchanged.
        """
        T, start = latent.shape[2], self.length
        if start + T > self.capacity:
            raise ValueError(f"latent cache is full: {start} cached + {T} new positions exceed capacity={self.capacity}")
        self.latent[:, :, start:start + T] = latent
        self.rope_keys[:, :, start:start + T] = rope_keys
        self.length = start + T
        cached = self.latent[:, :, :self.length], self.rope_keys[:, :, :self.length]  # (B, 1, S, Dc), (B, 1, S, Dr)
        if T == 1:
            return (*cached, None)
        query_pos = torch.arange(start, start + T, device=latent.device)  # (T,)
        key_pos = torch.arange(self.length, device=latent.device)  # (S,)
        return (*cached, query_pos[:, None] >= key_pos[None, :])  # (T, S): lower-right causal

    # Same as attention/decoding/caches.py::KVCache.rewind
    def rewind(self, length):
        """Forget every position from `length` on: the next chunk starts at position `length`."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise ValueError(f"length must be an int in [0, {self.length}] (the positions cached), got length={length!r}")
        self.length = length


class RecurrentStateCache:
    """What a linear attention layer keeps to decode: its recurrent state `(B, H, Dk, Dv)` and its short causal
    convolution's last `kernel_size - 1` inputs `(B, channels, kernel_size - 1)`, the same bytes at every context.

    Not a `DecodingCache`: it holds no positions, so there is nothing to append per position and nothing to rewind
    to. The layer reads both states and, after each chunk, `replace`s them (counting the chunk's positions in
    `length`). `state_dtype` is the recurrent state's (float32 at least where the layer's weights are lower: the
    state sums every past write). `layer` is set by the layer's `new_cache`.
    """

    def __init__(self, batch_size, channels, kernel_size, num_heads, key_dim, value_dim, dtype=torch.float32,
                 state_dtype=None, device=None):
        sizes = {"batch_size": batch_size, "channels": channels, "kernel_size": kernel_size, "num_heads": num_heads,
                 "key_dim": key_dim, "value_dim": value_dim}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        self.length, self.layer = 0, None
        self.conv_state = torch.zeros(batch_size, channels, kernel_size - 1, dtype=dtype, device=device)
        self.recurrent_state = torch.zeros(batch_size, num_heads, key_dim, value_dim, dtype=state_dtype or dtype,
                                           device=device)

    @property
    def nbytes(self):
        """Bytes the cache holds: both states, whatever the context."""
        return self.conv_state.nbytes + self.recurrent_state.nbytes

    def replace(self, conv_state, recurrent_state, positions):
        """Store the states after a chunk of `positions` tokens (copied in: the cache keeps its own tensors)."""
        self.conv_state.copy_(conv_state)
        self.recurrent_state.copy_(recurrent_state)
        self.length += positions
