"""The layers the decode sweep steps (`LAYERS`, a `Layer` record each): MHA, GQA and MQA, the model families' layers at
the config's sizes, and multi-head latent attention; how each is built, what its cache holds, its float64 reference
and its FLOPs. The sweep itself (`decode.py`) reads nothing else of a layer.
"""

from types import SimpleNamespace
from typing import Callable, NamedTuple

import torch

from attention.causal.gqa import GroupedQueryAttention
from attention.decoding import DECODE_KERNELS
from attention.models import MODELS
from attention.models.deepseek_v3 import LATENT_NORM_EPS, DeepseekV3Attention, latent_attention_flops, latent_config
from attention.models.published import PUBLISHED
from attention.reference import (canonical_weights, kv_heads_state, model_reference_kwargs, randomised_parameters,
                                 reference_kernel, reference_latent_attention, reference_model_attention)

KERNELS = (*(kernel for kernel in DECODE_KERNELS if kernel != "auto"), "auto")  # "auto": the faster of the others, timed


def step_flops(row, element_size):
    """A step's useful FLOPs from its row: `2 * batch * parameters` (every weight once per token) plus
    `4 * batch * num_heads * positions_read * head_dim` (scores and weighted values)."""
    parameters = row["weight_bytes"] // element_size
    return 2 * row["batch"] * parameters + 4 * row["batch"] * row["num_heads"] * row["positions_read"] * row["head_dim"]


class Layer(NamedTuple):
    """One kind of attention layer the decode sweep steps: a row per kernel, batch size and context.

    * `kernels`: the decode kernels it runs (names of its own, one row each: `("sdpa", "matmul")`).
    * `build(config, kernel) -> (module, hidden_size)`: the layer in float32 on the CPU, running `kernel`, weights
      drawn from `config.seed`, and the width of its input. The sweep casts and moves it; `module(x, cache=cache)`
      runs a step of `x` `(B, 1, hidden_size)`; `module.new_cache(batch, capacity)` makes its `DecodingCache`;
      `head_sizes(module)` reads its head counts and size for the rows.
    * `entries(module) -> [(heads, *dims), ...]`: per position, the shape of each tensor its cache's
      `update` takes, batch and positions left out (keys and values: `[(H_kv, D), (H_kv, D)]`). The sweep
      fills the cache with random ones: the step's time does not depend on their values.
    * `reference(config, module, x0, cached, context) -> (1, hidden_size)` float64: batch element 0's step from the
      module's weights (as rounded to the run's dtype), its new token `x0` `(1, 1, hidden_size)` and `cached`,
      what the sweep gave `update` for it (`[(1, heads, context, *dims), ...]`), the rest from `config`: each row's check.
    * `positions_read(context)`: cached positions a step reads, itself included (a window reads fewer), checked against `nbytes`.
    * `flops(row, element_size)`: the step's useful FLOPs from the row's own numbers (the validator recomputes them).
    * `step_bytes(module, batch, positions)`: what a step allocates beyond the cache, counted in the memory budget.
    * `check(config)`: `ValueError` where `config` cannot build this layer (a family's returns its model config).
    * `module`: the module of the layer's class (a row's numbers depend on it: `subjects`).
    """

    kernels: tuple
    build: Callable
    entries: Callable
    reference: Callable
    positions_read: Callable = lambda context: context + 1
    flops: Callable = step_flops
    check: Callable = lambda config: None
    step_bytes: Callable = lambda module, batch, positions: 0
    module: str = GroupedQueryAttention.__module__  # where the layer's class is written


# --- Multi-head, grouped-query and multi-query attention (`attention.causal.gqa`) -----------------------------------

def grouped(group):
    """MHA (`group` 1), GQA (`group` query heads per K/V head) or MQA (`group` None: one K/V head for all)."""
    def num_kv_heads(config):
        if group is not None and config.num_heads % group:
            raise ValueError(f"num_heads must be divisible by {group} for {group}:1 GQA, got num_heads={config.num_heads}")
        return 1 if group is None else config.num_heads // group

    def build(config, kernel):
        d_model, heads = config.num_heads * config.head_dim, num_kv_heads(config)
        module = GroupedQueryAttention(d_model, d_model, max(config.contexts) + 1, 0.0, config.num_heads,
                                       num_kv_heads=heads, decode_kernel=kernel)
        module.load_canonical_state_dict(kv_heads_state(canonical_weights(d_model, d_model, config.seed),
                                                        config.num_heads, heads))
        return module, d_model

    return Layer(KERNELS, build, lambda module: [(module.num_kv_heads, module.head_dim)] * 2, grouped_reference,
                 check=num_kv_heads)


def grouped_reference(config, module, x0, cached, context):
    """float64 step of `GroupedQueryAttention`: the new token's query over the cached keys and values and its own."""
    weights = {name: tensor.to("cpu", torch.float64) for name, tensor in module.canonical_state_dict().items()}
    x = x0.to("cpu", torch.float64)  # (1, 1, d_model)
    H, H_kv, D = module.num_heads, module.num_kv_heads, module.head_dim
    q = (x @ weights["query.weight"].T).view(1, 1, H, D).transpose(1, 2)  # (1, H, 1, D)
    keys, values = ((torch.cat([past.to(torch.float64), (x @ weights[f"{name}.weight"].T).view(1, 1, H_kv, D)
                                .transpose(1, 2)], dim=2)) for past, name in zip(cached, ("key", "value")))  # (1, H_kv, context + 1, D)
    out, _ = reference_kernel(q, keys, values)  # (1, H, 1, D)
    return out.transpose(1, 2).reshape(1, H * D) @ weights["out.weight"].T + weights["out.bias"]  # (1, d_model)


# --- Layers of current open models (`attention.models`), at the config's sizes -------------------------------------

def family(published, layer_idx, kernels, group=None):
    """Layer `layer_idx` of `attention.models.published.PUBLISHED[published]` (its window or chunk, norms, scale, RoPE,
    soft-cap, sinks) at the config's `num_heads` query heads of `head_dim`, the published query heads per K/V head
    (or `group`, where the published ratio does not divide `num_heads`), and hidden size `num_heads * head_dim`;
    `kernels` name the attention its forward runs: `("matmul",)` for a layer whose forward writes its softmax out
    (soft-cap, sinks), `("sdpa", "matmul")` for one built with `decode_kernel` (SDPA or the grouped matmuls)."""
    base = PUBLISHED[published]["config"]
    group, family_class = group or base["num_attention_heads"] // base["num_key_value_heads"], MODELS[base["model_type"]]

    def sized(config):
        if config.num_heads % group:
            raise ValueError(f"num_heads must be divisible by {group} for {published}, got num_heads={config.num_heads}")
        return base | dict(num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads // group,
                           head_dim=config.head_dim, hidden_size=config.num_heads * config.head_dim)

    def build(config, kernel):
        options = {"decode_kernel": kernel} if "sdpa" in kernels else {}  # a written-out softmax takes no kernel
        module = family_class.from_config(sized(config), layer_idx, **options)
        return randomised_parameters(module, config.seed), module.hidden_size

    def reference(config, module, x0, cached, context):  # float64, over the cached past: the layer's settings from config
        state = {name: tensor.to("cpu") for name, tensor in module.state_dict().items()}
        settings = model_reference_kwargs(sized(config), layer_idx, torch.arange(context, context + 1), family_class)
        return reference_model_attention(x0.cpu(), state, past_keys=cached[0].cpu(), past_values=cached[1].cpu(),
                                         **settings)[0][0]  # (1, hidden_size)

    with torch.device("meta"):  # the layer's window or chunk (what its cache keeps): the published model's, not the sizes'
        layer = family_class.from_config(sized(SimpleNamespace(num_heads=group, head_dim=8)), layer_idx)
        window = layer.sliding_window or getattr(layer, "attention_chunk_size", None)
    return Layer(kernels, build, lambda module: [(module.num_key_value_heads, module.head_dim)] * 2, reference,
                 lambda context: min(context + 1, window or context + 1), check=sized, module=family_class.__module__)


def head_sizes(module):
    """A row's `num_heads`, `num_kv_heads` and `head_dim`, under each kind of layer's names (MLA: one latent read by
    every head, one K/V head; the head size given to `latent_config` is its `qk_nope_head_dim`)."""
    if isinstance(module, DeepseekV3Attention):
        return dict(num_heads=module.num_heads, num_kv_heads=1, head_dim=module.qk_nope_head_dim)
    if isinstance(module, GroupedQueryAttention):
        return dict(num_heads=module.num_heads, num_kv_heads=module.num_kv_heads, head_dim=module.head_dim)
    return dict(num_heads=module.num_attention_heads, num_kv_heads=module.num_key_value_heads, head_dim=module.head_dim)


def latent_build(config, kernel):
    module = DeepseekV3Attention.from_config(latent_config(config.num_heads, config.head_dim), path=kernel)
    return randomised_parameters(module, config.seed), module.hidden_size


def latent_reference(config, module, x0, cached, context):
    """float64 step of MLA (`attention.reference.reference_latent_attention` over the cached latents and rotary keys)."""
    c = latent_config(config.num_heads, config.head_dim)
    state = {name: tensor.to("cpu") for name, tensor in module.state_dict().items()}
    out, _ = reference_latent_attention(x0.cpu(), state, c["num_attention_heads"], c["qk_nope_head_dim"],
                                        c["qk_rope_head_dim"], c["v_head_dim"], c["rope_theta"], c["rope_scaling"],
                                        norm_eps=LATENT_NORM_EPS, past_latent=cached[0][:, 0].cpu(),
                                        past_rope_keys=cached[1][:, 0].cpu())
    return out[0]  # (1, hidden_size)


def naive_bytes_per_element(module):
    """Bytes the naive MLA step allocates per head, position and element of a head beyond the cache (the memory
    budget's count): its expanded keys and values and their copies, about 5 head sizes (20 bytes in float32, measured;
    in bfloat16 SDPA's CPU kernel also works on float32 copies of them: 23), counted as 24 bytes at least."""
    return max(5 * module.kv_b_proj.weight.element_size(), 24)


MLA = Layer(("absorbed", "naive"), latent_build, lambda module: [(1, module.kv_lora_rank), (1, module.qk_rope_head_dim)],
            latent_reference, flops=lambda row, element: row["batch"] * latent_attention_flops(
                latent_config(row["num_heads"], row["head_dim"]), 1, row["positions_read"], row["kernel"]),
            check=lambda config: latent_config(config.num_heads, config.head_dim), step_bytes=lambda module, batch, positions: 0 if module.path == "absorbed" else (
                batch * positions * module.num_heads * module.v_head_dim * naive_bytes_per_element(module)),
            module=DeepseekV3Attention.__module__)

# name -> Layer: the row's `model`. 32 query heads of 128 (the default config): Llama 2 7B's and Llama 3 8B's
# attention; GQA's 8:1 is Llama 2 70B's and Llama 3 70B's. The model families' layers take those sizes too.
LAYERS = {"MHA": grouped(1), "GQA": grouped(8), "MQA": grouped(None),
          "Llama-3": family("Llama 3.1 8B", 0, KERNELS), "Gemma-3-local": family("Gemma 3 27B", 0, KERNELS),
          "Gemma-2-local": family("Gemma 2 27B", 0, ("matmul",)), "Gemma-2-global": family("Gemma 2 27B", 1, ("matmul",)),
          "gpt-oss-local": family("gpt-oss-120b", 0, ("matmul",)), "gpt-oss-global": family("gpt-oss-120b", 1, ("matmul",)),
          # Llama 4 Scout's 40:8 heads do not divide 32 query heads: 4 query heads per K/V head (8 K/V heads) here.
          "Llama-4-chunked": family("Llama 4 Scout", 0, KERNELS, group=4),
          "Llama-4-NoPE": family("Llama 4 Scout", 3, KERNELS, group=4), "MLA": MLA}
