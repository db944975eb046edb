"""Gemma 4's attention (attention/models/gemma4.py): equal to transformers' layer for every kind of layer (local,
global with K = V and its own head size and K/V heads, storing and reusing K/V across layers), equal in float64 to a
reference written here from the model card's description on `attention.reference`'s primitives, forward and
gradients, and decoding equal to the full forward at every step, the reusing layers with no cache of their own."""

import math

import pytest
import torch

from attention.models import MODELS, ModelAttention
from attention.models.gemma4 import Gemma4Attention, gemma4_rope_frequencies
from attention.reference import reference_kernel, reference_rms_norm, reference_rope, rope_frequencies
from helpers import captured_attention

F64 = dict(atol=1e-12, rtol=1e-12)
# transformers computes its norms and rotary angles in float32 even in a float64 model
TRANSFORMERS = dict(atol=2e-6, rtol=2e-6)
LAYER_TYPES = ["sliding_attention", "full_attention"] * 3
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
             num_hidden_layers=6, sliding_window=4, layer_types=LAYER_TYPES, rms_norm_eps=1e-6)
ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1000000.0}}
# K = V with one K/V head on the global layers, and the last two layers reusing layers 2 and 3's K/V (E2B's and E4B's
# sharing); or neither (the 31B shares nothing; E2B has no K = V)
CONFIGS = {
    "k-eq-v-shared": dict(attention_k_eq_v=True, num_global_key_value_heads=1, num_kv_shared_layers=2),
    "plain": dict(attention_k_eq_v=False, num_kv_shared_layers=0),
}


def plain_config(name, **fields):
    """`CONFIGS[name]` as a config.json's `text_config`: a mapping with transformers' field names."""
    return {"model_type": "gemma4_text", **SIZES, **CONFIGS[name], "rope_parameters": ROPE, **fields}


def randomized(module, seed):
    """`module` in float64 with every parameter drawn afresh from `seed` (norm weights near 1)."""
    generator = torch.Generator().manual_seed(seed)
    module = module.to(torch.float64)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            param.copy_(1 + 0.2 * noise if "norm" in name else noise / math.sqrt(param.shape[-1]))
    return module


def build_layers(name, seed=0, **options):
    config = plain_config(name)
    return [randomized(Gemma4Attention.from_config(config, i, **options), seed + i).eval() for i in range(6)]


def inputs(T, seed, B=2):
    """One input per layer: `[(B, T, hidden)] * 6`, each drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, SIZES["hidden_size"], dtype=torch.float64, generator=generator) for _ in range(6)]


def run_layers(layers, xs, caches=None):
    """Every layer on its input in order, one `shared_kv` for the step, as the model runs them."""
    shared_kv = {}
    caches = caches or [None] * len(layers)
    return [layer(x, cache=cache, shared_kv=shared_kv) for layer, x, cache in zip(layers, xs, caches)]


# ---- transformers' layer ----

def tiny_transformers_model(name, seed):
    """A tiny random Gemma 4 text model in float64, eager attention, every parameter randomised."""
    transformers = pytest.importorskip("transformers")
    fields = {key: value for key, value in SIZES.items() if key != "global_head_dim"}
    # per-layer inputs on: transformers' K/V-sharing path slices them and fails without (transformers 5.x)
    config = transformers.Gemma4TextConfig(**fields, **CONFIGS[name], global_head_dim=SIZES["global_head_dim"],
                                           rope_parameters=ROPE, intermediate_size=48, vocab_size=64,
                                           hidden_size_per_layer_input=8, vocab_size_per_layer_input=64)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(config).to(torch.float64).eval()
    return config, randomized(model, seed)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_transformers_layer(name):
    """Each layer fed what transformers' tiny model feeds its attention, in order, one `shared_kv` for the pass (the
    reusing layers read what layers 2 and 3 stored), weights loaded under transformers' names unchanged."""
    config, model = tiny_transformers_model(name, seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))
    captured = captured_attention(model, input_ids)
    shared_kv = {}
    for layer_idx, (hidden, expected) in sorted(captured.items()):
        module = Gemma4Attention.from_config(config, layer_idx).to(torch.float64).eval()
        module.load_state_dict(model.model.layers[layer_idx].self_attn.state_dict())
        assert module.kv_sharing == config.kv_sharing_modes[layer_idx]
        with torch.no_grad():
            torch.testing.assert_close(module(hidden, shared_kv=shared_kv), expected, **TRANSFORMERS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_config_json_builds_the_layers_transformers_config_builds(name):
    """From a config.json's fields (`global_head_dim`, `num_global_key_value_heads`) or from transformers' config
    object (`per_layer_config`): the same kinds, head sizes, sharing and parameters."""
    config, _ = tiny_transformers_model(name, seed=1)
    for layer_idx in range(6):
        from_json = Gemma4Attention.from_config(plain_config(name), layer_idx)
        from_object = Gemma4Attention.from_config(config, layer_idx)
        for attribute in ("layer_type", "sliding_window", "head_dim", "num_key_value_heads", "kv_sharing",
                          "key_is_value"):
            assert getattr(from_json, attribute) == getattr(from_object, attribute), (layer_idx, attribute)
        assert {k: v.shape for k, v in from_json.state_dict().items()} == \
               {k: v.shape for k, v in from_object.state_dict().items()}


def test_proportional_rope_equals_transformers():
    """The global layers' "proportional" RoPE: the first quarter (here half) of the pairs turn, at the frequencies of
    the whole head; the rest stay put. Equal to transformers' `_compute_proportional_rope_parameters`."""
    pytest.importorskip("transformers")
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for rope, head_dim in ((ROPE["full_attention"], 16), ({**ROPE["full_attention"], "partial_rotary_factor": 0.25,
                                                           "factor": 8.0}, 64)):
        config = Gemma4TextConfig(**{**SIZES, "global_head_dim": head_dim},
                                  rope_parameters={**ROPE, "full_attention": rope})
        expected, factor = ROPE_INIT_FUNCTIONS["proportional"](config, None, layer_type="full_attention")
        inv_freq, attention_factor = gemma4_rope_frequencies(head_dim, dict(rope))
        torch.testing.assert_close(inv_freq.float(), expected)
        assert attention_factor == factor == 1.0
        assert (inv_freq[int(rope["partial_rotary_factor"] * head_dim // 2):] == 0).all()


# ---- the float64 reference, written here from the description of Gemma 4's attention ----

def reference_layer(config, layer_idx, x, state, kv_x, kv_state, past=0):
    """Layer `layer_idx` of `config` in float64 over positions `past .. past + T - 1` of `x` `(B, T, hidden)`, attending
    to the keys and values that layer `kv_state`'s weights make of `kv_x` `(B, S, hidden)` (positions `0 .. S - 1`):
    its own weights and input, or, for a layer that reuses, the storing layer's. Queries and keys RMS-normed per head
    (times the weight), rotated; values RMS-normed without weight; K = V takes the value from `k_proj` on a global
    layer where `attention_k_eq_v`; no score scale; a window of `sliding_window` keys on local layers."""
    kind = config["layer_types"][layer_idx]
    head_dim = config["global_head_dim"] if kind == "full_attention" else config["head_dim"]
    f64 = {key: value.to(torch.float64) for key, value in {**kv_state, **state}.items()}
    B, T, _ = x.shape
    S = kv_x.shape[1]

    def heads(y):  # (B, L, n * D) -> (B, n, L, D)
        return y.reshape(B, y.shape[1], -1, head_dim).transpose(1, 2)

    eps = config["rms_norm_eps"]
    q = reference_rms_norm(heads(x.to(torch.float64) @ f64["q_proj.weight"].T), f64["q_norm.weight"], eps)
    raw_key = heads(kv_x.to(torch.float64) @ f64["k_proj.weight"].T)
    value_weight = f64["k_proj.weight"] if "v_proj.weight" not in kv_state else f64["v_proj.weight"]
    k = reference_rms_norm(raw_key, f64["k_norm.weight"], eps)
    v = reference_rms_norm(heads(kv_x.to(torch.float64) @ value_weight.T), None, eps)
    rope = config["rope_parameters"][kind]
    if rope["rope_type"] == "proportional":  # pairs past partial_rotary_factor * D / 2 never turn
        inverse_frequencies = rope["rope_theta"] ** (-2 * torch.arange(head_dim // 2, dtype=torch.float64) / head_dim)
        inverse_frequencies[int(rope["partial_rotary_factor"] * head_dim // 2):] = 0
    else:
        inverse_frequencies, _ = rope_frequencies(head_dim, rope)
    query_positions, key_positions = torch.arange(past, past + T), torch.arange(S)
    q = reference_rope(q, query_positions, inverse_frequencies)
    k = reference_rope(k, key_positions, inverse_frequencies)
    distance = query_positions[:, None] - key_positions[None, :]
    mask = distance >= 0
    if kind == "sliding_attention":
        mask = mask & (distance < config["sliding_window"])
    out, _ = reference_kernel(q, k, v, mask, scale=1.0)
    return out.transpose(1, 2).reshape(B, T, -1) @ f64["o_proj.weight"].T


def reference_layers(config, layers, xs):
    """Every layer's reference output; a reusing layer attends to the storing layer's K/V of its kind."""
    storing = {}
    outputs = []
    for i, (layer, x) in enumerate(zip(layers, xs)):
        state = dict(layer.named_parameters())
        if layer.kv_sharing == "reuse":
            kv_x, kv_state = storing[layer.layer_type]
        else:
            kv_x, kv_state = x, state
            if layer.kv_sharing == "store":
                storing[layer.layer_type] = (x, state)
        outputs.append(reference_layer(config, i, x, state, kv_x, kv_state))
    return outputs


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_reference_forward_and_gradients(name):
    layers = build_layers(name, seed=3)
    xs = [x.requires_grad_() for x in inputs(11, seed=4)]
    weights = [torch.randn(2, 11, SIZES["hidden_size"], dtype=torch.float64,
                           generator=torch.Generator().manual_seed(5 + i)) for i in range(6)]
    outputs = run_layers(layers, xs)
    expected = reference_layers(plain_config(name), layers, xs)
    for out, ref in zip(outputs, expected):
        torch.testing.assert_close(out, ref, **F64)
    parameters = [p for layer in layers for p in layer.parameters()]
    ours = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outputs, weights)), xs + parameters)
    theirs = torch.autograd.grad(sum((o * w).sum() for o, w in zip(expected, weights)), xs + parameters)
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine, reference, **F64)


def test_a_reusing_layer_attends_to_the_storing_layers_keys_and_values():
    """Layer 4 (local) reuses layer 2's K/V, layer 5 (global) layer 3's: changing layer 2's input changes layer 4's
    output and not layer 5's; layers 4 and 5 have no K/V weights."""
    layers = build_layers("k-eq-v-shared", seed=6)
    assert [layer.kv_sharing for layer in layers] == [None, None, "store", "store", "reuse", "reuse"]
    assert not any(hasattr(layers[i], name) for i in (4, 5) for name in ("k_proj", "v_proj", "k_norm"))
    xs = inputs(9, seed=7)
    with torch.no_grad():
        before = run_layers(layers, xs)
        xs[2] = xs[2] + 1.0
        after = run_layers(layers, xs)
    assert not torch.allclose(before[4], after[4])
    torch.testing.assert_close(before[5], after[5], **F64)


def test_k_eq_v_global_layers_have_no_v_proj_and_fewer_kv_heads():
    layers = build_layers("k-eq-v-shared")
    global_layer, local_layer = layers[1], layers[0]
    assert global_layer.key_is_value and global_layer.v_proj is None and "v_proj.weight" not in global_layer.state_dict()
    assert (global_layer.num_key_value_heads, global_layer.head_dim) == (1, 16)
    assert not local_layer.key_is_value and local_layer.v_proj is not None
    assert (local_layer.num_key_value_heads, local_layer.head_dim) == (2, 8)
    assert global_layer.scaling == 1.0 and "weight" not in dict(global_layer.v_norm.named_parameters())


# ---- decoding ----

@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decoding_every_step_equals_full_forward(name):
    """A prompt of 5, a chunk of 3, then single tokens to 14 (past the window of 4): each step, the storing layers'
    caches feed the reusing layers (which hold none), and every layer's output equals the full forward's."""
    layers = build_layers(name, seed=8)
    xs = inputs(14, seed=9)
    with torch.no_grad():
        full = run_layers(layers, xs)
        caches = [layer.new_cache(2, 14) for layer in layers]
        assert [cache is None for cache in caches] == [layer.kv_sharing == "reuse" for layer in layers]
        for start, stop in [(0, 5), (5, 8)] + [(t, t + 1) for t in range(8, 14)]:
            steps = run_layers(layers, [x[:, start:stop] for x in xs], caches)
            for out, expected in zip(steps, full):
                torch.testing.assert_close(out, expected[:, start:stop], **F64)


def test_sliding_caches_keep_the_window_and_global_ones_their_head_size():
    layers = build_layers("k-eq-v-shared")
    with torch.device("meta"):
        caches = [layer.new_cache(3, 100) for layer in layers]
    assert caches[0].nbytes == 3 * 2 * 2 * 8 * 8 * 4  # 3 sequences, K and V, 2 heads of 8, window 4, float64
    assert caches[1].nbytes == 3 * 2 * 1 * 16 * 8 * 100  # one head of 16 (K = V: both still kept), 100 positions
    assert caches[4] is None and caches[5] is None


# ---- the family contract and bad input ----

def test_registry_and_contract():
    assert MODELS["gemma4_text"] is Gemma4Attention
    layer = Gemma4Attention.from_config(plain_config("plain"), 1)
    assert isinstance(layer, ModelAttention) and layer.layer_type == "full_attention"
    last = Gemma4Attention.from_config(plain_config("plain", layer_types=["full_attention"] + ["sliding_attention"] * 5), 5)
    assert last.layer_type == "full_attention"  # transformers makes the last layer global whatever the list says
    default = Gemma4Attention.from_config({k: v for k, v in plain_config("plain").items()
                                           if k not in ("layer_types", "rope_parameters")}, 5)
    assert default.layer_type == "full_attention" and default.rope_parameters["rope_type"] == "proportional"


@pytest.mark.parametrize("fields, error, pattern", [
    (dict(num_kv_shared_layers=7), ValueError, r"num_kv_shared_layers must be at most num_hidden_layers=6, got num_kv_shared_layers=7"),
    (dict(num_kv_shared_layers=-1), ValueError, r"num_kv_shared_layers must be non-negative, got num_kv_shared_layers=-1"),
    (dict(num_kv_shared_layers=5), ValueError, r"num_kv_shared_layers=5 leaves no earlier layer of kind full_attention to share its K/V"),
    (dict(num_kv_shared_layers=2.0), TypeError, r"num_kv_shared_layers must be an int, got num_kv_shared_layers=2.0"),
    (dict(global_head_dim=0), ValueError, r"head_dim must be positive, got head_dim=0"),
    (dict(global_head_dim="16"), TypeError, r"head_dim must be an int, got head_dim='16'"),
    (dict(num_global_key_value_heads=3), ValueError, r"num_key_value_heads must divide num_attention_heads"),
    (dict(use_bidirectional_attention="all"), ValueError, r"use_bidirectional_attention must be None or 'vision'"),
    (dict(rope_parameters={**ROPE, "full_attention": {**ROPE["full_attention"], "partial_rotary_factor": 1.5}}),
     ValueError, r"partial_rotary_factor must be at most 1 and head_dim even, got partial_rotary_factor=1.5"),
    (dict(rope_parameters={"sliding_attention": ROPE["sliding_attention"]}), ValueError,
     r"rope_parameters must hold a dict per layer type, lacks 'full_attention'"),
    (dict(layer_types=["local"] * 6), ValueError, r"layer_types holds 'local'"),
])
def test_a_bad_config_is_refused_naming_the_field(fields, error, pattern):
    with pytest.raises(error, match=pattern):
        Gemma4Attention.from_config(plain_config("k-eq-v-shared", **fields), 1)


def test_a_reusing_layer_needs_the_steps_shared_kv():
    layers = build_layers("k-eq-v-shared")
    xs = inputs(5, seed=10)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"layer 4 reuses the K/V of the last earlier sliding_attention layer"):
            layers[4](xs[4])
        with pytest.raises(ValueError, match=r"keeps no cache: pass cache=None"):
            layers[4](xs[4], cache=layers[2].new_cache(2, 5), shared_kv={})
        shared_kv = {}
        layers[2](xs[2], shared_kv=shared_kv)
        with pytest.raises(ValueError, match=r"shared_kv holds K/V for batch 2 and 5 new tokens, x has shape \(2, 3, 32\)"):
            layers[4](xs[4][:, :3], shared_kv=shared_kv)


def test_other_rope_types_on_local_layers_equal_the_references_frequencies():
    """A config may give a layer kind any RoPE transformers knows: `gemma4_rope_frequencies` hands all but
    "proportional" to the marked copy of llama.py's `rope_frequencies`, equal to `attention.reference`'s."""
    for parameters in ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 8.0},
                       {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                       {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
                       {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                        "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2}):
        layer = Gemma4Attention.from_config(plain_config("plain", rope_parameters={**ROPE, "sliding_attention": parameters}), 0)
        expected, factor = rope_frequencies(8, parameters)
        torch.testing.assert_close(layer.inv_freq, expected, **F64)
        assert layer.attention_scaling == pytest.approx(factor)
    with pytest.raises(ValueError, match=r"rope_type must be one of default, linear, llama3, yarn, got rope_type='ntk'"):
        Gemma4Attention.from_config(plain_config("plain", rope_parameters={**ROPE, "sliding_attention": {
            "rope_type": "ntk", "rope_theta": 10000.0}}), 0)
    with pytest.raises(ValueError, match=r"config lacks the field 'factor', which rope_type='linear' reads"):
        Gemma4Attention.from_config(plain_config("plain", rope_parameters={**ROPE, "sliding_attention": {
            "rope_type": "linear", "rope_theta": 10000.0}}), 0)
    with pytest.raises(ValueError, match=r"high_freq_factor must be at least low_freq_factor"):
        Gemma4Attention.from_config(plain_config("plain", rope_parameters={**ROPE, "sliding_attention": {
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
            "original_max_position_embeddings": 16}}), 0)
    with pytest.raises(ValueError, match=r"attention_factor must be finite and > 0, got attention_factor=0"):
        Gemma4Attention.from_config(plain_config("plain", rope_parameters={**ROPE, "sliding_attention": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
            "attention_factor": 0}}), 0)
    with pytest.raises(TypeError, match=r"rope_parameters\['sliding_attention'\] must be a dict"):
        Gemma4Attention.from_config(plain_config("plain", rope_parameters={**ROPE, "sliding_attention": 10000.0}), 0)


def test_a_per_layer_config_mapping_and_an_all_reusing_model():
    """A saved per_layer_config (overrides by layer index, str keys as JSON writes them) sizes the layers as
    global_head_dim would; with every layer reusing (transformers' assistant models) no layer has K/V weights."""
    fields = {key: value for key, value in plain_config("plain").items() if key != "global_head_dim"}
    layer = Gemma4Attention.from_config({**fields, "per_layer_config": {"1": {"head_dim": 16, "num_key_value_heads": 1}}}, 1)
    assert (layer.head_dim, layer.num_key_value_heads) == (16, 1)
    assert Gemma4Attention.from_config({**fields, "per_layer_config": {}}, 0).head_dim == 8
    every = [Gemma4Attention.from_config(plain_config("plain", num_kv_shared_layers=6), i) for i in range(6)]
    assert all(layer.kv_sharing == "reuse" and not hasattr(layer, "k_proj") for layer in every)


def test_bad_input_caches_and_state_dicts_are_refused_naming_them():
    layers = build_layers("k-eq-v-shared")
    layer = layers[0]
    x = inputs(5, seed=11)[0]
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor, got list"):
        layer([[0.0]])
    with pytest.raises(TypeError, match=r"x must be a floating-point tensor"):
        layer(torch.zeros(2, 5, 32, dtype=torch.long))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T > 0, hidden_size=32\)"):
        layer(torch.zeros(2, 5, 31, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x.dtype=torch.float32 differs from the layer's dtype torch.float64"):
        layer(x.float())
    with pytest.raises(ValueError, match=r"a KV cache is for inference"):
        layer(x, cache=layer.new_cache(2, 8))
    with torch.no_grad():
        with pytest.raises(TypeError, match=r"cache must come from the layer's new_cache\(\), got dict"):
            layer(x, cache={})
        with pytest.raises(ValueError, match=r"cache was made by Gemma4Attention layer 2, not by this layer"):
            layer(x, cache=layers[2].new_cache(2, 8))
        with pytest.raises(ValueError, match=r"x has batch size 2, the cache was made for batch_size=3"):
            layer(x, cache=layer.new_cache(3, 8))
        with pytest.raises(ValueError, match=r"cache is torch.float32 on cpu, x is torch.float64 on cpu"):
            layer(x, cache=Gemma4Attention.from_config(plain_config("k-eq-v-shared"), 0).new_cache(2, 8))
        wide = layers[1].new_cache(2, 8)
        wide.layer = ("Gemma4Attention", 0)
        with pytest.raises(ValueError, match=r"cache holds 1 K/V heads of size 16, the layer has num_key_value_heads=2"):
            layer(x, cache=wide)
        long_window = layer.new_cache(2, 64)
        long_window.window = 9
        with pytest.raises(ValueError, match=r"cache keeps a window of 9 positions, the layer's is 4"):
            layer(x, cache=long_window)
        shared_kv = {}
        layers[3](x, shared_kv=shared_kv)
        shared_kv["sliding_attention"] = shared_kv["full_attention"]  # the global layer's K/V offered to a local one
        with pytest.raises(ValueError, match=r"shared_kv holds 1 K/V heads of size 16, layer 4 has num_key_value_heads=2"):
            layers[4](inputs(5, seed=12)[4], shared_kv=shared_kv)
    state = layer.state_dict()
    with pytest.raises(ValueError, match=r"missing keys \['q_proj.weight'\]"):
        layer.load_state_dict({k: v for k, v in state.items() if k != "q_proj.weight"})
    with pytest.raises(ValueError, match=r"k_proj.weight has shape \(8, 32\), the layer's is \(16, 32\)"):
        layer.load_state_dict({**state, "k_proj.weight": torch.zeros(8, 32)})


@pytest.mark.parametrize("fields, layer_idx, error, pattern", [
    (dict(model_type="gemma3_text"), 0, ValueError, r"this class builds the layers of model_type gemma4_text"),
    ({}, 6, ValueError, r"layer_idx must be an int in \[0, num_hidden_layers=6\), got layer_idx=6"),
    (dict(attention_dropout=0.1), 0, ValueError, r"attention_dropout must be 0.0"),
    (dict(rms_norm_eps=0), 0, ValueError, r"rms_norm_eps must be finite and > 0"),
    (dict(layer_types="sliding_attention"), 0, TypeError, r"layer_types must be a list of layer kinds"),
    (dict(layer_types=["sliding_attention"] * 5), 0, ValueError, r"layer_types must list one kind per layer"),
    (dict(rope_parameters=[]), 0, TypeError, r"rope_parameters must be a dict of RoPE fields"),
    (dict(sliding_window=0), 0, ValueError, r"sliding_window must be positive"),
])
def test_the_shared_checks_name_the_field(fields, layer_idx, error, pattern):
    with pytest.raises(error, match=pattern):
        Gemma4Attention.from_config(plain_config("plain", **fields), layer_idx)
