"""Every configuration path of the model families (attention/models/), read as transformers reads it.

* **A field left out takes transformers' default**: a family reads some fields with a default of its own (no
  soft-cap, a chunk size, a window pattern, a local RoPE base, a temperature floor...). Built from a plain mapping
  that leaves every such field out, each layer equals the layer built from transformers' config object made from
  the same mapping (which fills in transformers' defaults): same kind, window, scale, settings, RoPE frequencies
  and parameter shapes. The same holds for every layer-kind rule (a window on every layer, from
  `max_window_layers` on, alternating, every n-th layer global, NoPE every n-th layer, listed kinds), and the
  kinds and windows are transformers' own.
* **RoPE at real sizes**: every kind of RoPE scaling, at a published model's head size and original context, in
  both spellings a config may use (`rope_parameters`, or `rope_theta` and `rope_scaling`), gives the inverse
  frequencies and the attention factor of transformers' own initialisation functions (`ROPE_INIT_FUNCTIONS`),
  in every family (each keeps its own marked copy of the code). At the tiny sizes of tests/test_models.py two
  swapped constants can give the same frequencies; here they do not.
* **Grouped-query attention in every family**: 6 query heads sharing 2 K/V heads (groups of 3), against
  transformers' own layer.

transformers (a test-only extra) builds the configs offline; the file skips without it.
"""

import pytest
import torch

from attention.models import MODELS
from tests.test_models import CASES, config_of

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

REAL = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=8,
            max_position_embeddings=131072, vocab_size=64, intermediate_size=64)
# Each family's fields that have no default (of the family's own), at a published model's sizes; every field the
# family reads with a default of its own is left out.
MINIMAL = {
    "llama": dict(rope_theta=500000.0),
    "mistral": dict(rope_theta=10000.0, sliding_window=4096),
    "qwen2": dict(rope_theta=1000000.0),
    "qwen3": dict(rope_theta=1000000.0, rms_norm_eps=1e-6),
    "olmo2": dict(rope_theta=500000.0, rms_norm_eps=1e-6),
    "gemma2": dict(rope_theta=10000.0, query_pre_attn_scalar=256, sliding_window=4096),
    "gemma3_text": dict(query_pre_attn_scalar=256, sliding_window=512, rms_norm_eps=1e-6),
    # gpt-oss: no rope_scaling, so the family must take transformers' default, YaRN x32.
    "gpt_oss": dict(rope_theta=150000.0, sliding_window=128, num_local_experts=4),
    "llama4_text": dict(rope_theta=500000.0, rms_norm_eps=1e-5, num_local_experts=2, intermediate_size_mlp=64),
    "deepseek_v3": dict(rope_theta=10000.0, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=4, num_experts_per_tok=2),
}
# Each way a family decides a layer's kind (beyond MINIMAL's): (family, fields).
LAYER_KINDS = [
    ("mistral", dict(sliding_window=None)),  # no window: every layer full
    ("qwen2", dict(use_sliding_window=True, sliding_window=4096, max_window_layers=3)),  # local from layer 3 on
    ("qwen3", dict(use_sliding_window=True, sliding_window=4096, max_window_layers=5)),
    ("qwen2", dict(use_sliding_window=False, sliding_window=4096, max_window_layers=3)),  # switched off
    ("llama", dict(layer_types=["sliding_attention", "full_attention"] * 4, sliding_window=256)),  # listed
    ("gemma3_text", dict(sliding_window_pattern=3)),  # every 3rd layer global
    ("gemma3_text", dict(layer_types=["full_attention"] * 2 + ["sliding_attention"] * 6)),
    ("gpt_oss", dict(layer_types=["full_attention"] * 4 + ["sliding_attention"] * 4)),
    ("llama4_text", dict(no_rope_layer_interval=2, attention_chunk_size=128)),  # NoPE (and full) every 2nd layer
    ("llama4_text", dict(no_rope_layers=[1, 0, 0, 1, 1, 1, 1, 0], attention_chunk_size=64)),  # listed NoPE layers
    ("llama4_text", dict(attention_chunk_size=None)),  # no chunks: every layer full
]
CONFIG_CASES = [(family, {}) for family in MINIMAL] + LAYER_KINDS
CONFIG_IDS = [f"{family}-{'-'.join(fields) or 'defaults'}-{i}" for i, (family, fields) in enumerate(CONFIG_CASES)]


def plain(family, **fields):
    return {"model_type": family, **REAL, **MINIMAL[family], **fields}


def fingerprint(module):
    """What a layer is: its settings (every plain attribute), RoPE frequencies and parameter shapes."""
    settings = {name: value for name, value in vars(module).items()
                if not name.startswith("_") and isinstance(value, (bool, int, float, str, tuple, type(None)))}
    inv_freq = getattr(module, "inv_freq", None)
    settings["inv_freq"] = None if inv_freq is None else inv_freq.tolist()
    settings["parameters"] = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    return settings


@pytest.mark.parametrize("family,fields", CONFIG_CASES, ids=CONFIG_IDS)
def test_a_plain_mapping_builds_the_layers_of_transformers_config(family, fields):
    """Every layer built from the plain mapping equals the layer built from transformers' config object of the same
    fields (its defaults filled in), and has transformers' kind, window or chunk, and RoPE (or none)."""
    config = plain(family, **fields)
    hf_config = transformers.AutoConfig.for_model(**config)
    hf_types = getattr(hf_config, "layer_types", None)
    no_rope = getattr(hf_config, "no_rope_layers", None)
    for layer_idx in range(config["num_hidden_layers"]):
        with torch.device("meta"):
            ours = MODELS[family].from_config(config, layer_idx)
            from_hf = MODELS[family].from_config(hf_config, layer_idx)
        assert fingerprint(ours) == fingerprint(from_hf), layer_idx
        # transformers' Mistral lists no kinds: its window, where set, is on every layer.
        expected = (hf_types[layer_idx] if hf_types else
                    "sliding_attention" if family == "mistral" and hf_config.sliding_window else "full_attention")
        assert ours.layer_type == expected, layer_idx
        if family == "deepseek_v3":
            continue
        assert ours.sliding_window == (hf_config.sliding_window if expected == "sliding_attention" else None), layer_idx
        expected_chunk = hf_config.attention_chunk_size if expected == "chunked_attention" else None
        assert getattr(ours, "attention_chunk_size", None) == expected_chunk, layer_idx
        if no_rope is not None:  # Llama 4: 0 marks a layer without RoPE (and without the norm of q and k)
            assert (ours.inv_freq is not None) == bool(no_rope[layer_idx]), layer_idx


# RoPE scaling at published sizes: head_dim 128 and original contexts of thousands of positions.
ROPES = {
    "linear": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},  # Gemma 3 27B
    "llama3.1": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192, "rope_theta": 500000.0},  # Llama 3.1
    "llama3-equal-factors": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_theta": 500000.0},  # Llama 4 Scout
    "yarn-gpt-oss": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
    "yarn-qwen": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                  "rope_theta": 1000000.0},  # Qwen2.5's long context: beta defaults, truncated
    "yarn-betas": {"rope_type": "yarn", "factor": 40.0, "beta_fast": 16.0, "beta_slow": 2.0,
                   "original_max_position_embeddings": 4096, "rope_theta": 10000.0},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5,
                              "original_max_position_embeddings": 2048, "rope_theta": 10000.0},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                    "original_max_position_embeddings": 4096, "rope_theta": 10000.0},
}
ROTARY_FAMILIES = list(MINIMAL)


def with_rope(family, rope, spelling):
    """The family's plain config with `rope` as transformers 5 spells it (`rope_parameters`) or as a published
    config.json does (`rope_theta` and `rope_scaling`); Gemma 3's applies to its global layers. MLA rotates only
    `qk_rope_head_dim` features of each head: transformers' DeepSeek config names that width `head_dim`."""
    config = {name: value for name, value in plain(family).items() if name != "rope_scaling"}
    if family == "deepseek_v3":
        config["head_dim"] = config["qk_rope_head_dim"]
    if family == "gemma3_text":
        local = {"rope_type": "default", "rope_theta": 10000.0}
        if spelling == "rope_parameters":
            return {**config, "rope_parameters": {"full_attention": dict(rope), "sliding_attention": local}}
    if spelling == "rope_parameters":
        return {**config, "rope_parameters": dict(rope)}
    scaling = {name: value for name, value in rope.items() if name != "rope_theta"}
    return {**config, "rope_theta": rope["rope_theta"], "rope_scaling": scaling}


@pytest.mark.parametrize("spelling", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("family", ROTARY_FAMILIES)
def test_rope_scaling_at_published_sizes_equals_transformers_init_functions(family, rope, spelling):
    if family == "gemma3_text" and ROPES[rope].get("truncate") is False:
        pytest.skip("transformers 5's _compute_yarn_parameters reads truncate as config.rope_parameters.get('truncate', "
                    "True), the top of the dict, which for Gemma 3 holds one dict per layer type: it always truncates "
                    "there, whatever the layer's dict says, while it reads every other YaRN field from the layer's dict. "
                    "The family reads truncate from the layer's dict too: "
                    "test_gemma3_reads_yarn_truncate_from_its_layers_rope_parameters")
    config = with_rope(family, ROPES[rope], spelling)
    hf_config = transformers.AutoConfig.for_model(**with_rope(family, ROPES[rope], "rope_parameters"))
    layer_idx = 5 if family == "gemma3_text" else 0  # a global layer (Gemma 3), a RoPE layer (Llama 4)
    layer_type = "full_attention" if family == "gemma3_text" else None
    with torch.device("meta"):
        ours = MODELS[family].from_config(config, layer_idx)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[ROPES[rope]["rope_type"]](hf_config, "cpu", layer_type=layer_type)
    torch.testing.assert_close(ours.inv_freq.float(), inv_freq, rtol=2e-6, atol=0)  # transformers: float32
    assert ours.attention_scaling == pytest.approx(attention_factor, rel=1e-6)
    if family == "deepseek_v3":  # YaRN's mscale_all_dim also scales MLA's softmax: transformers' layer's scale
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention

        with torch.device("meta"):
            assert ours.scaling == pytest.approx(DeepseekV3Attention(hf_config, 0).scaling, rel=1e-12)


def test_gemma3_reads_yarn_truncate_from_its_layers_rope_parameters():
    """A Gemma 3 global layer with YaRN's `truncate` false in its layer type's dict rotates as transformers' YaRN
    with `truncate` false does where transformers reads it (a flat `rope_parameters`), not as transformers' Gemma 3,
    which reads `truncate` from the top of `rope_parameters` only and so always truncates (the skip above)."""
    rope = ROPES["yarn-gpt-oss"]
    with torch.device("meta"):
        ours = MODELS["gemma3_text"].from_config(with_rope("gemma3_text", rope, "rope_parameters"), 5)
    flat = transformers.AutoConfig.for_model(**{**with_rope("llama", rope, "rope_parameters"), "head_dim": ours.head_dim})
    untruncated, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](flat, "cpu")
    torch.testing.assert_close(ours.inv_freq.float(), untruncated, rtol=2e-6, atol=0)
    assert ours.attention_scaling == pytest.approx(attention_factor, rel=1e-6)
    per_layer = transformers.AutoConfig.for_model(**with_rope("gemma3_text", rope, "rope_parameters"))
    truncated, _ = ROPE_INIT_FUNCTIONS["yarn"](per_layer, "cpu", layer_type="full_attention")
    assert not torch.allclose(truncated, untruncated, rtol=1e-3, atol=0)  # the two readings differ at these sizes


# Grouped-query attention in every family, against transformers' own layer (the tiny cases of tests/test_models.py).

@pytest.mark.parametrize("name", list(CASES))
def test_six_query_heads_sharing_two_kv_heads_equal_transformers_layer(name):
    config = {**config_of(name), "hidden_size": 48, "num_attention_heads": 6, "num_key_value_heads": 2}
    extra = {"experts_implementation": "eager"} if config["model_type"] in ("gpt_oss", "llama4_text") else {}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config),
                                                          attn_implementation="eager", dtype=torch.float64, **extra)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            param.normal_(0.0, 2.0 if pname.endswith("sinks") else 0.5)
    captured = {}
    for layer_idx, layer in enumerate(model.model.layers):
        layer.self_attn.register_forward_hook(
            lambda module, args, kwargs, output, layer_idx=layer_idx: captured.setdefault(
                layer_idx, (kwargs["hidden_states"], output[0])), with_kwargs=True)
    with torch.no_grad():
        model.eval()(torch.randint(0, config["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(1)))
        for layer_idx, (x, expected) in captured.items():
            module = MODELS[config["model_type"]].from_config(config, layer_idx).to(torch.float64)
            assert (module.num_key_value_heads, module.num_heads if hasattr(module, "num_heads") else 6) == (2, 6)
            module.load_state_dict(model.model.layers[layer_idx].self_attn.state_dict())
            torch.testing.assert_close(module(x), expected, rtol=1e-6, atol=1e-5)
