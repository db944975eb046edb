"""Shared test helpers: weight copying and canonical-layout gradients; `tolerance` is `attention.reference`'s table's."""

import copy

import pytest
import torch

import attention
from attention.reference import reference_causal_self_attention, tolerance  # noqa: F401 -- the one tolerance table

IMPLEMENTATION_NAMES = sorted(attention.IMPLEMENTATIONS)


def build(name, d_in, d_out, context_length, num_heads, qkv_bias=False, dropout=0.0, seed=0):
    """A registered implementation with weights drawn from `seed` (so two builds can share them)."""
    torch.manual_seed(seed)
    return attention.IMPLEMENTATIONS[name](d_in, d_out, context_length, dropout, num_heads, qkv_bias=qkv_bias)


def supports(name, d_in, d_out):
    """False where the class cannot be built for these sizes (nn.MultiheadAttention needs d_in == d_out)."""
    return not (name.startswith("torch_mha") and d_in != d_out)


def canonical_grads(module):
    """The module's parameter gradients laid out like its canonical state dict.

    `canonical_state_dict` only re-lays parameters (splits, concatenations, renames), so applying it to
    a copy whose parameters hold the gradients gives the gradients in canonical form.
    """
    shadow = copy.deepcopy(module)
    with torch.no_grad():
        for param, original in zip(shadow.parameters(), module.parameters()):
            param.copy_(original.grad)
    return shadow.canonical_state_dict()


def reference_with_grads(x, state, num_heads, position_encoding, grad_out):
    """Float64 reference output and the gradients of `(out * grad_out).sum()` for x and each weight."""
    x64 = x.detach().to(torch.float64).requires_grad_(True)
    state64 = {k: v.detach().to(torch.float64).requires_grad_(True) for k, v in state.items()}
    out, _ = reference_causal_self_attention(x64, state64, num_heads, position_encoding)
    (out * grad_out.to(torch.float64)).sum().backward()
    return out.detach(), x64.grad, {k: v.grad for k, v in state64.items()}


def captured_attention(model, input_ids):
    """`{layer index: (hidden states fed to its attention, its output)}` while a transformers model runs `input_ids`
    (its layers' `self_attn` hooked, the hooks removed after)."""
    captured = {}

    def hook(module, args, kwargs, output):
        captured[module.layer_idx] = (kwargs["hidden_states"].detach(), output[0].detach())

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return captured


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
