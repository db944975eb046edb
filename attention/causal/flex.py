"""Causal multi-head self-attention with FlexAttention, compiled.

FlexAttention (https://pytorch.org/blog/flexattention/) takes the mask as a predicate
`mask_mod(b, h, q_idx, kv_idx) -> bool` (True = attend) and compiles it into a fused kernel that
skips every fully masked block; a position bias comes as a `score_mod(score, b, h, q_idx, kv_idx)`
fused into the same kernel. The `BlockMask` describing which blocks to skip costs time to build, so
it is built once per (sequence length, device) and reused.

`FlexCausalAttention` is also the FlexAttention machinery of its variants: a subclass changes only
`score_mod` and the matching dense `score_bias` (see `attention/causal/alibi_flex.py`).

Limits of PyTorch's FlexAttention that shape this class, stated rather than hidden:

* It has no dropout on the attention weights, so `dropout` must be 0 (else `ValueError`).
* It has no backward on CPU or MPS. There, when gradients are needed, the forward still runs the
  compiled FlexAttention kernel and the backward is computed densely (`FlexDenseBackward`); on
  CUDA, FlexAttention's own backward runs.
* Compiled on CPU, PyTorch 2.13 gave wrong rows for some short sequences: see `MIN_CPU_SEQ_LEN`.
"""

import math

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# Compiled once per process; uncompiled, flex_attention falls back to a slow dense reference.
# dynamic=False: one kernel specialised per (shape, dtype), the fastest, and inductor's CPU FlexAttention
# template fails on some dynamic-shape compiles.
_compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
# Past torch's default recompile_limit of 8 per function, flex_attention would run its slow uncompiled
# path (torch logs one warning, then keeps going), so allow many (one per shape and dtype in use).
RECOMPILE_LIMIT = 256
# PyTorch 2.13's compiled CPU FlexAttention gave wrong rows (garbage, no error, not on every run) for
# some sequences shorter than 64 tokens (seen at T = 8, 24, 40 and 56 on an AVX2 CPU).
MIN_CPU_SEQ_LEN = 128


def recompile_room(limit=RECOMPILE_LIMIT):
    """A context in which `torch.compile` keeps up to `limit` compiled variants per function.

    Past torch's default `recompile_limit` of 8, a compiled function falls back to eager after one
    logged warning (for FlexAttention: its slow dense reference), so code that compiles for many
    shapes or dtypes runs inside this. The one place the package sets torch's `recompile_limit`.
    """
    return torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=limit)


def compiled_flex_attention(*args, **kwargs):
    """`torch.compile(flex_attention)` with room for one compiled kernel per (shape, dtype) in use."""
    with recompile_room():
        return _compiled_flex_attention(*args, **kwargs)


# Same as attention/masks/patterns.py::causal
def causal(b, h, q_idx, kv_idx):
    """Query i attends to keys j <= i (decoder self-attention)."""
    return q_idx >= kv_idx


class FlexDenseBackward(torch.autograd.Function):
    """Compiled FlexAttention forward, with the attention backward computed densely.

    Used where PyTorch's FlexAttention has no backward (CPU, MPS); compiled FlexAttention on CPU
    cannot return the log-sum-exp either, so the backward recomputes the weights
    `P = softmax(q k^T * scale + score_bias)` (`score_bias`: the `score_mod` as an additive tensor,
    `-inf` where masked), then applies the FlashAttention backward formulas: `dV = P^T dO`,
    `dS = P * (dO V^T - rowsum(dO * O))`, `dQ = dS K * scale`, `dK = dS^T Q * scale`. The bias is a
    constant, so it adds no gradient term.
    """

    @staticmethod
    def forward(ctx, q, k, v, block_mask, score_mod, score_bias, scale):
        # Detached: FlexAttention refuses inputs that require grad on CPU, even under no_grad.
        out = compiled_flex_attention(q.detach(), k.detach(), v.detach(), score_mod=score_mod, block_mask=block_mask,
                                      scale=scale)
        ctx.save_for_backward(q, k, v, out, score_bias)  # out: (B, H, T, D); score_bias: (H or 1, T, S)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, score_bias = ctx.saved_tensors
        scores = (q @ k.transpose(-2, -1)) * ctx.scale + score_bias  # (B, H, T, S)
        attn_weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        grad_v = attn_weights.transpose(-2, -1) @ grad_out  # (B, H, S, D)
        grad_weights = grad_out @ v.transpose(-2, -1)  # (B, H, T, S)
        row_dot = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, H, T, 1)
        grad_scores = attn_weights * (grad_weights - row_dot)  # (B, H, T, S)
        grad_q = grad_scores @ k * ctx.scale  # (B, H, T, D)
        grad_k = grad_scores.transpose(-2, -1) @ q * ctx.scale  # (B, H, S, D)
        return grad_q, grad_k, grad_v, None, None, None, None


class FlexCausalAttention(nn.Module):
    """Causal multi-head self-attention on compiled FlexAttention: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.

    Args:
        dropout: must be 0.0: FlexAttention has no attention-weight dropout.
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        init_family(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)  # sizes, q/k/v/out projections
        if dropout != 0:
            raise ValueError(f"FlexAttention has no dropout on the attention weights: dropout must be 0.0, got dropout={dropout}")
        self.block_masks = {}  # (T, device) -> BlockMask, built on first use

    def score_mod(self, dtype):
        """The FlexAttention `score_mod` applied to every score; None: the scores as they are."""
        return None

    def score_bias(self, T, device, dtype):
        """`score_mod` and the causal mask as one additive `(H or 1, T, T)` tensor, for the dense backward."""
        positions = torch.arange(T, device=device)
        attend = causal(None, None, positions[:, None], positions[None, :])  # (T, T), True = attend
        return torch.zeros(1, T, T, device=device, dtype=dtype).masked_fill(~attend, float("-inf"))  # (1, T, T)

    def block_mask(self, T, device):
        """The causal `BlockMask` for length `T` on `device`, built once and reused."""
        cache_key = (T, str(device))
        if cache_key not in self.block_masks:
            self.block_masks[cache_key] = create_block_mask(causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)
        return self.block_masks[cache_key]

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        D = self.head_dim
        q, k, v = project_heads(self, x)  # (B, H, T, D) each
        # Short sequences run padded on CPU (see MIN_CPU_SEQ_LEN): zero tokens appended after the last
        # one change nothing under a causal mask, and the extra rows are cut off below.
        T_run = max(T, MIN_CPU_SEQ_LEN) if x.device.type == "cpu" else T
        if T_run > T:
            q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, T_run - T)) for t in (q, k, v))  # (B, H, T_run, D)
        block_mask = self.block_mask(T_run, x.device)
        score_mod = self.score_mod(q.dtype)
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        if needs_grad and x.device.type in ("cpu", "mps"):
            score_bias = self.score_bias(T_run, x.device, q.dtype)  # (H or 1, T_run, T_run)
            context = FlexDenseBackward.apply(q, k, v, block_mask, score_mod, score_bias, 1 / math.sqrt(D))  # (B, H, T_run, D)
        else:
            context = compiled_flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)  # (B, H, T_run, D)
        context = context[:, :, :T]  # (B, H, T, D)
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
