"""The model families (attention/models/): each layer equal to the float64 reference and to transformers' own layer,
and decoding with its cache equal to the full forward.

Each family is built from a tiny configuration, a plain mapping with transformers' field names (`CASES`), that
switches its mechanisms on at sizes where they bite: windows of 4-5 keys under 11 tokens, a soft-cap of 2, a query
scale that is not `1 / sqrt(head_dim)`, YaRN and Llama 3.1's RoPE scaling. Most tests need nothing but torch: the
layer, its parameters drawn at random, against `attention.reference`, whose settings come from the same
configuration (`model_reference_kwargs`), never from the layer. transformers (a test-only extra) is needed only for
the comparisons with its own layers (`hf`): it builds each model from the same fields, offline (no weights are
downloaded), randomises every parameter, runs the whole tiny model in float64 with eager attention, and hooks
capture what each attention layer receives and returns, so masks, windows and rotary embeddings are the model's own.
"""

import dataclasses
import functools
import os
import subprocess
import sys

import pytest
import torch

import attention.decoding.kernels as kernels
from attention.decoding import AUTO_MATMUL_MAX_TOKENS, KVCache, SlidingWindowKVCache
from attention.models import MODELS, ModelAttention, published
from attention.models.llama import rotary_cos_sin
from attention.reference import model_reference_kwargs, reference_model_attention
from tests.helpers import requires_cuda, tolerance

B, T = 2, 11  # 11 tokens: past every window below
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# "original" contexts of 16 positions put some of the 4 frequency pairs on each side of the ramps.
YARN_ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 16}
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 16}
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}

CASES = {  # name: (model_type, the tiny configuration's fields beyond TINY): every field a family reads
    "llama": ("llama", dict(attention_bias=True, rope_parameters=LLAMA3_ROPE)),
    "mistral": ("mistral", dict(sliding_window=4, rope_theta=10000.0)),
    # YaRN here too: llama.py's own copy of rope_frequencies runs it only for this class (Qwen2.5's long-context setting).
    "qwen2": ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1, rope_parameters=YARN_ROPE)),
    "qwen3": ("qwen3", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1, rope_parameters=YARN_ROPE,
                            rms_norm_eps=1e-6)),
    "olmo2": ("olmo2", dict(num_key_value_heads=4, rope_theta=10000.0, rms_norm_eps=1e-6)),  # multi-head, as OLMo 2 7B
    "gemma2": ("gemma2", dict(sliding_window=4, query_pre_attn_scalar=12, attn_logit_softcapping=2.0, rope_theta=10000.0)),
    "gemma3_text": ("gemma3_text", dict(num_hidden_layers=3, sliding_window_pattern=3, sliding_window=4,
                                        query_pre_attn_scalar=12, rope_parameters=GEMMA3_ROPE, rms_norm_eps=1e-6)),
    "gpt_oss": ("gpt_oss", dict(sliding_window=4, num_local_experts=4, num_experts_per_tok=2, rope_parameters=GPT_OSS_ROPE)),
    # Chunks of 4 under 11 tokens; a temperature floor of 3 positions (8,192 in Llama 4), so it grows within 11.
    "llama4_text": ("llama4_text", dict(num_hidden_layers=4, no_rope_layer_interval=2, attention_chunk_size=4,
                                        floor_scale=3, attn_scale=0.5, num_local_experts=2, intermediate_size_mlp=48,
                                        rope_parameters=LLAMA3_ROPE, rms_norm_eps=1e-5)),
}
LAYERS = [(name, layer_idx) for name, (_, fields) in CASES.items()
          for layer_idx in range(fields.get("num_hidden_layers", TINY["num_hidden_layers"]))]
LAYER_IDS = [f"{name}-{layer_idx}" for name, layer_idx in LAYERS]


def config_of(name):
    """`CASES[name]` as a plain configuration: a new dict with transformers' field names."""
    model_type, fields = CASES[name]
    return {"model_type": model_type, **TINY, **fields}


def randomised(module, seed):
    """`module` in float64, every parameter drawn from `seed` (norm weights too; sinks wider, so that they matter)."""
    module = module.to(torch.float64)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, param in module.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * (2.0 if pname == "sinks" else 0.5))
    return module


def layer_of(name, layer_idx, **options):
    """Our layer `layer_idx` of `CASES[name]` (`options`: `from_config`'s), float64, its parameters drawn at random."""
    config = config_of(name)
    return randomised(MODELS[config["model_type"]].from_config(config, layer_idx, **options), seed=10 * layer_idx + 3)


def reference_kwargs(name, layer_idx, positions=None):
    """`reference_model_attention`'s keywords for layer `layer_idx` of `CASES[name]`, from its configuration."""
    config = config_of(name)
    return model_reference_kwargs(config, layer_idx, torch.arange(T) if positions is None else positions,
                                  MODELS[config["model_type"]])


# Llama 4 is left out: it normalises q and k (an L2 norm, in float32) and rotates them in complex float32.
NORMLESS = [(case, case_id) for case, case_id in zip(LAYERS, LAYER_IDS)
            if not hasattr(layer_of(*case), "q_norm") and case[0] != "llama4_text"]
CHUNKED = [(case, case_id) for case, case_id in zip(LAYERS, LAYER_IDS)
           if getattr(layer_of(*case), "attention_chunk_size", None)]
SLIDING = [(case, case_id) for case, case_id in zip(LAYERS, LAYER_IDS) if layer_of(*case).sliding_window]


def random_input(module, dtype=torch.float64, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, module.hidden_size, generator=generator, dtype=torch.float64).to(dtype)


# transformers' own layers (the test-only extra).

def hf():
    """transformers, or a skip: only the comparisons with its layers need it."""
    return pytest.importorskip("transformers")


@dataclasses.dataclass
class Run:
    config: object  # transformers' config object
    model: object  # the tiny transformers model, float64, eager attention
    inputs: dict  # layer_idx -> what the model fed that attention layer: hidden_states, attention_mask, ...
    outputs: dict  # layer_idx -> the layer's output (B, T, hidden_size)


@functools.cache
def run_model(name):
    """The tiny model of `CASES[name]`, every parameter randomised, run once on random tokens with hooks."""
    model_type = CASES[name][0]
    config = hf().AutoConfig.for_model(**config_of(name))
    # Their experts' grouped_mm has no float64.
    extra = {"experts_implementation": "eager"} if model_type in ("gpt_oss", "llama4_text") else {}
    torch.manual_seed(0)
    model = hf().AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float64,
                                                  **extra).eval()
    with torch.no_grad():
        for pname, param in model.named_parameters():  # norm weights and sinks too
            param.normal_(0.0, 2.0 if pname.endswith("sinks") else 0.5)
    inputs, outputs = {}, {}
    for layer_idx, layer in enumerate(model.model.layers):
        def capture(module, args, kwargs, output, layer_idx=layer_idx):
            inputs[layer_idx], outputs[layer_idx] = dict(kwargs), output[0]
        layer.self_attn.register_forward_hook(capture, with_kwargs=True)
    with torch.no_grad():
        model(torch.randint(0, TINY["vocab_size"], (B, T)))
    return Run(config, model, inputs, outputs)


def layer_pair(name, layer_idx):
    """transformers' attention layer of `CASES[name]` and ours, ours built from the plain configuration, with its weights."""
    hf_layer = run_model(name).model.model.layers[layer_idx].self_attn
    module = MODELS[CASES[name][0]].from_config(config_of(name), layer_idx).to(torch.float64)
    module.load_state_dict(hf_layer.state_dict())
    return hf_layer, module


@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
def test_layer_equals_transformers_layer(name, layer_idx):
    """Built from the plain configuration, our layer is transformers' (built from the same fields): same kind of layer,
    same output for the input the tiny model gave it."""
    run = run_model(name)
    hf_layer, module = layer_pair(name, layer_idx)
    assert isinstance(module, ModelAttention)
    assert module.layer_type == getattr(run.config, "layer_types", [module.layer_type] * 99)[layer_idx]
    with torch.no_grad():
        out = module(run.inputs[layer_idx]["hidden_states"])
    # transformers computes RoPE's angles and the RMSNorms in float32, even in a float64 model: ~1e-7 relative.
    torch.testing.assert_close(out, run.outputs[layer_idx], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("name,layer_idx", [case for case, _ in NORMLESS], ids=[case_id for _, case_id in NORMLESS])
def test_transformers_differs_only_by_its_float32_steps(name, layer_idx, monkeypatch):
    """transformers computes RoPE's cos and sin, and Llama's and Gemma's softmax, in float32 even in a float64 model.
    Fed float64 cos and sin (ours) and the model's own mask, its softmax left in float64, its layer (one without
    norms, which are float32 too) equals ours to 1e-12."""
    softmax = torch.nn.functional.softmax

    def float64_softmax(input, dim=None, _stacklevel=3, dtype=None):
        return softmax(input, dim=dim, dtype=None if input.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", float64_softmax)
    run = run_model(name)
    hf_layer, module = layer_pair(name, layer_idx)
    x = run.inputs[layer_idx]["hidden_states"]
    cos, sin = rotary_cos_sin(module, 0, T, x)  # (T, D) each
    if run.config.model_type == "gpt_oss":  # its tables hold each pair's angle once: (T, D/2)
        cos, sin = cos[:, : module.head_dim // 2], sin[:, : module.head_dim // 2]
    with torch.no_grad():
        expected, _ = hf_layer(hidden_states=x, position_embeddings=(cos[None], sin[None]),
                               attention_mask=run.inputs[layer_idx]["attention_mask"])
        out = module(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_without_transformers_only_its_comparisons_skip():
    """The file does not skip whole without transformers: hidden (an import that fails), every test but the
    comparisons with its layers is still collected and run."""
    code = ("import sys, pytest; sys.modules['transformers'] = None; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--collect-only', 'tests/test_models.py']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected = [line for line in done.stdout.splitlines() if "::test_" in line]
    assert len(collected) > 200 and any("float64_reference" in line for line in collected), done.stdout[-3000:]


# Against the float64 reference, set from the configuration (no transformers needed).

@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
def test_forward_and_gradients_equal_float64_reference(name, layer_idx):
    module = layer_of(name, layer_idx)
    x = random_input(module).requires_grad_(True)
    grad_out = torch.randn(B, T, module.hidden_size, dtype=torch.float64)
    out = module(x)
    (out * grad_out).sum().backward()
    state = {pname: param.detach().clone().requires_grad_(True) for pname, param in module.named_parameters()}
    x_ref = x.detach().clone().requires_grad_(True)
    expected, _ = reference_model_attention(x_ref, state, **reference_kwargs(name, layer_idx))
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=1e-11)
    for pname, param in module.named_parameters():
        torch.testing.assert_close(param.grad, state[pname].grad, rtol=1e-10, atol=1e-10, msg=pname)


# A setting the layer computes wrongly, each as a plausible slip: (case, layer, attribute, its wrong value).
WRONG_SETTINGS = [
    ("gemma2", 0, "scaling", lambda module: module.head_dim ** -0.5),  # not query_pre_attn_scalar ** -0.5
    ("gemma3_text", 2, "scaling", lambda module: module.head_dim ** -0.5),
    ("gemma2", 0, "attn_logit_softcapping", lambda module: 50.0),  # the published cap, not the config's
    ("mistral", 0, "sliding_window", lambda module: module.sliding_window + 1),
    ("qwen3", 1, "sliding_window", lambda module: module.sliding_window - 1),
    ("llama4_text", 0, "attention_chunk_size", lambda module: 3),
    ("qwen2", 0, "attention_scaling", lambda module: 1.0),  # YaRN's 0.1 ln(factor) + 1 forgotten
    ("llama", 0, "inv_freq", lambda module: module.inv_freq * 8.0),  # Llama 3.1's stretch undone
    ("gemma3_text", 0, "inv_freq", lambda module: module.inv_freq / 8.0),  # the global layers' linear stretch, locally
    ("llama4_text", 1, "floor_scale", lambda module: 8192),  # the published floor: no temperature within 11 tokens
]


@pytest.mark.parametrize("name,layer_idx,attribute,wrong", WRONG_SETTINGS,
                         ids=[f"{case[0]}-{case[1]}-{case[2]}" for case in WRONG_SETTINGS])
def test_a_setting_the_layer_computes_wrongly_differs_from_the_reference(name, layer_idx, attribute, wrong):
    """The reference takes its scale, window, chunk, soft-cap, RoPE frequencies and query temperature from the
    configuration, not from the layer under test: a layer holding a wrong one no longer equals it."""
    module = layer_of(name, layer_idx)
    x = random_input(module)
    expected, _ = reference_model_attention(x, module.state_dict(), **reference_kwargs(name, layer_idx))
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)
        setattr(module, attribute, wrong(module))
        module.rope_tables = {}  # the rotary tables are cached per device from inv_freq
        assert (module(x) - expected).abs().max() > 1e-4


@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
def test_float32_layer_within_the_float32_tolerance_of_the_reference(name, layer_idx):
    module = layer_of(name, layer_idx).to(torch.float32)
    x = random_input(module, torch.float32)
    with torch.no_grad():
        out = module(x)
    expected, _ = reference_model_attention(x, module.state_dict(), **reference_kwargs(name, layer_idx))
    torch.testing.assert_close(out.double(), expected, **tolerance("cpu", torch.float32))


@pytest.mark.parametrize("name,layer_idx", [case for case, _ in SLIDING], ids=[case_id for _, case_id in SLIDING])
def test_a_sliding_layer_sees_only_its_window(name, layer_idx):
    """The window changes the output (the sequence is longer than it), and exactly as the reference's mask says."""
    module = layer_of(name, layer_idx)
    x = random_input(module)
    kwargs = reference_kwargs(name, layer_idx)
    with torch.no_grad():
        out = module(x)
    windowed, weights = reference_model_attention(x, module.state_dict(), **kwargs)
    unwindowed, _ = reference_model_attention(x, module.state_dict(), **{**kwargs, "window": None})
    torch.testing.assert_close(out, windowed, rtol=0, atol=1e-12)
    assert (out - unwindowed).abs().max() > 1e-3
    seen = (weights[0, 0] > 0).sum(dim=-1)  # keys each query attends to
    assert seen.tolist() == [min(i + 1, config_of(name)["sliding_window"]) for i in range(T)]


@pytest.mark.parametrize("name,layer_idx", [case for case, _ in CHUNKED], ids=[case_id for _, case_id in CHUNKED])
def test_a_chunked_layer_sees_only_its_chunk(name, layer_idx):
    module = layer_of(name, layer_idx)
    x = random_input(module)
    with torch.no_grad():
        out = module(x)
    chunked, weights = reference_model_attention(x, module.state_dict(), **reference_kwargs(name, layer_idx))
    unchunked, _ = reference_model_attention(x, module.state_dict(), **{**reference_kwargs(name, layer_idx), "chunk": None})
    torch.testing.assert_close(out, chunked, rtol=0, atol=1e-12)
    assert (out - unchunked).abs().max() > 1e-3
    seen = (weights[0, 0] > 0).sum(dim=-1)  # keys each query attends to
    assert seen.tolist() == [i % config_of(name)["attention_chunk_size"] + 1 for i in range(T)]


SCHEDULES = {"prefill": [T], "steps": [1] * T, "prompt_then_steps": [5] + [1] * (T - 5), "chunks": [3, 4, 4]}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
def test_cached_decoding_equals_the_full_forward(name, layer_idx, schedule):
    module = layer_of(name, layer_idx)
    x = random_input(module)
    cache = module.new_cache(B, capacity=16)
    with torch.no_grad():
        full = module(x)
        pieces, start = [], 0
        for length in SCHEDULES[schedule]:
            pieces.append(module(x[:, start:start + length], cache=cache))
            start += length
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-12)
    assert cache.length == T
    # A local layer's cache holds its window (or chunk), not the capacity.
    kept = min(module.sliding_window or getattr(module, "attention_chunk_size", None) or 16, 16)
    assert cache.nbytes == 2 * B * module.num_key_value_heads * kept * module.head_dim * 8


DECODE_KERNEL_LAYERS = [(case, case_id) for case, case_id in zip(LAYERS, LAYER_IDS) if hasattr(layer_of(*case), "decode_kernel")]


@pytest.mark.parametrize("decode_kernel", ["sdpa", "matmul"])
@pytest.mark.parametrize("schedule", ["steps", "chunks"])
@pytest.mark.parametrize("name,layer_idx", [case for case, _ in DECODE_KERNEL_LAYERS],
                         ids=[case_id for _, case_id in DECODE_KERNEL_LAYERS])
def test_each_decode_kernel_continues_the_full_forward(name, layer_idx, schedule, decode_kernel):
    """A layer on SDPA decodes through SDPA or the grouped matmuls (`decode_kernel`, a `from_config` argument), each
    equal to the full forward (its window, chunk, norms, scale and positions included); the grouped matmuls run where
    they are asked for."""
    module = layer_of(name, layer_idx, decode_kernel=decode_kernel)
    assert module.decode_kernel == decode_kernel
    x = random_input(module)
    calls = []
    original = kernels.grouped_decode_attention
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "grouped_decode_attention", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
        full = module(x)
        cache, pieces, start = module.new_cache(B, capacity=16), [], 0
        for length in SCHEDULES[schedule]:
            pieces.append(module(x[:, start:start + length], cache=cache))
            start += length
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-12)
    assert len(calls) == (len(SCHEDULES[schedule]) if decode_kernel == "matmul" else 0)


def test_with_tuning_off_the_auto_decode_kernel_takes_the_grouped_matmuls_for_a_few_tokens_on_cpu(monkeypatch):
    monkeypatch.setenv("ATTENTION_TUNING", "off")  # the fixed rule; tests/test_tuning.py: the measured choice
    module = layer_of("llama", 0)
    assert module.decode_kernel == "auto"
    calls = []
    original = kernels.grouped_decode_attention
    monkeypatch.setattr(kernels, "grouped_decode_attention", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    x = random_input(module)
    with torch.no_grad():
        module(x)  # no cache: SDPA
        cache = module.new_cache(B, capacity=64)
        module(x[:, :1], cache=cache)
        assert calls == [1]
        module(torch.cat([x] * 2, dim=1), cache=cache)  # 22 new tokens: past AUTO_MATMUL_MAX_TOKENS, SDPA
        assert calls == [1] and AUTO_MATMUL_MAX_TOKENS < 2 * T


def test_the_decode_kernel_is_chosen_at_construction():
    """`decode_kernel` is a `from_config` argument, checked there (before any weight is made); a layer whose forward
    writes its softmax out (Gemma 2's soft-cap, gpt-oss's sinks) has no such choice and takes no such argument."""
    for name in ("llama", "qwen3", "olmo2", "gemma3_text", "llama4_text"):
        config = config_of(name)
        assert MODELS[config["model_type"]].from_config(config, 0, decode_kernel="sdpa").decode_kernel == "sdpa"
        with pytest.raises(ValueError, match="decode_kernel must be one of .* got decode_kernel='flash'"):
            MODELS[config["model_type"]].from_config(config, 0, decode_kernel="flash")
    for name in ("gemma2", "gpt_oss"):
        with pytest.raises(TypeError, match="decode_kernel"):
            MODELS[name].from_config(config_of(name), 0, decode_kernel="sdpa")


@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
def test_a_decoding_step_reads_the_cache_where_it_lies(name, layer_idx):
    """One new token over 2,048 cached positions allocates less than a quarter of the cache: no layer copies its keys
    and values (a batched matmul broadcasting K/V heads over their query heads would: `group` copies of the cache)."""
    from attention.bench.metrics import profile_call

    config = config_of(name)
    config.update({key: 4096 for key in ("sliding_window", "attention_chunk_size") if key in config}, head_dim=64)
    module = MODELS[config["model_type"]].from_config(config, layer_idx)
    cache = module.new_cache(B, capacity=2049)
    x = torch.randn(B, 2048, module.hidden_size)
    with torch.no_grad():
        for start in range(0, 2048, 256):
            module(x[:, start:start + 256], cache=cache)
        step = lambda: (cache.rewind(2048), module(x[:, :1], cache=cache))  # noqa: E731
        step()
        peak = profile_call(step, torch.device("cpu"))["cpu_tensor_peak_bytes"]
    assert cache.length == 2049 and peak is not None
    assert peak < cache.nbytes / 4, f"a step allocated {peak:,} bytes, the cache holds {cache.nbytes:,}"


@pytest.mark.parametrize("name,layer_idx", LAYERS, ids=LAYER_IDS)
def test_a_rewound_cache_repeats_the_step(name, layer_idx):
    module = layer_of(name, layer_idx)
    x = random_input(module)
    cache = module.new_cache(B, capacity=16)
    with torch.no_grad():
        module(x[:, :T - 1], cache=cache)
        first = module(x[:, T - 1:], cache=cache)
        cache.rewind(T - 1)
        again = module(x[:, T - 1:], cache=cache)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_a_sliding_layer_given_a_capacity_within_its_window_keeps_a_full_cache():
    module = layer_of("gemma2", 0)
    cache = module.new_cache(B, capacity=3)  # window 4
    with torch.no_grad():
        module(random_input(module)[:, :3], cache=cache)
        with pytest.raises(ValueError, match="capacity=3"):
            module(random_input(module)[:, :1], cache=cache)


# Bad input: clear errors naming what is wrong.

def test_unknown_model_type_lists_the_registry():
    with pytest.raises(KeyError, match="gemma2.*gpt_oss.*llama"):
        MODELS["gpt2"]


def test_a_config_missing_a_field_names_it():
    fields = {**TINY, "model_type": "llama", "rope_theta": 10000.0}
    del fields["hidden_size"]
    with pytest.raises(ValueError, match="'hidden_size'"):
        MODELS["llama"].from_config(fields, 0)
    fields = {**TINY, "model_type": "gemma2", "rope_theta": 10000.0}
    with pytest.raises(ValueError, match="'query_pre_attn_scalar'"):
        MODELS["gemma2"].from_config(fields, 0)
    with pytest.raises(ValueError, match="'rope_theta'"):
        MODELS["qwen3"].from_config({**TINY, "model_type": "qwen3", "rms_norm_eps": 1e-6}, 0)


def test_a_config_of_another_family_is_refused():
    with pytest.raises(ValueError, match="model_type='gemma2'"):
        MODELS["llama"].from_config(config_of("gemma2"), 0)


def test_a_layer_index_outside_the_model_is_refused():
    with pytest.raises(ValueError, match="layer_idx"):
        MODELS["llama"].from_config(config_of("llama"), 2)


def test_a_state_dict_that_does_not_fit_names_the_key_and_both_shapes():
    module = layer_of("qwen3", 0)
    state = dict(module.state_dict())
    state["k_norm.weight"] = torch.ones(16)
    with pytest.raises(ValueError, match=r"k_norm.weight has shape \(16,\), the layer's is \(8,\)"):
        module.load_state_dict(state)
    del state["k_norm.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['k_norm.weight'\]"):
        module.load_state_dict(state)


def test_a_cache_from_another_layer_is_refused():
    layer0 = layer_of("gemma3_text", 0)
    layer1 = layer_of("gemma3_text", 1)  # the same kind (local) and shape: only the owner tells them apart
    cache = layer0.new_cache(B, capacity=16)
    with torch.no_grad(), pytest.raises(ValueError, match="layer 0"):
        layer1(random_input(layer1)[:, :1], cache=cache)
    foreign = KVCache(B, layer0.num_key_value_heads, layer0.head_dim, 16, dtype=torch.float64)
    with torch.no_grad(), pytest.raises(TypeError, match="new_cache"):
        layer0(random_input(layer0)[:, :1], cache=foreign)


def test_bad_inputs_get_clear_errors():
    module = layer_of("llama", 0)
    with pytest.raises(ValueError, match="hidden_size=32"):
        module(torch.randn(B, T, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="floating"):
        module(torch.ones(B, T, 32, dtype=torch.long))
    cache = module.new_cache(B, capacity=16)
    with pytest.raises(ValueError, match="inference"):
        module(random_input(module)[:, :1], cache=cache)  # gradients on


# Config values out of range: refused at construction, naming the field and its value (issue 44).

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
PLAIN = {  # a small valid config.json of each family, as a plain mapping (no transformers needed)
    "llama": dict(model_type="llama", **SMALL, rope_theta=1e4),
    "qwen3": dict(model_type="qwen3", **SMALL, rope_theta=1e4, rms_norm_eps=1e-6),
    "olmo2": dict(model_type="olmo2", **SMALL, rope_theta=1e4, rms_norm_eps=1e-6),
    "gemma2": dict(model_type="gemma2", **SMALL, rope_theta=1e4, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                   sliding_window=4),
    "gemma3_text": dict(model_type="gemma3_text", **SMALL, query_pre_attn_scalar=16, sliding_window=4,
                        sliding_window_pattern=2, rms_norm_eps=1e-6),
    "gpt_oss": dict(model_type="gpt_oss", **SMALL, rope_theta=1e4, sliding_window=4),
    "llama4_text": dict(model_type="llama4_text", **{**SMALL, "num_hidden_layers": 4}, rope_theta=1e4, rms_norm_eps=1e-5,
                        attention_chunk_size=4),
}
SLIDING_LLAMA = dict(layer_types=["sliding_attention", "full_attention"])  # layer 0 local: its window is read
LINEAR = {"rope_type": "linear", "factor": 2.0}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
NAN, INF = float("nan"), float("inf")

# (family, layer_idx, fields replacing the plain config's, error, what the message must say). Layer 0 is local in
# Gemma 2, Gemma 3 (pattern 2) and gpt-oss; Llama 4's layer 3 is its NoPE layer (interval 4), layer 0 chunked.
BAD_CONFIGS = [
    # Sizes: positive ints (an int where it counts), an even head_dim where RoPE rotates it.
    ("llama", 0, dict(num_attention_heads=0), ValueError, "num_attention_heads=0"),
    ("llama", 0, dict(num_attention_heads=-4), ValueError, "num_attention_heads=-4"),
    ("llama", 0, dict(num_attention_heads=4.0), TypeError, "num_attention_heads=4.0"),
    ("llama", 0, dict(num_attention_heads="4"), TypeError, "num_attention_heads='4'"),
    ("llama", 0, dict(num_key_value_heads=-2), ValueError, "num_key_value_heads=-2"),
    ("llama", 0, dict(num_key_value_heads=2.0), TypeError, "num_key_value_heads=2.0"),
    ("llama", 0, dict(hidden_size=0), ValueError, "hidden_size=0"),
    ("llama", 0, dict(hidden_size=-64, head_dim=None), ValueError, "hidden_size=-64"),
    ("llama", 0, dict(head_dim=-16), ValueError, "head_dim=-16"),
    ("llama", 0, dict(head_dim=15), ValueError, "head_dim must be even .* head_dim=15"),
    ("llama", 0, dict(hidden_size=60, num_attention_heads=8, num_key_value_heads=8, head_dim=None), ValueError,
     "head_dim=7"),  # 60 // 8
    ("gemma2", 1, dict(head_dim=15), ValueError, "head_dim=15"),
    ("llama", 0, dict(num_hidden_layers="2"), TypeError, "num_hidden_layers='2'"),
    # RoPE: the rope_type first, each field it reads named, rope_theta and factor finite and > 0.
    ("llama", 0, dict(rope_theta=0.0), ValueError, "rope_theta=0.0"),
    ("llama", 0, dict(rope_theta=-1e4), ValueError, "rope_theta=-10000.0"),
    ("llama", 0, dict(rope_theta=NAN), ValueError, "rope_theta=nan"),
    ("llama", 0, dict(rope_theta=INF), ValueError, "rope_theta=inf"),
    ("llama", 0, dict(rope_theta="10000"), TypeError, "rope_theta='10000'"),
    ("llama", 0, dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), ValueError,
     "rope_type must be one of default, linear, llama3, yarn, got rope_type='dynamic'"),
    ("llama", 0, dict(rope_scaling={"type": "longrope"}), ValueError, "got rope_type='longrope'"),
    ("llama", 0, dict(rope_scaling={"rope_type": "linear"}), ValueError, "'factor'"),
    ("llama", 0, dict(rope_scaling={**LLAMA3, "low_freq_factor": None}), ValueError, "'low_freq_factor'"),
    ("llama", 0, dict(rope_scaling={k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}),
     ValueError, "'original_max_position_embeddings'"),
    ("llama", 0, dict(rope_scaling={**LINEAR, "factor": 0}), ValueError, "factor=0"),
    ("llama", 0, dict(rope_scaling={**LINEAR, "factor": NAN}), ValueError, "factor=nan"),
    ("llama", 0, dict(rope_scaling={**YARN, "factor": 0.0}), ValueError, "factor=0.0"),
    ("llama", 0, dict(rope_scaling={**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}), ValueError,
     "low_freq_factor=4.0, high_freq_factor=1.0"),
    ("llama", 0, dict(rope_scaling={**YARN, "original_max_position_embeddings": 0}), ValueError,
     "original_max_position_embeddings=0"),
    ("llama", 0, dict(rope_scaling={**YARN, "original_max_position_embeddings": 16.0}), TypeError,
     "original_max_position_embeddings=16.0"),
    ("llama", 0, dict(rope_theta=1.0, rope_scaling=YARN), ValueError, "rope_theta must be finite and > 1, got rope_theta=1.0"),
    ("llama", 0, dict(rope_scaling={**YARN, "mscale": NAN, "mscale_all_dim": 1.0}), ValueError, "mscale=nan"),
    ("llama", 0, dict(rope_scaling={**YARN, "attention_factor": 0.0}), ValueError, "attention_factor=0.0"),
    ("llama", 0, dict(rope_scaling={**YARN, "beta_fast": -32}), ValueError, "beta_fast=-32"),
    ("llama", 0, dict(rope_scaling="linear"), TypeError, "rope_scaling='linear'"),
    ("llama", 0, dict(rope_parameters=["linear"]), TypeError, r"rope_parameters=\['linear'\]"),
    ("gemma3_text", 0, dict(rope_local_base_freq=0.0), ValueError, "rope_local_base_freq=0.0"),
    ("gemma3_text", 0, dict(rope_parameters={"full_attention": {"rope_theta": 1e6}}), ValueError,
     "lacks 'sliding_attention'"),
    # Windows: a positive int on every layer that uses one; Gemma 2 and gpt-oss no longer read 0 as "no window".
    *[(family, 0, {**extra, "sliding_window": window}, error, f"sliding_window={window!r}")
      for family, extra in (("llama", SLIDING_LLAMA), ("gemma2", {}), ("gemma3_text", {}), ("gpt_oss", {}),
                            ("qwen3", SLIDING_LLAMA))
      for window, error in ((0, ValueError), (-3, ValueError), (4.5, TypeError), (None, TypeError))],
    ("gemma3_text", 0, dict(sliding_window_pattern=0), ValueError, "sliding_window_pattern=0"),
    ("llama", 1, dict(model_type="qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=None), TypeError,
     "max_window_layers=None"),
    ("llama4_text", 0, dict(attention_chunk_size=0, layer_types=["chunked_attention"] * 3 + ["full_attention"]),
     ValueError, "attention_chunk_size=0"),
    ("llama4_text", 0, dict(attention_chunk_size=-4), ValueError, "attention_chunk_size=-4"),
    ("llama4_text", 0, dict(attention_chunk_size=4.5), TypeError, "attention_chunk_size=4.5"),
    ("llama4_text", 0, dict(no_rope_layer_interval=0), ValueError, "no_rope_layer_interval=0"),
    # Scales and caps: finite and > 0 (a soft-cap of None: no cap).
    ("gemma2", 0, dict(attn_logit_softcapping=0.0), ValueError, "attn_logit_softcapping=0.0"),
    ("gemma2", 0, dict(attn_logit_softcapping=NAN), ValueError, "attn_logit_softcapping=nan"),
    ("gemma2", 0, dict(attn_logit_softcapping=-50.0), ValueError, "attn_logit_softcapping=-50.0"),
    ("gemma2", 0, dict(query_pre_attn_scalar=0), ValueError, "query_pre_attn_scalar=0"),
    ("gemma2", 0, dict(query_pre_attn_scalar=-16), ValueError, "query_pre_attn_scalar=-16"),
    ("gemma3_text", 0, dict(query_pre_attn_scalar=INF), ValueError, "query_pre_attn_scalar=inf"),
    ("llama4_text", 3, dict(floor_scale=0), ValueError, "floor_scale=0"),
    ("llama4_text", 3, dict(attn_scale=NAN), ValueError, "attn_scale=nan"),
    ("qwen3", 0, dict(rms_norm_eps=NAN), ValueError, "rms_norm_eps=nan"),
    ("llama4_text", 0, dict(rms_norm_eps=-1e-5), ValueError, "rms_norm_eps=-1e-05"),
    # Layer kinds: each one of the family's; layer_types a list of num_hidden_layers of them.
    ("llama", 0, dict(layer_types=["banana", "full_attention"]), ValueError,
     "layer_types holds 'banana'; the layers of this family are full_attention, sliding_attention"),
    ("gemma2", 1, dict(layer_types=["chunked_attention", "full_attention"]), ValueError, "'chunked_attention'"),
    ("llama4_text", 0, dict(layer_types=["sliding_attention"] * 4), ValueError,
     "'sliding_attention'; the layers of this family are full_attention, chunked_attention"),
    ("gpt_oss", 0, dict(layer_types="full_attention"), TypeError, "layer_types='full_attention'"),
    ("olmo2", 0, dict(layer_types=["full_attention"]), ValueError, r"num_hidden_layers=2\), got 1"),
    ("llama4_text", 0, dict(no_rope_layers=[1, 1, 1]), ValueError, "no_rope_layers=\\[1, 1, 1\\]"),
    ("llama4_text", 0, dict(no_rope_layers=["1"] * 4), ValueError, "no_rope_layers"),
]


@pytest.mark.parametrize("family,layer_idx,fields,error,pattern", BAD_CONFIGS,
                         ids=[f"{case[0]}-{'-'.join(case[2])}-{i}" for i, case in enumerate(BAD_CONFIGS)])
def test_a_config_value_out_of_range_is_refused_naming_the_field(family, layer_idx, fields, error, pattern):
    config = {**PLAIN[family], **fields}
    with pytest.raises(error, match=pattern):
        MODELS[config["model_type"]].from_config(config, layer_idx)


def test_the_plain_configs_build_every_layer():
    """The bad configurations above differ from these, which build, in the fields they name only."""
    for family, config in PLAIN.items():
        for layer_idx in range(config["num_hidden_layers"]):
            MODELS[config["model_type"]].from_config(config, layer_idx)


def test_values_transformers_accepts_keep_their_meaning():
    """Where transformers accepts a value, so do the families, with its meaning: no K/V head count (0 or None) is one
    per query head, no head_dim (0 or None) hidden_size // heads, a Mistral window of 0 or None and a Qwen2 window of
    0 are no window, no soft-cap is none, Llama 3's two frequency factors may be equal (Llama 4 Scout's are), and a
    NoPE layer rotates nothing, so its head_dim may be odd."""
    build = lambda family, layer_idx=0, **fields: MODELS[PLAIN[family]["model_type"]].from_config(  # noqa: E731
        {**PLAIN[family], **fields}, layer_idx)
    for missing in (0, None):
        assert build("llama", num_key_value_heads=missing).num_key_value_heads == 4
        assert build("llama", head_dim=missing).head_dim == 16
        mistral = build("llama", model_type="mistral", sliding_window=missing)
        assert (mistral.layer_type, mistral.sliding_window) == ("full_attention", None)
    qwen2 = build("llama", 1, model_type="qwen2", use_sliding_window=True, sliding_window=0, max_window_layers=0)
    assert (qwen2.layer_type, qwen2.sliding_window) == ("full_attention", None)
    assert build("gemma2", attn_logit_softcapping=None).attn_logit_softcapping is None
    assert build("llama", rope_scaling={**LLAMA3, "low_freq_factor": 1.0, "high_freq_factor": 1.0}).inv_freq.isfinite().all()
    assert build("llama4_text", 3, head_dim=15).inv_freq is None


@pytest.mark.parametrize("name", list(CASES))
def test_x_of_another_dtype_than_the_layer_is_refused_naming_both(name):
    module = layer_of(name, 0).to(torch.float32)
    for dtype in (torch.float64, torch.bfloat16):
        with pytest.raises(ValueError, match=rf"x.dtype={dtype} differs from the layer's dtype torch.float32"):
            module(torch.randn(B, T, module.hidden_size, dtype=dtype))


def test_under_autocast_x_may_differ_from_the_weights():
    module = MODELS["llama"].from_config(config_of("llama"), 0).requires_grad_(False)  # nn.Linear's small weights
    x = torch.randn(B, T, module.hidden_size)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x.bfloat16())
    torch.testing.assert_close(out.float(), module(x), **tolerance("cpu", torch.bfloat16))


# The fused path: attention/models/flex.py.

# A soft-cap with and without a window (Gemma 2), sinks with a window (gpt-oss), chunks (Llama 4): each compile
# takes seconds.
FLEX_LAYERS = [("gemma2", 0), ("gemma2", 1), ("gpt_oss", 0), ("llama4_text", 0)]


@pytest.mark.parametrize("name,layer_idx", FLEX_LAYERS, ids=[f"{n}-{i}" for n, i in FLEX_LAYERS])
def test_flex_forward_equals_the_reference(name, layer_idx):
    from attention.models.flex import flex_forward

    module = layer_of(name, layer_idx).to(torch.float32)
    x = random_input(module, torch.float32)
    with torch.no_grad():
        fused, own = flex_forward(module, x), module(x)
    expected, _ = reference_model_attention(x, module.state_dict(), **reference_kwargs(name, layer_idx))
    torch.testing.assert_close(fused.double(), expected, **tolerance("cpu", torch.float32))
    torch.testing.assert_close(fused, own, **tolerance("cpu", torch.float32))


def test_flex_forward_refuses_what_compiled_cpu_flex_cannot_do():
    from attention.models.flex import flex_forward

    module = layer_of("gemma2", 0)
    with pytest.raises(ValueError, match="float64"):
        flex_forward(module, random_input(module))
    module = module.to(torch.float32)
    with pytest.raises(ValueError, match="gradients"):
        flex_forward(module, random_input(module, torch.float32))


def test_sinks_scale_the_sinkless_output_by_a_sigmoid_of_the_log_sum_exp():
    """The identity behind a sink on any kernel that returns the log-sum-exp: out_sink = out * sigmoid(lse - sink)."""
    from attention.reference import reference_kernel

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    sinks = torch.randn(4, generator=generator, dtype=torch.float64) * 3
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    with_sinks, _ = reference_kernel(q, k, v, mask, sinks=sinks)
    without, _ = reference_kernel(q, k, v, mask)
    lse = torch.logsumexp((q @ k.transpose(-1, -2) / 8**0.5).masked_fill(~mask, float("-inf")), dim=-1, keepdim=True)
    torch.testing.assert_close(with_sinks, without * torch.sigmoid(lse - sinks.view(1, 4, 1, 1)), rtol=0, atol=1e-14)


# The published configurations (attention/models/published.py), read as transformers reads them.

HF_CLASSES = {"llama": ("llama", "Llama"), "mistral": ("mistral", "Mistral"), "qwen2": ("qwen2", "Qwen2"),
              "qwen3": ("qwen3", "Qwen3"), "olmo2": ("olmo2", "Olmo2"), "gemma2": ("gemma2", "Gemma2"),
              "gemma3_text": ("gemma3", "Gemma3"), "gpt_oss": ("gpt_oss", "GptOss"),
              "llama4_text": ("llama4", "Llama4Text"), "gemma4_text": ("gemma4", "Gemma4Text"),
              "deepseek_v4": ("deepseek_v4", "DeepseekV4")}


@pytest.mark.parametrize("model", sorted(published.PUBLISHED | published.PUBLISHED_ECONOMIES))
def test_a_published_config_builds_every_layer_as_transformers_reads_it(model):
    """Every layer, from the published config.json's fields: the same kind, window, scale, RoPE frequencies and
    parameter shapes as transformers' own layer and rotary embedding built from them (on the meta device)."""
    import importlib

    fields = (published.PUBLISHED | published.PUBLISHED_ECONOMIES)[model]["config"]
    transformers = hf()
    hf_config = transformers.AutoConfig.for_model(**fields)
    package, prefix = HF_CLASSES[fields["model_type"]]
    modeling = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(hf_config)
    for layer_idx in range(fields["num_hidden_layers"]):
        with torch.device("meta"):
            ours = MODELS[fields["model_type"]].from_config(fields, layer_idx)
            from_hf = MODELS[fields["model_type"]].from_config(hf_config, layer_idx)
            theirs = getattr(modeling, f"{prefix}Attention")(hf_config, layer_idx)
        hf_types, hf_window = getattr(hf_config, "layer_types", None), getattr(hf_config, "sliding_window", None)
        # transformers' Mistral has no layer_types: its window, where set, is on every layer.
        expected_type = hf_types[layer_idx] if hf_types else "sliding_attention" if hf_window else "full_attention"
        assert ours.layer_type == from_hf.layer_type == expected_type, layer_idx
        # DeepSeek-V4: a window on every layer, its compressed entries beside it
        expected_window = hf_window if expected_type == "sliding_attention" or fields["model_type"] == "deepseek_v4" \
            else None
        assert ours.sliding_window == from_hf.sliding_window == expected_window, layer_idx
        expected_chunk = hf_config.attention_chunk_size if expected_type == "chunked_attention" else None
        assert getattr(ours, "attention_chunk_size", None) == getattr(from_hf, "attention_chunk_size", None) == expected_chunk
        assert ours.scaling == from_hf.scaling == theirs.scaling
        expected_sharing = hf_config.kv_sharing_modes[layer_idx] if hasattr(hf_config, "kv_sharing_modes") else None
        assert getattr(ours, "kv_sharing", None) == getattr(from_hf, "kv_sharing", None) == expected_sharing  # Gemma 4
        assert {n: t.shape for n, t in ours.state_dict().items()} == {n: t.shape for n, t in theirs.state_dict().items()}
        if ours.inv_freq is None:  # Llama 4's NoPE layers
            assert from_hf.inv_freq is None and not theirs.use_rope
            continue
        prefix_type = f"{ours.layer_type}_" if hasattr(rotary, f"{ours.layer_type}_inv_freq") else ""  # Gemma 3
        if fields["model_type"] == "deepseek_v4":  # its RoPE kinds: "main" (sliding layers), "compress" (CSA, HCA)
            prefix_type = "main_" if ours.layer_type == "sliding_attention" else "compress_"
        inv_freq = getattr(rotary, f"{prefix_type}inv_freq")
        torch.testing.assert_close(ours.inv_freq, from_hf.inv_freq, rtol=1e-12, atol=0)
        torch.testing.assert_close(ours.inv_freq.float(), inv_freq, rtol=2e-6, atol=0)  # transformers: float32
        assert ours.attention_scaling == pytest.approx(getattr(rotary, f"{prefix_type}attention_scaling"), rel=1e-6)


def test_a_cache_of_another_shape_or_window_is_refused():
    module = layer_of("gemma2", 0)  # window 4, 2 K/V heads of 8
    with torch.no_grad():
        x = random_input(module)[:, :1]
        for cache in (KVCache(B, 1, module.head_dim, 16, dtype=torch.float64),
                      SlidingWindowKVCache(B, module.num_key_value_heads, module.head_dim, 8, dtype=torch.float64)):
            cache.layer = ("Gemma2Attention", 0)  # as if made by this layer: the shape or the window still tells
            with pytest.raises(ValueError, match="K/V heads|window of 8"):
                module(x, cache=cache)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("name,layer_idx", [("gemma2", 0), ("gpt_oss", 0), ("llama4_text", 0), ("qwen3", 1)],
                         ids=["gemma2-0", "gpt_oss-0", "llama4_text-0", "qwen3-1"])
def test_on_cuda_the_layer_its_cache_and_flex_equal_the_reference(name, layer_idx):
    from attention.models.flex import flex_forward

    module = layer_of(name, layer_idx).to("cuda", torch.float32)
    x = random_input(module, torch.float32).cuda()
    expected, _ = reference_model_attention(x.cpu(), {k: v.cpu() for k, v in module.state_dict().items()},
                                            **reference_kwargs(name, layer_idx))
    with torch.no_grad():
        cache = module.new_cache(B, capacity=16)
        steps = torch.cat([module(x[:, :5], cache=cache)] + [module(x[:, t:t + 1], cache=cache) for t in range(5, T)], 1)
        for out in (module(x), steps, flex_forward(module, x)):
            torch.testing.assert_close(out.double().cpu(), expected, **tolerance("cuda", torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kv_cache_bytes_equals_the_caches_each_layer_allocates(dtype):
    """`kv_cache_bytes` of every published model (the latent and the hybrids too) equals the bytes of the caches its layers allocate
    (on the meta device) for 3 sequences, at contexts below, at and past each window and at 1M positions."""
    from attention.models.published import kv_cache_bytes, layer_cache_bytes, published_entries, published_layers

    for name in published_entries():
        layers = [layer.to(dtype) for layer in published_layers(name)]
        for context in (1, 128, 129, 4096, 8193, 2**20):
            allocated = 0
            for layer in layers:
                with torch.device("meta"):
                    cache = layer.new_cache(3, context)
                reuses = getattr(layer, "kv_sharing", None) == "reuse"  # Gemma 4's last layers: an earlier one's K/V
                assert (cache is None) == reuses, (name, layer.layer_idx)
                nbytes = 0 if reuses else cache.nbytes
                assert nbytes == 3 * layer_cache_bytes(layer, context, dtype), (name, layer.layer_idx, context)
                allocated += nbytes
            if context in (129, 2**20):  # the whole model's count (each call builds the layers again)
                assert kv_cache_bytes(name, context, batch_size=3, dtype=dtype) == allocated, (name, context)


def test_kv_cache_bytes_of_a_hybrid_counts_its_states_once_whatever_the_context():
    """A hybrid's linear layers hold the same bytes at every context (counted by hand here for Qwen3-Next: 36 gated
    DeltaNet states of 32 heads of 128 x 128 in float32 and 4 - 1 inputs of 8,192 channels, 12 softmax layers of 2 K/V
    heads of 256)."""
    from attention.models.published import kv_cache_bytes

    states = 36 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2)
    for context in (1, 4096, 2**20):
        assert kv_cache_bytes("Qwen3-Next 80B-A3B", context) == states + 12 * 2 * 2 * 256 * 2 * context


def test_kv_cache_bytes_of_latent_models_by_hand():
    """MLA keeps 512 latent and 64 rotary values per position and layer whatever its 128 heads (DeepSeek-V3: 61 layers);
    DeepSeek-V3.2's indexer adds its key of 128."""
    from attention.models.published import kv_cache_bytes, published_entries

    assert {"DeepSeek-V2-Lite", "DeepSeek-V3", "Kimi K2", "DeepSeek-V3.2"} <= set(published_entries())
    assert kv_cache_bytes("DeepSeek-V3", 4096) == 61 * (512 + 64) * 2 * 4096
    assert kv_cache_bytes("DeepSeek-V3.2", 4096, batch_size=2) == 2 * 61 * (512 + 64 + 128) * 2 * 4096
    assert kv_cache_bytes("DeepSeek-V2-Lite", 100, dtype=torch.float32) == 27 * (512 + 64) * 4 * 100


def test_kv_cache_bytes_of_gemma_4_by_hand():
    """Gemma 4 31B: 50 local layers of 16 K/V heads of 256 (a window of 1,024) and 10 global ones of 4 heads of 512,
    K = V but both kept; E2B: only its first 15 layers keep a cache (12 local of one head of 256, window 512, and 3
    global of one head of 512), the other 20 reuse theirs."""
    from attention.models.published import kv_cache_bytes

    for context in (1000, 4096, 2**20):
        assert kv_cache_bytes("Gemma 4 31B", context) == (50 * 2 * 16 * 256 * 2 * min(context, 1024)
                                                          + 10 * 2 * 4 * 512 * 2 * context)
        assert kv_cache_bytes("Gemma 4 E2B", context) == (12 * 2 * 1 * 256 * 2 * min(context, 512)
                                                          + 3 * 2 * 1 * 512 * 2 * context)


def test_kv_cache_bytes_names_bad_arguments():
    from attention.models.published import kv_cache_bytes

    with pytest.raises(ValueError, match=r"name must be one of the published models, got name='Llama 9'; the models: "
                                         r"Llama 3.1 8B, .*Qwen3-Next 80B-A3B, Kimi Linear 48B-A3B, MiniMax-M1"):
        kv_cache_bytes("Llama 9", 4096)
    with pytest.raises(ValueError, match="context_length must be at least 1, got context_length=0"):
        kv_cache_bytes("Llama 3.1 8B", 0)
    with pytest.raises(ValueError, match="batch_size must be at least 1, got batch_size=-2"):
        kv_cache_bytes("Llama 3.1 8B", 4096, batch_size=-2)
    for argument, value in (("context_length", 4096.0), ("context_length", True), ("batch_size", "8")):
        with pytest.raises(TypeError, match=f"{argument} must be an int, got {argument}={value!r}"):
            kv_cache_bytes("Llama 3.1 8B", **{"context_length": 4096, argument: value})
    assert kv_cache_bytes("Qwen3-Next 80B-A3B", 4096, dtype=torch.float8_e4m3fn) == (  # an FP8 cache, float32 states
        36 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3) + 12 * 2 * 2 * 256 * 4096)
    for dtype in (torch.int8, "bfloat16"):
        with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
            kv_cache_bytes("Llama 3.1 8B", 4096, dtype=dtype)
