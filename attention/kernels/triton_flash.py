"""FlashAttention-2 in Triton: forward and backward, causal or not, on `(B, H, T, D)` tensors.

The algorithm of `attention/causal/tiled.py`, written as a GPU kernel. One program takes a tile of `BLOCK_M` queries
of one head and walks over the keys a tile of `BLOCK_N` at a time, keeping for each query its running maximum score
`m`, its running softmax denominator `l` and its unnormalized output `acc` (the online softmax): the `(T, T)` score
matrix never exists in memory, only `(BLOCK_M, BLOCK_N)` tiles of it. The forward saves one number per query, the
log-sum-exp `m + log(l)`; the backward recomputes each tile's probabilities from it, once in a program per key tile
(for dK and dV, summed over the query tiles) and once in a program per query tile (for dQ, over the key tiles).

Without a GPU the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`, set here before the kernels are
defined when CUDA is not available): the same code, executed by NumPy on the CPU, exact enough to check against
float64 and far too slow to time. Needs Triton (Linux x86-64 wheels; the `test` and `docs` extras install it there).

Anchors: Tri Dao, "FlashAttention-2" (2023), Algorithms 1 and 2; Triton's fused-attention tutorial.
"""

import math
import os
import sys

import torch

if not torch.cuda.is_available():  # no GPU: the kernels below are defined for Triton's interpreter
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise ImportError("Triton was imported before TRITON_INTERPRET=1 was set, and without a GPU its kernels run "
                          "only in its interpreter: set TRITON_INTERPRET=1 in the environment before Python starts")
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton
    import triton.language as tl
except ImportError as error:  # pragma: no cover (platform: Triton ships wheels for Linux x86-64 only)
    raise ImportError("attention.kernels.triton_flash needs Triton, which ships wheels for Linux x86-64: "
                      "pip install -e '.[test]' (or pip install triton)") from error

MAX_HEAD_DIM = 128
BLOCK_M, BLOCK_N = 64, 64  # a tile of queries, a tile of keys
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # the kernels run in Triton's interpreter


@triton.jit
def _dot(a, b, WIDEN: tl.constexpr):
    """`a @ b` in float32: exact products for float32 tiles (not TensorFloat-32). `WIDEN`: bfloat16 and float16 tiles
    widened to float32 first, for the interpreter, whose `tl.dot` mishandles them (Triton 3.9)."""
    if WIDEN:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _forward(Q, K, V, O, LSE, scale, T_q, T_k, H, GROUP, D,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
             WIDEN: tl.constexpr):
    tile, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # this program: one tile of queries of one (batch, head)
    kv = (bh // H) * (H // GROUP) + (bh % H) // GROUP  # the K/V head this query head reads
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    dims = tl.arange(0, BLOCK_D)  # (BLOCK_D,) D padded to a power of two
    row_ok, dim_ok = rows < T_q, dims < D
    q = tl.load(Q + bh * T_q * D + rows[:, None] * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running maximum score per query
    l = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(score - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # running sum of exp(score - m) * v
    end = T_k
    if CAUSAL:  # no key past the tile's last query
        end = tl.minimum(T_k, (tile + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        kv_mask = (keys < T_k)[:, None] & dim_ok[None, :]
        k = tl.load(K + kv * T_k * D + keys[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + kv * T_k * D + keys[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), WIDEN) * scale  # (BLOCK_M, BLOCK_N) scores
        allowed = (keys < T_k)[None, :]
        if CAUSAL:
            allowed = allowed & (keys[None, :] <= rows[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet: exp(-inf) = 0
        p = tl.exp(s - m_safe[:, None])  # (BLOCK_M, BLOCK_N)
        correction = tl.exp(m - m_safe)  # rescales what was summed against the old maximum
        l = l * correction + tl.sum(p, 1)
        acc = acc * correction[:, None] + _dot(p.to(v.dtype), v, WIDEN)
        m = m_new
    l_safe = tl.where(l == 0.0, 1.0, l)  # a query with no key: output 0, never NaN
    out = acc / l_safe[:, None]
    tl.store(O + bh * T_q * D + rows[:, None] * D + dims[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(LSE + bh * T_q + rows, tl.where(m == float("-inf"), 0.0, m) + tl.log(l_safe), mask=row_ok)


@triton.jit
def _backward_kv(Q, K, V, DO, LSE, DELTA, DK, DV, scale, T_q, T_k, H, GROUP, D,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
             WIDEN: tl.constexpr):
    tile, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # one tile of keys, as read by one query head
    kv = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    key_ok, dim_ok = keys < T_k, dims < D
    kv_mask = key_ok[:, None] & dim_ok[None, :]
    k = tl.load(K + kv * T_k * D + keys[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + kv * T_k * D + keys[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    first = 0
    if CAUSAL:  # no query before the tile's first key
        first = (tile * BLOCK_N // BLOCK_M) * BLOCK_M
    for start in range(first, T_q, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < T_q
        q_mask = row_ok[:, None] & dim_ok[None, :]
        q = tl.load(Q + bh * T_q * D + rows[:, None] * D + dims[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + bh * T_q * D + rows[:, None] * D + dims[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + bh * T_q + rows, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * T_q + rows, mask=row_ok, other=0.0)
        s = _dot(q, tl.trans(k), WIDEN) * scale  # the forward's scores, recomputed
        allowed = row_ok[:, None] & key_ok[None, :]
        if CAUSAL:
            allowed = allowed & (keys[None, :] <= rows[:, None])
        p = tl.where(allowed, tl.exp(s - lse[:, None]), 0.0)  # the forward's probabilities, recomputed
        dv += _dot(tl.trans(p).to(do.dtype), do, WIDEN)
        dp = _dot(do, tl.trans(v), WIDEN)  # dL/dp
        ds = p * (dp - delta[:, None])  # dL/ds: the softmax's backward, delta = rowsum(dO * O)
        dk += _dot(tl.trans(ds).to(q.dtype), q, WIDEN)
    tl.store(DK + bh * T_k * D + keys[:, None] * D + dims[None, :], dk * scale, mask=kv_mask)
    tl.store(DV + bh * T_k * D + keys[:, None] * D + dims[None, :], dv, mask=kv_mask)


@triton.jit
def _backward_q(Q, K, V, DO, LSE, DELTA, DQ, scale, T_q, T_k, H, GROUP, D,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
             WIDEN: tl.constexpr):
    tile, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # one tile of queries of one (batch, head)
    kv = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < T_q, dims < D
    q_mask = row_ok[:, None] & dim_ok[None, :]
    q = tl.load(Q + bh * T_q * D + rows[:, None] * D + dims[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + bh * T_q * D + rows[:, None] * D + dims[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * T_q + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * T_q + rows, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = T_k
    if CAUSAL:
        end = tl.minimum(T_k, (tile + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv_mask = (keys < T_k)[:, None] & dim_ok[None, :]
        k = tl.load(K + kv * T_k * D + keys[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + kv * T_k * D + keys[:, None] * D + dims[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), WIDEN) * scale
        allowed = row_ok[:, None] & (keys < T_k)[None, :]
        if CAUSAL:
            allowed = allowed & (keys[None, :] <= rows[:, None])
        p = tl.where(allowed, tl.exp(s - lse[:, None]), 0.0)
        ds = p * (_dot(do, tl.trans(v), WIDEN) - delta[:, None])
        dq += _dot(ds.to(k.dtype), k, WIDEN)
    tl.store(DQ + bh * T_q * D + rows[:, None] * D + dims[None, :], dq * scale, mask=q_mask)


def _launch_sizes(q, k):
    """The sizes every kernel takes: `(B, H, T_q, T_k, group, D, BLOCK_D)` (`D` padded to a power of two, at least 16,
    the smallest side `tl.dot` takes)."""
    B, H, T_q, D = q.shape
    return B, H, T_q, k.shape[2], H // k.shape[1], D, max(16, triton.next_power_of_2(D))


class FlashAttentionFunction(torch.autograd.Function):
    """`flash_attention` as an autograd function: the forward saves the inputs, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        q, k, v = (t.contiguous() for t in (q, k, v))
        B, H, T_q, T_k, group, D, BLOCK_D = _launch_sizes(q, k)
        out = torch.empty_like(q)  # (B, H, T_q, D)
        lse = torch.empty(B, H, T_q, device=q.device, dtype=torch.float32)  # (B, H, T_q)
        _forward[(triton.cdiv(T_q, BLOCK_M), B * H)](q, k, v, out, lse, scale, T_q, T_k, H, group, D, BLOCK_M=BLOCK_M,
                                                      BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, CAUSAL=causal,
                                                      WIDEN=INTERPRETED and q.dtype != torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        B, H, T_q, T_k, group, D, BLOCK_D = _launch_sizes(q, k)
        delta = (grad_out.float() * out.float()).sum(-1)  # (B, H, T_q): rowsum(dO * O), the softmax backward's term
        dq = torch.empty(q.shape, device=q.device, dtype=torch.float32)
        dk = torch.empty(B, H, T_k, D, device=q.device, dtype=torch.float32)  # per query head: summed per group below
        dv = torch.empty_like(dk)
        sizes = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, CAUSAL=ctx.causal,
                     WIDEN=INTERPRETED and q.dtype != torch.float32)
        _backward_kv[(triton.cdiv(T_k, BLOCK_N), B * H)](q, k, v, grad_out, lse, delta, dk, dv, ctx.scale, T_q, T_k, H,
                                                         group, D, **sizes)
        _backward_q[(triton.cdiv(T_q, BLOCK_M), B * H)](q, k, v, grad_out, lse, delta, dq, ctx.scale, T_q, T_k, H,
                                                        group, D, **sizes)
        dk, dv = (grad.view(B, H // group, group, T_k, D).sum(2) for grad in (dk, dv))  # (B, H_kv, T_k, D)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def flash_attention(q, k, v, causal=False, scale=None):
    """Attention of `q` over `k` and `v` by FlashAttention-2's tiles, in Triton.

    Args:
        q: `(B, H, T_q, D)` queries; `k`, `v`: `(B, H_kv, T_k, D)`, `H_kv` dividing `H` (grouped-query attention:
            query head `h` reads K/V head `h // (H // H_kv)`). Float32, bfloat16 or float16, on one device; `D` at most
            128.
        causal: query `i` attends to keys `0..i` (needs `T_q == T_k`).
        scale: the score scale, default `1 / sqrt(D)`.

    Returns:
        `(B, H, T_q, D)`, differentiable in `q`, `k` and `v`.
    """
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError(f"q, k and v must be tensors, got {type(q).__name__}, {type(k).__name__}, {type(v).__name__}")
    shapes = f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or (q.shape[0], q.shape[3]) != (k.shape[0], k.shape[3]):
        raise ValueError(f"q must be (B, H, T_q, D) and k, v both (B, H_kv, T_k, D), got {shapes}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"k and v's heads must divide q's, got {shapes}")
    if not 1 <= q.shape[3] <= MAX_HEAD_DIM or 0 in q.shape or 0 in k.shape:
        raise ValueError(f"the head size D must be 1 to {MAX_HEAD_DIM} and no size 0, got {shapes}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal=True needs as many queries as keys, got {shapes}")
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or {k.dtype, v.dtype} != {q.dtype}:
        raise TypeError(f"q, k and v must share one of float32, bfloat16, float16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if {k.device, v.device} != {q.device}:
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    scale = 1 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    return FlashAttentionFunction.apply(q, k, v, bool(causal), scale)
