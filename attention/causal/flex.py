"""Causal multi-head self-attention with FlexAttention, compiled.

FlexAttention (https://pytorch.org/blog/flexattention/) takes the mask as a predicate
`mask_mod(b, h, q_idx, kv_idx) -> bool` (True = attend) and compiles it into a fused kernel that
skips every fully masked block. The `BlockMask` describing which blocks to skip costs time to
build, so it is built once per (sequence length, device) and reused.

Two limits of PyTorch's FlexAttention shape this class, and it states them rather than hiding them:

* It has no dropout on the attention weights, so `dropout` must be 0 (else `ValueError`).
* It has no backward on CPU or MPS. There, when gradients are needed, the forward still runs the
  compiled FlexAttention kernel and the backward is computed densely
  (`FlexDenseBackward`); on CUDA, FlexAttention's own backward runs.

A widely copied FlexAttention class could not run at all: it called `flex_attention` with a
`(T, T)` boolean tensor as `block_mask` and never compiled it. This one builds a real `BlockMask`.
"""

import math

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# Compiled once per process; uncompiled, flex_attention falls back to a slow dense reference.
_compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
# dynamic=False: one kernel specialised per (shape, dtype), the fastest, and inductor's CPU FlexAttention
# template fails on some dynamic-shape compiles. Past torch's default of 8 recompiles per function,
# flex_attention would silently run its slow uncompiled path, so allow many.
RECOMPILE_LIMIT = 256
# PyTorch 2.13's compiled CPU FlexAttention gave wrong rows (garbage, no error, not on every run) for
# some sequences shorter than 64 tokens (seen at T = 8, 24, 40 and 56 on an AVX2 CPU).
MIN_CPU_SEQ_LEN = 128


def compiled_flex_attention(*args, **kwargs):
    """`torch.compile(flex_attention)` with room for one compiled kernel per (shape, dtype) in use."""
    with torch._dynamo.config.patch(cache_size_limit=RECOMPILE_LIMIT, accumulated_cache_size_limit=RECOMPILE_LIMIT):
        return _compiled_flex_attention(*args, **kwargs)


def causal(b, h, q_idx, kv_idx):
    """FlexAttention mask predicate: True where query `q_idx` may attend to key `kv_idx`."""
    return q_idx >= kv_idx


class FlexDenseBackward(torch.autograd.Function):
    """Compiled FlexAttention forward, with the attention backward computed densely.

    Used where PyTorch's FlexAttention has no backward (CPU, MPS); compiled FlexAttention on CPU
    cannot return the log-sum-exp either, so the backward recomputes the weights `P` with a
    masked softmax, then applies the FlashAttention backward formulas: `dV = P^T dO`,
    `dS = P * (dO V^T - rowsum(dO * O))`, `dQ = dS K * scale`, `dK = dS^T Q * scale`.
    """

    @staticmethod
    def forward(ctx, q, k, v, block_mask, dense_mask, scale):
        # Detached: FlexAttention refuses inputs that require grad on CPU, even under no_grad.
        out = compiled_flex_attention(q.detach(), k.detach(), v.detach(), block_mask=block_mask, scale=scale)
        ctx.save_for_backward(q, k, v, out, dense_mask)  # out: (B, H, T, D)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, dense_mask = ctx.saved_tensors
        scores = (q @ k.transpose(-2, -1)) * ctx.scale  # (B, H, T, S)
        attn_weights = torch.softmax(scores.masked_fill(~dense_mask, float("-inf")), dim=-1)  # (B, H, T, S)
        grad_v = attn_weights.transpose(-2, -1) @ grad_out  # (B, H, S, D)
        grad_weights = grad_out @ v.transpose(-2, -1)  # (B, H, T, S)
        row_dot = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, H, T, 1)
        grad_scores = attn_weights * (grad_weights - row_dot)  # (B, H, T, S)
        grad_q = grad_scores @ k * ctx.scale  # (B, H, T, D)
        grad_k = grad_scores.transpose(-2, -1) @ q * ctx.scale  # (B, H, S, D)
        return grad_q, grad_k, grad_v, None, None, None


class FlexCausalAttention(nn.Module):
    """Causal multi-head self-attention on compiled FlexAttention: `(B, T, d_in) -> (B, T, d_out)`.

    Args:
        d_in: features of the input `x`.
        d_out: features of the output; split into `num_heads` heads of `d_out // num_heads`.
        context_length: longest sequence accepted.
        dropout: must be 0.0: FlexAttention has no attention-weight dropout.
        num_heads: number of heads.
        qkv_bias: add a bias to the query, key and value projections.
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        check_init_args(d_in, d_out, context_length, dropout, num_heads)
        if dropout != 0:
            raise ValueError(f"FlexAttention has no dropout on the attention weights: dropout must be 0.0, got dropout={dropout}")
        self.d_in, self.d_out, self.context_length = d_in, d_out, context_length
        self.num_heads, self.head_dim, self.qkv_bias = num_heads, d_out // num_heads, qkv_bias
        self.query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out = nn.Linear(d_out, d_out)
        self.block_masks = {}  # (T, device) -> BlockMask, built on first use

    def block_mask(self, T, device):
        """The causal `BlockMask` for length `T` on `device`, built once and reused."""
        cache_key = (T, str(device))
        if cache_key not in self.block_masks:
            self.block_masks[cache_key] = create_block_mask(causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)
        return self.block_masks[cache_key]

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.query(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.key(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = self.value(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        # Short sequences run padded on CPU (see MIN_CPU_SEQ_LEN): zero tokens appended after the last
        # one change nothing under a causal mask, and the extra rows are cut off below.
        T_run = max(T, MIN_CPU_SEQ_LEN) if x.device.type == "cpu" else T
        if T_run > T:
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, T_run - T)) for t in (q, k, v))  # (B, H, T_run, D)
        block_mask = self.block_mask(T_run, x.device)
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if needs_grad and x.device.type in ("cpu", "mps"):
            positions = torch.arange(T_run, device=x.device)
            dense_mask = causal(None, None, positions[:, None], positions[None, :])  # (T_run, T_run), True = attend
            context = FlexDenseBackward.apply(q, k, v, block_mask, dense_mask, 1 / math.sqrt(D))  # (B, H, T_run, D)
        else:
            context = compiled_flex_attention(q, k, v, block_mask=block_mask)  # (B, H, T_run, D)
        context = context[:, :, :T]  # (B, H, T, D)
        context = context.transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)

    def canonical_state_dict(self):
        """Weights under the names every implementation shares."""
        return {name: tensor.detach().clone() for name, tensor in self.state_dict().items()}

    def load_canonical_state_dict(self, state):
        """Load the shared form: see `SplitHeadsAttention.load_canonical_state_dict`."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        self.load_state_dict(state)


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
