"""The published configurations of the models the pages describe, typed once: the fields their attention reads.

Each entry of `PUBLISHED` is a model's `config.json` from its Hugging Face repository (for a multimodal
release, its `text_config`), reduced to the fields `attention.models` reads, under the file's own names, so
`MODELS[config["model_type"]].from_config(config, layer_idx)` builds any of its layers (on the `meta` device,
without allocating a weight). Where a file leaves a field to transformers' default, the default is written out
and marked `# default`. No network at build time: the values are typed here, each entry links its source.
`PUBLISHED_ECONOMIES` holds the models whose caches save more than grouped K/V heads and windows do (Gemma 4,
DeepSeek-V4),
`PUBLISHED_HYBRIDS` the models whose linear attention layers keep a state instead of a KV cache,
`PUBLISHED_LATENT` those with multi-head latent attention (DeepSeek-V2-Lite, V3 and Kimi K2 typed beside their layer,
in `attention/models/deepseek_v3.py`; DeepSeek-V3.2's sparse attention here), and `kv_cache_bytes` counts any of
their caches at a context.
"""

import torch

from attention.models.deepseek_v3 import PUBLISHED_CONFIGS

# gpt-oss lists its layer types; the others follow from a rule (see each family's file).
_GPT_OSS_LAYER_TYPES = ["sliding_attention", "full_attention"]
# Gemma 4 lists every layer's kind: 5 local per global (4 in the E2B), and the same RoPE in every size.
_GEMMA4_LAYER_TYPES = ["sliding_attention"] * 5 + ["full_attention"]
_GEMMA4_SMALL_LAYER_TYPES = ["sliding_attention"] * 4 + ["full_attention"]
_GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}

PUBLISHED = {
    "Llama 3.1 8B": {
        "source": "https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
        "config": {
            "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
            "attention_bias": False, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        },
    },
    "Mistral 7B v0.1": {
        "source": "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json",
        "config": {
            "model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "sliding_window": 4096,
        },
    },
    "Mistral Small 3 (24B)": {
        "source": "https://huggingface.co/mistralai/Mistral-Small-24B-Base-2501/blob/main/config.json",
        "config": {
            "model_type": "mistral", "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
            "rope_theta": 100000000.0, "sliding_window": None,
        },
    },
    "Qwen2.5 7B": {
        "source": "https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json",
        "config": {
            "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
            "num_key_value_heads": 4, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28,
        },
    },
    "Qwen3 8B": {
        "source": "https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json",
        "config": {
            "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
            "attention_bias": False, "rope_theta": 1000000, "rope_scaling": None, "sliding_window": None,
            "use_sliding_window": False, "max_window_layers": 36,
        },
    },
    "OLMo 2 7B": {
        "source": "https://huggingface.co/allenai/OLMo-2-1124-7B/blob/main/config.json",
        "config": {
            "model_type": "olmo2", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06,
            "attention_bias": False, "rope_theta": 500000, "rope_scaling": None,
        },
    },
    "Gemma 2 9B": {
        "source": "https://huggingface.co/google/gemma-2-9b/blob/main/config.json",
        "config": {
            "model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-06,
            "attention_bias": False, "rope_theta": 10000.0, "query_pre_attn_scalar": 256,
            "attn_logit_softcapping": 50.0, "sliding_window": 4096,
        },
    },
    "Gemma 2 27B": {
        "source": "https://huggingface.co/google/gemma-2-27b/blob/main/config.json",
        "config": {
            "model_type": "gemma2", "hidden_size": 4608, "num_hidden_layers": 46, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 128, "max_position_embeddings": 8192, "rms_norm_eps": 1e-06,
            "attention_bias": False, "rope_theta": 10000.0, "query_pre_attn_scalar": 144,
            "attn_logit_softcapping": 50.0, "sliding_window": 4096,
        },
    },
    "Gemma 3 1B": {
        "source": "https://huggingface.co/google/gemma-3-1b-pt/blob/main/config.json",
        "config": {
            "model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
            "attention_bias": False, "query_pre_attn_scalar": 256, "sliding_window": 512,
            "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": None,
        },
    },
    "Gemma 3 27B": {
        "source": "https://huggingface.co/google/gemma-3-27b-pt/blob/main/config.json",  # its text_config
        "config": {
            "model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168, "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "max_position_embeddings": 131072,  # default
            "rms_norm_eps": 1e-06,  # default
            "sliding_window_pattern": 6,  # default
            "rope_theta": 1000000.0,  # default
            "rope_local_base_freq": 10000.0,  # default
        },
    },
    "Llama 4 Scout": {
        "source": "https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct/blob/main/config.json",  # text_config
        "config": {
            "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 10485760, "rms_norm_eps": 1e-05,
            "attention_bias": False, "attention_chunk_size": 8192, "no_rope_layers": [1, 1, 1, 0] * 12,
            "use_qk_norm": True, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
            "rope_theta": 500000.0,
            "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        },
    },
    "gpt-oss-20b": {
        "source": "https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json",
        "config": {
            "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
            "attention_bias": True, "sliding_window": 128, "layer_types": _GPT_OSS_LAYER_TYPES * 12,
            "rope_theta": 150000,
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                             "rope_type": "yarn", "truncate": False},
        },
    },
    "gpt-oss-120b": {
        "source": "https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json",
        "config": {
            "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
            "attention_bias": True, "sliding_window": 128, "layer_types": _GPT_OSS_LAYER_TYPES * 18,
            "rope_theta": 150000,
            "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                             "rope_type": "yarn", "truncate": False},
        },
    },
}

# The hybrids: linear attention layers (a recurrent state of the same size at every context) beside softmax ones.
# Qwen3-Next's and Kimi Linear's files give the layer kinds by their own rules (`full_attention_interval`; Kimi's 1-based
# `linear_attn_config`); MiniMax-M1's `attn_type_list` (0: lightning, 1: softmax) is written out as `layer_types`.
PUBLISHED_HYBRIDS = {
    "Qwen3-Next 80B-A3B": {
        "source": "https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json",
        "config": {
            "model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
            "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
            "rope_theta": 10000000, "partial_rotary_factor": 0.25, "full_attention_interval": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "hidden_act": "silu",
        },
    },
    "Kimi Linear 48B-A3B": {
        "source": "https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json",
        "config": {
            "model_type": "kimi_linear", "hidden_size": 2304, "num_hidden_layers": 27, "num_attention_heads": 32,
            "num_key_value_heads": 32, "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True, "rms_norm_eps": 1e-05,
            "model_max_length": 1048576, "rope_theta": 10000.0, "hidden_act": "silu",
            "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                                   "kda_layers": [i for i in range(1, 28) if i % 4 and i != 27],
                                   "full_attn_layers": [4, 8, 12, 16, 20, 24, 27]},
        },
    },
    "MiniMax-M1": {
        # Its file names the type minimax_m1 (the checkpoint's own code); transformers' MiniMax is the same attention,
        # except that M1 rotates the first rotary_dim 64 of each head's 128 features and transformers all of them.
        "source": "https://huggingface.co/MiniMaxAI/MiniMax-M1-80k/blob/main/config.json",
        "config": {
            "model_type": "minimax", "hidden_size": 6144, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 10240000, "rms_norm_eps": 1e-05,
            "rope_theta": 10000000, "hidden_act": "silu", "sliding_window": None,
            "layer_types": (["linear_attention"] * 7 + ["full_attention"]) * 10,
        },
    },
}

# Multi-head latent attention: one latent and one rotary key per position for all heads. DeepSeek-V3.2 is DeepSeek-V3
# (V3.1-Terminus) with a lightning indexer in every layer, whose one key per position the cache keeps too.
PUBLISHED_LATENT = {
    **{name: {"source": fields["source"], "config": {key: value for key, value in fields.items() if key != "source"}}
       for name, fields in PUBLISHED_CONFIGS.items()},
    "DeepSeek-V3.2": {
        "source": "https://huggingface.co/deepseek-ai/DeepSeek-V3.2/blob/main/config.json",
        "config": {
            "model_type": "deepseek_v32", "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048,
            "max_position_embeddings": 163840, "rope_theta": 10000,
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                             "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        },
    },
}


# Caches smaller than GQA's with windows: Gemma 4 (`attention/models/gemma4.py`): K = V on global layers, two head
# sizes, and in its E2B and E4B the last layers reusing earlier layers' K/V; DeepSeek-V4 (`deepseek_v4.py`): one K=V
# vector per position of a short window, plus one compressed entry per 4 (CSA) or 128 (HCA) positions.
PUBLISHED_ECONOMIES = {
    # Local layers of `head_dim` 256, global ones of `global_head_dim` 512; the 26B and 31B have K = V and
    # fewer K/V heads on their global layers, the E2B and E4B share K/V across their last 20 and 18 layers.
    "Gemma 4 E2B": {
        "source": "https://huggingface.co/google/gemma-4-E2B/blob/main/config.json",  # its text_config
        "config": {
            "model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35, "num_attention_heads": 8,
            "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": None,
            "attention_k_eq_v": False, "num_kv_shared_layers": 20, "sliding_window": 512,
            "layer_types": _GEMMA4_SMALL_LAYER_TYPES * 7, "max_position_embeddings": 131072, "rms_norm_eps": 1e-06,
            "rope_parameters": _GEMMA4_ROPE,
        },
    },
    "Gemma 4 E4B": {
        "source": "https://huggingface.co/google/gemma-4-E4B/blob/main/config.json",  # its text_config
        "config": {
            "model_type": "gemma4_text", "hidden_size": 2560, "num_hidden_layers": 42, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512, "attention_k_eq_v": False,
            "num_kv_shared_layers": 18, "sliding_window": 512, "layer_types": _GEMMA4_LAYER_TYPES * 7,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "rope_parameters": _GEMMA4_ROPE,
        },
    },
    "Gemma 4 26B A4B": {
        "source": "https://huggingface.co/google/gemma-4-26B-A4B/blob/main/config.json",  # its text_config
        "config": {
            "model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
            "attention_k_eq_v": True, "num_kv_shared_layers": 0, "sliding_window": 1024,
            "layer_types": _GEMMA4_LAYER_TYPES * 5, "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
            "rope_parameters": _GEMMA4_ROPE,
        },
    },
    "Gemma 4 31B": {
        "source": "https://huggingface.co/google/gemma-4-31B/blob/main/config.json",  # its text_config
        "config": {
            "model_type": "gemma4_text", "hidden_size": 5376, "num_hidden_layers": 60, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 4,
            "attention_k_eq_v": True, "num_kv_shared_layers": 0, "sliding_window": 1024,
            "layer_types": _GEMMA4_LAYER_TYPES * 10, "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
            "rope_parameters": _GEMMA4_ROPE,
        },
    },
    # transformers' DeepseekV4Config defaults are this model's (its docstring's checkpoint): marked `# default`.
    "DeepSeek-V4-Flash": {
        "source": "https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash/blob/main/config.json",
        "config": {
            "model_type": "deepseek_v4", "hidden_size": 4096, "num_hidden_layers": 43, "num_attention_heads": 64,
            "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024, "o_lora_rank": 1024,
            "qk_rope_head_dim": 64, "sliding_window": 128, "max_position_embeddings": 1048576, "rope_theta": 10000,
            "rms_norm_eps": 1e-06,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                             "beta_slow": 1},
            # one per layer and one for the next-token-prediction layer: 0 sliding only, 4 CSA, 128 HCA
            "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
            "o_groups": 8,  # default
            "index_n_heads": 64,  # default
            "index_head_dim": 128,  # default
            "index_topk": 512,  # default
            "compress_rope_theta": 160000.0,  # default
        },
    },
}


def published_entries():
    """Every published model the calculator knows, `{name: {"source": url, "config": {...}}}`: `PUBLISHED`, then
    `PUBLISHED_ECONOMIES`, `PUBLISHED_LATENT` and `PUBLISHED_HYBRIDS`."""
    return PUBLISHED | PUBLISHED_ECONOMIES | PUBLISHED_LATENT | PUBLISHED_HYBRIDS


def layer_cache_bytes(layer, context_length, dtype):
    """Bytes one sequence's cache of `layer` (an `attention.models` layer, e.g. built on the `meta` device) holds after
    `context_length` positions in `dtype`: a linear layer's recurrent state (float32 at least) and its convolution's
    last `kernel - 1` inputs, whatever the context; a latent layer's latent and shared rotary key per position (and
    DeepSeek-V3.2's indexer key); nothing for a layer that reuses an earlier layer's K/V (Gemma 4); DeepSeek-V4's window
and compressed entries (`compressed_cache_values`); a softmax layer's key and value per K/V head per position, at most its window's (or
    chunk's) positions."""
    size = dtype.itemsize
    if hasattr(layer, "state_shape"):
        heads, key_dim, value_dim = layer.state_shape
        convolution = getattr(layer, "conv_dim", 0) * (getattr(layer, "conv_kernel_size", 1) - 1)
        return heads * key_dim * value_dim * max(size, 4) + convolution * size  # the state: float32 at least
    if getattr(layer, "kv_sharing", None) == "reuse":  # Gemma 4: it attends to an earlier layer's cache
        return 0
    if hasattr(layer, "compress_rate"):  # DeepSeek-V4 (its DeepseekV4Cache)
        return compressed_cache_values(layer, context_length) * size
    span = getattr(layer, "sliding_window", None) or getattr(layer, "attention_chunk_size", None)
    positions = min(context_length, span or context_length)
    if hasattr(layer, "kv_lora_rank"):  # DeepSeek-V3.2's indexer adds its key (DeepSeek's kernels keep it in FP8)
        index_keys = layer.indexer.head_dim if hasattr(layer, "indexer") else 0
        return (layer.kv_lora_rank + layer.qk_rope_head_dim + index_keys) * size * positions
    return 2 * layer.num_key_value_heads * layer.head_dim * size * positions


def compressed_cache_values(layer, context_length):
    """Values a DeepSeek-V4 layer's cache holds for one sequence after `context_length` positions: the window's shared
    K=V vectors (`head_dim` each, at most `sliding_window`) and, on CSA and HCA layers, one entry per `compress_rate`
    positions (`head_dim`, and on CSA the indexer's key of `index_head_dim`), with the compressors' projections of
    the window still open (`kv_proj` and `gate_proj`, twice as wide where windows overlap: CSA) and, on CSA, the
    last closed window's first half, which the next entry pools."""
    total = min(context_length, layer.sliding_window) * layer.head_dim
    if layer.compress_rate is None:
        return total
    rate, overlap = layer.compress_rate, layer.index_head_dim is not None  # CSA: overlapping windows, an indexer
    for width in [layer.head_dim] + ([layer.index_head_dim] if overlap else []):
        projection = 2 * width if overlap else width
        total += (context_length // rate) * width + 2 * (rate - 1) * projection + (2 * rate * width if overlap else 0)
    return total


def published_layers(name):
    """Every attention layer of the published model `name` (a key of `published_entries()`), built on the `meta`
    device: attributes and shapes, no weight allocated. `ValueError` listing the names for another."""
    entries = published_entries()
    if name not in entries:
        raise ValueError(f"name must be one of the published models, got name={name!r}; the models: "
                         f"{', '.join(entries)}")
    from attention.models import MODELS  # here, not at the top: the models' files never import this one

    config = entries[name]["config"]
    with torch.device("meta"):
        return [MODELS[config["model_type"]].from_config(config, i) for i in range(config["num_hidden_layers"])]


def kv_cache_bytes(name, context_length, batch_size=1, dtype=torch.bfloat16):
    """Bytes of every layer's cache of the published model `name` for `batch_size` sequences of `context_length`
    positions in `dtype` (`layer_cache_bytes` per layer): what a deployment must hold beside the weights.
    `ValueError` naming the argument for an unknown name, a context or batch below 1; `TypeError` for a non-int
    count or a dtype that is not a floating-point `torch.dtype`."""
    for argument, value in (("context_length", context_length), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{argument} must be an int, got {argument}={value!r}")
        if value < 1:
            raise ValueError(f"{argument} must be at least 1, got {argument}={value}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got dtype={dtype!r}")
    return batch_size * sum(layer_cache_bytes(layer, context_length, dtype) for layer in published_layers(name))
