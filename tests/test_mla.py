"""Multi-head latent attention (attention/models/deepseek_v3.py): equal to transformers' DeepSeek-V2/V3 layers, to
the float64 reference written from the paper, and, decoding with the latent cache, the absorbed path equal to
the naive one and to the full forward at every step; the cost counts equal to what the code computes."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attention.decoding import DecodingCache, KVCache, LatentCache
from attention.models import MODELS, ModelAttention
from attention.models.deepseek_v3 import (PUBLISHED_CONFIGS, DeepseekV3Attention, decode_step_bytes,
                                          kv_cache_bytes_per_token, latent_attention_flops,
                                          latent_cache_bytes_per_token, layer_parameters)
from attention.reference import reference_latent_attention, rope_frequencies
from helpers import captured_attention, requires_cuda, tolerance

F64 = dict(atol=1e-12, rtol=1e-12)  # float64 against float64: only the order of the sums differs
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}  # attention factor != 1, mscale² != 1
SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8,
             qk_rope_head_dim=8, v_head_dim=12, num_hidden_layers=2, max_position_embeddings=64)
# (model_type, fields): query compression or not, YaRN or plain rotary, interleaved pairs or halves, biases
CONFIGS = {
    "v3-yarn": ("deepseek_v3", dict(q_lora_rank=24, rope_parameters=YARN)),
    "v3-direct-halves-bias": ("deepseek_v3", dict(q_lora_rank=None, rope_interleave=False, attention_bias=True)),
    "v2-lite-yarn": ("deepseek_v2", dict(q_lora_rank=None, rope_parameters=YARN)),
    "v2-bias": ("deepseek_v2", dict(q_lora_rank=20, attention_bias=True)),
}


def plain_config(name):
    """The sizes of `CONFIGS[name]` as a mapping (no transformers needed)."""
    model_type, fields = CONFIGS[name]
    rope = fields.get("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0})
    return {"model_type": model_type, **SIZES, **fields, "rope_parameters": rope}


def randomized(module, seed):
    """`module` with every parameter drawn afresh from `seed` (norm weights near 1), float64."""
    generator = torch.Generator().manual_seed(seed)
    module = module.to(torch.float64)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            if "norm" in name:
                param.copy_(1 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(noise / math.sqrt(param.shape[-1]))
    return module


def reference(name, x, state, **past):
    """`reference_latent_attention` of `x` with the sizes of `CONFIGS[name]` and the weights `state`."""
    config = plain_config(name)
    rope = config["rope_parameters"]
    return reference_latent_attention(x, state, config["num_attention_heads"], config["qk_nope_head_dim"],
                                      config["qk_rope_head_dim"], config["v_head_dim"], rope["rope_theta"], rope,
                                      config.get("rope_interleave", True), **past)[0]


def build(name, path, seed=0):
    """`DeepseekV3Attention` of `CONFIGS[name]` taking `path`, every parameter drawn from `seed`, float64."""
    return randomized(DeepseekV3Attention.from_config(plain_config(name), 0, path=path), seed).eval()


# ---- transformers' layers ----

def tiny_transformers_model(name, seed):
    """A tiny random DeepSeek-V2/V3 causal LM in float64, eager attention, every parameter randomised."""
    transformers = pytest.importorskip("transformers")
    model_type, fields = CONFIGS[name]
    config = transformers.AutoConfig.for_model(model_type, **SIZES, **fields, first_k_dense_replace=2,
                                               intermediate_size=32, vocab_size=50)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    return config, randomized(model, seed)


# transformers computes its RMS norms, its rotary angles (and DeepSeek-V2's rotation itself, in complex64) and the
# eager softmax in float32 even in a float64 model, so its float64 layer agrees with float64 to float32 rounding:
# about 3e-7 here. test_transformers_float32_steps_explain_the_gap lifts those steps to float64 and gets 1e-15.
TRANSFORMERS = dict(atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("path", ["absorbed", "naive"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_transformers_layer(name, path):
    config, model = tiny_transformers_model(name, seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))
    for layer_idx, (hidden, expected) in captured_attention(model, input_ids).items():
        module = DeepseekV3Attention.from_config(config, layer_idx, path=path).to(torch.float64).eval()
        module.load_state_dict(model.model.layers[layer_idx].self_attn.state_dict())  # transformers' names, unchanged
        with torch.no_grad():
            torch.testing.assert_close(module(hidden), expected, **TRANSFORMERS)


def test_transformers_float32_steps_explain_the_gap(monkeypatch):
    """With transformers' float32 norm and rotary angles computed in float64 (and SDPA's float64 softmax), its
    DeepSeek-V3 layer and ours agree to float64 rounding: the tolerance above hides nothing else."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    def norm_in_float64(self, hidden):
        return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def angles_in_float64(self, x, position_ids):
        frequencies, _ = rope_frequencies(self.config.qk_rope_head_dim, self.config.rope_parameters)
        angles = position_ids[..., None].to(torch.float64) * frequencies
        angles = torch.cat([angles, angles], dim=-1)
        return (angles.cos() * self.attention_scaling).to(x.dtype), (angles.sin() * self.attention_scaling).to(x.dtype)

    monkeypatch.setattr(hf.DeepseekV3RMSNorm, "forward", norm_in_float64)
    monkeypatch.setattr(hf.DeepseekV3RotaryEmbedding, "forward", angles_in_float64)
    config, model = tiny_transformers_model("v3-yarn", seed=3)
    model.config._attn_implementation = "sdpa"
    input_ids = torch.randint(0, config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(4))
    for layer_idx, (hidden, expected) in captured_attention(model, input_ids).items():
        for path in ("absorbed", "naive"):
            module = DeepseekV3Attention.from_config(config, layer_idx, path=path).to(torch.float64)
            module.load_state_dict(model.model.layers[layer_idx].self_attn.state_dict())
            with torch.no_grad():
                torch.testing.assert_close(module(hidden), expected, **F64)


# ---- the float64 reference ----

@pytest.mark.parametrize("path", ["absorbed", "naive"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_reference_forward_and_gradients(name, path):
    module = build(name, path, seed=5).train()
    x = torch.randn(2, 9, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    x_module, x_reference = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    state = {key: value.detach().clone().requires_grad_(True) for key, value in module.state_dict().items()}
    out = module(x_module)
    expected = reference(name, x_reference, state)
    torch.testing.assert_close(out, expected, **F64)
    grad_out = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    (out * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(x_module.grad, x_reference.grad, **F64)
    for key, param in module.named_parameters():
        torch.testing.assert_close(param.grad, state[key].grad, **F64, msg=lambda text: f"{key}: {text}")


def test_reference_is_the_paper_per_head():
    """The reference against a loop over heads and positions written from eqs. 9-19 directly (no YaRN)."""
    module = build("v3-direct-halves-bias", "naive", seed=10)
    x = torch.randn(1, 5, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    s = {key: value.to(torch.float64) for key, value in module.state_dict().items()}
    H, Dn, Dr, Dv, Dc = 4, 8, 8, 12, 16
    frequencies = 10000.0 ** (-torch.arange(0, Dr, 2, dtype=torch.float64) / Dr)

    def rope(vector, t):  # halves layout: pair (i, i + Dr/2) turns by t * frequencies[i]
        first, second = vector[:Dr // 2], vector[Dr // 2:]
        cos, sin = torch.cos(t * frequencies), torch.sin(t * frequencies)
        return torch.cat([first * cos - second * sin, second * cos + first * sin])

    def norm(vector, weight):
        return vector / torch.sqrt(vector.pow(2).mean() + 1e-6) * weight

    out = torch.zeros(5, SIZES["hidden_size"], dtype=torch.float64)
    for t in range(5):
        heads = []
        for i in range(H):
            q = s["q_proj.weight"][i * (Dn + Dr):(i + 1) * (Dn + Dr)] @ x[0, t]
            q = torch.cat([q[:Dn], rope(q[Dn:], t)])  # eq. 16
            scores, values = [], []
            for j in range(t + 1):
                compressed = s["kv_a_proj_with_mqa.weight"] @ x[0, j] + s["kv_a_proj_with_mqa.bias"]
                c = norm(compressed[:Dc], s["kv_a_layernorm.weight"])  # eq. 9
                w_up = s["kv_b_proj.weight"][i * (Dn + Dv):(i + 1) * (Dn + Dv)]
                k = torch.cat([w_up[:Dn] @ c, rope(compressed[Dc:], j)])  # eqs. 10, 15, 17
                scores.append(q @ k / math.sqrt(Dn + Dr))
                values.append(w_up[Dn:] @ c)  # eq. 11
            weights = torch.softmax(torch.stack(scores), dim=0)
            heads.append(sum(w * v for w, v in zip(weights, values)))  # eq. 18
        out[t] = s["o_proj.weight"] @ torch.cat(heads) + s["o_proj.bias"]  # eq. 19
    torch.testing.assert_close(reference("v3-direct-halves-bias", x, s)[0], out, **F64)


# ---- decoding with the latent cache ----

@pytest.mark.parametrize("name", ["v3-yarn", "v2-lite-yarn"])
def test_decoding_every_step_equals_full_forward_and_paths_agree(name):
    """Prefill, single steps, chunks: the absorbed and naive paths give the full forward's rows, float64."""
    modules = {path: build(name, path, seed=12) for path in ("absorbed", "naive")}
    x = torch.randn(2, 23, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        full = modules["naive"](x)
        torch.testing.assert_close(modules["absorbed"](x), full, **F64)
        torch.testing.assert_close(full, reference(name, x, modules["naive"].state_dict()), **F64)
        caches = {path: module.new_cache(2, 32) for path, module in modules.items()}
        assert all(isinstance(cache, DecodingCache) for cache in caches.values())
        chunks = [(0, 6), (6, 7), (7, 8), (8, 11), (11, 12), (12, 17), (17, 18), (18, 23)]  # prefill, steps, chunks
        for start, end in chunks:
            outs = {path: modules[path](x[:, start:end], cache=caches[path]) for path in modules}
            torch.testing.assert_close(outs["absorbed"], outs["naive"], **F64)
            torch.testing.assert_close(outs["absorbed"], full[:, start:end], **F64)
            assert all(cache.length == end for cache in caches.values())


@pytest.mark.parametrize("path", ["absorbed", "naive"])
def test_a_call_over_any_cache_contents_matches_the_reference(path):
    """A decode step or chunk over what the cache holds, against the reference given those contents as its past:
    a cache filled by the module's own prefill, and one filled with random latents (as a benchmark fills it)."""
    module = build("v2-lite-yarn", path, seed=22)
    generator = torch.Generator().manual_seed(23)
    x = torch.randn(2, 30, SIZES["hidden_size"], dtype=torch.float64, generator=generator)
    own, random = module.new_cache(2, 40), module.new_cache(2, 40)
    random.update(torch.randn(2, 1, 30, 16, dtype=torch.float64, generator=generator),
                  torch.randn(2, 1, 30, 8, dtype=torch.float64, generator=generator))
    with torch.no_grad():
        module(x[:, :27], cache=own)
        for cache, length in ((own, 27), (random, 30)):
            for new in (1, 3):
                cache.rewind(length)
                x_new = torch.randn(2, new, SIZES["hidden_size"], dtype=torch.float64, generator=generator)
                past = dict(past_latent=cache.latent[:, 0, :length], past_rope_keys=cache.rope_keys[:, 0, :length])
                torch.testing.assert_close(module(x_new, cache=cache), reference("v2-lite-yarn", x_new,
                                                                                module.state_dict(), **past), **F64)


def test_reference_with_a_past_continues_the_full_sequence():
    module = build("v3-yarn", "naive", seed=24)
    x = torch.randn(2, 14, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(25))
    cache = module.new_cache(2, 14)
    with torch.no_grad():
        module(x[:, :9], cache=cache)
    past = dict(past_latent=cache.latent[:, 0, :9], past_rope_keys=cache.rope_keys[:, 0, :9])
    torch.testing.assert_close(reference("v3-yarn", x[:, 9:], module.state_dict(), **past),
                               reference("v3-yarn", x, module.state_dict())[:, 9:], **F64)


def test_latent_cache_holds_only_the_latent_and_rope_key():
    module = build("v3-yarn", "absorbed", seed=14)
    cache = module.new_cache(batch_size=3, capacity=20)
    Dc, Dr = module.kv_lora_rank, module.qk_rope_head_dim
    assert cache.nbytes == 3 * 20 * (Dc + Dr) * 8  # float64: batch x positions x (kv_lora_rank + qk_rope_head_dim)
    assert cache.latent.shape == (3, 1, 20, Dc) and cache.rope_keys.shape == (3, 1, 20, Dr)
    x = torch.randn(3, 5, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        module(x, cache=cache)
        compressed = module.kv_a_proj_with_mqa(x)  # (B, T, Dc + Dr)
        torch.testing.assert_close(cache.latent[:, 0, :5], module.kv_a_layernorm(compressed[..., :Dc]), **F64)
    assert cache.latent[:, :, 5:].abs().max() == 0  # nothing past length was written


def test_rewind_repeats_a_step():
    module = build("v2-lite-yarn", "absorbed", seed=16)
    x = torch.randn(1, 9, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(17))
    cache = module.new_cache(1, 16)
    with torch.no_grad():
        module(x[:, :8], cache=cache)
        first = module(x[:, 8:9], cache=cache)
        cache.rewind(8)
        again = module(x[:, 8:9], cache=cache)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"length must be an int in \[0, 9\]"):
        cache.rewind(10)


def test_cache_errors():
    module = build("v3-yarn", "absorbed", seed=18)
    x = torch.randn(2, 3, SIZES["hidden_size"], dtype=torch.float64)
    with torch.no_grad():
        with pytest.raises(TypeError, match="cache must come from new_cache"):
            module(x, cache=KVCache(2, 1, 8, 4))
        with pytest.raises(ValueError, match="batch_size=1"):
            module(x, cache=module.new_cache(1, 8))
        with pytest.raises(ValueError, match="float32"):
            module(x, cache=LatentCache(2, 16, 8, 8))
        with pytest.raises(ValueError, match="kv_lora_rank=16"):
            module(x, cache=LatentCache(2, 32, 8, 8, dtype=torch.float64))
        cache = module.new_cache(2, 4)
        module(x, cache=cache)
        with pytest.raises(ValueError, match="exceed capacity=4"):
            module(x, cache=cache)
        assert cache.length == 3  # unchanged by the refused call
    with pytest.raises(ValueError, match="for inference"):
        module(x, cache=module.new_cache(2, 8))
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        module.new_cache(2, 0)


# ---- the contract, config reading, bad input ----

def test_registry_and_contract():
    assert MODELS["deepseek_v3"] is MODELS["deepseek_v2"] is MODELS["kimi_k2"] is DeepseekV3Attention
    module = DeepseekV3Attention.from_config(plain_config("v3-yarn"), 1)
    assert isinstance(module, ModelAttention) and module.layer_type == "full_attention"
    names = set(module.state_dict())
    assert {"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
            "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"} == names
    direct = DeepseekV3Attention.from_config(plain_config("v3-direct-halves-bias"), 0)
    assert {"q_proj.weight", "kv_a_proj_with_mqa.bias", "o_proj.bias"} <= set(direct.state_dict())
    assert not any(name.startswith("q_a_") for name in direct.state_dict())


def test_published_configs_build_from_their_own_fields():
    """A config.json as published (rope_theta and rope_scaling at the top level) builds the layer; on the meta
    device, so DeepSeek-V3's 187M attention parameters allocate nothing."""
    for name, config in PUBLISHED_CONFIGS.items():
        with torch.device("meta"):
            module = MODELS[config["model_type"]].from_config(config, config["num_hidden_layers"] - 1)
        assert sum(p.numel() for p in module.parameters()) == layer_parameters(config), name
        mscale = 0.1 * config["rope_scaling"]["mscale_all_dim"] * math.log(config["rope_scaling"]["factor"]) + 1
        assert module.scaling == pytest.approx(mscale**2 / math.sqrt(192), rel=1e-12), name


def test_errors_name_the_argument():
    config = plain_config("v3-yarn")
    with pytest.raises(ValueError, match="'kv_lora_rank'"):
        DeepseekV3Attention.from_config({k: v for k, v in config.items() if k != "kv_lora_rank"}, 0)
    with pytest.raises(ValueError, match="path must be one of"):
        DeepseekV3Attention.from_config(config, 0, path="fast")
    with pytest.raises(ValueError, match="num_hidden_layers=2"):
        DeepseekV3Attention.from_config(config, 2)
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        DeepseekV3Attention.from_config({**config, "qk_rope_head_dim": 7}, 0)
    module = DeepseekV3Attention.from_config(config, 0)
    with pytest.raises(ValueError, match="hidden_size=64"):
        module(torch.randn(2, 3, 32))
    with pytest.raises(TypeError, match="floating-point"):
        module(torch.ones(2, 3, 64, dtype=torch.long))
    state = module.state_dict()
    state["kv_b_proj.weight"] = state["kv_b_proj.weight"][:, :8]
    with pytest.raises(RuntimeError, match=r"kv_b_proj.weight.*torch.Size\(\[80, 8\]\).*torch.Size\(\[80, 16\]\)"):
        module.load_state_dict(state)


NAN = float("nan")
# (fields replacing those of CONFIGS["v3-yarn"], error, what the message must say), issue 44
BAD_CONFIGS = [
    (dict(rope_parameters={**YARN, "rope_theta": 0.0}), ValueError, "rope_theta=0.0"),
    (dict(rope_parameters={**YARN, "rope_theta": NAN}), ValueError, "rope_theta=nan"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": -1e4}), ValueError, "rope_theta=-10000.0"),
    (dict(rope_parameters={**YARN, "rope_theta": 1.0}), ValueError, "rope_theta must be finite and > 1"),
    (dict(rope_parameters={"rope_type": "default"}), ValueError, "'rope_theta'"),
    (dict(rope_parameters={**YARN, "factor": 0.0}), ValueError, "factor=0.0"),
    (dict(rope_parameters={k: v for k, v in YARN.items() if k != "factor"}), ValueError, "'factor'"),
    (dict(rope_parameters={k: v for k, v in YARN.items() if k != "original_max_position_embeddings"}), ValueError,
     "'original_max_position_embeddings'"),
    (dict(rope_parameters={**YARN, "rope_type": "dynamic"}), ValueError, "rope_type must be one of .* got rope_type='dynamic'"),
    (dict(rope_parameters={**YARN, "mscale_all_dim": NAN}), ValueError, "mscale_all_dim=nan"),
    (dict(rope_parameters={**YARN, "mscale": -1.0}), ValueError, "mscale=-1.0"),
    (dict(rope_parameters="yarn"), TypeError, "rope_parameters='yarn'"),
    (dict(rope_parameters=None, rope_theta=0.0), ValueError, "rope_theta=0.0"),
    (dict(rope_parameters=None, rope_theta=1e4, rope_scaling={"type": "yarn", "factor": 0}), ValueError, "factor=0"),
    (dict(rope_interleave="no"), TypeError, "rope_interleave='no'"),
    (dict(attention_dropout=0.1), ValueError, "attention_dropout must be 0.0"),
]


@pytest.mark.parametrize("fields,error,pattern", BAD_CONFIGS, ids=[f"{'-'.join(c[0])}-{i}" for i, c in enumerate(BAD_CONFIGS)])
def test_a_config_value_out_of_range_is_refused_naming_the_field(fields, error, pattern):
    with pytest.raises(error, match=pattern):
        DeepseekV3Attention.from_config({**plain_config("v3-yarn"), **fields}, 0)


def test_x_of_another_dtype_than_the_layer_is_refused_naming_both():
    module = DeepseekV3Attention.from_config(plain_config("v3-yarn"), 0)  # float32
    for dtype in (torch.float64, torch.bfloat16):
        with pytest.raises(ValueError, match=rf"x.dtype={dtype} differs from the layer's dtype torch.float32"):
            module(torch.randn(2, 3, SIZES["hidden_size"], dtype=dtype))


@pytest.mark.parametrize("path", ["absorbed", "naive"])
def test_a_cache_made_by_another_layer_is_refused(path):
    """Every MLA layer of a model has the same sizes: only the tag `new_cache` puts on its cache tells them apart."""
    layer0, layer1 = (DeepseekV3Attention.from_config(plain_config("v3-yarn"), i, path=path).double().eval()
                      for i in (0, 1))
    x = torch.randn(2, 3, SIZES["hidden_size"], dtype=torch.float64)
    with torch.no_grad():
        cache = layer1.new_cache(2, 8)
        layer1(x, cache=cache)
        with pytest.raises(ValueError, match=r"cache was made by DeepseekV3Attention layer 1, not by this layer "
                                             r"\(DeepseekV3Attention layer 0\)"):
            layer0(x[:, :1], cache=cache)
        assert cache.length == 3  # untouched by the refused call
        with pytest.raises(ValueError, match="made by no layer's new_cache"):
            layer0(x, cache=LatentCache(2, 16, 8, 8, dtype=torch.float64))
        layer0(x, cache=layer0.new_cache(2, 8))  # its own


# ---- what it costs ----

@pytest.mark.parametrize("path", ["absorbed", "naive"])
@pytest.mark.parametrize("name", ["v3-yarn", "v2-lite-yarn"])
@pytest.mark.parametrize("cached, new", [(0, 7), (9, 1), (9, 4)])
def test_flops_equal_the_count_of_the_matmuls_run(name, path, cached, new):
    """`latent_attention_flops` against torch's FLOP counter over the module's own call (prefill, step, chunk)."""
    module = build(name, path, seed=19)
    config = plain_config(name)
    x = torch.randn(1, cached + new, SIZES["hidden_size"], dtype=torch.float64)
    cache = module.new_cache(1, 16)
    with torch.no_grad():
        if cached:
            module(x[:, :cached], cache=cache)
        with FlopCounterMode(display=False) as counter:
            module(x[:, cached:], cache=cache)
    assert counter.get_total_flops() == latent_attention_flops(config, new, cached + new, path)


def test_flop_paths_differ_where_the_shapes_say():
    """At DeepSeek-V3's sizes one decoded token's attention part per position: naive expands the latent
    (`Dc * H * (Dn + Dv)` multiply-adds) where absorbed attends over it (`H * (2 Dc + Dr)`)."""
    config = PUBLISHED_CONFIGS["DeepSeek-V3"]
    per_position = {path: latent_attention_flops(config, 1, 2001, path) - latent_attention_flops(config, 1, 2000, path)
                    for path in ("absorbed", "naive")}
    assert per_position["absorbed"] == 2 * 128 * (2 * 512 + 64)
    assert per_position["naive"] == 2 * 512 * 128 * (128 + 128) + 2 * 128 * (192 + 128)


@pytest.mark.parametrize("name", sorted(PUBLISHED_CONFIGS))
def test_published_cache_bytes_equal_allocated_caches(name):
    """Per-token cache bytes of MLA and of MHA, GQA (8 groups) and MQA of the same heads, against caches allocated
    at a small batch and length."""
    config = PUBLISHED_CONFIGS[name]
    batch, length, dtype = 2, 3, torch.bfloat16
    latent = LatentCache(batch, config["kv_lora_rank"], config["qk_rope_head_dim"], length, dtype=dtype)
    assert latent.nbytes == batch * length * latent_cache_bytes_per_token(config, dtype)
    assert latent_cache_bytes_per_token(config, dtype) == (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 2
    for kv_heads in (config["num_attention_heads"], 8, 1):
        kv = KVCache(batch, kv_heads, config["v_head_dim"], length, dtype=dtype)
        assert kv.nbytes == batch * length * kv_cache_bytes_per_token(config, kv_heads, dtype)


def test_decode_step_bytes():
    config = plain_config("v3-yarn")
    module = DeepseekV3Attention.from_config(config, 0).to(torch.bfloat16)
    weights = sum(p.nbytes for p in module.parameters())
    cache = module.new_cache(batch_size=4, capacity=50)
    assert decode_step_bytes(config, 50, 4, torch.bfloat16, "absorbed") == weights + cache.nbytes
    expanded = 4 * 50 * 4 * (8 + 8 + 12) * 2  # batch x context x H x (Dn + Dr + Dv) x 2 bytes, written then read
    assert decode_step_bytes(config, 50, 4, torch.bfloat16, "naive") == weights + cache.nbytes + 2 * expanded


# ---- float32 and bfloat16, CPU and CUDA (CUDA skipped without an NVIDIA GPU) ----

CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, requires_cuda])


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["absorbed", "naive"])
def test_low_precision_forward_and_decoding_match_reference(path, dtype, device):
    module = build("v3-yarn", path, seed=20)
    x = torch.randn(2, 17, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(21))
    expected = reference("v3-yarn", x, module.state_dict())
    module = module.to(device=device, dtype=dtype)
    x_run = x.to(device=device, dtype=dtype)
    cache = module.new_cache(2, 32)
    with torch.no_grad():
        full = module(x_run)
        decoded = torch.cat([module(x_run[:, :9], cache=cache)] + [module(x_run[:, t:t + 1], cache=cache)
                                                                   for t in range(9, 17)], dim=1)
    for out in (full, decoded):
        torch.testing.assert_close(out.double().cpu(), expected, **tolerance(device, dtype))


def test_a_bfloat16_absorbed_step_takes_each_sequences_cache_as_a_2d_block():
    """On the CPU in bfloat16, a batched matmul over the cache's slice (its sequences `capacity` rows apart) runs a
    slow kernel (a decode step at batch 8 over 16k positions: 626 ms, against 62 ms over a contiguous cache): the
    absorbed step multiplies each sequence's latent and rotary keys as the 2-D blocks they are (`per_head_matmul`),
    never in a batched matmul, and stays equal to the reference."""
    from torch.profiler import ProfilerActivity, profile

    module = build("v3-yarn", "absorbed").to(torch.bfloat16)
    cache, context = module.new_cache(2, 64), 40  # 41 positions read: a size no weight or head has
    cache.update(torch.randn(2, 1, context, 16).to(torch.bfloat16), torch.randn(2, 1, context, 8).to(torch.bfloat16))
    x = torch.randn(2, 1, SIZES["hidden_size"]).to(torch.bfloat16)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiled:
        out = module(x, cache=cache)
    over_cache = [event.name for event in profiled.events() if event.name in ("aten::mm", "aten::bmm", "aten::baddbmm")
                  and any(context + 1 in shape for shape in event.input_shapes if shape)]
    assert over_cache == ["aten::mm"] * 6, over_cache  # scores (latent, rotary keys) and weighted latents, 2 sequences
    past = dict(past_latent=cache.latent[:, 0, :context].double(), past_rope_keys=cache.rope_keys[:, 0, :context].double())
    state = {name: tensor.double() for name, tensor in module.state_dict().items()}
    torch.testing.assert_close(out.double(), reference("v3-yarn", x.double(), state, **past),
                               **tolerance("cpu", torch.bfloat16))
