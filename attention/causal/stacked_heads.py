"""Causal multi-head attention as a stack of independent single-head modules.

The most literal reading of "multi-head": build `num_heads` single-head causal attention modules,
run them one after another, concatenate their outputs and project (chapter 3 of *Build a Large
Language Model (From Scratch)*). It is the clearest to read; every head is its own small matmul.
It ends in the output projection every other implementation has, so weights move between them.
"""

import math

import torch
from torch import nn


class CausalHead(nn.Module):
    """One causal attention head: `(B, T, d_in) -> (B, T, head_dim)`."""

    def __init__(self, d_in, head_dim, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.query = nn.Linear(d_in, head_dim, bias=qkv_bias)
        self.key = nn.Linear(d_in, head_dim, bias=qkv_bias)
        self.value = nn.Linear(d_in, head_dim, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        causal_mask = torch.ones(context_length, context_length, dtype=torch.bool).tril()  # True = attend
        self.register_buffer("causal_mask", causal_mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, D) each
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # (B, T, T)
        scores = scores.masked_fill(~self.causal_mask[:T, :T], float("-inf"))
        attn_weights = self.dropout(torch.softmax(scores, dim=-1))  # (B, T, T)
        return attn_weights @ v  # (B, T, D)


class StackedHeadsAttention(nn.Module):
    """Causal multi-head self-attention from `num_heads` separate `CausalHead`s: `(B, T, d_in) -> (B, T, d_out)`.

    The family's constructor, shapes and canonical state dict: `attention.causal.CausalSelfAttention`.

    Args:
        d_out: features of the output; each head produces `d_out // num_heads` of them.
    """

    position_encoding = None

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        init_sizes(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias)
        self.heads = nn.ModuleList(
            CausalHead(d_in, self.head_dim, context_length, dropout, qkv_bias) for _ in range(num_heads)
        )
        self.out = nn.Linear(d_out, d_out)

    def forward(self, x):
        check_input(x, self.d_in, self.context_length)
        context = torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)

    def canonical_state_dict(self):
        """Head h's projection rows become rows `h*head_dim:(h+1)*head_dim` of the shared weights."""
        state = {"out.weight": self.out.weight.detach().clone(), "out.bias": self.out.bias.detach().clone()}
        for proj in ("query", "key", "value"):
            layers = [getattr(head, proj) for head in self.heads]
            state[f"{proj}.weight"] = torch.cat([layer.weight.detach() for layer in layers], dim=0)  # (H*D, d_in)
            if self.qkv_bias:
                state[f"{proj}.bias"] = torch.cat([layer.bias.detach() for layer in layers], dim=0)  # (H*D,)
        return state

    def load_canonical_state_dict(self, state):
        """Load the canonical state dict (`attention.causal.CausalSelfAttention`)."""
        check_canonical_state(state, self.d_in, self.d_out, self.qkv_bias)
        with torch.no_grad():
            self.out.weight.copy_(state["out.weight"])
            self.out.bias.copy_(state["out.bias"])
            for proj in ("query", "key", "value"):
                weights = state[f"{proj}.weight"].split(self.head_dim, dim=0)  # H x (D, d_in)
                biases = state[f"{proj}.bias"].split(self.head_dim) if self.qkv_bias else [None] * self.num_heads
                for head, weight, bias in zip(self.heads, weights, biases):
                    getattr(head, proj).weight.copy_(weight)
                    if bias is not None:
                        getattr(head, proj).bias.copy_(bias)


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
