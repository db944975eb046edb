"""Causal multi-head self-attention computed tile by tile with the online softmax, in plain PyTorch.

FlashAttention's algorithm (Dao et al., 2022, https://arxiv.org/abs/2205.14135, Algorithm 1; the
loop order of FlashAttention-2, https://arxiv.org/abs/2307.08691), written for reading, not speed:
queries and keys are taken in blocks of `block_size`, and for each block of queries a running
maximum `m`, a running sum `l` and an unnormalised output `acc` are updated as each block of keys
arrives. When a new block raises the maximum, the old sum and output are rescaled by
`exp(m_old - m_new)`, so at the end `acc / l` is exactly the softmax-weighted sum of the values, and
no `(T, T)` score matrix ever exists: memory is O(T) in the sequence length, plus one
`(block_size, block_size)` tile per head. Blocks above the causal diagonal are skipped.

The backward pass recomputes each tile's scores from the queries, the keys and the saved
log-sum-exp of every row (`m + log l`) instead of storing the attention weights, as the paper does:
training memory is O(T) too. It is slower than the fused kernels (Python loops over tiles); its point
is to be read and measured.
"""

import math

import torch
from torch import nn


class TiledAttention(nn.Module):
    """Causal multi-head self-attention by tiles with the online softmax: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.
    Keyword `block_size` (default 128): the side of the query and key tiles. There is no dropout on the
    attention weights, so `dropout` must be 0 (else `ValueError`).
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, *, block_size=128):
        super().__init__()
        init_family(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)  # sizes, q/k/v/out projections
        if dropout != 0:
            raise ValueError(f"tiled attention has no dropout on the attention weights: dropout must be 0.0, "
                             f"got dropout={dropout}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got block_size={block_size!r}")
        self.block_size = block_size

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        q, k, v = project_heads(self, x)  # (B, H, T, D) each
        context = tiled_attention(q, k, v, self.block_size, causal=True)  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.canonical_state_dict
    def canonical_state_dict(self):
        """The weights under the names every implementation shares (`attention.causal.CausalSelfAttention`)."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    # Same as attention/causal/split_heads.py::SplitHeadsAttention.load_canonical_state_dict
    def load_canonical_state_dict(self, state):
        """Load the canonical state dict (`attention.causal.CausalSelfAttention`)."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        self.load_state_dict(state)


def tiled_attention(q, k, v, block_size=128, causal=True, mask=None):
    """Softmax attention of `q` `(B, H, Tq, D)` over `k`, `v` `(B, H, Tk, D)` by tiles: `(B, H, Tq, D)`.

    Exact (up to rounding) and differentiable; memory O(Tq + Tk) per head besides one tile of scores.

    Args:
        block_size: side of the query and key tiles; need not divide the lengths.
        causal: query i attends to keys `<= i + (Tk - Tq)` (lower-right aligned, as in decoding where the
            queries are the last `Tq` positions); tiles wholly above that diagonal are skipped.
        mask: optional boolean mask, True = attend, broadcastable to `(B, H, Tq, Tk)`. A query that may
            attend to no key gets a zero output (and zero gradients), not NaN.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got block_size={block_size!r}")
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q must be (B, H, Tq, D) and k, v (B, H, Tk, D), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a boolean tensor (True = attend), got mask.dtype={mask.dtype}")
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])  # (B, H, Tq, Tk), a view
    return _TiledAttention.apply(q, k, v, block_size, causal, mask)


def _tiles(Tq, Tk, block_size, causal):
    """`(q_start, q_end, [(k_start, k_end), ...])` for each query tile: the key tiles it needs."""
    offset = Tk - Tq  # query i sits at key position i + offset
    for q_start in range(0, Tq, block_size):
        q_end = min(q_start + block_size, Tq)
        k_stop = min(Tk, q_end + offset) if causal else Tk  # keys past the tile's last query are all masked
        yield q_start, q_end, [(k_start, min(k_start + block_size, k_stop)) for k_start in range(0, k_stop, block_size)]


def _tile_scores(q_tile, k_tile, scale, q_start, k_start, offset, causal, mask_tile):
    """Scaled scores of one tile `(B, H, bq, bk)`, -inf where the query may not attend."""
    scores = (q_tile @ k_tile.transpose(-2, -1)) * scale  # (B, H, bq, bk)
    allowed = None
    if causal and k_start + k_tile.shape[-2] - 1 > q_start + offset:  # the tile crosses the diagonal
        q_pos = torch.arange(q_start, q_start + q_tile.shape[-2], device=q_tile.device) + offset
        k_pos = torch.arange(k_start, k_start + k_tile.shape[-2], device=q_tile.device)
        allowed = q_pos[:, None] >= k_pos[None, :]  # (bq, bk)
    if mask_tile is not None:
        allowed = mask_tile if allowed is None else allowed & mask_tile
    return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))



def _online_softmax_update(row_max, row_sum, acc, scores, v_tile):
    """Fold one tile of scores `(B, H, bq, bk)` (-inf where masked) and its values `(B, H, bk, D)` into the
    running maximum `m` and sum `l` `(B, H, bq)` and unnormalised output `acc` `(B, H, bq, D)` of its
    queries; return the three updated. Where the tile raises the maximum, what was summed so far is
    rescaled by `exp(m_old - m_new)` (the online softmax)."""
    new_max = torch.maximum(row_max, scores.amax(dim=-1))  # (B, H, bq)
    safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)  # no -inf - -inf
    weights = torch.exp(scores - safe_max[..., None])  # (B, H, bq, bk): 0 where masked
    rescale = torch.exp(row_max - safe_max)  # (B, H, bq): 0 while nothing was seen yet
    row_sum = rescale * row_sum + weights.sum(dim=-1)
    acc = rescale[..., None] * acc + weights @ v_tile  # (B, H, bq, D)
    return new_max, row_sum, acc


def _finish_rows(row_max, row_sum, acc):
    """The output `acc / l` `(B, H, bq, D)` and log-sum-exp `m + log l` `(B, H, bq)` of rows whose keys are all
    folded in; a row that could attend to no key gets a zero output and a log-sum-exp of -inf."""
    seen = row_sum > 0  # False for a query that may attend to no key
    out = torch.where(seen[..., None], acc / row_sum.clamp_min(1e-30)[..., None], torch.zeros_like(acc))
    lse = torch.where(seen, row_max + torch.log(row_sum.clamp_min(1e-30)), torch.full_like(row_max, float("-inf")))
    return out, lse  # (B, H, bq, D), (B, H, bq)


def _tile_gradients(q_tile, k_tile, v_tile, grad_out_tile, scores, lse_tile, delta_tile, scale):
    """One tile's share of the gradients, from its recomputed scores `(B, H, bq, bk)`, the saved log-sum-exp
    `(B, H, bq)` of its queries and their row term `delta = dO . O` `(B, H, bq)`: `(grad_q, grad_k, grad_v)`,
    `(B, H, bq, D)`, `(B, H, bk, D)`, `(B, H, bk, D)` (FlashAttention's Algorithm 2, one tile)."""
    safe_lse = torch.where(torch.isinf(lse_tile), torch.zeros_like(lse_tile), lse_tile)  # rows that saw no key
    weights = torch.exp(scores - safe_lse[..., None])  # (B, H, bq, bk): P, recomputed
    weights = torch.where(torch.isinf(lse_tile[..., None]), torch.zeros_like(weights), weights)  # P = 0 there
    grad_v = weights.transpose(-2, -1) @ grad_out_tile  # (B, H, bk, D)
    grad_weights = grad_out_tile @ v_tile.transpose(-2, -1)  # (B, H, bq, bk): dP
    grad_scores = weights * (grad_weights - delta_tile[..., None])  # (B, H, bq, bk): dS
    grad_q = (grad_scores @ k_tile) * scale  # (B, H, bq, D)
    grad_k = (grad_scores.transpose(-2, -1) @ q_tile) * scale  # (B, H, bk, D)
    return grad_q, grad_k, grad_v

class _TiledAttention(torch.autograd.Function):
    """Forward by tiles with the online softmax; backward by recomputing each tile from the saved
    output and log-sum-exp (FlashAttention, Algorithms 1 and 2)."""

    @staticmethod
    def forward(ctx, q, k, v, block_size, causal, mask):
        B, H, Tq, D = q.shape
        Tk = k.shape[-2]
        scale, offset = 1.0 / math.sqrt(D), Tk - Tq
        acc_dtype = torch.promote_types(q.dtype, torch.float32)  # running statistics in float32 at least
        out = torch.zeros_like(q)  # rows no tile reaches stay zero
        lse = torch.full((B, H, Tq), float("-inf"), dtype=acc_dtype, device=q.device)  # log-sum-exp per query
        for q_start, q_end, k_tiles in _tiles(Tq, Tk, block_size, causal):
            q_tile = q[:, :, q_start:q_end].to(acc_dtype)  # (B, H, bq, D)
            row_max = torch.full((B, H, q_end - q_start), float("-inf"), dtype=acc_dtype, device=q.device)  # m
            row_sum = torch.zeros_like(row_max)  # l
            acc = torch.zeros_like(q_tile)  # (B, H, bq, D): unnormalised output
            for k_start, k_end in k_tiles:
                mask_tile = None if mask is None else mask[:, :, q_start:q_end, k_start:k_end]
                scores = _tile_scores(q_tile, k[:, :, k_start:k_end].to(acc_dtype), scale, q_start, k_start, offset,
                                      causal, mask_tile)  # (B, H, bq, bk)
                row_max, row_sum, acc = _online_softmax_update(row_max, row_sum, acc, scores,
                                                               v[:, :, k_start:k_end].to(acc_dtype))
            out_tile, lse[:, :, q_start:q_end] = _finish_rows(row_max, row_sum, acc)  # (B, H, bq, D), (B, H, bq)
            out[:, :, q_start:q_end] = out_tile.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block_size, ctx.causal, ctx.mask = block_size, causal, mask
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        block_size, causal, mask = ctx.block_size, ctx.causal, ctx.mask
        B, H, Tq, D = q.shape
        Tk = k.shape[-2]
        scale, offset = 1.0 / math.sqrt(D), Tk - Tq
        acc_dtype = lse.dtype
        grad_q = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
        grad_k = torch.zeros(k.shape, dtype=acc_dtype, device=k.device)
        grad_v = torch.zeros(v.shape, dtype=acc_dtype, device=v.device)
        # delta_i = sum_j P_ij dP_ij = dO_i . O_i: the softmax backward's row term, from the saved output.
        delta = (grad_out.to(acc_dtype) * out.to(acc_dtype)).sum(dim=-1)  # (B, H, Tq)
        for q_start, q_end, k_tiles in _tiles(Tq, Tk, block_size, causal):
            q_tile = q[:, :, q_start:q_end].to(acc_dtype)  # (B, H, bq, D)
            grad_out_tile = grad_out[:, :, q_start:q_end].to(acc_dtype)  # (B, H, bq, D)
            for k_start, k_end in k_tiles:
                k_tile, v_tile = k[:, :, k_start:k_end].to(acc_dtype), v[:, :, k_start:k_end].to(acc_dtype)
                mask_tile = None if mask is None else mask[:, :, q_start:q_end, k_start:k_end]
                scores = _tile_scores(q_tile, k_tile, scale, q_start, k_start, offset, causal, mask_tile)
                grad_q_tile, grad_k_tile, grad_v_tile = _tile_gradients(
                    q_tile, k_tile, v_tile, grad_out_tile, scores, lse[:, :, q_start:q_end], delta[:, :, q_start:q_end],
                    scale)
                grad_q[:, :, q_start:q_end] += grad_q_tile  # (B, H, bq, D)
                grad_k[:, :, k_start:k_end] += grad_k_tile  # (B, H, bk, D)
                grad_v[:, :, k_start:k_end] += grad_v_tile  # (B, H, bk, D)
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None, None, None


# Same as attention/causal/split_heads.py::init_sizes
def init_sizes(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias):
    """Check the family's constructor arguments (clear errors) and keep the sizes on `module`."""
    check_init_args(d_in, d_out, context_length, dropout, num_heads)
    module.d_in, module.d_out, module.context_length = d_in, d_out, context_length
    module.num_heads, module.head_dim, module.qkv_bias = num_heads, d_out // num_heads, qkv_bias


# Same as attention/causal/split_heads.py::init_family
def init_family(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias):
    """`init_sizes`, then the query, key and value projections `d_in -> d_out` and the output projection."""
    init_sizes(module, d_in, d_out, context_length, dropout, num_heads, qkv_bias)
    module.query = nn.Linear(d_in, d_out, bias=qkv_bias)
    module.key = nn.Linear(d_in, d_out, bias=qkv_bias)
    module.value = nn.Linear(d_in, d_out, bias=qkv_bias)
    module.out = nn.Linear(d_out, d_out)


# Same as attention/causal/split_heads.py::project_heads
def project_heads(module, x):
    """The queries, keys and values of `x` `(B, T, d_in)`, each split into heads: `(B, H, T, D)`."""
    B, T, C = x.shape
    H, D = module.num_heads, module.head_dim
    q = module.query(x).view(B, T, H, D).transpose(1, 2)  # (B, T, d_out) -> (B, T, H, D) -> (B, H, T, D)
    k = module.key(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    v = module.value(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    return q, k, v


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


# Same as attention/causal/split_heads.py::check_canonical_state
def check_canonical_state(state, d_in, d_out, qkv_bias):
    """Raise a clear error unless `state` holds exactly the canonical keys with the right shapes."""
    shapes = {"query.weight": (d_out, d_in), "key.weight": (d_out, d_in), "value.weight": (d_out, d_in),
              "out.weight": (d_out, d_out), "out.bias": (d_out,)}
    if qkv_bias:
        shapes.update({"query.bias": (d_out,), "key.bias": (d_out,), "value.bias": (d_out,)})
    missing, extra = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
    if missing or extra:
        raise ValueError(f"canonical state dict: missing keys {missing}, unexpected keys {extra}")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise ValueError(f"canonical state dict: {name} must have shape {shape}, got {tuple(state[name].shape)}")
