"""DeepSeek sparse attention (DSA) of DeepSeek-V3.2: MLA that attends to `index_topk` chosen positions per query.

DeepSeek-V3.2 (https://github.com/deepseek-ai/DeepSeek-V3.2-Exp, its report's section 2.1) is DeepSeek-V3's
multi-head latent attention (`attention/models/deepseek_v3.py`, which this file builds on) plus a *lightning
indexer*: a few small heads score every past position for each query,

    I(t, s) = sum_j w(t, j) * ReLU(q(t, j) . k(s)),

with one key `k(s)` per position shared by the indexer's heads and per-query head weights `w(t, j)`, and MLA then
attends only to the `index_topk` (2,048) positions of highest `I(t, s)`. Its cost per query stops growing with the
context once the context passes `index_topk`; the indexer's own still grows (it scores every position), but its heads
are few, narrow, and run in FP8 in DeepSeek's kernels.

Two forms of the same function (`sparse`):

* `"gather"`: gather the chosen positions' latents and rotary keys, `(B, T, top-k, ...)`, and attend over those
  only, on MLA's absorbed path (FlashMLA's sparse kernels do this; its README lists the same few lines). Queries run
  in blocks, so the gathered copies stay small at any length.
* `"mask"`: attend densely over every position with the unchosen ones masked out, as transformers', fla's and
  MaxText's DSA do. Correct, and it computes every score it then throws away.

The tests hold both equal in float64, equal to transformers' `DeepseekV32Attention` fed what the real tiny model
feeds it, and equal to `attention.reference` (`reference_indexer_selection`, `reference_latent_attention`). Two
details that are easy to get wrong: the indexer rotates its first `qk_rope_head_dim` features in the rotate-half
layout, pairs `(i, i + R/2)`, while MLA rotates its own interleaved, pairs `(2i, 2i + 1)`; and with more than one
indexer head the per-head weights change which positions win (`index_scores` shows how).

Decoding keeps MLA's latent cache plus the indexer's keys (`index_head_dim` values per position):
`IndexedLatentCache`. Imports torch and `attention.models.deepseek_v3` (and, through it, `attention/decoding/`).
"""

import torch
import torch.nn.functional as F
from torch import nn

from attention.decoding import LatentCache
from attention.models.deepseek_v3 import (DeepseekV3Attention, apply_rotary, check_cache, check_input, check_int,
                                          config_value, rotary_cos_sin)

SPARSE_FORMS = ("gather", "mask")
INDEX_NORM_EPS = 1e-6  # the indexer's LayerNorm on its keys (DeepSeek's code and transformers': 1e-6)
# The gather form scores and gathers a block of queries at a time: about this many elements per block's tensors.
BLOCK_ELEMENTS = 1 << 24


class IndexedLatentCache(LatentCache):
    """MLA's `LatentCache` plus the indexer's key of every position: `(B, capacity, index_head_dim)` more.

    `update(latent, rope_keys, index_keys)` appends one chunk of all three and returns the cached positions of each
    and the chunk's causal mask (or None for one query), as `LatentCache.update` does.
    """

    def __init__(self, batch_size, kv_lora_rank, qk_rope_head_dim, index_head_dim, capacity, dtype=torch.float32,
                 device=None):
        super().__init__(batch_size, kv_lora_rank, qk_rope_head_dim, capacity, dtype=dtype, device=device)
        check_int("index_head_dim", index_head_dim)
        self.index_keys = torch.zeros(batch_size, capacity, index_head_dim, dtype=dtype, device=device)

    @property
    def nbytes(self):
        """Bytes the cache holds: `batch_size * capacity * (kv_lora_rank + qk_rope_head_dim + index_head_dim) * element size`."""
        return super().nbytes + self.index_keys.nbytes

    def update(self, latent, rope_keys, index_keys):
        """Append `(B, 1, T, kv_lora_rank)`, `(B, 1, T, qk_rope_head_dim)` and `(B, T, index_head_dim)`; returns
        `(latent, rope_keys, index_keys, mask)` over positions `0 .. length + T - 1`."""
        start = self.length
        latent, rope_keys, mask = super().update(latent, rope_keys)  # checks the capacity before writing anything
        self.index_keys[:, start:self.length] = index_keys
        return latent, rope_keys, self.index_keys[:, :self.length], mask


class LightningIndexer(nn.Module):
    """DSA's indexer: `index_n_heads` query heads of `index_head_dim` from the compressed query `c^Q`, one key per
    position from `x`, a weight per head and query from `x`. Transformers' names (`wq_b`, `wk`, `k_norm`,
    `weights_proj`), so a checkpoint's `indexer.*` weights load unchanged. (transformers keeps `weights_proj` in
    float32 when it loads a checkpoint in bfloat16; here every weight has the layer's dtype, and the scores are float32
    at least either way.)"""

    def __init__(self, hidden_size, q_lora_rank, index_n_heads, index_head_dim, qk_rope_head_dim):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_head_dim = index_n_heads, index_head_dim, qk_rope_head_dim
        self.wq_b = nn.Linear(q_lora_rank, index_n_heads * index_head_dim, bias=False)
        self.wk = nn.Linear(hidden_size, index_head_dim, bias=False)
        self.k_norm = nn.LayerNorm(index_head_dim, eps=INDEX_NORM_EPS)
        self.weights_proj = nn.Linear(hidden_size, index_n_heads, bias=False)

    def queries_keys_weights(self, x, compressed_query, cos, sin):
        """Per head queries `(B, Hi, T, Di)`, keys `(B, T, Di)` and head weights `(B, T, Hi)` of the tokens of `x`.

        The first `qk_rope_head_dim` features of queries and keys rotate with `cos`, `sin` `(T, Dr)` in the
        rotate-half layout (pairs `(i, i + Dr/2)`): not MLA's interleaved pairs. The weights carry
        `1 / sqrt(index_n_heads)` and the scores' `1 / sqrt(index_head_dim)` (both positive: ReLU keeps them out).
        """
        B, T, _ = x.shape
        Hi, Di, Dr = self.n_heads, self.head_dim, self.rope_head_dim
        q = self.wq_b(compressed_query).view(B, T, Hi, Di).transpose(1, 2)  # (B, Hi, T, Di)
        k = self.k_norm(self.wk(x)).unsqueeze(1)  # (B, 1, T, Di): one key per position, for every indexer head
        q = torch.cat([apply_rotary(q[..., :Dr], cos, sin), q[..., Dr:]], dim=-1)  # (B, Hi, T, Di)
        k = torch.cat([apply_rotary(k[..., :Dr], cos, sin), k[..., Dr:]], dim=-1).squeeze(1)  # (B, T, Di)
        weights = self.weights_proj(x) * (Hi * Di) ** -0.5  # (B, T, Hi)
        return q, k, weights


def index_scores(queries, keys, weights):
    """`I(t, s) = sum_j weights[t, j] * ReLU(queries[j, t] . keys[s])`: `(B, Hi, T, Di)`, `(B, S, Di)`, `(B, T, Hi)`
    -> `(B, T, S)`, in float32 at least (transformers' too; DeepSeek's kernel reads FP8 queries and keys).

    With one head, a positive weight scales a query's scores and leaves their order alone. With more, each head's
    weight changes how much its ReLU scores count, so the weights change which positions rank highest (the tests show
    a case): they are part of the ranking, not a scale on it.
    """
    B, Hi, T, Di = queries.shape
    dtype = torch.promote_types(queries.dtype, torch.float32)
    # The heads folded into the rows of one matmul: the keys, shared by every head, are read once.
    per_head = F.relu(queries.to(dtype).reshape(B, Hi * T, Di) @ keys.to(dtype).transpose(1, 2))  # (B, Hi*T, S)
    return torch.einsum("bth,bhts->bts", weights.to(dtype), per_head.view(B, Hi, T, -1))  # (B, T, S)


def top_k_positions(scores, top_k, causal):
    """The `min(top_k, S)` positions of highest score per query: `scores` `(B, T, S)`, `causal` `(T, S)` (True =
    visible). Returns `(indices, valid)`, both `(B, T, k)`: a query with fewer visible positions than `top_k` keeps
    them all, and its other slots point at positions it must not see (`valid` False there). Positions tied at the
    boundary (a score of exactly 0, where every indexer head's ReLU is 0: frequent with few heads) are kept as
    `torch.topk` breaks the tie, as transformers' layer keeps them."""
    k = min(top_k, scores.shape[-1])
    indices = scores.masked_fill(~causal, float("-inf")).topk(k, dim=-1).indices  # (B, T, k)
    valid = causal.expand(scores.shape[0], -1, -1).gather(-1, indices)  # (B, T, k)
    return indices, valid


def query_blocks(num_queries, num_positions, heads):
    """Slices of the `num_queries` queries, each block's `(heads, block, num_positions)` scores about `BLOCK_ELEMENTS`
    (at least one query a block)."""
    block = max(1, BLOCK_ELEMENTS // (num_positions * heads))
    return [slice(first, first + block) for first in range(0, num_queries, block)]


class DeepseekV32Attention(DeepseekV3Attention):
    """DeepSeek-V3.2's attention: MLA (the parent class) whose queries each attend to the `index_topk` positions
    the lightning indexer ranks highest, `(B, T, hidden_size) -> (B, T, hidden_size)`.

    The model families' contract (`attention.models.ModelAttention`): `from_config`, transformers' parameter names
    (MLA's, plus `indexer.wq_b`, `indexer.wk`, `indexer.k_norm`, `indexer.weights_proj`), decoding with `new_cache`
    (an `IndexedLatentCache`).

    Args (beyond `DeepseekV3Attention`'s, whose `q_lora_rank` must be set here: the indexer reads `c^Q`):
        index_n_heads: the indexer's heads (64 in DeepSeek-V3.2).
        index_head_dim: their width (128); the first `qk_rope_head_dim` features rotate.
        index_topk: positions each query attends to (2,048).
        sparse: `"gather"` (attend over the chosen positions only; needs `path="absorbed"`) or `"mask"` (dense
            attention with the others masked out, either path). The same function.

    Raises `ValueError`/`TypeError` naming the argument, beyond the parent's: `q_lora_rank` None, sizes that are
    not positive ints, `index_head_dim` below `qk_rope_head_dim`, an unknown `sparse`, or `"gather"` on the naive path.
    """

    layer_type = "indexed_attention"

    def __init__(self, hidden_size, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                 v_head_dim, *, index_n_heads, index_head_dim, index_topk, sparse="gather", path="absorbed", **options):
        if q_lora_rank is None:
            raise ValueError("q_lora_rank must be a positive int for DeepSeek sparse attention (the indexer's queries "
                             "come from the compressed query), got q_lora_rank=None")
        if sparse not in SPARSE_FORMS:
            raise ValueError(f"sparse must be one of {SPARSE_FORMS}, got sparse={sparse!r}")
        if sparse == "gather" and path != "absorbed":
            raise ValueError(f"sparse='gather' attends over the latent itself and needs path='absorbed', got "
                             f"path={path!r} (the naive path takes sparse='mask')")
        super().__init__(hidden_size, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                         v_head_dim, path=path, **options)
        for name, value in {"index_n_heads": index_n_heads, "index_head_dim": index_head_dim,
                            "index_topk": index_topk}.items():
            check_int(name, value)
        if index_head_dim < qk_rope_head_dim:
            raise ValueError(f"index_head_dim must be at least qk_rope_head_dim (its first features rotate), got "
                             f"index_head_dim={index_head_dim}, qk_rope_head_dim={qk_rope_head_dim}")
        self.index_topk, self.sparse = index_topk, sparse
        self.indexer = LightningIndexer(hidden_size, q_lora_rank, index_n_heads, index_head_dim, qk_rope_head_dim)

    @classmethod
    def from_config(cls, config, layer_idx=0, *, path="absorbed", sparse="gather"):
        """The attention of layer `layer_idx` of a DeepSeek-V3.2 configuration (transformers' config or a mapping
        with its names, a published `config.json` included): DeepSeek-V3's fields plus `index_n_heads`,
        `index_head_dim` and `index_topk`. Every layer is alike. An `index_topk` above `max_position_embeddings`
        (where the config has it) could never be reached and is refused."""
        args, kwargs = DeepseekV3Attention.config_arguments(config, layer_idx)  # MLA's fields, checked
        index_topk = config_value(config, "index_topk")
        check_int("index_topk", index_topk)
        longest = config_value(config, "max_position_embeddings", None)
        if longest is not None and index_topk > longest:
            raise ValueError(f"index_topk must be at most max_position_embeddings={longest} (no sequence has more "
                             f"positions to choose from), got index_topk={index_topk}")
        return cls(*args, **kwargs, index_n_heads=config_value(config, "index_n_heads"),
                   index_head_dim=config_value(config, "index_head_dim"), index_topk=index_topk, sparse=sparse,
                   path=path)

    def forward(self, x, cache=None):
        """`x` `(B, T, hidden_size)` -> `(B, T, hidden_size)`; with `cache`, `x` continues the cached sequence."""
        check_input(x, self.hidden_size, self.o_proj.weight.dtype)
        B, T, C = x.shape
        start = 0 if cache is None else cache.length
        q_nope, q_rope, latent, k_rope, index_q, index_k, index_w = self.attention_inputs(x, start)
        if cache is not None:
            check_cache(self, cache, x)
            latent, k_rope, index_k, _ = cache.update(latent, k_rope, index_k)  # (B, 1, S, Dc), (B, 1, S, Dr), (B, S, Di)
        attn_output = self.attend(q_nope, q_rope, latent, k_rope, index_q, index_k, index_w)  # (B, H, T, Dv)
        attn_output = attn_output.transpose(1, 2).reshape(B, T, self.num_heads * self.v_head_dim)  # (B, T, H*Dv)
        return self.o_proj(attn_output)  # (B, T, C)

    def attention_inputs(self, x, start=0):
        """What attention reads of the tokens of `x` at positions `start ..`, after the projections: MLA's query parts
        `(B, H, T, Dn)`, `(B, H, T, Dr)`, latent `(B, 1, T, Dc)` and rotary key `(B, 1, T, Dr)`, and the indexer's
        queries `(B, Hi, T, Di)`, keys `(B, T, Di)` and head weights `(B, T, Hi)`."""
        B, T, C = x.shape
        H, Dn, Dr, Dc = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        compressed_query = self.q_a_layernorm(self.q_a_proj(x))  # (B, T, q_lora_rank): c^Q, read by MLA and the indexer
        q = self.q_b_proj(compressed_query).view(B, T, H, Dn + Dr).transpose(1, 2)  # (B, H, T, Dn+Dr)
        q_nope, q_rope = q.split([Dn, Dr], dim=-1)  # (B, H, T, Dn), (B, H, T, Dr)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split([Dc, Dr], dim=-1)  # (B, T, Dc), (B, T, Dr)
        latent = self.kv_a_layernorm(latent).unsqueeze(1)  # (B, 1, T, Dc)
        q_rope = self.rotary(q_rope, start)  # (B, H, T, Dr): MLA's layout (interleaved in DeepSeek's configs)
        k_rope = self.rotary(k_rope.unsqueeze(1), start)  # (B, 1, T, Dr)
        cos, sin = rotary_cos_sin(self, start, T, x)  # (T, Dr): the indexer's rotation, always in halves
        with torch.no_grad():  # a choice, not a function to differentiate: DeepSeek trains the indexer with its own loss
            index_q, index_k, index_w = self.indexer.queries_keys_weights(x, compressed_query, cos, sin)
        return q_nope, q_rope, latent, k_rope, index_q, index_k, index_w

    def attend(self, q_nope, q_rope, latent, k_rope, index_q, index_k, index_w):
        """`T` queries (the last `T` positions) over `S` cached positions, in the layer's form: `(B, H, T, Dv)`."""
        (B, _, T, _), S = q_nope.shape, latent.shape[2]
        causal = torch.arange(S - T, S, device=latent.device)[:, None] >= torch.arange(S, device=latent.device)  # (T, S)
        if self.sparse == "gather":
            return self.attend_gathered(q_nope, q_rope, latent, k_rope, index_q, index_k, index_w, causal)
        indices, valid = top_k_positions(index_scores(index_q, index_k, index_w), self.index_topk, causal)
        chosen = torch.zeros(B, T, S, dtype=torch.bool, device=latent.device).scatter(-1, indices, valid)  # (B, T, S)
        attend = self.attend_naive if self.path == "naive" else self.attend_absorbed
        return attend(q_nope, q_rope, latent, k_rope, chosen.unsqueeze(1))  # (B, H, T, Dv)

    def attend_gathered(self, q_nope, q_rope, latent, k_rope, index_q, index_k, index_w, causal):
        """Each query attends to its `index_topk` chosen positions only, read from the latent cache by index:
        `(B, H, T, Dv)`. Queries go in blocks (`BLOCK_ELEMENTS`): the indexer's `(B, Hi, block, S)` scores and the
        `(B, block, k, Dc + Dr)` gathered entries are all that grows with the context."""
        B, H, T, _ = q_nope.shape
        S, Dn, Dv, Dc = latent.shape[2], self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank
        w_kv = self.kv_b_proj.weight.view(H, Dn + Dv, Dc)  # (H, Dn+Dv, Dc)
        w_uk, w_uv = w_kv[:, :Dn], w_kv[:, Dn:]  # (H, Dn, Dc), (H, Dv, Dc)
        latent, k_rope = latent[:, 0], k_rope[:, 0]  # (B, S, Dc), (B, S, Dr): views of the cache, not copies
        sequences = torch.arange(B, device=latent.device).view(B, 1, 1)  # (B, 1, 1): picks each sequence's own rows
        # Each block's tensors are made, used and written into `output` in place: no list of blocks to concatenate,
        # and no copy of the cache (a decode step reads it as it lies).
        output = q_nope.new_empty(B, H, T, Dv)  # (B, H, T, Dv)
        for rows in query_blocks(T, S, max(index_q.shape[1], H)):
            scores = index_scores(index_q[:, :, rows], index_k, index_w[:, rows])  # (B, t, S)
            indices, valid = top_k_positions(scores, self.index_topk, causal[rows])  # (B, t, k) each
            picked_latent, picked_rope = latent[sequences, indices], k_rope[sequences, indices]  # (B, t, k, Dc), (B, t, k, Dr)
            q_latent = torch.einsum("bhtn,hnc->bhtc", q_nope[:, :, rows], w_uk)  # (B, H, t, Dc): W^UK folded into the query
            logits = (torch.einsum("bhtc,btkc->bhtk", q_latent, picked_latent)
                      + torch.einsum("bhtr,btkr->bhtk", q_rope[:, :, rows], picked_rope)) * self.scaling  # (B, H, t, k)
            logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
            weights = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
            weights = weights.to(logits.dtype)  # (B, H, t, k); every query sees at least its own position
            context = torch.einsum("bhtk,btkc->bhtc", weights, picked_latent)  # (B, H, t, Dc)
            output[:, :, rows] = torch.einsum("bhtc,hvc->bhtv", context, w_uv)  # (B, H, t, Dv): W^UV after attention
        return output

    def new_cache(self, batch_size, capacity):
        """An empty `IndexedLatentCache` for `batch_size` sequences of up to `capacity` positions, on the module's
        device and dtype."""
        weight = self.kv_b_proj.weight
        cache = IndexedLatentCache(batch_size, self.kv_lora_rank, self.qk_rope_head_dim, self.indexer.head_dim,
                                   capacity, dtype=weight.dtype, device=weight.device)
        cache.layer = (type(self).__name__, self.layer_idx)
        return cache
