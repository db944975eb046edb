"""The published configurations of the models the pages describe, typed once: the fields their attention reads.

Each entry of `PUBLISHED` is a model's `config.json` from its Hugging Face repository (for a multimodal
release, its `text_config`), reduced to the fields `attention.models` reads, under the file's own names, so
`MODELS[config["model_type"]].from_config(config, layer_idx)` builds any of its layers (on the `meta` device,
without allocating a weight). Where a file leaves a field to transformers' default, the default is written out
and marked `# default`. No network at build time: the values are typed here, each entry links its source.
"""

# gpt-oss lists its layer types; the others follow from a rule (see each family's file).
_GPT_OSS_LAYER_TYPES = ["sliding_attention", "full_attention"]

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
