"""The attention layer of DeepSeek-V4, as transformers runs it: one shared key-value head over a sliding window and
over compressed entries (CSA, HCA), attention sinks, partial interleaved RoPE and a de-rotated output.

DeepSeek-V4's technical report (section 2.3, as transformers' `DeepseekV4Config` cites it; the checkpoint its docs
name: https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash-Base) and transformers' `modeling_deepseek_v4.py` differ
from DeepSeek-V3's MLA (`attention/models/deepseek_v3.py`) in:

* **One shared key-value head** ("shared-KV multi-query attention"): `kv_proj` maps `x` to one `head_dim`-wide vector
  per position, RMS-normalised (`kv_norm`) and rotated, read by every query head as its key *and* its value.
* **A sliding window on every layer**: each query sees its last `sliding_window` positions, itself included.
* **Compressed entries** beyond the window, by `layer_types` (`config.compress_rates` gives each kind's rate):
  * `"compressed_sparse_attention"` (CSA, report section 2.3.1): every `m` positions (`compress_rates[...]`, 4 by
    transformers' default) close a window that pools into one entry, `softmax(gates + position_bias)`-weighted over
    `2m` positions: the window's own (second half of `kv_proj`'s `2 * head_dim` features) and the previous
    window's (first half): overlapping windows of width `2m`, stride `m`. A lightning indexer (`index_n_heads` heads
    of `index_head_dim`, its own pooled keys over the same windows) scores the entries,
    `I(t, s) = sum_j w(t, j) ReLU(q(t, j) . k(s))`, and each query attends to its `index_topk` best.
  * `"heavily_compressed_attention"` (HCA, section 2.3.2): non-overlapping windows of `m'` positions (128 by
    default), each pooled the same way into one entry; every query attends to all of them (densely).
  * `"sliding_attention"`: the window only.
  An entry is visible to a query once its whole window is in the past or present: entry `w` to the query at `t`
  iff `(w + 1) * m <= t + 1`.
* **Attention sinks**: a learned logit per head (`sinks`) joins each row's softmax and is dropped (as gpt-oss,
  `attention/models/gpt_oss.py`): a row's weights sum to less than 1.
* **Partial RoPE, interleaved, on the *last* features**: the last `qk_rope_head_dim = head_dim *
  partial_rotary_factor` features (by default 64 of 512) of queries, keys and entries rotate, pairs `(2i, 2i + 1)`.
  Sliding layers use `rope_theta`; CSA and HCA layers, their compressors and indexer, `compress_rope_theta`
  (with YaRN where the config scales it, its attention factor fixed at 1).
* **De-rotated output**: since the value is the rotated key, each head's output is rotated back by its query's
  position (angle `-t`), so what a key contributes depends on its distance to the query only.
* **Grouped output projection**: the `num_attention_heads * head_dim` output splits into `o_groups` groups, each
  projected to `o_lora_rank` (`o_a_proj`, block-diagonal), then mixed to `hidden_size` (`o_b_proj`).
* **No query-key normalisation beyond an unweighted RMS norm of each query head** (`q_b_norm`), after MLA's
  low-rank query (`q_a_proj`, `q_a_norm`, `q_b_proj`).

The attention is dense over the window and the compressed entries with the unchosen entries masked out (as
transformers'); a gathered form as `deepseek_v32.py`'s would skip their scores.

Decoding keeps `DeepseekV4Cache` (`new_cache`): the window's shared K=V vectors in a ring, the compressed entries,
and the tokens of the window not yet closed (their `kv_proj` and `gate_proj` outputs; for CSA also the previous
window's first half), for the compressor and, on CSA layers, the indexer. Its `nbytes` says the formula.

The contract: `attention.models.ModelAttention`. This file imports only torch; its helpers are marked copies of
`llama.py`'s and `llama4.py`'s.
"""

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

REQUIRED = object()  # `config_value`'s default: the field must be present

LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
CSA, HCA = LAYER_TYPES[1], LAYER_TYPES[2]
# What transformers' DeepseekV4Config fills in where a config names no `compress_rates` (m = 4, m' = 128), and its
# legacy per-layer `compress_ratios` (0, 4 or 128) read as kinds of layer.
DEFAULT_COMPRESS_RATES = {CSA: 4, HCA: 128}
COMPRESS_RATIO_TO_LAYER_TYPE = {0: LAYER_TYPES[0], 4: CSA, 128: HCA}
DEFAULT_PARTIAL_ROTARY_FACTOR = 64 / 512  # transformers' default: qk_rope_head_dim 64 of head_dim 512


class DeepseekV4Attention(nn.Module):
    """DeepSeek-V4's self-attention layer: `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The parameters of transformers' `DeepseekV4Attention`: `q_a_proj`, `q_a_norm`, `q_b_proj`, `kv_proj`, `kv_norm`,
    `o_a_proj`, `o_b_proj`, `sinks`, and on CSA and HCA layers `compressor.{kv_proj, gate_proj, position_bias,
    kv_norm}`, on CSA layers also `compressor.indexer.{kv_proj, gate_proj, position_bias, kv_norm, q_b_proj,
    scorer.weights_proj}`.

    Attributes the KV-memory count reads: `layer_type`, `head_dim` (the shared K=V vector), `sliding_window`,
    `compress_rate` (None on a sliding layer), `index_head_dim` (None but on CSA layers), `qk_rope_head_dim`.

    Raises `ValueError`/`TypeError` naming the config field and its value, before any weight is made, where the
    config cannot build the layer transformers builds (`config_fields`).
    """

    MODEL_TYPES = ("deepseek_v4",)
    LAYER_TYPES = LAYER_TYPES
    qk_norm = None

    def __init__(self, config, layer_idx):
        super().__init__()
        fields = config_fields(config, layer_idx)  # every check, before any weight
        self.layer_idx, self.layer_type = layer_idx, fields["layer_type"]
        self.hidden_size, self.num_attention_heads = fields["hidden_size"], fields["num_attention_heads"]
        self.num_key_value_heads = 1  # one shared K=V head, whatever `num_key_value_heads` says (transformers' too)
        self.head_dim, self.qk_rope_head_dim = fields["head_dim"], fields["qk_rope_head_dim"]
        self.sliding_window, self.compress_rate = fields["sliding_window"], fields["compress_rate"]
        self.o_groups, self.o_lora_rank, self.eps = fields["o_groups"], fields["o_lora_rank"], fields["rms_norm_eps"]
        self.index_topk = fields["index_topk"]
        self.index_head_dim = fields["index_head_dim"]
        self.scaling = self.head_dim**-0.5

        H, D, C, R = self.num_attention_heads, self.head_dim, self.hidden_size, fields["q_lora_rank"]
        self.q_a_proj = nn.Linear(C, R, bias=False)
        self.q_a_norm = RMSNorm(R, self.eps)
        self.q_b_proj = nn.Linear(R, H * D, bias=False)
        self.kv_proj = nn.Linear(C, D, bias=False)  # the one K=V head
        self.kv_norm = RMSNorm(D, self.eps)
        # Block-diagonal: group g's `H * D / o_groups` features -> its `o_lora_rank` (a Linear's weight, read by group).
        self.o_a_proj = nn.Linear(H * D // self.o_groups, self.o_groups * self.o_lora_rank, bias=False)
        self.o_b_proj = nn.Linear(self.o_groups * self.o_lora_rank, C, bias=False)
        self.sinks = nn.Parameter(torch.zeros(H))  # zeros until a checkpoint's are loaded (transformers' init)
        if self.layer_type == CSA:
            indexer = Indexer(C, R, fields["index_n_heads"], self.index_head_dim, self.compress_rate, self.eps)
            self.compressor = Compressor(C, D, self.compress_rate, overlap=True, eps=self.eps, indexer=indexer)
        elif self.layer_type == HCA:
            self.compressor = Compressor(C, D, self.compress_rate, overlap=False, eps=self.eps)
        else:
            self.compressor = None

        self.rope_parameters = fields["rope_parameters"]
        # float64 on the CPU, and not a buffer: `module.to(torch.bfloat16)` would round the frequencies, and with
        # them every angle. `rope_tables` keeps a copy per device, made on first use.
        self.inv_freq, self.attention_scaling = rope_frequencies(self.qk_rope_head_dim, self.rope_parameters)
        self.rope_tables = {}

    # Same as attention/models/llama.py::LlamaAttention.from_config
    @classmethod
    def from_config(cls, config, layer_idx, **options):
        """Layer `layer_idx` of the model configured by `config` (see `attention.models.ModelAttention`); `options`: the
        class's keyword arguments (`decode_kernel` where the layer attends through SDPA)."""
        return cls(config, layer_idx, **options)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.hidden_size, self.q_a_proj.weight.dtype)
        B, T, C = x.shape
        H, D = self.num_attention_heads, self.head_dim
        start = 0 if cache is None else check_v4_cache(self, cache, x)  # the position of x's first token
        positions = torch.arange(start, start + T, device=x.device)  # (T,)
        cos, sin = rope_cos_sin(self, positions, x)  # (T, Dr/2) each

        q_residual = self.q_a_norm(self.q_a_proj(x))  # (B, T, q_lora_rank): read by the queries and the indexer
        q = self.q_b_proj(q_residual).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        q = rotate_last(unweighted_rms_norm(q, self.eps), cos, sin)  # (B, H, T, D)
        kv = rotate_last(self.kv_norm(self.kv_proj(x)).unsqueeze(1), cos, sin)  # (B, 1, T, D): key and value

        if cache is None:
            keys, mask = kv, window_mask(positions, positions, self.sliding_window)  # (B, 1, T, D), (T, T)
        else:
            keys, mask = cache.update(kv)  # (B, 1, S, D), (T, S): the window's positions and the chunk's
        mask = mask.expand(B, 1, T, mask.shape[-1])  # (B, 1, T, S)
        if self.compressor is not None:
            rope = functools.partial(rope_cos_sin, self, like=x)  # positions -> the layer's cos, sin (compress RoPE)
            entries, visible = self.compressor(x, q_residual, positions, rope, cache)  # (B, 1, N, D), (B, 1, T, N)
            if self.layer_type == CSA:  # only the indexer's choice among the visible entries
                visible = visible & self.compressor.indexer.chosen(x, q_residual, positions, rope, cache,
                                                                   self.index_topk)  # (B, 1, T, N)
            keys = torch.cat([keys, entries], dim=2)  # (B, 1, S + N, D)
            mask = torch.cat([mask, visible.expand(B, 1, T, -1)], dim=-1)  # (B, 1, T, S + N)

        attn_output = shared_kv_attention(q, keys, mask, self.scaling, self.sinks)  # (B, H, T, D)
        attn_output = rotate_last(attn_output, cos, -sin)  # (B, H, T, D): back by each query's own angle
        grouped = attn_output.transpose(1, 2).reshape(B, T, self.o_groups, -1)  # (B, T, G, H*D/G)
        weight = self.o_a_proj.weight.view(self.o_groups, self.o_lora_rank, -1)  # (G, o_lora_rank, H*D/G)
        grouped = torch.einsum("btgi,gri->btgr", grouped, weight).reshape(B, T, -1)  # (B, T, G*o_lora_rank)
        return self.o_b_proj(grouped)  # (B, T, hidden_size)

    def new_cache(self, batch_size, capacity):
        """An empty `DeepseekV4Cache` for `batch_size` sequences of up to `capacity` positions: a window of
        `min(sliding_window, capacity)` K=V vectors, and on CSA/HCA layers `capacity // compress_rate` entries."""
        weight = self.kv_proj.weight
        cache = DeepseekV4Cache(batch_size, capacity, self.head_dim, self.sliding_window, self.compress_rate,
                                overlap=self.layer_type == CSA, index_head_dim=self.index_head_dim,
                                dtype=weight.dtype, device=weight.device)
        cache.layer = (type(self).__name__, self.layer_idx)  # check_v4_cache refuses it to any other layer
        return cache

    # Same as attention/models/llama.py::LlamaAttention.load_state_dict
    def load_state_dict(self, state_dict, strict=True, assign=False):
        """`nn.Module.load_state_dict`, with `ValueError` naming a missing, unexpected or misshapen key."""
        check_state_dict(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


class RMSNorm(nn.Module):
    """`weight * x / sqrt(mean(x²) + eps)` over the last dimension, in float32 at least (transformers' keeps its
    weights in float32 and casts the product back once)."""

    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        y = x.to(torch.promote_types(x.dtype, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * y).to(x.dtype)


def unweighted_rms_norm(x, eps):
    """`x / sqrt(mean(x²) + eps)` per head (`q_b_norm`, no weight): the scale in float32 at least, cast to `x`'s
    dtype."""
    y = x.to(torch.promote_types(x.dtype, torch.float32))
    return x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


class Compressor(nn.Module):
    """Pools every `compress_rate` positions into one entry of `head_dim` (report eqs. 9-12 and 20-23).

    Window `w` (positions `w*m .. w*m + m - 1`) gives `entry(w) = kv_norm(sum_j softmax_j(gate_j + position_bias_j)
    * kv_j)`, rotated at position `w*m`; the softmax runs per feature over the window's slots. With `overlap` (CSA)
    `kv_proj` and `gate_proj` give `2 * head_dim` features: the last `head_dim` pool into the window's own entry,
    the first `head_dim` into the next window's (`2m` slots, the first window's previous half empty).
    """

    def __init__(self, hidden_size, head_dim, compress_rate, overlap, eps, indexer=None):
        super().__init__()
        self.head_dim, self.compress_rate, self.overlap = head_dim, compress_rate, overlap
        width = 2 * head_dim if overlap else head_dim
        self.kv_proj = nn.Linear(hidden_size, width, bias=False)
        self.gate_proj = nn.Linear(hidden_size, width, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(compress_rate, width))  # per slot of a window
        self.kv_norm = RMSNorm(head_dim, eps)
        if indexer is not None:
            self.indexer = indexer

    def forward(self, x, q_residual, positions, rope, cache=None):
        """The entries of every closed window up to `x`'s last token `(B, 1, N, head_dim)` and which each query of
        `x` (at `positions` `(T,)`) may see `(1, 1, T, N)` (its window closed)."""
        entries = self.entries(x, positions, rope, None if cache is None else cache.states["compressor"])
        visible = entry_visible(positions, entries.shape[1], self.compress_rate)  # (T, N)
        return entries.unsqueeze(1), visible[None, None]  # (B, 1, N, D), (1, 1, T, N)

    def entries(self, x, positions, rope, state=None):
        """Pool the windows `x` closes (with `state`'s open window before it) -> every entry so far `(B, N, D)`."""
        B = x.shape[0]
        m, D, start = self.compress_rate, self.head_dim, int(positions[0])
        kv, gate = self.kv_proj(x), self.gate_proj(x)  # (B, T, width) each
        first = start // m  # the first window x closes (or the open one it continues)
        previous = None
        if state is not None:
            open_len = start - first * m  # positions of the open window already seen
            kv = torch.cat([state.open_kv[:, :open_len], kv], dim=1)  # (B, open_len + T, width)
            gate = torch.cat([state.open_gate[:, :open_len], gate], dim=1)
            if self.overlap and first > 0:
                previous = state.previous_kv, state.previous_gate  # (B, m, D) each: window first - 1's first half
        closed = kv.shape[1] // m
        if closed:
            pooled = self.pool(kv[:, :closed * m], gate[:, :closed * m], previous)  # (B, closed, D)
            at = torch.arange(first, first + closed, device=x.device) * m  # (closed,): each window's first position
            cos, sin = rope(at)  # (closed, Dr/2)
            pooled = rotate_last(self.kv_norm(pooled), cos, sin)  # (B, closed, D)
        else:
            pooled = kv.new_zeros(B, 0, D)
        if state is None:
            return pooled
        state.entries[:, first:first + closed] = pooled
        left = kv.shape[1] - closed * m  # positions of the window left open
        state.open_kv[:, :left] = kv[:, closed * m:]
        state.open_gate[:, :left] = gate[:, closed * m:]
        if self.overlap and closed:
            state.previous_kv.copy_(kv[:, (closed - 1) * m:closed * m, :D])  # the last closed window's first half
            state.previous_gate.copy_(gate[:, (closed - 1) * m:closed * m, :D])
        return state.entries[:, :first + closed]  # (B, N, D)

    def pool(self, kv, gate, previous=None):
        """`kv`, `gate` `(B, n*m, width)` of `n` closed windows -> `(B, n, head_dim)`: per feature, the
        `softmax(gate + position_bias)`-weighted sum over each window's slots (float32 softmax, as transformers')."""
        B, L, width = kv.shape
        m, D = self.compress_rate, self.head_dim
        kv = kv.view(B, L // m, m, width)  # (B, n, m, width)
        gate = gate.view(B, L // m, m, width) + self.position_bias  # (B, n, m, width)
        if self.overlap:  # slots: the previous window's first half, then this window's second half
            if previous is None:  # no window before the first: zero values, -inf gates (weight 0)
                before_kv = kv.new_zeros(B, 1, m, D)
                before_gate = gate.new_full((B, 1, m, D), float("-inf"))
            else:
                before_kv = previous[0].unsqueeze(1).to(kv.dtype)  # (B, 1, m, D)
                before_gate = (previous[1] + self.position_bias[:, :D]).unsqueeze(1).to(gate.dtype)
            before_kv = torch.cat([before_kv, kv[:, :-1, :, :D]], dim=1)  # (B, n, m, D)
            before_gate = torch.cat([before_gate, gate[:, :-1, :, :D]], dim=1)
            kv = torch.cat([before_kv, kv[..., D:]], dim=2)  # (B, n, 2m, D)
            gate = torch.cat([before_gate, gate[..., D:]], dim=2)
        weights = gate.softmax(dim=2, dtype=torch.promote_types(gate.dtype, torch.float32)).to(kv.dtype)
        return (kv * weights).sum(dim=2)  # (B, n, D)


class IndexScorer(nn.Module):
    """The indexer's per-query head weights `w(t, j)`: `weights_proj(x) / sqrt(index_n_heads)`."""

    def __init__(self, hidden_size, index_n_heads):
        super().__init__()
        self.weights_proj = nn.Linear(hidden_size, index_n_heads, bias=False)


class Indexer(Compressor):
    """CSA's lightning indexer (report eqs. 13-17): its own overlapping compressor at `index_head_dim` (the keys
    `K^IComp`), `index_n_heads` queries from the compressed query `c^Q` (`q_b_proj`), rotated as the layer's, and
    `I(t, s) = sum_j w(t, j) ReLU(q(t, j) . k(s)) / sqrt(index_head_dim)`."""

    def __init__(self, hidden_size, q_lora_rank, index_n_heads, index_head_dim, compress_rate, eps):
        super().__init__(hidden_size, index_head_dim, compress_rate, overlap=True, eps=eps)
        self.num_heads = index_n_heads
        self.q_b_proj = nn.Linear(q_lora_rank, index_n_heads * index_head_dim, bias=False)
        self.scorer = IndexScorer(hidden_size, index_n_heads)

    def chosen(self, x, q_residual, positions, rope, cache, index_topk):
        """`(B, 1, T, N)` bool: the `index_topk` visible entries of highest score for each query (all its visible
        ones where it has no more). Ties at the boundary are kept as `torch.topk` breaks them, as transformers'."""
        B, T, _ = x.shape
        Hi, Di = self.num_heads, self.head_dim
        with torch.no_grad():  # a choice, not a function to differentiate (the scores reach nothing else)
            keys = self.entries(x, positions, rope, None if cache is None else cache.states["indexer"])  # (B, N, Di)
            N = keys.shape[1]
            visible = entry_visible(positions, N, self.compress_rate)  # (T, N)
            if N == 0:
                return visible.expand(B, 1, T, 0)
            cos, sin = rope(positions)  # (T, Dr/2)
            queries = self.q_b_proj(q_residual).view(B, T, Hi, Di).transpose(1, 2)  # (B, Hi, T, Di)
            queries = rotate_last(queries, cos, sin)  # (B, Hi, T, Di)
            dtype = torch.promote_types(x.dtype, torch.float32)
            per_head = queries.to(dtype) @ keys.to(dtype).unsqueeze(1).transpose(-1, -2)  # (B, Hi, T, N)
            per_head = F.relu(per_head) * Di**-0.5
            weights = self.scorer.weights_proj(x).to(dtype) * Hi**-0.5  # (B, T, Hi)
            scores = torch.einsum("bhtn,bth->btn", per_head, weights)  # (B, T, N)
            top = scores.masked_fill(~visible, float("-inf")).topk(min(index_topk, N), dim=-1).indices  # (B, T, k)
            chosen = torch.zeros(B, T, N, dtype=torch.bool, device=x.device).scatter_(-1, top, True)  # (B, T, N)
            return (chosen & visible).unsqueeze(1)  # (B, 1, T, N)


def entry_visible(positions, num_entries, compress_rate):
    """`(T, N)` bool: entry `w` (positions `w*m .. w*m + m - 1`) visible to the query at position `t` iff its window
    closed by `t`, `(w + 1) * m <= t + 1`."""
    entries = torch.arange(num_entries, device=positions.device)  # (N,)
    return entries[None, :] < ((positions + 1) // compress_rate)[:, None]  # (T, N)


def window_mask(query_positions, key_positions, sliding_window):
    """`(T, S)` bool, True = attend: key `s` at most `sliding_window - 1` positions before query `t`, not after it."""
    distance = query_positions[:, None] - key_positions[None, :]  # (T, S)
    return (distance >= 0) & (distance < sliding_window) & (key_positions[None, :] >= 0)


def shared_kv_attention(q, kv, mask, scale, sinks):
    """`softmax([scale * q kvᵀ (masked), sink])[:-1] kv` per head: one key-value head read as key and value, with a
    learned sink logit per head (gpt-oss's), `(B, H, T, D)`.

    `q` `(B, H, T, D)`, `kv` `(B, 1, S, D)`, `mask` `(B, 1, T, S)` bool (True = attend; every query here sees at least
    itself), `sinks` `(H,)`. A row's weights sum to `1 - sigmoid(sink - logsumexp(scores))`.
    """
    B, H, T, D = q.shape
    S = kv.shape[2]
    scores = (q.reshape(B, H * T, D) @ kv[:, 0].transpose(1, 2)).view(B, H, T, S) * scale  # (B, H, T, S): kv read once
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, T, 1)  # (B, H, T, 1)
    attn_weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, T, S): sink dropped
    return (attn_weights.reshape(B, H * T, S) @ kv[:, 0]).view(B, H, T, D)  # (B, H, T, D)


def rope_cos_sin(module, positions, like):
    """cos and sin `(N, Dr/2)` of each pair's angle at `positions` `(N,)`, in `like`'s dtype, computed in float64
    (float32 on MPS) from `module.inv_freq`, times `module.attention_scaling`."""
    dtype = torch.float32 if like.device.type == "mps" else torch.float64
    if (like.device, dtype) not in module.rope_tables:
        module.rope_tables[(like.device, dtype)] = module.inv_freq.to(like.device, dtype)
    angles = positions.to(dtype)[:, None] * module.rope_tables[(like.device, dtype)][None, :]  # (N, Dr/2)
    scale = module.attention_scaling
    return (angles.cos() * scale).to(like.dtype), (angles.sin() * scale).to(like.dtype)


def rotate_last(x, cos, sin):
    """`x` `(..., N, D)` with its last `Dr = 2 * cos.shape[-1]` features rotated pair by pair, `(2i, 2i + 1)` by the
    angle of pair `i` (`cos`, `sin` `(N, Dr/2)`); the first `D - Dr` pass unchanged (V4 lays a head out as
    `[nope | rope]`). In float32 at least, as transformers'."""
    Dr = 2 * cos.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    rotated = apply_rotary_interleaved(x[..., -Dr:].to(dtype), cos.to(dtype), sin.to(dtype)).to(x.dtype)
    return torch.cat([x[..., :-Dr], rotated], dim=-1)


# Same as attention/models/llama4.py::apply_rotary_interleaved
def apply_rotary_interleaved(x, cos, sin):
    """`x` `(B, heads, T, D)` rotated pair by pair in Meta's layout: `(x_2i, x_2i+1)` turns by the angle of pair `i`."""
    even, odd = x[..., 0::2], x[..., 1::2]  # (B, heads, T, D/2) each
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)  # (B, heads, T, D)


class CompressorState:
    """What one compressor (the layer's, or CSA's indexer) keeps between chunks, for `batch_size` sequences:

    * `entries` `(B, capacity // compress_rate, width)`: every closed window's entry (normalised, rotated);
    * `open_kv`, `open_gate` `(B, compress_rate - 1, proj)`: `kv_proj` and `gate_proj` of the open window's
      positions so far (`proj` = `2 * width` with overlap, else `width`);
    * with overlap, `previous_kv`, `previous_gate` `(B, compress_rate, width)`: the first half of the last closed
      window's, which the next window's entry pools.
    """

    def __init__(self, batch_size, capacity, width, compress_rate, overlap, dtype, device):
        proj = 2 * width if overlap else width
        self.entries = torch.zeros(batch_size, capacity // compress_rate, width, dtype=dtype, device=device)
        self.open_kv = torch.zeros(batch_size, compress_rate - 1, proj, dtype=dtype, device=device)
        self.open_gate = torch.zeros_like(self.open_kv)
        self.previous_kv = self.previous_gate = None
        if overlap:
            self.previous_kv = torch.zeros(batch_size, compress_rate, width, dtype=dtype, device=device)
            self.previous_gate = torch.zeros_like(self.previous_kv)

    @property
    def nbytes(self):
        tensors = (self.entries, self.open_kv, self.open_gate, self.previous_kv, self.previous_gate)
        return sum(t.nbytes for t in tensors if t is not None)


class DeepseekV4Cache:
    """A DeepSeek-V4 layer's decoding state for `batch_size` sequences of up to `capacity` positions.

    * `window` `(B, 1, min(sliding_window, capacity), head_dim)`: the shared K=V vectors of the last positions, a
      ring (position `p` in slot `p % slots`);
    * on CSA and HCA layers, `states["compressor"]`, and on CSA layers `states["indexer"]` (`CompressorState`).

    `update(kv)` appends a chunk's K=V vectors `(B, 1, T, head_dim)` to the window and returns `(keys, mask)`: the
    window's vectors before the chunk and the chunk's, `(B, 1, S, head_dim)`, and `(T, S)` True where query `t` sees
    key `s` (within `sliding_window`, causal). The layer's compressor updates `states` itself.
    `rewind` only to the current length: a closed window's entry cannot be reopened.
    """

    def __init__(self, batch_size, capacity, head_dim, sliding_window, compress_rate=None, overlap=False,
                 index_head_dim=None, dtype=torch.float32, device=None):
        for name, value in {"batch_size": batch_size, "capacity": capacity, "head_dim": head_dim,
                            "sliding_window": sliding_window}.items():
            check_int(name, value)
        self.capacity, self.sliding_window, self.length, self.layer = capacity, sliding_window, 0, None
        self.window = torch.zeros(batch_size, 1, min(sliding_window, capacity), head_dim, dtype=dtype, device=device)
        self.states = {}
        if compress_rate is not None:
            sizes = dict(batch_size=batch_size, capacity=capacity, compress_rate=compress_rate, overlap=overlap,
                         dtype=dtype, device=device)
            self.states["compressor"] = CompressorState(width=head_dim, **sizes)
            if index_head_dim is not None:
                self.states["indexer"] = CompressorState(width=index_head_dim, **sizes)

    @property
    def nbytes(self):
        """Bytes the cache holds, `element_size *` (with `W = min(sliding_window, capacity)`, `D = head_dim`,
        `Di = index_head_dim`, `m = compress_rate`, `E = capacity // m`):

        * sliding: `B * W * D`;
        * HCA: `B * (W * D + E * D + 2 * (m - 1) * D)`;
        * CSA: `B * (W * D + E * D + 2 * (m - 1) * 2 * D + 2 * m * D + E * Di + 2 * (m - 1) * 2 * Di + 2 * m * Di)`.
        """
        return self.window.nbytes + sum(state.nbytes for state in self.states.values())

    def update(self, kv):
        """Append `kv` `(B, 1, T, D)`; return `(keys, mask)` over the window's cached positions and the chunk's."""
        T, start, slots = kv.shape[2], self.length, self.window.shape[2]
        if start + T > self.capacity:
            raise ValueError(f"DeepSeek-V4 cache is full: {start} cached + {T} new positions exceed "
                             f"capacity={self.capacity}")
        slot = torch.arange(slots, device=kv.device)  # (slots,)
        held = (start - 1) - ((start - 1 - slot) % slots)  # (slots,): the position each slot holds; < 0: empty
        query_pos = torch.arange(start, start + T, device=kv.device)  # (T,)
        keys = torch.cat([self.window, kv], dim=2)  # (B, 1, slots + T, D)
        key_pos = torch.cat([held, query_pos])  # (slots + T,)
        mask = window_mask(query_pos, key_pos, self.sliding_window)  # (T, slots + T)
        last = query_pos[-slots:]  # the positions the ring keeps
        self.window[:, :, last % slots] = kv[:, :, -len(last):]
        self.length = start + T
        return keys, mask

    def rewind(self, length):
        """Only to the current length (no change): the compressors' closed windows cannot be reopened."""
        if length != self.length:
            raise ValueError(f"a DeepSeek-V4 cache cannot rewind (its compressed windows are pooled for good): "
                             f"length={length!r}, cached {self.length}")


def check_v4_cache(module, cache, x):
    """Raise a clear error unless `cache` was made by this layer (`new_cache`) for `x`'s batch, dtype and device,
    and gradients are off (a cache is for inference); return the position of `x`'s first token."""
    if not isinstance(cache, DeepseekV4Cache):
        raise TypeError(f"cache must come from the layer's new_cache(), got {type(cache).__name__}")
    layer = (type(module).__name__, module.layer_idx)
    if cache.layer != layer:
        raise ValueError(f"cache was made by {cache.layer}, not by this layer ({layer[0]} layer {layer[1]}, "
                         f"{module.layer_type})")
    if x.shape[0] != cache.window.shape[0]:
        raise ValueError(f"x has batch size {x.shape[0]}, the cache was made for batch_size={cache.window.shape[0]}")
    if cache.window.dtype != x.dtype or cache.window.device != x.device:
        raise ValueError(f"cache is {cache.window.dtype} on {cache.window.device}, x is {x.dtype} on {x.device}")
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in module.parameters())):
        raise ValueError("a KV cache is for inference: call the layer under torch.no_grad() or torch.inference_mode()")
    return cache.length


def config_fields(config, layer_idx):
    """Every field the layer reads, checked as transformers' `DeepseekV4Config` reads it: a dict.

    Sizes positive ints (`hidden_size`, `num_attention_heads`, `head_dim`, `q_lora_rank`, `o_groups`, `o_lora_rank`,
    `sliding_window`; on CSA layers `index_n_heads`, `index_head_dim` at least `qk_rope_head_dim`, `index_topk` at
    most the entries `max_position_embeddings // compress_rate` a sequence can have), `o_groups` dividing
    `num_attention_heads * head_dim`, `qk_rope_head_dim = int(head_dim * partial_rotary_factor)` even, in
    `(0, head_dim]`, `layer_types` (or transformers' default schedule) of the three kinds, `compress_rates` a dict of
    positive ints for CSA and HCA (or transformers' default), RoPE parameters as `rope_frequencies` reads them.
    """
    check_model_type(config, DeepseekV4Attention.MODEL_TYPES)
    check_layer_idx(config, layer_idx)
    check_no_dropout(config)
    fields = {}
    for name in ("hidden_size", "num_attention_heads", "head_dim", "q_lora_rank", "o_groups", "o_lora_rank",
                 "sliding_window"):
        fields[name] = config_value(config, name)
        check_int(name, fields[name])
    eps = config_value(config, "rms_norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"rms_norm_eps must be a number, got rms_norm_eps={eps!r}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"rms_norm_eps must be finite and >= 0, got rms_norm_eps={eps!r}")
    fields["rms_norm_eps"] = eps
    H, D, G = fields["num_attention_heads"], fields["head_dim"], fields["o_groups"]
    if (H * D) % G:
        raise ValueError(f"o_groups must divide num_attention_heads * head_dim = {H * D} (the grouped output "
                         f"projection splits the heads' outputs evenly), got o_groups={G}")

    factor = config_value(config, "partial_rotary_factor", None)
    if factor is None:
        legacy = config_value(config, "qk_rope_head_dim", None)  # a published config.json's name
        legacy_ok = isinstance(legacy, int) and not isinstance(legacy, bool)
        factor = legacy / D if legacy_ok else DEFAULT_PARTIAL_ROTARY_FACTOR
    check_finite("partial_rotary_factor", factor)
    rope_dim = int(D * factor)
    if rope_dim <= 0 or rope_dim > D or rope_dim % 2:
        raise ValueError(f"partial_rotary_factor must give an even number of rotated features in (0, head_dim={D}], "
                         f"got partial_rotary_factor={factor!r} (int(head_dim * factor) = {rope_dim})")
    fields["qk_rope_head_dim"] = rope_dim

    layer_type = v4_layer_types(config)[layer_idx]
    fields["layer_type"] = layer_type
    rates = compress_rates(config)
    fields["compress_rate"] = rates[layer_type] if layer_type != LAYER_TYPES[0] else None
    fields["index_n_heads"] = fields["index_head_dim"] = fields["index_topk"] = None
    if layer_type == CSA:
        for name in ("index_n_heads", "index_head_dim", "index_topk"):
            fields[name] = config_value(config, name)
            check_int(name, fields[name])
        if fields["index_head_dim"] < rope_dim:
            raise ValueError(f"index_head_dim must be at least qk_rope_head_dim={rope_dim} (its last features rotate), "
                             f"got index_head_dim={fields['index_head_dim']}")
        longest = config_value(config, "max_position_embeddings", None)
        if longest is not None:
            check_int("max_position_embeddings", longest)
            available = longest // rates[CSA]
            if fields["index_topk"] > available:
                raise ValueError(f"index_topk must be at most max_position_embeddings // compress_rates[{CSA!r}] = "
                                 f"{longest} // {rates[CSA]} = {available} (no sequence has more entries to choose "
                                 f"from), got index_topk={fields['index_topk']}")
    fields["rope_parameters"] = v4_rope_parameters(config, "main" if layer_type == LAYER_TYPES[0] else "compress")
    check_rope_parameters(rope_dim, fields["rope_parameters"])
    return fields


def v4_layer_types(config):
    """`layer_types` (checked), or what transformers' config fills in: the legacy `compress_ratios` (0, 4, 128) read
    as kinds, else two HCA layers then CSA and HCA alternating (DeepSeek-V4-Pro's schedule)."""
    layer_types = listed_layer_types(config, LAYER_TYPES)
    if layer_types is not None:
        return layer_types
    n = config_value(config, "num_hidden_layers")
    ratios = config_value(config, "compress_ratios", None)
    if ratios is not None:
        if not isinstance(ratios, (list, tuple)) or len(ratios) < n:
            raise ValueError(f"compress_ratios must list one ratio per layer (num_hidden_layers={n}), "
                             f"got compress_ratios={ratios!r}")
        for ratio in ratios[:n]:
            if ratio not in COMPRESS_RATIO_TO_LAYER_TYPE or isinstance(ratio, bool):
                raise ValueError(f"compress_ratios holds {ratio!r}; transformers reads only "
                                 f"{sorted(COMPRESS_RATIO_TO_LAYER_TYPE)}")
        return [COMPRESS_RATIO_TO_LAYER_TYPE[ratio] for ratio in ratios[:n]]
    return [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]


def compress_rates(config):
    """`{CSA: m, HCA: m'}`: `compress_rates` (a dict; transformers' default 4 and 128 where absent), with the legacy
    top-level `compress_rate_csa` / `compress_rate_hca` folded in as transformers does; each a positive int."""
    rates = config_value(config, "compress_rates", None)
    if rates is None:
        rates = dict(DEFAULT_COMPRESS_RATES)
    elif not isinstance(rates, dict):
        raise TypeError(f"compress_rates must be a dict of the compression rate per layer kind, "
                        f"got compress_rates={rates!r}")
    rates = dict(rates)
    for kind, legacy in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if config_value(config, legacy, None) is not None:
            rates[kind] = config_value(config, legacy)
    for kind in (CSA, HCA):
        if kind not in rates:
            raise ValueError(f"compress_rates lacks {kind!r}, got compress_rates={rates!r}")
        check_int(f"compress_rates[{kind!r}]", rates[kind])
    return rates


def v4_rope_parameters(config, kind):
    """The RoPE parameters of a layer's `kind`, `"main"` (sliding layers: `rope_theta`, no scaling) or `"compress"`
    (CSA/HCA layers: `compress_rope_theta` with the config's scaling, YaRN's attention factor 1 unless set), read
    from transformers' nested `rope_parameters` or built from a flat one as its config does."""
    parameters = config_value(config, "rope_parameters", None)
    if isinstance(parameters, dict) and isinstance(parameters.get("main"), dict) \
            and isinstance(parameters.get("compress"), dict):
        chosen = dict(parameters[kind])
    else:
        if parameters is None:
            flat = mapping("rope_scaling", config_value(config, "rope_scaling", None))
        else:
            flat = mapping("rope_parameters", parameters)
        flat = {key: value for key, value in flat.items() if key not in ("main", "compress")}
        if kind == "main":
            chosen = {"rope_type": "default", "rope_theta": config_value(config, "rope_theta")}
        else:
            chosen = {**flat, "rope_theta": config_value(config, "compress_rope_theta")}
            chosen["rope_type"] = chosen.pop("type", None) or chosen.get("rope_type") or "default"
            if chosen["rope_type"] == "yarn":
                chosen.setdefault("attention_factor", 1.0)  # DeepSeek's reference scales no cos and sin
    chosen["rope_type"] = chosen.pop("type", None) or chosen.get("rope_type") or "default"
    return chosen


# Same as attention/models/llama.py::listed_layer_types
def listed_layer_types(config, kinds):
    """`config.layer_types`, checked: a list (or tuple) of `num_hidden_layers` kinds of layer, each one of `kinds`
    (the family's); None where the config lists none."""
    layer_types = config_value(config, "layer_types", None)
    if layer_types is None:
        return None
    if not isinstance(layer_types, (list, tuple)):
        raise TypeError(f"layer_types must be a list of layer kinds, one per layer, got layer_types={layer_types!r}")
    num_hidden_layers = config_value(config, "num_hidden_layers")
    if len(layer_types) != num_hidden_layers:
        raise ValueError(f"layer_types must list one kind per layer (num_hidden_layers={num_hidden_layers}), "
                         f"got {len(layer_types)}: layer_types={layer_types!r}")
    for kind in layer_types:
        if not isinstance(kind, str) or kind not in kinds:
            raise ValueError(f"layer_types holds {kind!r}; the layers of this family are {', '.join(kinds)}")
    return layer_types


# Same as attention/models/llama.py::mapping
def mapping(name, value):
    """A new dict of the config field `name` (`rope_scaling`, `rope_parameters`): `{}` for None, `TypeError` for
    anything but a dict."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict of RoPE fields, got {name}={value!r}")
    return dict(value)


# Same as attention/models/llama.py::rope_frequencies
def rope_frequencies(head_dim, parameters):
    """RoPE's inverse frequencies `(head_dim / 2,)` (float64, CPU) and the factor its cos and sin are multiplied by.

    Pair `i` turns by `position * inv_freq[i]`, `inv_freq[i] = rope_theta ** (-2i / head_dim)`, unless
    `rope_type` stretches the slow pairs for a longer context: `"linear"` divides every frequency by `factor`;
    `"llama3"` (Llama 3.1) divides the pairs slower than `original_max_position_embeddings / low_freq_factor`
    by `factor`, keeps those faster than `... / high_freq_factor`, and blends between; `"yarn"`
    (https://arxiv.org/abs/2309.00071) blends by pair index between the pairs turning `beta_fast` and
    `beta_slow` times over the original context, and multiplies cos and sin by `0.1 ln(factor) + 1`.
    Parameters that cannot rotate raise first (`check_rope_parameters`).
    """
    check_rope_parameters(head_dim, parameters)
    base, kind = parameters["rope_theta"], parameters["rope_type"]
    pair = torch.arange(head_dim // 2, dtype=torch.float64, device="cpu")
    inv_freq = base ** (-2 * pair / head_dim)
    if kind == "default":
        return inv_freq, 1.0
    factor = parameters["factor"]
    if kind == "linear":
        return inv_freq / factor, 1.0
    original = parameters["original_max_position_embeddings"]
    if kind == "llama3":
        low, high = parameters["low_freq_factor"], parameters["high_freq_factor"]
        blend = ((original * inv_freq / (2 * math.pi) - low) / (high - low)).clamp(0, 1)  # 0: slow pairs, 1: fast
        return (1 - blend) * inv_freq / factor + blend * inv_freq, 1.0
    if kind == "yarn":
        def pair_turning(turns):  # the (fractional) pair index turning `turns` times over the original context
            return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(parameters.get("beta_fast") or 32), pair_turning(parameters.get("beta_slow") or 1)
        if parameters.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        ramp = ((pair - low) / ((high - low) or 0.001)).clamp(0, 1)  # 0: keep the frequency, 1: divide by factor
        attention_factor = parameters.get("attention_factor")
        if attention_factor is None:
            def magnitude(scale, multiplier=1.0):
                return 1.0 if scale <= 1 else 0.1 * multiplier * math.log(scale) + 1.0

            mscale, mscale_all_dim = parameters.get("mscale"), parameters.get("mscale_all_dim")
            attention_factor = (magnitude(factor, mscale) / magnitude(factor, mscale_all_dim)
                                if mscale and mscale_all_dim else magnitude(factor))
        return (1 - ramp) * inv_freq + ramp * inv_freq / factor, float(attention_factor)


# Same as attention/models/llama.py::check_rope_parameters
def check_rope_parameters(head_dim, parameters):
    """Raise a clear error unless `parameters` (`{"rope_type", "rope_theta", ...}`) can rotate heads of `head_dim`.

    The `rope_type` first (default, linear, llama3 or yarn), then each field it reads, present and in range:
    `rope_theta` and `factor` finite and > 0 (`rope_theta` > 1 for YaRN, which divides by its log),
    `original_max_position_embeddings` a positive int, Llama 3's `low_freq_factor` and `high_freq_factor` finite,
    > 0 and in that order; YaRN's optional `beta_fast`, `beta_slow`, `mscale`, `mscale_all_dim` and
    `attention_factor`, where set (None or 0: the default, but a 0 attention factor), finite and > 0. RoPE turns
    pairs of features, so `head_dim` must be even.
    """
    needs = {"default": (), "linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings")}
    kind = parameters["rope_type"]
    if kind not in needs:
        raise ValueError(f"rope_type must be one of {', '.join(needs)}, got rope_type={kind!r}")
    for name in ("rope_theta",) + needs[kind]:
        if parameters.get(name) is None:
            raise ValueError(f"config lacks the field {name!r}, which rope_type={kind!r} reads (rope_parameters={parameters})")
        if name == "original_max_position_embeddings":
            check_int(name, parameters[name])
        else:
            check_finite(name, parameters[name], above=1 if (kind, name) == ("yarn", "rope_theta") else 0)
    if kind == "llama3" and parameters["high_freq_factor"] < parameters["low_freq_factor"]:
        raise ValueError(f"high_freq_factor must be at least low_freq_factor (Llama 3.1's blend runs from one to the "
                         f"other), got low_freq_factor={parameters['low_freq_factor']}, "
                         f"high_freq_factor={parameters['high_freq_factor']}")
    if kind == "yarn":
        for name in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if parameters.get(name):  # None or 0: the default
                check_finite(name, parameters[name])
        if parameters.get("attention_factor") is not None:  # 0 would zero every query and key: uniform attention
            check_finite("attention_factor", parameters["attention_factor"])
    if head_dim % 2:
        raise ValueError(f"head_dim must be even where RoPE rotates it (pairs of features), got head_dim={head_dim}")


# Same as attention/models/llama.py::check_finite
def check_finite(name, value, above=0):
    """Raise `TypeError` unless `value` is a number (an int or a float; a bool is not), `ValueError` unless it is
    finite and greater than `above`: the config field `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {name}={value!r}")
    if not (math.isfinite(value) and value > above):
        raise ValueError(f"{name} must be finite and > {above}, got {name}={value!r}")


# Same as attention/models/llama.py::check_state_dict
def check_state_dict(module, state_dict, strict):
    """Raise `ValueError` naming each key of `state_dict` that does not fit `module` (missing where `strict`,
    unexpected where `strict`, or of another shape, with both shapes)."""
    expected = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(state_dict)), sorted(set(state_dict) - set(expected))
    if strict and (missing or unexpected):
        raise ValueError(f"state dict does not fit {type(module).__name__} layer {module.layer_idx}: "
                         f"missing keys {missing}, unexpected keys {unexpected}")
    for name in sorted(set(expected) & set(state_dict)):
        if tuple(state_dict[name].shape) != expected[name]:
            raise ValueError(f"state dict does not fit {type(module).__name__} layer {module.layer_idx}: {name} has "
                             f"shape {tuple(state_dict[name].shape)}, the layer's is {expected[name]}")


# Same as attention/models/llama.py::check_input
def check_input(x, hidden_size, dtype):
    """Raise a clear error unless `x` is a floating `(B, T, hidden_size)` tensor with T > 0, of the layer's `dtype`
    (that of its weights; under autocast, which casts them, any floating dtype)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got x.dtype={x.dtype}")
    if x.dim() != 3 or x.shape[-1] != hidden_size or x.shape[1] == 0:
        raise ValueError(f"x must have shape (B, T > 0, hidden_size={hidden_size}), got x.shape={tuple(x.shape)}")
    if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise ValueError(f"x.dtype={x.dtype} differs from the layer's dtype {dtype}: convert x (x.to({dtype})) "
                         f"or the layer (layer.to({x.dtype}))")


# Same as attention/models/llama.py::check_model_type
def check_model_type(config, model_types):
    """Raise a clear error unless the config's `model_type` (where it names one) is one of `model_types`."""
    model_type = config_value(config, "model_type", None) or model_types[0]
    if model_type not in model_types:
        raise ValueError(f"this class builds the layers of model_type {', '.join(model_types)}; "
                         f"the config has model_type={model_type!r} (attention.models.MODELS maps each to its class)")


# Same as attention/models/llama.py::check_layer_idx
def check_layer_idx(config, layer_idx):
    """`layer_idx`, checked to be an int in `[0, num_hidden_layers)`."""
    num_hidden_layers = config_value(config, "num_hidden_layers")
    check_int("num_hidden_layers", num_hidden_layers)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or not 0 <= layer_idx < num_hidden_layers:
        raise ValueError(f"layer_idx must be an int in [0, num_hidden_layers={num_hidden_layers}), got layer_idx={layer_idx!r}")
    return layer_idx


# Same as attention/models/llama.py::check_no_dropout
def check_no_dropout(config):
    """Raise a clear error for a config with attention dropout: these layers have none (every published config: 0.0)."""
    dropout = config_value(config, "attention_dropout", 0.0) or 0.0
    if dropout != 0:
        raise ValueError(f"attention_dropout must be 0.0 (these layers have no attention dropout), got {dropout}")


# Same as attention/models/__init__.py::config_value
def config_value(config, name, default=REQUIRED):
    """`config.name`, or `config[name]` for a mapping; `default` if absent, `ValueError` naming it if required."""
    if isinstance(config, dict):
        value = config.get(name, default)
    else:
        value = getattr(config, name, default)
    if value is REQUIRED:
        kind = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
        raise ValueError(f"config lacks the field {name!r} (model_type={kind!r})")
    return value


# Same as attention/checks.py::check_int
def check_int(name, value, minimum=1):
    """Raise `TypeError` unless `value` is an int (a bool is not), `ValueError` if it is below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {name}={value!r}")
    if value < minimum:
        bound = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
        raise ValueError(f"{name} must be {bound}, got {name}={value}")
