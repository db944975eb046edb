"""DeepSeek sparse attention (attention/models/deepseek_v32.py): equal to transformers' DeepSeek-V3.2 layer, the gather
form equal to the mask form in float64, both equal to the float64 reference (the indexer's choice query by query, then
MLA over the chosen positions), decoding with the indexer's key cache equal to the full forward at every step; the
indexer's rotary layout and its per-head weights shown to matter."""

import math

import pytest
import torch

from attention.decoding import LatentCache
from attention.models import MODELS, ModelAttention
from attention.models import deepseek_v32
from attention.models.deepseek_v3 import apply_rotary_interleaved
from attention.models.deepseek_v32 import (DeepseekV32Attention, IndexedLatentCache, index_scores,
                                           top_k_positions)
from attention.reference import reference_indexer_selection, reference_latent_attention
from helpers import captured_attention

F64 = dict(atol=1e-12, rtol=1e-12)
# transformers computes its norms, rotary angles, softmax and the indexer's scores in float32 even in a float64 model
# (tests/test_mla.py shows the same gap for MLA alone, and lifts it to 1e-15).
TRANSFORMERS = dict(atol=2e-6, rtol=2e-6)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707}  # attention factor != 1
SIZES = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
             qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, num_hidden_layers=2, max_position_embeddings=64)
# top-k below the sequence (sparse), the indexer's head wider than its rotary part or not, YaRN or plain RoPE
CONFIGS = {
    "plain": dict(index_topk=5, index_n_heads=8, index_head_dim=16),
    "yarn-narrow-index": dict(index_topk=4, index_n_heads=8, index_head_dim=8, rope_parameters=YARN),
}


def plain_config(name):
    """`CONFIGS[name]` as a mapping with transformers' field names (no transformers needed)."""
    fields = CONFIGS[name]
    return {"model_type": "deepseek_v32", **SIZES, **fields,
            "rope_parameters": fields.get("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0})}


def randomized(module, seed):
    """`module` with every parameter drawn afresh from `seed` (norm weights near 1), float64."""
    generator = torch.Generator().manual_seed(seed)
    module = module.to(torch.float64)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
            if "norm" in name and name.endswith("weight"):
                param.copy_(1 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(noise / math.sqrt(param.shape[-1]))
    return module


def build(name, seed=0, **options):
    return randomized(DeepseekV32Attention.from_config(plain_config(name), 0, **options), seed).eval()


def inputs(T, seed, B=2):
    return torch.randn(B, T, SIZES["hidden_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


FORMS = [dict(sparse="gather"), dict(sparse="mask"), dict(sparse="mask", path="naive")]


# ---- transformers' layer ----

def tiny_transformers_model(name, seed):
    """A tiny random DeepSeek-V3.2 causal LM in float64, eager attention, every parameter randomised."""
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model("deepseek_v32", **SIZES, **CONFIGS[name], first_k_dense_replace=2,
                                               intermediate_size=32, vocab_size=50)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    return config, randomized(model, seed)


@pytest.mark.parametrize("form", FORMS, ids=lambda form: "-".join(form.values()))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_transformers_layer(name, form):
    config, model = tiny_transformers_model(name, seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2))
    for layer_idx, (hidden, expected) in captured_attention(model, input_ids).items():
        module = DeepseekV32Attention.from_config(config, layer_idx, **form).to(torch.float64).eval()
        module.load_state_dict(model.model.layers[layer_idx].self_attn.state_dict())  # transformers' names, unchanged
        with torch.no_grad():
            torch.testing.assert_close(module(hidden), expected, **TRANSFORMERS)


def test_the_indexer_rotating_in_mlas_layout_would_pick_other_positions(monkeypatch):
    """The trap: the indexer rotates in halves, MLA interleaved. An indexer rotating interleaved (as MLA) picks other
    positions than transformers' for the same weights, so the test above would catch it."""
    config, model = tiny_transformers_model("plain", seed=1)
    input_ids = torch.randint(0, config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(2))
    hidden, expected = captured_attention(model, input_ids)[0]
    module = DeepseekV32Attention.from_config(config, 0).to(torch.float64).eval()
    module.load_state_dict(model.model.layers[0].self_attn.state_dict())

    def interleaved(x, cos, sin):  # cos, sin (T, Dr) in halves; each pair's angle is in the first half
        half = cos.shape[-1] // 2
        return apply_rotary_interleaved(x, cos[..., :half], sin[..., :half])

    monkeypatch.setattr(deepseek_v32, "apply_rotary", interleaved)
    with torch.no_grad():
        assert (module(hidden) - expected).abs().max() > 1e-3


# ---- the two forms and the float64 reference ----

@pytest.mark.parametrize("top_k", [1, 3, 7, 64])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gather_form_equals_mask_form_in_float64(name, top_k, monkeypatch):
    """Every top-k, below and past the length (64: dense), queries in blocks of one or all at once."""
    x = inputs(10, seed=3)
    config = plain_config(name) | {"index_topk": top_k}
    mask_form = randomized(DeepseekV32Attention.from_config(config, 0, sparse="mask"), seed=4)
    gather_form = randomized(DeepseekV32Attention.from_config(config, 0, sparse="gather"), seed=4)
    naive = randomized(DeepseekV32Attention.from_config(config, 0, sparse="mask", path="naive"), seed=4)
    with torch.no_grad():
        expected = mask_form(x)
        torch.testing.assert_close(gather_form(x), expected, **F64)
        torch.testing.assert_close(naive(x), expected, **F64)
        monkeypatch.setattr(deepseek_v32, "BLOCK_ELEMENTS", 1)  # one query per block
        torch.testing.assert_close(gather_form(x), expected, **F64)


def reference(name, module, x, state):
    config = plain_config(name)
    rope = config["rope_parameters"]
    selected = reference_indexer_selection(x, state, config["index_n_heads"], config["index_head_dim"],
                                           config["index_topk"], config["qk_rope_head_dim"], rope["rope_theta"], rope)
    out = reference_latent_attention(x, state, config["num_attention_heads"], config["qk_nope_head_dim"],
                                     config["qk_rope_head_dim"], config["v_head_dim"], rope["rope_theta"], rope,
                                     True, selected=selected)[0]
    return out, selected


@pytest.mark.parametrize("form", FORMS, ids=lambda form: "-".join(form.values()))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_reference_forward_and_gradients(name, form):
    """The reference picks positions query by query (ties to the earlier position) and attends over them with MLA's
    equations; gradients flow through MLA only (the choice is not differentiated, as in DeepSeek's code)."""
    module = build(name, seed=5, **form).train()
    x = inputs(12, seed=6)
    x_module, x_reference = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    state = {key: value.detach().clone().requires_grad_(True) for key, value in module.state_dict().items()}
    out = module(x_module)
    expected, selected = reference(name, module, x_reference, state)
    assert selected.sum(-1).tolist() == [[min(t + 1, CONFIGS[name]["index_topk"]) for t in range(12)]] * 2
    torch.testing.assert_close(out, expected, **F64)
    grad_out = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    (out * grad_out).sum().backward()
    (expected * grad_out).sum().backward()
    torch.testing.assert_close(x_module.grad, x_reference.grad, **F64)
    grads = dict(module.named_parameters())
    for key, value in state.items():
        if key.startswith("indexer."):
            assert grads[key].grad is None
        else:
            torch.testing.assert_close(grads[key].grad, value.grad, **F64)


def test_the_chosen_positions_are_the_references():
    module = build("plain", seed=8)
    x = inputs(16, seed=9)
    _, expected = reference("plain", module, x, module.state_dict())
    with torch.no_grad():
        cos, sin = deepseek_v32.rotary_cos_sin(module, 0, 16, x)
        q, k, w = module.indexer.queries_keys_weights(x, module.q_a_layernorm(module.q_a_proj(x)), cos, sin)
        causal = torch.ones(16, 16, dtype=torch.bool).tril()
        indices, valid = top_k_positions(index_scores(q, k, w), module.index_topk, causal)
    chosen = torch.zeros(2, 16, 16, dtype=torch.bool).scatter(-1, indices, valid)
    assert torch.equal(chosen, expected)
    assert not valid[:, 5:].logical_not().any() and valid[:, 0].sum() == 2  # a query at 0 sees 1 position of its 5


# ---- what the per-head weights do to the ranking ----

def test_one_heads_weight_scales_its_scores_and_keeps_their_order():
    generator = torch.Generator().manual_seed(10)
    q = torch.randn(1, 1, 6, 8, generator=generator, dtype=torch.float64)
    k = torch.randn(1, 20, 8, generator=generator, dtype=torch.float64)
    w = torch.rand(1, 6, 1, generator=generator, dtype=torch.float64) + 0.1
    scores, scaled = index_scores(q, k, w), index_scores(q, k, 8 * w)  # 8: exact in binary, the order kept exactly
    torch.testing.assert_close(scaled, 8 * scores, **F64)
    assert torch.equal(scores.argsort(dim=-1, stable=True), scaled.argsort(dim=-1, stable=True))


def test_with_two_heads_the_weights_change_which_position_wins():
    """Head 0 prefers position 0, head 1 position 1: the weights decide (fla's DSA reference says they cannot)."""
    q = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # (B 1, Hi 2, T 1, Di 2)
    k = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])  # (B 1, S 2, Di 2): ReLU scores head 0: (2, 0), head 1: (0, 1)
    first = index_scores(q, k, torch.tensor([[[1.0, 1.0]]])).argmax(-1).item()
    second = index_scores(q, k, torch.tensor([[[1.0, 3.0]]])).argmax(-1).item()
    assert (first, second) == (0, 1)


def test_random_multi_head_weights_change_the_top_k():
    """On random indexer inputs (8 heads, 64 positions), positive weights drawn per query change the top-8 of most
    queries against equal weights."""
    generator = torch.Generator().manual_seed(11)
    q, k = torch.randn(1, 8, 32, 16, generator=generator), torch.randn(1, 64, 16, generator=generator)
    equal = index_scores(q, k, torch.ones(1, 32, 8)).topk(8).indices.sort(-1).values
    weighted = index_scores(q, k, torch.rand(1, 32, 8, generator=generator)).topk(8).indices.sort(-1).values
    changed = (equal != weighted).any(-1).float().mean().item()
    assert changed > 0.5


# ---- decoding ----

@pytest.mark.parametrize("form", FORMS, ids=lambda form: "-".join(form.values()))
def test_decoding_every_step_equals_full_forward(form):
    module = build("yarn-narrow-index", seed=12, **form)
    x = inputs(14, seed=13)
    with torch.no_grad():
        expected = module(x)
        cache = module.new_cache(2, capacity=20)
        assert isinstance(cache, IndexedLatentCache) and cache.index_keys.shape == (2, 20, 8)
        steps = [module(x[:, :5], cache=cache)]  # a prompt of 5, then one chunk of 3, then one token at a time
        steps.append(module(x[:, 5:8], cache=cache))
        steps += [module(x[:, t:t + 1], cache=cache) for t in range(8, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, **F64)
    assert cache.length == 14
    assert cache.nbytes == 2 * 20 * (16 + 8 + 8) * 8  # latent, rotary key, indexer key: float64


def test_rewind_repeats_a_step():
    module = build("plain", seed=14)
    x = inputs(9, seed=15)
    with torch.no_grad():
        cache = module.new_cache(2, capacity=9)
        module(x[:, :8], cache=cache)
        first = module(x[:, 8:], cache=cache)
        cache.rewind(8)
        torch.testing.assert_close(module(x[:, 8:], cache=cache), first, **F64)


def test_cache_errors():
    module = build("plain", seed=16)
    x = inputs(3, seed=17)
    with torch.no_grad():
        with pytest.raises(ValueError, match="no layer's new_cache"):
            module(x, cache=IndexedLatentCache(2, 16, 8, 16, capacity=8, dtype=torch.float64))
        with pytest.raises(ValueError, match="DeepseekV3Attention layer 0"):
            cache = LatentCache(2, 16, 8, capacity=8, dtype=torch.float64)
            cache.layer = ("DeepseekV3Attention", 0)
            module(x, cache=cache)
        cache = module.new_cache(2, capacity=4)
        module(x, cache=cache)
        with pytest.raises(ValueError, match="latent cache is full"):
            module(x[:, :2], cache=cache)
        assert cache.length == 3 and cache.index_keys[:, 3].abs().sum() == 0  # nothing written past the failure
    with pytest.raises(ValueError, match="index_head_dim must be positive, got index_head_dim=0"):
        IndexedLatentCache(1, 16, 8, 0, capacity=4)


def test_bfloat16_gather_equals_mask_form():
    """Both forms rank with the same float32 scores, so in bfloat16 they pick the same positions and agree to
    bfloat16's rounding."""
    x = inputs(12, seed=18).to(torch.bfloat16)
    gather_form, mask_form = (build("plain", seed=19, sparse=sparse).to(torch.bfloat16) for sparse in ("gather", "mask"))
    with torch.no_grad():
        torch.testing.assert_close(gather_form(x), mask_form(x), atol=2e-2, rtol=2e-2)


# ---- the contract and bad input ----

def test_registry_and_contract():
    assert MODELS["deepseek_v32"] is DeepseekV32Attention
    module = build("plain")
    assert isinstance(module, ModelAttention) and module.layer_type == "indexed_attention"
    assert sorted(key for key in module.state_dict() if key.startswith("indexer.")) == [
        "indexer.k_norm.bias", "indexer.k_norm.weight", "indexer.weights_proj.weight", "indexer.wk.weight",
        "indexer.wq_b.weight"]


@pytest.mark.parametrize("fields, error, pattern", [
    ({"q_lora_rank": None}, ValueError, "q_lora_rank must be a positive int .* got q_lora_rank=None"),
    ({"index_topk": 0}, ValueError, "index_topk must be positive, got index_topk=0"),
    ({"index_topk": 65}, ValueError, "index_topk must be at most max_position_embeddings=64 .*, got index_topk=65"),
    ({"index_topk": 4.0}, TypeError, "index_topk must be an int, got index_topk=4.0"),
    ({"index_n_heads": 0}, ValueError, "index_n_heads must be positive, got index_n_heads=0"),
    ({"index_head_dim": True}, TypeError, "index_head_dim must be an int, got index_head_dim=True"),
    ({"index_head_dim": 6}, ValueError, "index_head_dim must be at least qk_rope_head_dim .* index_head_dim=6, "
                                        "qk_rope_head_dim=8"),
    ({"index_topk": None}, ValueError, "config lacks the field 'index_topk'"),
])
def test_a_config_value_out_of_range_is_refused_naming_the_field(fields, error, pattern):
    config = {key: value for key, value in (plain_config("plain") | fields).items() if value is not None or
              key == "q_lora_rank"}
    with pytest.raises(error, match=pattern):
        DeepseekV32Attention.from_config(config, 0)


def test_options_are_checked():
    with pytest.raises(ValueError, match=r"sparse must be one of \('gather', 'mask'\), got sparse='dense'"):
        DeepseekV32Attention.from_config(plain_config("plain"), 0, sparse="dense")
    with pytest.raises(ValueError, match="sparse='gather' .* needs path='absorbed', got path='naive'"):
        DeepseekV32Attention.from_config(plain_config("plain"), 0, path="naive")
    with pytest.raises(ValueError, match="layer_idx must be below num_hidden_layers=2"):
        DeepseekV32Attention.from_config(plain_config("plain"), 2)
