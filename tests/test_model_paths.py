"""Each model family's own copy of the shared checks and paths (attention/models/), family by family.

Every family file is copyable alone, so each carries its own marked copy of the helpers that read a config, check an
input, a cache or a state dict, and turn RoPE parameters into frequencies (tests/test_copies.py keeps the copies'
text identical). What a user relies on is that the layer they copied behaves as documented, so each behaviour here
runs in every family, not only in Llama's copy (tests/test_models.py):

* **A bad argument gets the documented error in every family**: a state dict that does not fit, an input that is
  not a floating `(B, T > 0, hidden_size)` tensor, a cache the layer did not make (another layer, shape, window,
  batch or dtype, or gradients on), a config of another family, a layer index outside the model, attention dropout,
  K/V heads that do not divide the query heads, a missing field (from a mapping or from an object), RoPE parameters
  that cannot rotate, and `layer_types` that are not the family's.
* **Every spelling of the config means what transformers means**: a plain mapping, an object with attributes
  (`SimpleNamespace`, as a user without transformers would write), `rope_parameters` keyed by layer type, the old
  `type` key of `rope_scaling`, K/V heads and `head_dim` left to their defaults.
* **Multi-head latent attention** (its own constructor and checks) and **the position encodings**
  (attention/positional/) refuse bad sizes naming the argument; ALiBi's FlexAttention `score_mod` adds the bias
  `alibi_bias` builds.
"""

import re
import types

import pytest
import torch

from attention.decoding import KVCache, SlidingWindowKVCache
from attention.models import MODELS, config_value
from tests.test_models import INF, LINEAR, LLAMA3, NAN, YARN

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
# A small valid config of each family's class, as a plain mapping; layer 0 is a local layer (window 4 or chunk 4)
# wherever the family has one, so the window checks run.
PLAIN = {
    "llama": dict(model_type="llama", **SMALL, rope_theta=1e4, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention"]),
    "qwen3": dict(model_type="qwen3", **SMALL, rope_theta=1e4, rms_norm_eps=1e-6, use_sliding_window=True,
                  sliding_window=4, max_window_layers=0),
    # OLMo 2 reads listed layer kinds with llama.py's code (its published configs list none; transformers' OLMo 2
    # and Llama models build only the full causal mask whatever `layer_types` lists: an open difference).
    "olmo2": dict(model_type="olmo2", **SMALL, rope_theta=1e4, rms_norm_eps=1e-6, sliding_window=4,
                  layer_types=["sliding_attention", "full_attention"]),
    "gemma2": dict(model_type="gemma2", **SMALL, rope_theta=1e4, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                   sliding_window=4),
    "gemma3_text": dict(model_type="gemma3_text", **SMALL, query_pre_attn_scalar=16, sliding_window=4,
                        sliding_window_pattern=2, rms_norm_eps=1e-6),
    "gpt_oss": dict(model_type="gpt_oss", **SMALL, rope_theta=1e4, sliding_window=4),
    "llama4_text": dict(model_type="llama4_text", **{**SMALL, "num_hidden_layers": 4}, rope_theta=1e4,
                        rms_norm_eps=1e-5, attention_chunk_size=4),
}
FAMILIES = list(PLAIN)
B, T = 2, 5
# The global layer of each family's PLAIN config: the layer whose RoPE reads `rope_theta` and `rope_scaling` (Gemma 3's
# local layers read `rope_local_base_freq`), and a RoPE layer in Llama 4 (its layer 3 has none).
GLOBAL_LAYER = {family: 1 if family in ("llama", "gemma2", "gemma3_text", "gpt_oss") else 0 for family in FAMILIES}


def build(family, layer_idx=0, **fields):
    return MODELS[family].from_config({**PLAIN[family], **fields}, layer_idx)


def float64_layer(family, layer_idx=0):
    """Layer `layer_idx` of `PLAIN[family]`, float64, its parameters drawn at random (gradients off)."""
    module = build(family, layer_idx).to(torch.float64).requires_grad_(False)
    generator = torch.Generator().manual_seed(layer_idx)
    for param in module.parameters():
        param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * 0.5)
    return module


def some_input(module, batch=B, length=T, dtype=torch.float64):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(batch, length, module.hidden_size, generator=generator, dtype=torch.float64).to(dtype)


# State dicts, inputs and caches.

@pytest.mark.parametrize("family", FAMILIES)
def test_a_state_dict_that_does_not_fit_is_refused_naming_the_key_in_every_family(family):
    module = float64_layer(family)
    name = type(module).__name__
    state = dict(module.state_dict())
    state["q_proj.weight"] = torch.zeros(3, 64, dtype=torch.float64)
    with pytest.raises(ValueError,
                       match=rf"{name} layer 0: q_proj.weight has shape \(3, 64\), the layer's is \(64, 64\)"):
        module.load_state_dict(state)
    del state["q_proj.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['q_proj.weight'\], unexpected keys \[\]"):
        module.load_state_dict(state)
    with pytest.raises(ValueError, match=r"missing keys \[\], unexpected keys \['rotary.weight'\]"):
        module.load_state_dict({**module.state_dict(), "rotary.weight": torch.zeros(1)})
    # Not strict: a partial state dict loads what it names, and the rest of the layer is unchanged.
    before = module.k_proj.weight.clone()
    module.load_state_dict({"q_proj.weight": torch.ones(64, 64, dtype=torch.float64)}, strict=False)
    assert torch.equal(module.q_proj.weight, torch.ones(64, 64, dtype=torch.float64))
    assert torch.equal(module.k_proj.weight, before)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_input_that_is_not_a_floating_batch_of_tokens_is_refused_in_every_family(family):
    module = float64_layer(family)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        module([[0.0] * 64])
    with pytest.raises(TypeError, match="x must be a floating-point tensor, got x.dtype=torch.int64"):
        module(torch.ones(B, T, 64, dtype=torch.long))
    for shape in ((B, T, 32), (T, 64), (B, 0, 64)):
        with pytest.raises(ValueError, match=re.escape(f"(B, T > 0, hidden_size=64), got x.shape={shape}")):
            module(torch.zeros(shape, dtype=torch.float64))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cache_the_layer_did_not_make_is_refused_in_every_family(family):
    module = float64_layer(family)  # layer 0: local (window or chunk of 4) wherever the family has local layers
    other = float64_layer(family, 1)
    x = some_input(module)[:, :1]
    H_kv, D = module.num_key_value_heads, module.head_dim
    with torch.no_grad():
        with pytest.raises(TypeError, match="cache must come from the layer's new_cache\\(\\), got KVCache"):
            module(x, cache=KVCache(B, H_kv, D, 16, dtype=torch.float64))
        with pytest.raises(TypeError, match="got dict"):
            module(x, cache={})
        with pytest.raises(ValueError, match=f"cache was made by {type(module).__name__} layer 1, not by this layer"):
            module(x, cache=other.new_cache(B, 16))
        stranger = KVCache(B, H_kv + 1, D, 16, dtype=torch.float64)
        stranger.layer = (type(module).__name__, 0)  # as if this layer had made it: the shape still tells
        with pytest.raises(ValueError, match=f"cache holds {H_kv + 1} K/V heads of size {D}"):
            module(x, cache=stranger)
        local = module.attention_chunk_size if family == "llama4_text" else module.sliding_window  # 4 in PLAIN
        wider = SlidingWindowKVCache(B, H_kv, D, local + 1, dtype=torch.float64)
        wider.layer = (type(module).__name__, 0)
        with pytest.raises(ValueError, match=f"cache keeps a window of {local + 1} positions, the layer's is {local}"):
            module(x, cache=wider)
        with pytest.raises(ValueError, match=f"x has batch size 1, the cache was made for batch_size={B}"):
            module(x[:1], cache=module.new_cache(B, 16))
        cache = module.new_cache(B, 16)  # float64, as the layer
        module.float()
        with pytest.raises(ValueError, match="cache is torch.float64 on cpu, x is torch.float32 on cpu"):
            module(x.float(), cache=cache)
    module.double().requires_grad_(True)
    with pytest.raises(ValueError, match="a KV cache is for inference"):
        module(x, cache=module.new_cache(B, 16))


# Configs: what is refused, in every family's copy of the checks.

# (fields replacing the family's, error, what the message must say): read on every family's global (RoPE) layer.
BAD_FIELDS = [
    (dict(model_type="bert"), ValueError,
     "this class builds the layers of model_type .*; the config has model_type='bert'"),
    (dict(attention_dropout=0.1), ValueError, "attention_dropout must be 0.0 .* got 0.1"),
    (dict(num_key_value_heads=3), ValueError, "num_key_value_heads=3, num_attention_heads=4"),
    (dict(num_attention_heads=4.0), TypeError, "num_attention_heads=4.0"),
    (dict(head_dim=15), ValueError, "head_dim must be even .* head_dim=15"),
    (dict(rope_theta=0.0), ValueError, r"rope_theta must be finite and > \d, got rope_theta=0.0"),  # > 1 under YaRN
    (dict(rope_theta="10000"), TypeError, "rope_theta must be a number, got rope_theta='10000'"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), ValueError,
     "rope_type must be one of default, linear, llama3, yarn, got rope_type='dynamic'"),
    (dict(rope_scaling={"rope_type": "linear"}), ValueError,
     "config lacks the field 'factor', which rope_type='linear'"),
    (dict(rope_scaling={**LINEAR, "factor": NAN}), ValueError, "factor=nan"),
    (dict(rope_scaling={**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}), ValueError,
     "low_freq_factor=4.0, high_freq_factor=1.0"),
    (dict(rope_scaling={**YARN, "original_max_position_embeddings": 16.0}), TypeError,
     "original_max_position_embeddings must be an int, got original_max_position_embeddings=16.0"),
    (dict(rope_scaling={**YARN, "original_max_position_embeddings": 0}), ValueError,
     "original_max_position_embeddings must be positive"),
    (dict(rope_theta=1.0, rope_scaling=YARN), ValueError, "rope_theta must be finite and > 1, got rope_theta=1.0"),
    (dict(rope_scaling={**YARN, "beta_slow": INF}), ValueError, "beta_slow=inf"),
    (dict(rope_scaling={**YARN, "attention_factor": 0.0}), ValueError, "attention_factor=0.0"),
    (dict(rope_scaling="linear"), TypeError, "rope_scaling must be a dict of RoPE fields, got rope_scaling='linear'"),
    (dict(rope_parameters=["linear"]), TypeError, r"must be a dict of RoPE fields, got rope_parameters.*=\['linear'\]"),
    (dict(rms_norm_eps=NAN), ValueError, "rms_norm_eps=nan"),  # the families that read it
    (dict(layer_types="full_attention"), TypeError, "layer_types must be a list of layer kinds"),
    (dict(layer_types=["full_attention"]), ValueError, "one kind per layer .* got 1"),
    (dict(layer_types=["banana"] * 4), ValueError, "layer_types holds 'banana'; the layers of this family are"),
]
READS_RMS_NORM_EPS = ("qwen3", "olmo2", "gemma3_text", "llama4_text")


def bad_case(family, fields):
    """`fields` as `family` spells them: Gemma 3 takes `rope_parameters` keyed by layer type, and `layer_types`
    lists one kind per layer of the family's config."""
    fields = dict(fields)
    if "layer_types" in fields and isinstance(fields["layer_types"], list) and len(fields["layer_types"]) == 4:
        fields["layer_types"] = fields["layer_types"][:1] * PLAIN[family]["num_hidden_layers"]
    if family == "gemma3_text" and "rope_parameters" in fields:
        fields["rope_parameters"] = {"full_attention": fields["rope_parameters"],
                                     "sliding_attention": {"rope_theta": 1e4}}
    return fields


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fields,error,pattern", BAD_FIELDS,
                         ids=[f"{'-'.join(f)}-{i}" for i, (f, _, _) in enumerate(BAD_FIELDS)])
def test_a_bad_config_is_refused_naming_the_field_in_every_family(family, fields, error, pattern):
    if "rms_norm_eps" in fields and family not in READS_RMS_NORM_EPS:
        pytest.skip(f"{family}'s attention has no norm: it never reads rms_norm_eps")
    with pytest.raises(error, match=pattern):
        build(family, GLOBAL_LAYER[family], **bad_case(family, fields))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_layer_index_outside_the_model_is_refused_in_every_family(family):
    layers = PLAIN[family]["num_hidden_layers"]
    for layer_idx in (layers, -1, True, 1.0, "0"):
        with pytest.raises(ValueError, match=rf"layer_idx must be an int in \[0, num_hidden_layers={layers}\), "
                                             rf"got layer_idx={layer_idx!r}"):
            build(family, layer_idx)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_missing_field_is_named_whether_the_config_is_a_mapping_or_an_object(family):
    fields = {name: value for name, value in PLAIN[family].items() if name != "hidden_size"}
    cls = MODELS[family]
    with pytest.raises(ValueError, match=f"config lacks the field 'hidden_size' \\(model_type='{family}'\\)"):
        cls.from_config(fields, 0)
    with pytest.raises(ValueError, match=f"config lacks the field 'hidden_size' \\(model_type='{family}'\\)"):
        cls.from_config(types.SimpleNamespace(**fields), 0)


# Configs: every spelling means what transformers means.

def fingerprint(module):
    """What a layer is: its settings, RoPE frequencies and parameter shapes."""
    settings = {name: value for name, value in vars(module).items()
                if not name.startswith("_") and isinstance(value, (bool, int, float, str, tuple, dict, type(None)))}
    settings["inv_freq"] = None if module.inv_freq is None else module.inv_freq.tolist()
    settings["parameters"] = {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}
    return settings


@pytest.mark.parametrize("family", FAMILIES)
def test_an_object_with_the_fields_builds_the_layers_of_the_mapping(family):
    """A config given as attributes (a `SimpleNamespace`, as a user without transformers writes one) builds every
    layer as the same fields in a mapping do."""
    config = PLAIN[family]
    for layer_idx in range(config["num_hidden_layers"]):
        assert (fingerprint(MODELS[family].from_config(types.SimpleNamespace(**config), layer_idx))
                == fingerprint(MODELS[family].from_config(config, layer_idx))), layer_idx


@pytest.mark.parametrize("family", FAMILIES)
def test_a_config_naming_no_model_type_builds_the_class_own_family(family):
    """Given straight to a class, a config without `model_type` is read as that class's first model type's."""
    config = PLAIN[family]
    untyped = {name: value for name, value in config.items() if name != "model_type"}
    for layer_idx in range(config["num_hidden_layers"]):
        assert (fingerprint(MODELS[family].from_config(untyped, layer_idx))
                == fingerprint(MODELS[family].from_config(config, layer_idx))), layer_idx


@pytest.mark.parametrize("family", FAMILIES)
def test_rope_scaling_spelled_with_the_old_type_key_means_rope_type(family):
    """transformers 4's configs name the scaling `type`; it means `rope_type`, and wins where both are given."""
    layer_idx = GLOBAL_LAYER[family]
    new = build(family, layer_idx, rope_scaling={"rope_type": "linear", "factor": 4.0})
    old = build(family, layer_idx, rope_scaling={"type": "linear", "factor": 4.0})
    both = build(family, layer_idx, rope_scaling={"type": "linear", "rope_type": "default", "factor": 4.0})
    for module in (old, both):
        theta = module.rope_parameters["rope_theta"]
        assert module.rope_parameters == {"rope_type": "linear", "factor": 4.0, "rope_theta": theta}
        assert module.inv_freq.tolist() == new.inv_freq.tolist()
    # Linear scaling divides every frequency of the unscaled layer by the factor.
    plain = build(family, layer_idx, rope_scaling={"type": "default"})
    assert new.inv_freq.tolist() == (plain.inv_freq / 4.0).tolist()


ROPE_FAMILIES = [family for family in FAMILIES if family != "gemma3_text"]  # Gemma 3's: its own test below


@pytest.mark.parametrize("family", ROPE_FAMILIES)
def test_rope_parameters_keyed_by_layer_type_give_each_layer_its_own(family):
    """transformers 5 may key `rope_parameters` by layer type; each layer then rotates with its kind's dict, and a
    flat dict applies to every layer."""
    local, full = {"rope_type": "default", "rope_theta": 1e4}, {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    config = {**PLAIN[family], "rope_parameters": {"sliding_attention": local, "chunked_attention": local,
                                                   "full_attention": full}}
    config.pop("rope_theta")
    for layer_idx in range(config["num_hidden_layers"]):
        module = MODELS[family].from_config(config, layer_idx)
        if module.inv_freq is None:  # Llama 4's NoPE layer
            continue
        expected = full if module.layer_type == "full_attention" else local
        flat = MODELS[family].from_config({**config, "rope_parameters": expected}, layer_idx)
        assert module.rope_parameters == expected, layer_idx
        assert module.inv_freq.tolist() == flat.inv_freq.tolist(), layer_idx


@pytest.mark.parametrize("family", FAMILIES)
def test_kv_heads_and_head_dim_left_out_take_transformers_defaults(family):
    """No `num_key_value_heads` (absent, None or 0) is one K/V head per query head; no `head_dim` (absent, None or
    0) is `hidden_size // num_attention_heads`: the shapes of multi-head attention."""
    for missing in ("absent", None, 0):
        fields = {**PLAIN[family], "num_key_value_heads": missing, "head_dim": missing}
        if missing == "absent":
            del fields["num_key_value_heads"], fields["head_dim"]
        module = MODELS[family].from_config(fields, 0)
        assert (module.num_key_value_heads, module.head_dim) == (4, 16)
        assert module.k_proj.weight.shape == module.q_proj.weight.shape == (64, 64)


def test_config_value_reads_a_mapping_or_an_object_and_names_a_missing_field():
    """`attention.models.config_value`, the original of every family's copy."""
    fields = {"model_type": "llama", "rope_theta": 1e4}
    for config in (fields, types.SimpleNamespace(**fields)):
        assert config_value(config, "rope_theta") == 1e4
        assert config_value(config, "sliding_window", None) is None
        assert config_value(config, "head_dim", 0) == 0
        with pytest.raises(ValueError, match=r"config lacks the field 'hidden_size' \(model_type='llama'\)"):
            config_value(config, "hidden_size")
    with pytest.raises(ValueError, match=r"config lacks the field 'hidden_size' \(model_type=None\)"):
        config_value(types.SimpleNamespace(), "hidden_size")
    with pytest.raises(ValueError, match=r"\(model_type=None\)"):
        config_value({}, "hidden_size")


# The position encodings (attention/positional/): bad arguments refused naming them, before any work.

def test_position_encodings_refuse_bad_sizes_naming_the_argument():
    from attention.positional.alibi import alibi_bias
    from attention.positional.learned import LearnedPositionalEmbedding
    from attention.positional.rotary import RotaryEmbedding
    from attention.positional.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

    with pytest.raises(ValueError, match=r"dim must be even \(sine and cosine pairs\), got dim=5"):
        sinusoidal_table(4, 5)
    for base in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=f"base must be positive, got base={base}"):
            sinusoidal_table(4, 8, base=base)
        with pytest.raises(ValueError, match=f"base must be positive, got base={base}"):
            SinusoidalPositionalEncoding(8, base=base)
        with pytest.raises(ValueError, match=f"base must be positive, got base={base}"):
            RotaryEmbedding(8, base=base)
    for module, name in ((SinusoidalPositionalEncoding(8), "dim=8"), (LearnedPositionalEmbedding(6, 8), "dim=8"),
                         (RotaryEmbedding(8), "head_dim=8")):
        with pytest.raises(ValueError, match=rf"x must have shape \(.*{name}\), got x.shape=\(2, 3, 4\)"):
            module(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, dim=8\), got x.shape=\(3, 8\)"):
        SinusoidalPositionalEncoding(8)(torch.zeros(3, 8))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, head_dim=8\), got x.shape=\(8,\)"):
        RotaryEmbedding(8)(torch.zeros(8))
    for name, sizes in (("q_len", (0, 4)), ("kv_len", (4, True)), ("q_len", (2.0, 4))):
        value = sizes[0] if name == "q_len" else sizes[1]
        with pytest.raises(ValueError, match=f"{name} must be a positive int, got {name}={value!r}"):
            alibi_bias(2, *sizes)


def test_sinusoidal_encoding_of_no_positions_is_empty_and_an_offset_continues_the_table():
    from attention.positional.sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table

    assert sinusoidal_table(0, 8).shape == (0, 8)
    x = torch.zeros(1, 3, 8, dtype=torch.float64)
    assert torch.equal(SinusoidalPositionalEncoding(8)(x, offset=5)[0], sinusoidal_table(8, 8, dtype=torch.float64)[5:])


def test_alibi_score_mod_adds_the_causal_alibi_bias():
    """FlexAttention's `score_mod` adds, at every query and key index on and below the diagonal, the bias that
    `alibi_bias` builds (the causal mask removes the rest)."""
    from attention.positional.alibi import alibi_bias, alibi_score_mod, alibi_slopes

    num_heads, q_len, kv_len = 3, 4, 6
    score_mod = alibi_score_mod(alibi_slopes(num_heads))
    h, q_idx, kv_idx = torch.meshgrid(torch.arange(num_heads), torch.arange(q_len), torch.arange(kv_len), indexing="ij")
    scores = torch.zeros(num_heads, q_len, kv_len, dtype=torch.float64)
    modded = score_mod(scores, 0, h, q_idx, kv_idx)  # (H, Tq, Tk)
    bias = alibi_bias(num_heads, q_len, kv_len, dtype=torch.float64)
    below = bias.isfinite()
    assert torch.equal(modded[below], bias[below])


# Multi-head latent attention (attention/models/deepseek_v3.py): its own constructor and checks.

MLA = dict(model_type="deepseek_v3", hidden_size=64, num_attention_heads=4, num_hidden_layers=2, q_lora_rank=24,
           kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, rope_theta=1e4)
LLAMA3_MLA = {**LLAMA3, "rope_theta": 1e4}
# (fields replacing MLA's, error, what the message must say)
MLA_BAD_FIELDS = [
    (dict(kv_lora_rank=0), ValueError, "kv_lora_rank must be a positive int, got kv_lora_rank=0"),
    (dict(q_lora_rank=2.5), ValueError, "q_lora_rank must be a positive int, got q_lora_rank=2.5"),
    (dict(v_head_dim=True), ValueError, "v_head_dim must be a positive int, got v_head_dim=True"),
    (dict(rope_theta="1e4"), TypeError, "rope_theta must be a number, got rope_theta='1e4'"),
    (dict(rope_scaling={**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}), ValueError,
     "low_freq_factor=4.0, high_freq_factor=1.0"),
    (dict(rope_scaling={**YARN, "attention_factor": -1.0}), ValueError, "attention_factor=-1.0"),
    (dict(rope_scaling={**YARN, "original_max_position_embeddings": 16.0}), TypeError,
     "original_max_position_embeddings must be an int, got original_max_position_embeddings=16.0"),
    (dict(rope_scaling={**YARN, "original_max_position_embeddings": -16}), ValueError,
     "original_max_position_embeddings must be positive, got original_max_position_embeddings=-16"),
]


@pytest.mark.parametrize("fields,error,pattern", MLA_BAD_FIELDS,
                         ids=[f"{'-'.join(f)}-{i}" for i, (f, _, _) in enumerate(MLA_BAD_FIELDS)])
def test_a_bad_mla_config_is_refused_naming_the_field(fields, error, pattern):
    with pytest.raises(error, match=pattern):
        MODELS["deepseek_v3"].from_config({**MLA, **fields}, 0)


def test_mla_refuses_a_bad_layer_index_and_input():
    from attention.models.deepseek_v3 import DeepseekV3Attention

    for layer_idx in (-1, True, 0.0):
        with pytest.raises(ValueError, match=f"layer_idx must be a non-negative int, got layer_idx={layer_idx!r}"):
            DeepseekV3Attention.from_config(MLA, layer_idx)
    sizes = dict(hidden_size=64, num_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
                 qk_rope_head_dim=8, v_head_dim=12)
    for layer_idx, error in ((-1, ValueError), (1.0, TypeError)):
        with pytest.raises(error, match=f"layer_idx must be .*got layer_idx={layer_idx!r}"):
            DeepseekV3Attention(**sizes, layer_idx=layer_idx)
    assert DeepseekV3Attention(**sizes).layer_idx is None  # built directly: no layer index
    module = DeepseekV3Attention.from_config(MLA, 0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        module([[0.0] * 64])


def test_mla_without_a_config_layer_count_builds_any_layer_index():
    """`num_hidden_layers` is optional for MLA (every layer's attention is the same): any index builds, and the
    layer keeps it (its cache then serves that index only)."""
    fields = {name: value for name, value in MLA.items() if name != "num_hidden_layers"}
    assert MODELS["deepseek_v3"].from_config(fields, 40).layer_idx == 40


def test_mla_benchmark_helpers_refuse_a_bad_path_or_size():
    from attention.models.deepseek_v3 import decode_step_bytes, latent_attention_flops, latent_config

    with pytest.raises(ValueError, match="head_dim must be divisible by 4 for MLA .* got 6"):
        latent_config(4, 6)
    config = latent_config(4, 8)
    widths = ("hidden_size", "kv_lora_rank", "qk_rope_head_dim", "q_lora_rank")
    assert tuple(config[name] for name in widths) == (32, 32, 4, 96)  # 4 heads of 8: latent 4 x 8, rotary 8 / 2
    with pytest.raises(ValueError, match="path must be one of \\('absorbed', 'naive'\\), got path='fast'"):
        latent_attention_flops(config, 1, 8, "fast")
    with pytest.raises(ValueError, match="path must be one of \\('absorbed', 'naive'\\), got path='fast'"):
        decode_step_bytes(config, 8, 1, torch.float32, "fast")
    for new_tokens, context in ((0, 8), (9, 8)):
        with pytest.raises(ValueError,
                           match=f"need 0 < new_tokens <= context, got new_tokens={new_tokens}, context={context}"):
            latent_attention_flops(config, new_tokens, context, "naive")
