"""Sequence-first multi-head attention with a `PrepareForMultiHeadAttention` layer.

After labml.ai's annotated implementation (https://nn.labml.ai/transformers/mha.html): tensors are
`(T, B, ...)`, one small layer projects and splits heads in a single step, and einsum indices
`i`/`j` name the query/key positions. The softmax runs over `j`, dimension 1 of the `(T, S, B, H)`
scores. This class keeps that inner layout but takes and returns `(B, T, C)` like every other
implementation here, so it drops into the same model.
"""

import math

import torch
from torch import nn


class PrepareForMultiHeadAttention(nn.Module):
    """Project `(..., d_in)` to `(..., H, D)`: one linear layer, then split the features into heads."""

    def __init__(self, d_in, num_heads, head_dim, bias):
        super().__init__()
        self.linear = nn.Linear(d_in, num_heads * head_dim, bias=bias)
        self.num_heads, self.head_dim = num_heads, head_dim

    def forward(self, x):
        head_shape = x.shape[:-1]  # (T, B)
        return self.linear(x).view(*head_shape, self.num_heads, self.head_dim)  # (T, B, H, D)


class SeqFirstAttention(nn.Module):
    """Causal multi-head self-attention computed sequence-first: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        init_sizes(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.query = PrepareForMultiHeadAttention(d_in, num_heads, self.head_dim, qkv_bias)
        self.key = PrepareForMultiHeadAttention(d_in, num_heads, self.head_dim, qkv_bias)
        self.value = PrepareForMultiHeadAttention(d_in, num_heads, self.head_dim, qkv_bias)
        self.out = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.scale = 1 / math.sqrt(self.head_dim)
        causal_mask = torch.ones(context_length, context_length, dtype=torch.bool).tril()  # True = attend
        self.register_buffer("causal_mask", causal_mask, persistent=False)

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        B, T, C = x.shape
        x = x.transpose(0, 1)  # (T, B, C): sequence first
        q, k, v = self.query(x), self.key(x), self.value(x)  # (T, B, H, D) each

        scores = torch.einsum("ibhd,jbhd->ijbh", q, k) * self.scale  # (T, S, B, H)
        keep = self.causal_mask[:T, :T, None, None]  # (T, S, 1, 1): True = attend
        scores = scores.masked_fill(~keep, float("-inf"))
        attn_weights = self.dropout(torch.softmax(scores, dim=1))  # softmax over keys j: (T, S, B, H)

        context = torch.einsum("ijbh,jbhd->ibhd", attn_weights, v)  # (T, B, H, D)
        context = context.reshape(T, B, self.d_out)  # (T, B, H*D)
        return self.out(context).transpose(0, 1)  # (B, T, d_out)

    def canonical_state_dict(self):
        """The canonical state dict (`attention.causal.CausalSelfAttention`): `query.linear.*` becomes
        `query.*`, likewise key and value."""
        rename = {"query.linear.": "query.", "key.linear.": "key.", "value.linear.": "value.", "out.": "out."}
        state = {}
        for name, tensor in self.state_dict().items():
            prefix = next(p for p in rename if name.startswith(p))
            state[rename[prefix] + name[len(prefix):]] = tensor.detach().clone()
        return state

    def load_canonical_state_dict(self, state):
        """Load the canonical state dict (`attention.causal.CausalSelfAttention`)."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        rename = {"query.": "query.linear.", "key.": "key.linear.", "value.": "value.linear.", "out.": "out."}
        own = {}
        for name, tensor in state.items():
            prefix = next(p for p in rename if name.startswith(p))
            own[rename[prefix] + name[len(prefix):]] = tensor
        self.load_state_dict(own)


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
