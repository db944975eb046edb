"""DeepSeek-V4's attention (attention/models/deepseek_v4.py): equal to transformers' `DeepseekV4Attention` fed what
its tiny model feeds it, for each kind of layer (sliding window only, CSA, HCA), in a full forward and while the
model decodes with its cache; forward and gradients equal to a float64 reference composed here from
`attention.reference`'s primitives as the report describes the layer; decoding (a prompt, a chunk, single tokens)
equal to the full forward at every step; bad configs refused before any weight is made; the cache's bytes as
`DeepseekV4Cache.nbytes` states them."""

import math

import pytest
import torch
from torch import nn

from attention.models.deepseek_v4 import DeepseekV4Attention, DeepseekV4Cache
from attention.reference import (
    reference_kernel,
    reference_rms_norm,
    reference_rope,
    rope_frequencies,
)

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
LAYER_TYPES = [SLIDING, CSA, HCA]
F64 = dict(atol=1e-12, rtol=1e-12)
# transformers computes its rotary angles in float32 (ours in float64, cast), so a float32 model differs by a few ulps.
FLOAT32 = dict(atol=2e-6, rtol=2e-6)
# Tiny sizes that still exercise every path over ~20 positions: a window of 5, CSA every 2 positions (overlapping
# windows of 4) with a top-2 indexer (sparse past position 5), HCA every 4, a quarter of each head rotating.
SIZES = dict(hidden_size=32, num_attention_heads=4, head_dim=16, q_lora_rank=12, o_groups=2, o_lora_rank=8,
             sliding_window=5, index_n_heads=3, index_head_dim=8, index_topk=2, partial_rotary_factor=0.5,
             compress_rates={CSA: 2, HCA: 4}, layer_types=LAYER_TYPES, num_hidden_layers=3,
             max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1}
CONFIGS = {"plain": {}, "yarn": {"rope_parameters": YARN}}  # YaRN reaches the CSA and HCA layers only


def plain_config(name="plain", **changes):
    """`CONFIGS[name]` as a mapping with transformers' field names (no transformers needed), with `changes`."""
    return {"model_type": "deepseek_v4", "attention_dropout": 0.0, **SIZES, **CONFIGS[name], **changes}


def randomized(module, seed, dtype=torch.float64):
    """`module` with every parameter drawn afresh from `seed` (norm weights near 1, sinks and position biases O(1))."""
    generator = torch.Generator().manual_seed(seed)
    module = module.to(dtype)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64).to(dtype)
            if "norm" in name and name.endswith("weight"):
                param.copy_(1 + 0.2 * noise)
            elif param.dim() == 1 or name.endswith("position_bias"):
                param.copy_(noise)
            else:
                param.copy_(noise / math.sqrt(param.shape[-1]))
    return module


def build(layer_type, name="plain", seed=0):
    return randomized(DeepseekV4Attention.from_config(plain_config(name), LAYER_TYPES.index(layer_type)), seed).eval()


def inputs(T, seed, B=2):
    return torch.randn(B, T, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# ---- transformers' layer ----

def tiny_transformers_model(name, seed):
    """A tiny random DeepSeek-V4 causal LM in float32 (transformers keeps its norms in float32 anyway), eager."""
    transformers = pytest.importorskip("transformers")
    fields = {key: value for key, value in plain_config(name).items() if key not in ("model_type",)}
    config = transformers.AutoConfig.for_model("deepseek_v4", **fields, vocab_size=50, moe_intermediate_size=16,
                                               n_routed_experts=4, num_experts_per_tok=2, hc_mult=2,
                                               num_nextn_predict_layers=0)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return config, randomized(model, seed, torch.float32)


def captured_attention(model, calls):
    """`[{layer index: (hidden states fed to its attention, its output)} per call]` while the model runs each of
    `calls` (`input_ids` chunks) in turn, on one cache when there is more than one."""
    captured = []

    def hook(module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        captured[-1][module.layer_idx] = (hidden.detach(), output[0].detach())

    handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
    cache = None
    with torch.no_grad():
        for input_ids in calls:
            captured.append({})
            cache = model(input_ids, cache=cache, use_cache=len(calls) > 1).cache
    for handle in handles:
        handle.remove()
    return captured


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_transformers_layer(name):
    config, model = tiny_transformers_model(name, seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(2))
    (captured,) = captured_attention(model, [input_ids])
    assert sorted(DeepseekV4Attention.from_config(config, i).layer_type for i in captured) == sorted(LAYER_TYPES)
    for layer_idx, (hidden, expected) in captured.items():
        module = DeepseekV4Attention.from_config(config, layer_idx).eval()
        module.load_state_dict(model.model.layers[layer_idx].self_attn.state_dict())  # transformers' names, unchanged
        with torch.no_grad():
            torch.testing.assert_close(module(hidden), expected, **FLOAT32)


def test_matches_transformers_decoding():
    """transformers' model decoding on its own cache (its HCA/CSA cache layers: buffers, overlap, running entries):
    each call's attention output equals ours on `new_cache`."""
    config, model = tiny_transformers_model("plain", seed=3)
    input_ids = torch.randint(0, config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(4))
    calls = [input_ids[:, :7], input_ids[:, 7:10]] + [input_ids[:, t:t + 1] for t in range(10, 17)]
    captured = captured_attention(model, calls)
    for layer_idx in range(config.num_hidden_layers):
        module = DeepseekV4Attention.from_config(config, layer_idx).eval()
        module.load_state_dict(model.model.layers[layer_idx].self_attn.state_dict())
        cache = module.new_cache(2, 17)
        with torch.no_grad():
            for step in captured:
                hidden, expected = step[layer_idx]
                torch.testing.assert_close(module(hidden, cache=cache), expected, **FLOAT32)


def test_the_indexer_chooses():
    """Past `index_topk` visible entries the indexer's choice matters: attending to every visible entry instead
    (as HCA does) gives another output, so the tests above check the choice."""
    module = build(CSA, seed=5)
    x = inputs(15, seed=6)
    with torch.no_grad():
        sparse = module(x)
        module.index_topk = 100
        dense = module(x)
    assert not torch.allclose(sparse[:, 10:], dense[:, 10:])
    torch.testing.assert_close(sparse[:, :5], dense[:, :5], **F64)  # at most 2 entries visible: both chosen


# ---- the float64 reference, composed from attention.reference's primitives ----

def reference_layer(x, p, layer_type, config):
    """DeepSeek-V4's attention as the report describes it, in float64, from the parameters `p` (transformers' names).

    Shared K=V head `kv = RoPE(RMSNorm(x W_kv))`; queries from the low-rank `c = RMSNorm(x W_qa)`, each head
    RMS-normalised and rotated (the last `Dr` features, pairs `(2i, 2i+1)`); keys: the window's last `W` positions
    and, on CSA/HCA layers, compressed entries `RMSNorm(sum softmax(Z + B) * C)` of each closed window, rotated at its
    first position (CSA: overlapping windows of `2m`, the previous window's first half then the window's second half;
    the queries then attend only to the `index_topk` entries of highest indexer score); sinks in the softmax; the
    output rotated back by its query's position; grouped output projection.
    """
    B, T, C = x.shape
    H, D, W, G = config["num_attention_heads"], config["head_dim"], config["sliding_window"], config["o_groups"]
    Dr = int(D * config["partial_rotary_factor"])
    eps = config["rms_norm_eps"]
    if layer_type == SLIDING:
        rope_params = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    else:
        rope_params = {"rope_type": "default", **config.get("rope_parameters", {}),
                       "rope_theta": config["compress_rope_theta"]}
        rope_params.setdefault("attention_factor", 1.0)  # DeepSeek's YaRN scales no cos and sin
    inverse_frequencies, attention_factor = rope_frequencies(Dr, rope_params)

    def rope_last(t, positions):  # (B, heads, N, D): the last Dr features rotate, interleaved
        turned = reference_rope(t[..., -Dr:], positions, inverse_frequencies, attention_factor, interleaved=True)
        return torch.cat([t[..., :-Dr], turned], dim=-1)

    positions = torch.arange(T, dtype=torch.float64)
    c = reference_rms_norm(x @ p["q_a_proj.weight"].T, p["q_a_norm.weight"], eps)  # (B, T, q_lora_rank)
    q = reference_rms_norm((c @ p["q_b_proj.weight"].T).view(B, T, H, D).transpose(1, 2), None, eps)  # (B, H, T, D)
    q = rope_last(q, positions)
    kv = rope_last(reference_rms_norm(x @ p["kv_proj.weight"].T, p["kv_norm.weight"], eps).unsqueeze(1), positions)
    t_idx = torch.arange(T)
    mask = ((t_idx[:, None] - t_idx[None, :] >= 0) & (t_idx[:, None] - t_idx[None, :] < W)).expand(B, 1, T, T)
    keys = kv  # (B, 1, T, D)

    def compress(prefix, width, rate, overlap):  # (B, N, width): one entry per closed window
        kv_c, gate = x @ p[prefix + "kv_proj.weight"].T, x @ p[prefix + "gate_proj.weight"].T
        bias = p[prefix + "position_bias"]
        entries = []
        for w in range(T // rate):
            own = slice(w * rate, (w + 1) * rate)
            if overlap:  # second half of this window's features, first half of the previous window's
                values, logits = kv_c[:, own, width:], gate[:, own, width:] + bias[:, width:]
                if w > 0:
                    before = slice((w - 1) * rate, w * rate)
                    values = torch.cat([kv_c[:, before, :width], values], dim=1)
                    logits = torch.cat([gate[:, before, :width] + bias[:, :width], logits], dim=1)
            else:
                values, logits = kv_c[:, own], gate[:, own] + bias
            entries.append((torch.softmax(logits, dim=1) * values).sum(dim=1))  # (B, width)
        if not entries:
            return x.new_zeros(B, 0, width)
        pooled = reference_rms_norm(torch.stack(entries, dim=1), p[prefix + "kv_norm.weight"], eps)  # (B, N, width)
        return rope_last(pooled.unsqueeze(1), torch.arange(len(entries), dtype=torch.float64) * rate).squeeze(1)

    if layer_type != SLIDING:
        rate = config["compress_rates"][layer_type]
        entries = compress("compressor.", D, rate, overlap=layer_type == CSA)  # (B, N, D)
        N = entries.shape[1]
        closed = torch.arange(N)[None, :] < ((t_idx + 1) // rate)[:, None]  # (T, N): window closed by t
        chosen = closed.expand(B, T, N)
        if layer_type == CSA:
            with torch.no_grad():  # the indexer picks, it passes no gradient
                Hi, Di = config["index_n_heads"], config["index_head_dim"]
                index_keys = compress("compressor.indexer.", Di, rate, overlap=True)  # (B, N, Di)
                iq = (c @ p["compressor.indexer.q_b_proj.weight"].T).view(B, T, Hi, Di).transpose(1, 2)
                iq = rope_last(iq, positions)  # (B, Hi, T, Di)
                head_weights = x @ p["compressor.indexer.scorer.weights_proj.weight"].T / math.sqrt(Hi)  # (B, T, Hi)
                per_head = torch.relu(iq @ index_keys.unsqueeze(1).transpose(-1, -2)) / math.sqrt(Di)  # (B, Hi, T, N)
                scores = torch.einsum("bth,bhtn->btn", head_weights, per_head).masked_fill(~closed, float("-inf"))
                chosen = torch.zeros(B, T, N, dtype=torch.bool)
                for b in range(B):
                    for t in range(T):
                        best = scores[b, t].topk(min(config["index_topk"], int(closed[t].sum()))).indices
                        chosen[b, t, best] = True
        keys = torch.cat([kv, entries.unsqueeze(1)], dim=2)  # (B, 1, T + N, D)
        mask = torch.cat([mask, chosen.unsqueeze(1)], dim=-1)  # (B, 1, T, T + N)

    out, _ = reference_kernel(q, keys, keys, mask, scale=D**-0.5, sinks=p["sinks"])  # (B, H, T, D)
    out = rope_last(out, -positions)  # rotated back by each query's position
    grouped = out.transpose(1, 2).reshape(B, T, G, H * D // G)  # (B, T, G, H*D/G)
    o_a = p["o_a_proj.weight"].view(G, config["o_lora_rank"], H * D // G)
    grouped = torch.einsum("btgi,gri->btgr", grouped, o_a).reshape(B, T, -1)
    return grouped @ p["o_b_proj.weight"].T  # (B, T, hidden_size)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("layer_type", LAYER_TYPES)
def test_matches_reference_forward_and_gradients(layer_type, name):
    module = build(layer_type, name, seed=7)
    x = inputs(19, seed=8).requires_grad_()
    grad_output = torch.randn(2, 19, SIZES["hidden_size"], dtype=torch.float64,
                              generator=torch.Generator().manual_seed(9))
    out = module(x)
    out.backward(grad_output)
    params = {key: value.detach().clone().requires_grad_() for key, value in module.named_parameters()}
    x_ref = x.detach().clone().requires_grad_()
    expected = reference_layer(x_ref, params, layer_type, plain_config(name))
    expected.backward(grad_output)
    torch.testing.assert_close(out, expected, **F64)
    torch.testing.assert_close(x.grad, x_ref.grad, **F64)
    for key, param in module.named_parameters():
        if ".indexer." in key:  # it chooses, it is not differentiated (nor is the reference's)
            assert param.grad is None and params[key].grad is None, key
        else:
            torch.testing.assert_close(param.grad, params[key].grad, **F64, msg=key)


# ---- decoding ----

@pytest.mark.parametrize("layer_type", LAYER_TYPES)
def test_decoding_matches_the_full_forward(layer_type):
    """A prompt of 6, a chunk of 5, then single tokens to 21 positions: past the window (5) and across CSA's (2) and
    HCA's (4) window boundaries, at and between them."""
    module = build(layer_type, seed=10)
    x = inputs(21, seed=11)
    with torch.no_grad():
        full = module(x)
        cache = module.new_cache(2, 24)
        steps = [(0, 6), (6, 11)] + [(t, t + 1) for t in range(11, 21)]
        for first, last in steps:
            torch.testing.assert_close(module(x[:, first:last], cache=cache), full[:, first:last], **F64)
    assert cache.length == 21


def test_cache_refuses_what_it_cannot_do():
    module = build(HCA)
    other = build(CSA)
    with torch.no_grad():
        cache = module.new_cache(2, 8)
        with pytest.raises(ValueError, match="not by this layer"):
            other(inputs(3, 0), cache=cache)
        module(inputs(6, 0), cache=cache)
        with pytest.raises(ValueError, match="capacity=8"):
            module(inputs(3, 1), cache=cache)
        with pytest.raises(ValueError, match="cannot rewind"):
            cache.rewind(3)
    with pytest.raises(ValueError, match="inference"):
        module(inputs(1, 2), cache=module.new_cache(2, 8))


# ---- bad configs ----

BAD_CONFIGS = [
    (dict(compress_rates={CSA: 0, HCA: 4}), ValueError, "compress_rates"),
    (dict(compress_rates={CSA: 2.5, HCA: 4}), TypeError, "compress_rates.*2.5"),
    (dict(compress_rates={CSA: 2}), ValueError, "heavily_compressed_attention"),
    (dict(compress_rates=[2, 4]), TypeError, "compress_rates"),
    (dict(index_topk=0), ValueError, "index_topk"),
    (dict(index_topk=33), ValueError, "index_topk=33"),  # 64 positions // 2: 32 entries at most
    (dict(index_topk=2.0), TypeError, "index_topk"),
    (dict(index_head_dim=6), ValueError, "index_head_dim=6"),  # below the 8 rotated features
    (dict(head_dim=16.0), TypeError, "head_dim"),
    (dict(o_groups=3), ValueError, "o_groups=3"),
    (dict(partial_rotary_factor=0.1875), ValueError, "partial_rotary_factor"),  # 3 features: no pairs
    (dict(partial_rotary_factor=1.5), ValueError, "partial_rotary_factor"),  # more than the head
    (dict(sliding_window=0), ValueError, "sliding_window"),
    (dict(layer_types=[SLIDING, "full_attention", HCA]), ValueError, "full_attention"),
    (dict(layer_types=[SLIDING, CSA]), ValueError, "layer_types"),
    (dict(model_type="deepseek_v3"), ValueError, "model_type"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), ValueError, "original_max_position_embeddings"),
    (dict(rope_parameters={"rope_type": "dynamo"}), ValueError, "dynamo"),
    (dict(rms_norm_eps="1e-6"), TypeError, "rms_norm_eps must be a number"),
    (dict(rms_norm_eps=-1.0), ValueError, "rms_norm_eps must be finite and >= 0"),
    (dict(layer_types=None, compress_ratios=[0, 4]), ValueError, "compress_ratios must list one ratio per layer"),
    (dict(layer_types=None, compress_ratios=[0, 8, 128]), ValueError, "compress_ratios holds 8"),
    (dict(layer_types="sliding_attention"), TypeError, "layer_types must be a list"),
    (dict(rope_parameters=[1]), TypeError, "rope_parameters must be a dict of RoPE fields"),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                           "original_max_position_embeddings": 16}), ValueError, "high_freq_factor must be at least"),
    (dict(attention_dropout=0.1), ValueError, "attention_dropout must be 0.0"),
]


@pytest.mark.parametrize("changes,error,match", BAD_CONFIGS, ids=lambda v: str(v)[:40] if isinstance(v, dict) else "")
def test_bad_config_raises_before_any_weight(changes, error, match, monkeypatch):
    def no_weights(*args, **kwargs):
        raise AssertionError("a weight was made before the config was checked")

    monkeypatch.setattr(nn.Linear, "__init__", no_weights)
    monkeypatch.setattr(nn, "Parameter", no_weights)
    with pytest.raises(error, match=match):
        DeepseekV4Attention.from_config(plain_config(**changes), 1)  # layer 1: CSA, which reads every field


@pytest.mark.parametrize("missing", ["hidden_size", "q_lora_rank", "o_lora_rank", "index_n_heads",
                                     "compress_rope_theta", "rms_norm_eps"])
def test_missing_field_is_named(missing):
    config = plain_config()
    del config[missing]
    with pytest.raises(ValueError, match=missing):
        DeepseekV4Attention.from_config(config, 1)


def test_defaults_as_transformers_config():
    """Without `layer_types` and `compress_rates`, transformers' schedule (two HCA layers, then CSA and HCA in turn)
    and rates (4, 128); a sliding layer checks no indexer field."""
    config = plain_config(num_hidden_layers=5)
    del config["layer_types"], config["compress_rates"]
    layers = [DeepseekV4Attention.from_config(config, i) for i in range(5)]
    assert [layer.layer_type for layer in layers] == [HCA, HCA, HCA, CSA, HCA]
    assert [layer.compress_rate for layer in layers] == [128, 128, 128, 4, 128]
    sliding = plain_config(index_topk=0, index_head_dim=None)
    assert DeepseekV4Attention.from_config(sliding, 0).layer_type == SLIDING


# ---- the cache's bytes ----

def expected_cache_bytes(layer, batch_size, capacity, element_size):
    """`batch_size * element_size *` (window `min(sliding_window, capacity) * head_dim`, and on CSA/HCA layers
    `capacity // compress_rate` entries of `head_dim`, the open window's `kv_proj` and `gate_proj` outputs
    `2 * (compress_rate - 1) * proj`, with `proj = 2 * head_dim` on CSA (overlap) else `head_dim`, on CSA the
    previous window's first half `2 * compress_rate * head_dim`; on CSA all of it again at `index_head_dim`)."""
    window = min(layer.sliding_window, capacity) * layer.head_dim
    total = window
    if layer.compress_rate is not None:
        m, overlap = layer.compress_rate, layer.layer_type == CSA
        widths = [layer.head_dim] + ([layer.index_head_dim] if overlap else [])
        for width in widths:
            proj = 2 * width if overlap else width
            total += capacity // m * width + 2 * (m - 1) * proj + (2 * m * width if overlap else 0)
    return batch_size * element_size * total


# transformers' DeepseekV4Config defaults (the sizes its docstrings give for DeepSeek-V4-Flash).
FLASH = dict(hidden_size=4096, num_attention_heads=64, head_dim=512, q_lora_rank=1024, o_groups=8, o_lora_rank=1024,
             sliding_window=128, index_n_heads=64, index_head_dim=128, index_topk=512, partial_rotary_factor=64 / 512,
             compress_rates={CSA: 4, HCA: 128}, layer_types=LAYER_TYPES, max_position_embeddings=1048576)


@pytest.mark.parametrize("layer_type", LAYER_TYPES)
@pytest.mark.parametrize("sizes,capacity", [(FLASH, 1 << 20), (SIZES, 21), (SIZES, 3)],
                         ids=["flash-1M", "tiny", "shorter-than-the-window"])
def test_cache_bytes(layer_type, sizes, capacity):
    config = plain_config(**sizes)
    with torch.device("meta"):  # DeepSeek-V4-Flash's sizes: nothing allocated
        layer = DeepseekV4Attention.from_config(config, LAYER_TYPES.index(layer_type)).to(torch.bfloat16)
        cache = layer.new_cache(2, capacity)
    assert isinstance(cache, DeepseekV4Cache)
    assert cache.nbytes == expected_cache_bytes(layer, 2, capacity, 2)
    if sizes is FLASH and capacity == 1 << 20:  # the formula's numbers, per sequence, spelled out
        per_sequence = {SLIDING: 128 * 512,
                        HCA: 128 * 512 + (1 << 20) // 128 * 512 + 2 * 127 * 512,
                        CSA: 128 * 512 + (1 << 20) // 4 * (512 + 128) + 2 * 3 * 2 * (512 + 128) + 2 * 4 * (512 + 128)}
        assert cache.nbytes == 2 * 2 * per_sequence[layer_type]


def test_legacy_fields_and_other_rope_scalings_build_transformers_layers():
    """A published config.json's `compress_ratios` (0, 4, 128 per layer, one more for the next-token layer) and its
    legacy `compress_rate_csa` / `compress_rate_hca`, read as transformers does; the compress layers' Llama 3 and YaRN
    (with mscale) frequencies equal `attention.reference`'s."""
    config = {key: value for key, value in plain_config().items() if key != "layer_types"}
    legacy = DeepseekV4Attention.from_config({**config, "compress_ratios": [0, 4, 128, 0], "compress_rate_csa": 2,
                                              "compress_rate_hca": 4}, 1)
    assert (legacy.layer_type, legacy.compress_rate) == (CSA, 2)
    for scaling in ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 16},
                    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
                     "mscale_all_dim": 0.5}):
        layer = DeepseekV4Attention.from_config(plain_config(rope_parameters=scaling), 2)  # HCA: the compress RoPE
        expected, factor = rope_frequencies(layer.qk_rope_head_dim, {**scaling, "rope_theta": 160000.0,
                                                                     "attention_factor": 1.0})
        torch.testing.assert_close(layer.inv_freq, expected, **F64)
        assert layer.attention_scaling == factor == 1.0


def test_bad_input_caches_and_state_dicts_are_refused_naming_them():
    module = build(SLIDING)
    x = inputs(4, seed=3)
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        module([[0.0]])
    with pytest.raises(ValueError, match=r"x must have shape \(B, T > 0, hidden_size=32\)"):
        module(x[..., :31])
    with pytest.raises(ValueError, match=r"x.dtype=torch.float32 differs from the layer's dtype torch.float64"):
        module(x.float())
    with torch.no_grad():
        with pytest.raises(TypeError, match=r"cache must come from the layer's new_cache\(\), got dict"):
            module(x, cache={})
        with pytest.raises(ValueError, match=r"x has batch size 2, the cache was made for batch_size=3"):
            module(x, cache=module.new_cache(3, 8))
        with pytest.raises(ValueError, match=r"cache is torch.float32 on cpu, x is torch.float64 on cpu"):
            module(x, cache=DeepseekV4Attention.from_config(plain_config(), 0).new_cache(2, 8))
    state = module.state_dict()
    with pytest.raises(ValueError, match=r"missing keys \['sinks'\]"):
        module.load_state_dict({k: v for k, v in state.items() if k != "sinks"})
    with pytest.raises(ValueError, match=r"kv_proj.weight has shape \(8, 32\)"):
        module.load_state_dict({**state, "kv_proj.weight": torch.zeros(8, 32)})
