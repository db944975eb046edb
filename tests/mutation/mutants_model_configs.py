"""Plausible bugs in the model families (attention/models/) that the tiny layers of tests/test_models.py cannot
see: a family's own default for a field transformers' config class always fills in, a branch only a published
config.json reaches, RoPE constants that give the same frequencies at tiny sizes, K/V heads grouped in the wrong
order in a family whose tiny case has as many K/V heads as query heads.

tests/test_model_configs.py is their check: every family built from a plain mapping that leaves its defaulted
fields out, against the layer built from transformers' config object (defaults filled in); every RoPE scaling at
a published model's head size and original context against transformers' initialisation functions; 6 query heads
sharing 2 K/V heads against transformers' layer. The published configs themselves (attention/models/published.py)
are read against transformers in tests/test_models.py (`published`). A marked copy is mutated where the family it
belongs to is the one that runs the code (gpt-oss's YaRN, OLMo 2's Llama 3 scaling).
"""

from mutant import Mutant

MODELS = "attention/models/"


def defaults_of(family):
    """A plain mapping without the family's defaulted fields, against transformers' config object (`-k`: test ids)."""
    return f"tests/test_model_configs.py -k 'plain_mapping and {family}-defaults'"


def rope_at_published_sizes(family, rope):
    """Every spelling of one RoPE scaling at published sizes, in one family, against transformers' init functions."""
    return f"tests/test_model_configs.py -k 'published_sizes and {family}- and {rope}'"


MUTANTS = [
    # (b) Constants the tiny sizes cannot tell apart.
    Mutant("gpt_oss_yarn_betas_swapped", MODELS + "gpt_oss.py",
           "low, high = pair_turning(parameters.get(\"beta_fast\") or 32), pair_turning(parameters.get(\"beta_slow\") or 1)",
           "low, high = pair_turning(parameters.get(\"beta_slow\") or 1), pair_turning(parameters.get(\"beta_fast\") or 32)",
           "YaRN's beta_fast and beta_slow swapped: the ramp runs from the slow pairs' index to the fast ones' (in "
           "gpt-oss's copy: the family whose every layer runs YaRN)", rope_at_published_sizes("gpt_oss", "yarn")),
    Mutant("olmo2_llama3_factors_swapped", MODELS + "olmo2.py",
           "low, high = parameters[\"low_freq_factor\"], parameters[\"high_freq_factor\"]",
           "low, high = parameters[\"high_freq_factor\"], parameters[\"low_freq_factor\"]",
           "Llama 3.1's low_freq_factor and high_freq_factor swapped: the blend between kept and divided pairs reversed "
           "(in OLMo 2's copy)", rope_at_published_sizes("olmo2", "llama3")),
    # (a) Branches only a published config.json reaches, and defaults transformers always fills in.
    Mutant("gemma3_published_local_layers_on_the_global_base", MODELS + "gemma3.py",
           "local_base = config_value(config, \"rope_local_base_freq\", 10_000.0)",
           "local_base = config_value(config, \"rope_theta\", 10_000.0)",
           "a published Gemma 3 config's local layers rotating with rope_theta (1,000,000) instead of "
           "rope_local_base_freq (10,000)", "tests/test_models.py -k 'published and Gemma'"),
    Mutant("gemma3_default_pattern_of_five", MODELS + "gemma3.py",
           "pattern = config_value(config, \"sliding_window_pattern\", 6)",
           "pattern = config_value(config, \"sliding_window_pattern\", 5)",
           "\"5 local layers per global\" read as a pattern of 5: every 5th layer global where the config names none",
           defaults_of("gemma3_text")),
    Mutant("gemma2_softcap_default_none", MODELS + "gemma2.py",
           "self.attn_logit_softcapping = config_value(config, \"attn_logit_softcapping\", 50.0)",
           "self.attn_logit_softcapping = config_value(config, \"attn_logit_softcapping\", None)",
           "Gemma 2 without attn_logit_softcapping read as no cap, where transformers fills in 50 (issue 50's fixed bug)",
           defaults_of("gemma2")),
    Mutant("llama4_chunk_default_none", MODELS + "llama4.py",
           "chunked = rope_layers(config)[layer_idx] and config_value(config, \"attention_chunk_size\", 8192) is not None",
           "chunked = rope_layers(config)[layer_idx] and config_value(config, \"attention_chunk_size\", None) is not None",
           "Llama 4 without attention_chunk_size read as no chunks (every layer full), where transformers fills in "
           "8,192 (issue 50's fixed bug)", defaults_of("llama4_text")),
    Mutant("llama4_no_rope_interval_of_three", MODELS + "llama4.py",
           "interval = config_value(config, \"no_rope_layer_interval\", 4)",
           "interval = config_value(config, \"no_rope_layer_interval\", 3)",
           "\"three RoPE layers for each NoPE layer\" read as an interval of 3 where the config names none",
           defaults_of("llama4_text")),
    Mutant("llama4_temperature_floor_off_by_one", MODELS + "llama4.py",
           "scales = torch.log1p(torch.floor((positions + 1) / self.floor_scale)) * self.attn_scale + 1  # (T,)",
           "scales = torch.log1p(torch.floor(positions / self.floor_scale)) * self.attn_scale + 1  # (T,)",
           "the NoPE layers' query temperature steps one position late: floor(p / floor_scale), not floor((p + 1) / ...)",
           "tests/test_models.py -k 'equals_transformers and llama4'"),
    Mutant("llama4_floor_scale_default", MODELS + "llama4.py",
           "config_value(config, \"floor_scale\", 8192)", "config_value(config, \"floor_scale\", 4096)",
           "Llama 4's temperature floor defaulted to 4,096, half of transformers' 8,192, where the config names none",
           defaults_of("llama4_text")),
    Mutant("deepseek_rope_interleave_default_false", MODELS + "deepseek_v3.py",
           "rope_interleave=config_value(config, \"rope_interleave\", True),",
           "rope_interleave=config_value(config, \"rope_interleave\", False),",
           "a DeepSeek-V3 config.json, which names no rope_interleave, rotated in halves (i, i + Dr/2) instead of "
           "transformers' default interleaved pairs (2i, 2i + 1)", defaults_of("deepseek_v3")),
    Mutant("gpt_oss_default_rope_plain", MODELS + "gpt_oss.py",
           "DEFAULT_ROPE_SCALING = {\"rope_type\": \"yarn\",", "DEFAULT_ROPE_SCALING = {\"rope_type\": \"default\",",
           "gpt-oss without rope_scaling read as plain RoPE, where transformers fills in YaRN x32 (issue 50's fixed bug)",
           defaults_of("gpt_oss")),
    # A family whose tiny case has as many K/V heads as query heads (OLMo 2 7B is multi-head).
    Mutant("olmo2_kv_heads_repeated_not_interleaved", MODELS + "olmo2.py",
           "        attn_output = cached_attention(q, keys, values, mask, self.scaling, self.decode_kernel,\n",
           "        group = q.shape[1] // keys.shape[1]  # K/V heads repeated for their query heads (transformers' repeat_kv)\n"
           "        keys, values = keys.repeat(1, group, 1, 1), values.repeat(1, group, 1, 1)  # (B, H, S, D) each\n"
           "        attn_output = cached_attention(q, keys, values, mask, self.scaling, self.decode_kernel,\n",
           "K/V heads tiled (repeat) instead of each repeated for its group (repeat_interleave): query head h reads "
           "K/V head h % H_kv instead of h // group", "tests/test_model_configs.py -k 'six_query_heads and olmo2'"),
]
