"""The hybrid models, linear attention layers beside softmax ones: Qwen3-Next (attention/models/qwen3_next.py, gated
DeltaNet) and Kimi Linear (attention/models/kimi_linear.py, Kimi delta attention and latent attention without RoPE).

Every kind of layer equals transformers' own, fed what the real tiny model feeds it; decoding with the states (the
linear layers') or the caches (the softmax layers') equals the full forward at every step and chunk, and transformers'
own decoding; the three forms of a linear layer are one function in float64; bad input is refused.

transformers runs the delta rules, the L2 norms and the RMSNorms in float32 whatever the model's dtype (its
`torch_chunk_gated_delta_rule` and `chunk_kimi_delta_attention` cast to float32), so its float64 model agrees with
ours to float32's precision; our own forms and our decoding agree with each other to float64's.
"""

import functools
import types

import pytest
import torch

from attention.linear import gated_delta_rule
from attention.models import MODELS, ModelAttention
from attention.decoding import RecurrentStateCache
from attention.models.qwen3_next import Qwen3NextAttention, Qwen3NextGatedDeltaNet, qwen3_next_layer_type

B, T = 2, 11
QWEN3_NEXT = dict(model_type="qwen3_next", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-6,
              layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
              linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
              linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
              shared_expert_intermediate_size=16, decoder_sparse_step=2, hidden_act="silu")
KIMI_LINEAR = dict(model_type="kimi_linear", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-6,
                   layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                   kv_lora_rank=8, q_lora_rank=None, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=6,
                   linear_num_heads=4, linear_head_dim=6, linear_conv_kernel_dim=4, num_local_experts=4,
                   num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                   mlp_layer_types=["dense", "sparse", "dense", "sparse"], hidden_act="silu", pad_token_id=0,
                   bos_token_id=1, eos_token_id=2)
MINIMAX = dict(model_type="minimax", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-6,
               layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
               block_size=4,  # blocks of 4 under 11 tokens: a partial last block
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, num_local_experts=4,
               num_experts_per_tok=2, hidden_act="silu")
CASES = {"qwen3_next": QWEN3_NEXT, "kimi_linear": KIMI_LINEAR,
         "kimi_linear_q_lora": KIMI_LINEAR | {"q_lora_rank": 12},  # the queries through a low-rank bottleneck
         "minimax": MINIMAX}
CONFIG = QWEN3_NEXT  # the model of the tests written for one
LAYERS = [(name, layer_idx) for name, config in CASES.items() for layer_idx in range(config["num_hidden_layers"])]
LAYER_IDS = [f"{name}-{layer_idx}" for name, layer_idx in LAYERS]
LINEAR = [(name, i) for name, i in LAYERS if CASES[name]["layer_types"][i] == "linear_attention"]
LINEAR_IDS = [f"{name}-{layer_idx}" for name, layer_idx in LINEAR]


def randomised(module, seed):
    """`module` in float64, every parameter drawn from `seed`; `A_log` and `dt_bias` so that decays span (0, 1)."""
    module = module.to(torch.float64)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * 0.5)
    return module


def layer_of(layer_idx, name="qwen3_next", **options):
    config = CASES[name]
    return randomised(MODELS[config["model_type"]].from_config(config, layer_idx, **options), seed=10 * layer_idx + 3)


def random_input(seed=1, length=T, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(B, length, CONFIG["hidden_size"], generator=generator, dtype=torch.float64).to(dtype)


@functools.cache
def run_model(name):
    """transformers' tiny model `CASES[name]`, every parameter randomised, run once in float64 on random tokens; hooks
    capture what each attention layer (softmax or linear) receives and returns."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**CASES[name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float64,
                                                          experts_implementation="eager").eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    inputs, outputs = {}, {}
    for layer_idx, layer in enumerate(model.model.layers):
        mixer = hf_mixer(model, layer_idx)

        def capture(module, args, kwargs, output, layer_idx=layer_idx):
            inputs[layer_idx] = kwargs.get("hidden_states", args[0] if args else None)
            outputs[layer_idx] = output[0] if isinstance(output, tuple) else output
        mixer.register_forward_hook(capture, with_kwargs=True)
    with torch.no_grad():
        model(torch.randint(0, CASES[name]["vocab_size"], (B, T)))
    return config, model, inputs, outputs


def hf_mixer(model, layer_idx):
    """transformers' attention of layer `layer_idx`: Qwen3-Next's `linear_attn` or `self_attn`, Kimi's `self_attn`."""
    layer = model.model.layers[layer_idx]
    return getattr(layer, "linear_attn", None) or layer.self_attn


@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
def test_each_layer_equals_transformers_layer(name, layer_idx):
    """Our layer, built from the plain configuration with transformers' weights, gives transformers' output for the
    input the tiny model gave it (float32's precision: transformers' rule and norms run in float32)."""
    config, model, inputs, outputs = run_model(name)
    module = MODELS[config.model_type].from_config(CASES[name], layer_idx).to(torch.float64)
    assert isinstance(module, ModelAttention) and module.layer_type == config.layer_types[layer_idx]
    module.load_state_dict(hf_mixer(model, layer_idx).state_dict())
    with torch.no_grad():
        out = module(inputs[layer_idx])
    assert out.abs().max() > 0.1  # the comparison is not of zeros
    torch.testing.assert_close(out, outputs[layer_idx], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,layer_idx", LINEAR, ids=LINEAR_IDS)
def test_transformers_linear_layer_decodes_as_ours(name, layer_idx):
    """transformers' linear layer, run with its own cache over a prompt then token by token, gives what ours gives with
    our `RecurrentStateCache`: the convolution's state and the recurrent state carried the same way."""
    transformers = pytest.importorskip("transformers")
    config, model, inputs, _ = run_model(name)
    hf_layer = hf_mixer(model, layer_idx)
    module = MODELS[config.model_type].from_config(CASES[name], layer_idx).to(torch.float64)
    module.load_state_dict(hf_layer.state_dict())
    x = inputs[layer_idx]
    if config.model_type == "minimax":  # its own cache class, and its layer's positional arguments
        from transformers.models.minimax.modeling_minimax import MiniMaxCache
        hf_cache = MiniMaxCache()

        def step(chunk):
            return hf_layer(chunk, None, None, cache=hf_cache)[0]
    else:
        hf_cache = transformers.DynamicCache(config=config)

        def step(chunk):
            return hf_layer(chunk, cache=hf_cache)
    cache = module.new_cache(B)
    with torch.no_grad():
        theirs = [step(x[:, :5])] + [step(x[:, t:t + 1]) for t in range(5, T)]
        ours = [module(x[:, :5], cache=cache)] + [module(x[:, t:t + 1], cache=cache) for t in range(5, T)]
    torch.testing.assert_close(torch.cat(ours, dim=1), torch.cat(theirs, dim=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
@pytest.mark.parametrize("splits", [(1,) * T, (4, 1, 3, 3), (5, 6)], ids=["token by token", "chunks", "two halves"])
def test_decoding_with_the_cache_equals_the_full_forward(name, layer_idx, splits):
    """A sequence fed in pieces through the layer's cache gives the full forward's output at every position (float64,
    1e-12): the linear layer's states (recurrent and convolution) carry what the whole prompt would."""
    module, x = layer_of(layer_idx, name), random_input()
    with torch.no_grad():
        full = module(x)
        cache, outs, start = module.new_cache(B, T), [], 0
        for size in splits:
            outs.append(module(x[:, start:start + size], cache=cache))
            start += size
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=0, atol=1e-12)
    if module.layer_type == "linear_attention":
        assert isinstance(cache, RecurrentStateCache) and cache.length == T
        assert cache.nbytes == module.new_cache(B, 10**6).nbytes  # the same size at every context


@pytest.mark.parametrize("name,layer_idx", LINEAR, ids=LINEAR_IDS)
def test_the_linear_layer_is_one_function_in_every_form_and_chunk(name, layer_idx):
    """recurrent, chunked (chunks of 1, 3 and 64) and quadratic forms give the same outputs (float64, 1e-12) and
    parameter gradients (1e-10 relative)."""
    x = random_input(seed=2)
    results = []
    for form, chunk_size in [("recurrent", 64), ("chunked", 1), ("chunked", 3), ("chunked", 64), ("quadratic", 64)]:
        module = layer_of(layer_idx, name, form=form, chunk_size=chunk_size)
        out = module(x)
        out.square().sum().backward()
        results.append((out.detach(), {pname: p.grad for pname, p in module.named_parameters()}))
    for out, grads in results[1:]:
        torch.testing.assert_close(out, results[0][0], rtol=0, atol=1e-12)
        for pname, grad in grads.items():  # sums over every position: relative to their size
            torch.testing.assert_close(grad, results[0][1][pname], rtol=1e-10, atol=1e-10, msg=pname)


def test_the_linear_layer_runs_the_gated_delta_rule_on_its_projections():
    """The layer's core is `gated_delta_rule` on the convolved, L2-normalised q and k (repeated to the value heads),
    beta = sigmoid(b) and g = -exp(A_log) softplus(a + dt_bias): rebuilt here step by step from the parameters."""
    module, x = layer_of(0), random_input(seed=3)
    Hk, Hv, Dk, Dv = module.num_k_heads, module.num_v_heads, module.head_k_dim, module.head_v_dim
    r = Hv // Hk
    with torch.no_grad():
        qkvz = module.in_proj_qkvz(x).view(B, T, Hk, -1)
        q, k, v, z = qkvz.split([Dk, Dk, r * Dv, r * Dv], dim=-1)
        b, a = module.in_proj_ba(x).view(B, T, Hk, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(B, T, -1), k.reshape(B, T, -1), v.reshape(B, T, -1)], dim=-1)
        conv = torch.zeros_like(mixed)
        kernel = module.conv1d.weight[:, 0]  # (conv_dim, K): tap K-1 multiplies the current position
        for t in range(T):
            for tap in range(kernel.shape[1]):
                source = t - (kernel.shape[1] - 1 - tap)
                if source >= 0:
                    conv[:, t] += kernel[:, tap] * mixed[:, source]
        conv = conv * torch.sigmoid(conv)
        q, k, v = conv.split([module.key_dim, module.key_dim, module.value_dim], dim=-1)
        q, k = (t.reshape(B, T, Hk, Dk) for t in (q, k))
        q, k = (t / (t.square().sum(-1, keepdim=True) + 1e-6).sqrt() for t in (q, k))
        q, k = (t.repeat_interleave(r, dim=2).transpose(1, 2) for t in (q, k))
        v = v.reshape(B, T, Hv, Dv).transpose(1, 2)
        beta = torch.sigmoid(b.reshape(B, T, Hv)).transpose(1, 2)
        g = (-module.A_log.exp() * torch.log1p((a.reshape(B, T, Hv) + module.dt_bias).exp())).transpose(1, 2)
        core, _ = gated_delta_rule(q, k, v, g, beta, form="recurrent")
        core = core.transpose(1, 2)  # (B, T, Hv, Dv)
        normed = core / (core.square().mean(-1, keepdim=True) + module.norm.variance_epsilon).sqrt()
        gated = module.norm.weight * normed * torch.nn.functional.silu(z.reshape(B, T, Hv, Dv))
        expected = module.out_proj(gated.reshape(B, T, -1))
        torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)


def test_the_softmax_layer_gates_its_output_and_turns_part_of_each_head():
    """`o_proj` receives the attention times `sigmoid(gate)`, the gate being each head's second half of `q_proj`:
    with the gate's weights zeroed (sigmoid(0) = 1/2) it receives half the attention, so the two runs differ by
    exactly `2 sigmoid(gate)`. RoPE turns only the first `partial_rotary_factor` of each head's features."""
    module, x = layer_of(1), random_input(seed=4)
    assert module.rotary_dim == 4 and module.inv_freq.shape == (2,)
    H, D = module.num_attention_heads, module.head_dim
    captured = []
    module.o_proj.register_forward_hook(lambda m, args, out: captured.append(args[0]))
    with torch.no_grad():
        module(x)
        weight = module.q_proj.weight.view(H, 2, D, -1)  # per head: D query rows, then D gate rows
        gate = torch.sigmoid(x @ weight[:, 1].reshape(H * D, -1).T)  # (B, T, H*D), no bias: attention_bias False
        weight[:, 1] = 0
        module(x)
    gated, halved = captured
    torch.testing.assert_close(gated, 2 * halved * gate, rtol=0, atol=1e-12)
    assert (gate - 0.5).abs().max() > 0.1  # the gate does change the output


def test_the_layer_types_follow_the_full_attention_interval_where_not_listed():
    config = {key: value for key, value in CONFIG.items() if key != "layer_types"} | {"num_hidden_layers": 8}
    assert [qwen3_next_layer_type(config, i) for i in range(8)] == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    config["full_attention_interval"] = 2
    assert [qwen3_next_layer_type(config, i) for i in range(4)] == ["linear_attention", "full_attention"] * 2
    assert isinstance(Qwen3NextAttention.from_config(config, 0), Qwen3NextGatedDeltaNet)
    assert isinstance(Qwen3NextGatedDeltaNet.from_config(config, 1), Qwen3NextAttention)


@pytest.mark.parametrize("name", ["qwen3_next", "kimi_linear", "minimax"])
def test_a_bfloat16_layer_keeps_a_float32_state_and_stays_close(name):
    """A bfloat16 linear layer keeps its recurrent state in float32 and its convolution's inputs in bfloat16, and
    decodes within bfloat16's error of the float64 layer."""
    module, x = layer_of(0, name), random_input(seed=5)
    expected = module(x).detach()
    low = module.to(torch.bfloat16)
    with torch.no_grad():
        cache = low.new_cache(B, T)
        out = torch.cat([low(x[:, :6].bfloat16(), cache=cache)] + [low(x[:, t:t + 1].bfloat16(), cache=cache)
                                                                   for t in range(6, T)], dim=1)
    assert cache.recurrent_state.dtype == torch.float32 and cache.conv_state.dtype == torch.bfloat16
    # bfloat16 weights and activations (8 bits of mantissa) through three products and two norms: within 4% of the
    # output's largest value (measured: 0.9% to 2.4%).
    assert (out.double() - expected).abs().max() <= 0.04 * expected.abs().max()


def test_bad_input_is_refused_with_the_argument_named():
    module = layer_of(0)
    with pytest.raises(ValueError, match="cache was made by Qwen3NextGatedDeltaNet layer 2"):
        with torch.no_grad():
            module(random_input(), cache=layer_of(2).new_cache(B))
    with pytest.raises(TypeError, match="cache must come from the layer's new_cache"):
        with torch.no_grad():
            module(random_input(), cache=layer_of(1).new_cache(B, T))
    with pytest.raises(ValueError, match="x has batch size 2, the cache was made for batch_size=3"):
        with torch.no_grad():
            module(random_input(), cache=module.new_cache(3))
    with pytest.raises(ValueError, match="a cache is for inference"):
        module(random_input(), cache=module.new_cache(B))
    with pytest.raises(ValueError, match="form must be one of"):
        layer_of(0, form="parallel")
    with pytest.raises(ValueError, match="chunk_size must be positive"):
        layer_of(0, chunk_size=0)
    with pytest.raises(ValueError, match="linear_num_key_heads must divide linear_num_value_heads"):
        MODELS["qwen3_next"].from_config(CONFIG | {"linear_num_key_heads": 3}, 0)
    with pytest.raises(ValueError, match="hidden_act must be 'silu'"):
        MODELS["qwen3_next"].from_config(CONFIG | {"hidden_act": "gelu"}, 0)
    with pytest.raises(ValueError, match="config lacks the field 'linear_value_head_dim'"):
        MODELS["qwen3_next"].from_config({k: v for k, v in CONFIG.items() if k != "linear_value_head_dim"}, 0)
    with pytest.raises(ValueError, match="partial_rotary_factor must turn an even number"):
        MODELS["qwen3_next"].from_config(CONFIG | {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.1}}, 1)
    with pytest.raises(ValueError, match="layer 1 is a full_attention layer"):
        Qwen3NextGatedDeltaNet(CONFIG, 1)
    with pytest.raises(ValueError, match="layer 0 is a linear_attention layer"):
        Qwen3NextAttention(CONFIG, 0)
    with pytest.raises(ValueError, match="layer_types holds 'sliding_attention'"):
        MODELS["qwen3_next"].from_config(CONFIG | {"layer_types": ["sliding_attention"] * 4}, 0)


def test_kimi_layer_types_follow_the_checkpoint_where_not_listed():
    """A config.json lists the softmax layers 1-based in `linear_attn_config["full_attn_layers"]`; without it,
    transformers' default makes every fourth layer from layer 4 on softmax attention."""
    from attention.models.kimi_linear import KimiDeltaAttention, KimiLinearAttention, kimi_layer_type
    config = {key: value for key, value in KIMI_LINEAR.items() if key not in ("layer_types",)} | {"num_hidden_layers": 9}
    assert [kimi_layer_type(config, i) for i in range(9)] == ["linear_attention"] * 4 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    config["linear_attn_config"] = {"full_attn_layers": [2, 9], "kda_layers": [1, 3, 4, 5, 6, 7, 8]}
    assert [i for i in range(9) if kimi_layer_type(config, i) == "full_attention"] == [1, 8]
    assert isinstance(MODELS["kimi_linear"].from_config(config, 1), KimiLinearAttention)
    nested = {key: value for key, value in config.items() if key not in ("linear_num_heads", "linear_head_dim")}
    nested["linear_attn_config"] |= {"num_heads": 4, "head_dim": 6}
    assert isinstance(KimiLinearAttention.from_config(nested, 0), KimiDeltaAttention)
    assert KimiLinearAttention.from_config(nested, 0).head_dim == 6
    # The checkpoint's own convolution width, and its nested sizes read before the fields, as transformers reads them.
    both = nested | {"linear_num_heads": 2, "linear_conv_kernel_dim": 4}
    both["linear_attn_config"] = both["linear_attn_config"] | {"short_conv_kernel_size": 3}
    layer = KimiLinearAttention.from_config(both, 0)
    assert (layer.num_heads, layer.head_dim, layer.conv_kernel_size, layer.conv1d.weight.shape[-1]) == (4, 6, 3, 3)
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.AutoConfig.for_model(**{key: value for key, value in both.items() if key != "mlp_layer_types"})
    assert (hf_config.linear_num_heads, hf_config.linear_head_dim, hf_config.linear_conv_kernel_dim) == (4, 6, 3)


def test_kimi_bad_input_is_refused_with_the_argument_named():
    from attention.models.kimi_linear import KimiDeltaAttention, KimiLinearAttention
    linear, full = layer_of(0, "kimi_linear"), layer_of(1, "kimi_linear")
    with torch.no_grad():
        with pytest.raises(TypeError, match="cache must come from the layer's new_cache"):
            linear(random_input(), cache=full.new_cache(B, T))
        with pytest.raises(TypeError, match="cache must come from the layer's new_cache"):
            full(random_input(), cache=linear.new_cache(B))
        with pytest.raises(ValueError, match="cache was made by KimiLinearAttention layer 3, not by this layer"):
            full(random_input(), cache=layer_of(3, "kimi_linear").new_cache(B, T))
        with pytest.raises(ValueError, match="latent cache is full"):
            full(random_input(), cache=full.new_cache(B, T - 1))
    config = {key: value for key, value in KIMI_LINEAR.items() if key != "linear_head_dim"}
    with pytest.raises(ValueError, match=r"config lacks the field 'linear_head_dim' \(nor linear_attn_config\['head_dim'\]\)"):
        MODELS["kimi_linear"].from_config(config, 0)
    with pytest.raises(ValueError, match="kv_lora_rank must be positive"):
        MODELS["kimi_linear"].from_config(KIMI_LINEAR | {"kv_lora_rank": 0}, 1)
    with pytest.raises(TypeError, match="q_lora_rank must be an int"):
        MODELS["kimi_linear"].from_config(KIMI_LINEAR | {"q_lora_rank": 1.5}, 1)
    with pytest.raises(ValueError, match="layer 1 is a full_attention layer"):
        KimiDeltaAttention(KIMI_LINEAR, 1)
    with pytest.raises(ValueError, match="layer 0 is a linear_attention layer"):
        KimiLinearAttention(KIMI_LINEAR, 0)
    with pytest.raises(ValueError, match="form must be one of"):
        layer_of(0, "kimi_linear", form="fused")


def test_a_state_cache_refuses_sizes_that_are_not_positive_ints():
    with pytest.raises(ValueError, match="kernel_size must be a positive int, got kernel_size=0"):
        RecurrentStateCache(1, 4, 0, 2, 3, 3)
    cache = RecurrentStateCache(2, 4, 1, 2, 3, 5, state_dtype=torch.float64)  # a kernel of 1 tap keeps no inputs
    assert cache.conv_state.shape == (2, 4, 0) and cache.recurrent_state.dtype == torch.float64
    assert cache.nbytes == 2 * 2 * 3 * 5 * 8


def test_minimax_decays_are_alibi_slopes_shrinking_with_depth_and_its_buffers_are_not_loaded():
    """Lightning attention's decay of head h in layer l is `exp(-slope)`, `slope = 2 ** (-8 (h + 1) / H) * (1 - l / (L -
    1 + 1e-5) + 1e-5)`; transformers' decay buffers in a state dict are dropped (recomputed here), not refused."""
    module = layer_of(0, "minimax")
    H, L = MINIMAX["num_attention_heads"], MINIMAX["num_hidden_layers"]
    expected = [2 ** (-8 * (h + 1) / H) * (1 + 1e-5) for h in range(H)]
    torch.testing.assert_close(module.slopes, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    deeper = layer_of(2, "minimax")
    torch.testing.assert_close(deeper.slopes, module.slopes / (1 + 1e-5) * (1 - 2 / (L - 1 + 1e-5) + 1e-5),
                               rtol=1e-12, atol=0)
    state = module.state_dict() | {"slope_rate": torch.ones(H, 1, 1), "diagonal_decay": torch.ones(1)}
    module.load_state_dict(state)
    with pytest.raises(ValueError, match=r"unexpected keys \['bias'\]"):
        module.load_state_dict(module.state_dict() | {"bias": torch.ones(1)})


def test_minimax_bad_input_is_refused_with_the_argument_named():
    from attention.models.minimax import MiniMaxAttention, MiniMaxLightningAttention
    with pytest.raises(ValueError, match="sliding_window must be None"):
        MODELS["minimax"].from_config(MINIMAX | {"sliding_window": 4}, 1)
    with pytest.raises(ValueError, match="block_size must be positive"):
        MODELS["minimax"].from_config(MINIMAX | {"block_size": 0}, 0)
    with pytest.raises(ValueError, match="layer 1 is a full_attention layer"):
        MiniMaxLightningAttention(MINIMAX, 1)
    with pytest.raises(ValueError, match="layer 0 is a linear_attention layer"):
        MiniMaxAttention(MINIMAX, 0)
    with pytest.raises(ValueError, match="hidden_act must be 'silu'"):
        MODELS["minimax"].from_config(MINIMAX | {"hidden_act": "relu"}, 0)
    with torch.no_grad(), pytest.raises(ValueError, match="cache was made by MiniMaxLightningAttention layer 2"):
        layer_of(0, "minimax")(random_input(), cache=layer_of(2, "minimax").new_cache(B))
    config = {key: value for key, value in MINIMAX.items() if key != "layer_types"}
    assert [MODELS["minimax"].from_config(config, i).layer_type for i in range(4)] == ["full_attention",
                                                                                     "linear_attention"] * 2


# Each hybrid's own marked copies of llama.py's helpers (tests/test_copies.py keeps their text identical; here each
# copy's branches run in its own file, as tests/test_model_paths.py runs every other family's).

HYBRID_MODULES = ["qwen3_next", "kimi_linear", "minimax"]


def helpers(name):
    import importlib
    return importlib.import_module(f"attention.models.{name}")


@pytest.mark.parametrize("name", HYBRID_MODULES)
def test_each_hybrids_copied_checks_refuse_bad_values_naming_them(name):
    module = helpers(name)
    with pytest.raises(ValueError, match="config lacks the field 'hidden_size'"):
        module.config_value({"model_type": name}, "hidden_size")
    assert module.config_value(types.SimpleNamespace(hidden_size=8), "hidden_size") == 8
    with pytest.raises(TypeError, match="x must be an int"):
        module.check_int("x", True)
    with pytest.raises(ValueError, match="x must be non-negative"):
        module.check_int("x", -1, minimum=0)
    with pytest.raises(ValueError, match="x must be at least 3"):
        module.check_int("x", 2, minimum=3)
    with pytest.raises(TypeError, match="x must be a number"):
        module.check_finite("x", "1")
    with pytest.raises(ValueError, match="x must be finite and > 0"):
        module.check_finite("x", float("inf"))
    with pytest.raises(TypeError, match="layer_types must be a list"):
        module.listed_layer_types({"layer_types": "full_attention"}, module.LAYER_TYPES)
    with pytest.raises(ValueError, match="one kind per layer"):
        module.listed_layer_types({"layer_types": ["full_attention"], "num_hidden_layers": 2}, module.LAYER_TYPES)
    with pytest.raises(ValueError, match="this class builds the layers of model_type"):
        module.check_model_type({"model_type": "llama"}, (name,))
    with pytest.raises(ValueError, match="layer_idx must be an int in"):
        module.check_layer_idx({"num_hidden_layers": 2}, 2)
    with pytest.raises(ValueError, match="attention_dropout must be 0.0"):
        module.check_no_dropout({"attention_dropout": 0.1})
    layer = layer_of(1, "kimi_linear" if name.startswith("kimi") else name)
    with pytest.raises(ValueError, match="missing keys"):
        module.check_state_dict(layer, {}, True)
    key, tensor = next(iter(layer.state_dict().items()))
    with pytest.raises(ValueError, match=f"{key} has shape"):
        module.check_state_dict(layer, {key: torch.zeros(*tensor.shape, 2)}, False)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        module.check_input([1.0], 32, torch.float64)
    with pytest.raises(TypeError, match="floating-point"):
        module.check_input(torch.zeros(1, 2, 32, dtype=torch.long), 32, torch.float64)
    with pytest.raises(ValueError, match="x must have shape"):
        module.check_input(torch.zeros(1, 0, 32), 32, torch.float32)
    with pytest.raises(ValueError, match="differs from the layer's dtype"):
        module.check_input(torch.zeros(1, 2, 32), 32, torch.float64)


@pytest.mark.parametrize("name", ["qwen3_next", "minimax"])
def test_each_hybrids_softmax_layer_reads_every_rope_spelling_and_refuses_bad_ones(name):
    """The softmax layers' RoPE: transformers 4's `rope_theta` and `rope_scaling` (with its old `type` key), per layer
    type parameters, and each scaling (linear, Llama 3, YaRN) give the frequencies the checked helper computes; bad
    parameters, heads or caches are refused naming them."""
    from tests.test_models import LINEAR, LLAMA3, YARN
    module, config = helpers(name), CASES[name]
    extra = {"partial_rotary_factor": 0.5} if name == "qwen3_next" else {}
    base = {key: value for key, value in config.items() if key != "rope_parameters"}
    old = MODELS[name].from_config(base | {"rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}} | extra, 1)
    assert old.rope_parameters["rope_type"] == "linear"
    per_type = MODELS[name].from_config(config | {"rope_parameters": {"full_attention": {"rope_theta": 1e4, **extra}}}, 1)
    assert per_type.rope_parameters["rope_theta"] == 1e4
    for scaling in (LINEAR, LLAMA3, YARN, YARN | {"mscale": 1.0, "mscale_all_dim": 0.5, "truncate": False},
                    YARN | {"attention_factor": 1.5}):
        layer = MODELS[name].from_config(config | {"rope_parameters": {"rope_theta": 1e4, **scaling, **extra}}, 1)
        assert torch.isfinite(layer.inv_freq).all() and layer.attention_scaling > 0
    with pytest.raises(ValueError, match="rope_type must be one of"):
        module.check_rope_parameters(8, {"rope_type": "dynamic", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="config lacks the field 'factor'"):
        module.check_rope_parameters(8, {"rope_type": "linear", "rope_theta": 1e4})
    with pytest.raises(ValueError, match="high_freq_factor must be at least low_freq_factor"):
        module.check_rope_parameters(8, LLAMA3 | {"rope_theta": 1e4, "low_freq_factor": 4.0, "high_freq_factor": 1.0})
    with pytest.raises(ValueError, match="beta_fast must be finite"):
        module.check_rope_parameters(8, YARN | {"rope_theta": 1e4, "beta_fast": float("inf")})
    with pytest.raises(ValueError, match="attention_factor must be finite"):
        module.check_rope_parameters(8, YARN | {"rope_theta": 1e4, "attention_factor": 0})
    with pytest.raises(ValueError, match="head_dim must be even"):
        module.check_rope_parameters(7, {"rope_type": "default", "rope_theta": 1e4})
    with pytest.raises(TypeError, match="rope_scaling must be a dict"):
        module.mapping("rope_scaling", 2.0)
    with pytest.raises(ValueError, match="num_key_value_heads must divide num_attention_heads"):
        MODELS[name].from_config(config | {"num_key_value_heads": 3}, 1)
    window = types.SimpleNamespace(sliding_window=4, num_key_value_heads=2, head_dim=8, layer_idx=1,
                                   k_proj=torch.nn.Linear(1, 1))
    assert type(module.make_cache(window, 2, 10)).__name__ == "SlidingWindowKVCache"
    layer, x = layer_of(1, name), random_input()
    with torch.no_grad():
        with pytest.raises(TypeError, match="cache must come from the layer's new_cache"):
            layer(x, cache=object())
        with pytest.raises(ValueError, match="cache was made by"):
            layer(x, cache=layer_of(3, name).new_cache(B, T))
        with pytest.raises(ValueError, match="x has batch size 2"):
            layer(x, cache=layer.new_cache(3, T))
        with pytest.raises(ValueError, match="cache is torch.float32"):
            layer(x, cache=_float_cache(layer))
    with pytest.raises(ValueError, match="a KV cache is for inference"):
        layer.requires_grad_(True)(x, cache=layer.new_cache(B, T))
    wrong = layer.new_cache(B, T)
    wrong.keys = wrong.keys[:, :1]
    with torch.no_grad(), pytest.raises(ValueError, match="cache holds 1 K/V heads"):
        layer(x, cache=wrong)


def _float_cache(layer):
    """A cache this layer made, in float32 (the layer is float64)."""
    cache = layer.new_cache(B, T)
    cache.keys, cache.values = cache.keys.float(), cache.values.float()
    return cache
