"""The decode sweep's rows of the model families' layers and of MLA (`attention/bench/sweeps/decode.py`).

A tiny run (8 query heads of 16, contexts of 64 and 1,100: past Gemma 3's window of 1,024 and gpt-oss's of
128) must give every new model's rows checked correct against the float64 reference over the cached past,
with the positions, bytes and FLOPs their definitions give; the validator must refuse a row that claims
otherwise.
"""

import copy
import math

import pytest
import torch
from bench_tables import TINY_DECODE, quick_yardsticks

from attention.bench import core, profiles, results
from attention import report
from attention.bench.sweeps import decode, decode_layers
from attention.models import MODELS
from attention.models.deepseek_v3 import latent_attention_flops, latent_config
from attention.models.published import PUBLISHED
from attention.reference import model_reference_kwargs, reference_model_attention

NEW = ("Llama-3", "Gemma-3-local", "Gemma-2-local", "Gemma-2-global", "gpt-oss-local", "gpt-oss-global",
       "Llama-4-chunked", "Llama-4-NoPE", "MLA")
# The published models' windows (Llama 4: its chunk, which its cache keeps whole).
WINDOWS = {"Gemma-3-local": 1024, "Gemma-2-local": 4096, "gpt-oss-local": 128, "Llama-4-chunked": 8192}


def run_decode(**config):
    with quick_yardsticks():
        return core.run(profiles.plan("decode", TINY_DECODE | dict(contexts=(64, 1100), batches=(2,)) | config), "cpu",
                        progress=False)


@pytest.fixture(scope="module")
def result():
    return run_decode(models=NEW)


def test_every_model_decodes_a_bfloat16_cache_correctly():
    """Every model of the sweep, its keys and values a slice of a cache of twice the capacity, in bfloat16 (the
    grouped matmuls one head at a time on the CPU): every row checked correct against the float64 reference of the
    same bfloat16 weights and cache, and valid."""
    with quick_yardsticks():
        found = core.run(profiles.plan("decode", TINY_DECODE | dict(contexts=(64, 128), batches=(2,))), "cpu",
                         "bfloat16", progress=False)
    rows = found["decode"]["rows"]
    assert {row["model"] for row in rows} == set(decode.LAYERS)
    assert [row for row in rows if row["status"] != "ok" or row["correct"] is not True] == []
    assert results.validate(found) == []


def step_peak_bytes(module, shapes, batch, context, hidden):
    """The profiler's peak of new memory in one step of one new token per sequence over `context` random cached
    positions (`shapes`: what the layer's cache takes per position, `Layer.entries`), in the module's dtype."""
    from attention.bench.metrics import profile_call

    dtype = next(module.parameters()).dtype
    cache = module.new_cache(batch, context + 1)
    for start in range(0, context, 1024):
        cache.update(*(torch.randn(batch, heads, min(1024, context - start), *dims).to(dtype) for heads, *dims in shapes))
    x = torch.randn(batch, 1, hidden).to(dtype)

    def step():
        cache.rewind(context)
        with torch.no_grad():
            return module(x, cache=cache)
    step()
    return profile_call(step, torch.device("cpu"))["cpu_tensor_peak_bytes"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_memory_budget_counts_what_a_naive_mla_step_allocates(dtype):
    """A row past the memory budget is skipped, not run: past the RAM the operating system kills the whole run. So
    what the budget counts for a naive MLA step must cover what the step allocates (the profiler's peak); in
    bfloat16 it counted half of it, and the decode profile was killed at its last row."""
    module, hidden = decode_layers.MLA.build(decode.Config(**TINY_DECODE), "naive")
    module = module.to(dtype).eval().requires_grad_(False)
    batch, context = 2, 2048
    peak = step_peak_bytes(module, decode_layers.MLA.entries(module), batch, context, hidden)
    counted = decode_layers.MLA.step_bytes(module, batch, context + 1)
    assert peak is not None and peak <= counted, f"the step allocated {peak:,} bytes, the budget counts {counted:,}"


def test_every_new_model_gives_correct_valid_rows(result):
    rows = result["decode"]["rows"]
    assert [(r["model"], r["kernel"]) for r in rows[::2]] == [
        ("Llama-3", "sdpa"), ("Llama-3", "matmul"), ("Llama-3", "auto"), ("Gemma-3-local", "sdpa"),
        ("Gemma-3-local", "matmul"), ("Gemma-3-local", "auto"), ("Gemma-2-local", "matmul"), ("Gemma-2-global", "matmul"),
        ("gpt-oss-local", "matmul"), ("gpt-oss-global", "matmul"), ("Llama-4-chunked", "sdpa"),
        ("Llama-4-chunked", "matmul"), ("Llama-4-chunked", "auto"), ("Llama-4-NoPE", "sdpa"), ("Llama-4-NoPE", "matmul"),
        ("Llama-4-NoPE", "auto"), ("MLA", "absorbed"), ("MLA", "naive")]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), [r["reason"] for r in rows]
    assert report.validate_result(result) == []
    assert all(r["sdpa_backends"] != ["n/a"] for r in rows if r["kernel"] in ("sdpa", "naive"))  # naive runs SDPA
    assert all(r["sdpa_backends"] == ["n/a"] for r in rows if r["kernel"] in ("matmul", "absorbed"))


def test_positions_bytes_and_flops_follow_from_the_layers(result):
    for row in result["decode"]["rows"]:
        window = WINDOWS.get(row["model"])
        assert row["positions_read"] == min(row["context"] + 1, window or row["context"] + 1)
        module, _ = decode.LAYERS[row["model"]].build(decode.Config(**TINY_DECODE), row["kernel"])
        assert row["weight_bytes"] == sum(p.numel() for p in module.parameters()) * 4
        if row["model"] == "MLA":  # the latent (4 head sizes) and the rotary key (half a head size) per position
            assert (row["num_kv_heads"], row["cache_bytes_per_token"]) == (1, (4 * 16 + 8) * 4)
            expected = 2 * latent_attention_flops(latent_config(8, 16), 1, row["positions_read"], row["kernel"])
        else:
            assert row["cache_bytes_per_token"] == 2 * module.num_key_value_heads * 16 * 4
            expected = 2 * 2 * row["weight_bytes"] // 4 + 4 * 2 * 8 * row["positions_read"] * 16
        assert row["flops"] == expected
        assert row["cache_bytes_read"] == 2 * row["positions_read"] * row["cache_bytes_per_token"]
    windowed = {r["model"]: r["positions_read"] for r in result["decode"]["rows"] if r["context"] == 1100}
    assert windowed == {"Llama-3": 1101, "Gemma-3-local": 1024, "Gemma-2-local": 1101, "Gemma-2-global": 1101,
                        "gpt-oss-local": 128, "gpt-oss-global": 1101, "Llama-4-chunked": 1101, "Llama-4-NoPE": 1101,
                        "MLA": 1101}


def test_past_gemma_2s_window_and_llama_4s_chunk_the_steps_stay_correct():
    """At 8,300 cached positions a Gemma 2 local step reads its last 4,096 and a Llama 4 chunked step its ring of
    8,192, of which it attends to the 109 of its own chunk (8,192 .. 8,300), through SDPA and through the grouped
    matmuls: each checked against the float64 reference over the whole past."""
    rows = run_decode(models=("Gemma-2-local", "Llama-4-chunked"), contexts=(8300,), batches=(1,),
                      kernels=("sdpa", "matmul"))["decode"]["rows"]
    assert [(r["model"], r["kernel"], r["positions_read"]) for r in rows] == [
        ("Gemma-2-local", "matmul", 4096), ("Llama-4-chunked", "sdpa", 8192), ("Llama-4-chunked", "matmul", 8192)]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), [r["reason"] for r in rows]


@pytest.mark.parametrize("model", ["gpt-oss-local", "MLA"])
@pytest.mark.parametrize("field", ["positions_read", "flops"])
def test_the_validator_refuses_a_wrong_count(result, model, field):
    tampered = copy.deepcopy(result)
    index, row = next((i, r) for i, r in enumerate(tampered["decode"]["rows"]) if r["model"] == model and r["context"] == 1100)
    if field == "positions_read":  # the unwindowed count (MLA: one position short), every number derived from it redone
        row["positions_read"] = 1101 if model == "gpt-oss-local" else 1100
        row["cache_bytes_read"] = row["batch"] * row["positions_read"] * row["cache_bytes_per_token"]
        row["bytes_read"] = row["cache_bytes_read"] + row["weight_bytes"]
        row["gbps"] = row["bytes_read"] / row["ms_median"] * 1e3 / 1e9
        row["share_of_paired_bandwidth"] = row["gbps"] / row["bandwidth_gbps_paired"]
    else:  # the default definition's FLOPs, not the model's
        row["flops"] = decode_layers.step_flops(row, 4) + (0 if model == "MLA" else 1)
    assert any(f"decode.rows[{index}]" in problem and field in problem for problem in report.validate_result(tampered))


def test_a_model_whose_window_disagrees_with_its_cache_is_refused(monkeypatch):
    gemma = decode.LAYERS["Gemma-3-local"]
    monkeypatch.setitem(decode.LAYERS, "Gemma-3-local", gemma._replace(positions_read=lambda context: context + 1))
    with pytest.raises(ValueError, match="Gemma-3-local: the cache holds .* not batch x positions_read"):
        run_decode(models=("Gemma-3-local",))


def test_the_reference_over_a_cached_past_is_the_full_reference_at_the_last_position():
    """What the sweep checks against: `reference_model_attention` given the past keys and values as a cache holds
    them equals its own full pass at the new position, a window past its length included."""
    sweep = decode.Config(**TINY_DECODE)
    module, hidden = decode.LAYERS["Gemma-3-local"].build(sweep, "sdpa")
    module = module.to(torch.float64)
    x = torch.randn(1, 1030, hidden, dtype=torch.float64)  # past the window of 1,024
    with torch.no_grad():
        _, past_keys, past_values = module.qkv(x[:, :-1], 0)  # (1, H_kv, 1029, D): normed and rotated, as cached
    state = module.state_dict()  # Gemma 3 27B's layer 0 at the sweep's sizes: 8 query heads of 16, 2 per K/V head
    config = PUBLISHED["Gemma 3 27B"]["config"] | dict(num_attention_heads=8, num_key_value_heads=4, head_dim=16,
                                                       hidden_size=128)
    full, _ = reference_model_attention(x, state, **model_reference_kwargs(config, 0, torch.arange(1030), type(module)))
    step, weights = reference_model_attention(x[:, -1:], state, past_keys=past_keys, past_values=past_values,
                                              **model_reference_kwargs(config, 0, torch.arange(1029, 1030), type(module)))
    torch.testing.assert_close(step, full[:, -1:], rtol=1e-10, atol=1e-10)
    assert weights.shape[-1] == 1030 and (weights[..., :1030 - 1024] == 0).all() and (weights[..., -1024:] > 0).all()


def test_a_step_past_the_memory_budget_is_skipped_and_the_shorter_ones_run():
    """The naive MLA step expands every cached latent: its copies count in the budget, context by context."""
    rows = run_decode(models=("MLA",), memory_budget_bytes=5 * 2**20)["decode"]["rows"]
    status = {(r["kernel"], r["context"]): r["status"] for r in rows}
    assert status == {("absorbed", 64): "ok", ("absorbed", 1100): "ok", ("naive", 64): "ok", ("naive", 1100): "skipped"}
    skipped = next(r for r in rows if r["status"] == "skipped")
    assert "step's own tensors" in skipped["reason"] and "exceeds the memory budget 5.0 MiB" in skipped["reason"]


def test_the_sweep_builds_each_layer_as_from_config_does_and_sets_nothing_on_it():
    """The layer a row steps is what `from_config` gives (its kernel chosen there, `decode_kernel`): the sweep pokes no
    attribute onto it (it once wrote `num_heads`, `num_kv_heads`, `head_dim` and `decode_kernel` onto built layers);
    the row's head sizes are read under each family's own names."""
    sweep = decode.Config(**TINY_DECODE)
    for name in ("Llama-3", "Gemma-2-local", "gpt-oss-global", "Llama-4-NoPE", "MLA"):
        for kernel in decode.LAYERS[name].kernels:
            module, _ = decode.LAYERS[name].build(sweep, kernel)
            if name == "MLA":
                attributes = set(vars(type(module).from_config(latent_config(8, 16), path=kernel)))
            else:
                config = decode.LAYERS[name].check(sweep)  # the model's config at the sweep's sizes
                options = {"decode_kernel": kernel} if hasattr(module, "decode_kernel") else {}
                attributes = set(vars(MODELS[config["model_type"]].from_config(config, module.layer_idx, **options)))
            assert set(vars(module)) == attributes, name
            assert getattr(module, "decode_kernel", getattr(module, "path", kernel)) == kernel
            kv_heads = 1 if name == "MLA" else module.num_key_value_heads
            assert decode.head_sizes(module) == dict(num_heads=8, num_kv_heads=kv_heads, head_dim=16)


NO_COPY_LAYERS = [(name, kernel) for name, layer in decode.LAYERS.items() for kernel in layer.kernels if kernel != "naive"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("model, kernel", NO_COPY_LAYERS, ids=[f"{name}-{kernel}" for name, kernel in NO_COPY_LAYERS])
def test_a_decode_step_allocates_less_than_half_the_cache_it_reads(model, kernel, dtype):
    """A step of one new token per sequence over 4,096 cached positions, for every layer of the sweep (GQA, MQA, each
    model family's layer, MLA's absorbed path), allocates less than half the bytes of the cache it reads: it reads the
    cache where it lies, never a copy of it (a matmul that broadcasts K/V heads over their query heads, or takes a
    batch over the cache's slice as a copy, would allocate the cache again). MLA's naive path expands the latent to
    per-head keys and values by design (`decode_layers.MLA.step_bytes` counts it).

    The batch is large enough for the step to read at least 1 MiB of cache: a step also allocates what does not grow
    with its cache, e.g. the scratch of oneDNN's bfloat16 matmuls on a CPU with AVX-512 BF16 (about 130 KiB per
    projection, whatever its size), which exceeded half of a 128-position window's cache at batch 2."""
    layer, context = decode.LAYERS[model], 4096
    module, hidden = layer.build(decode.Config(**TINY_DECODE | dict(head_dim=64, contexts=(context,))), kernel)
    module = module.to(dtype).eval().requires_grad_(False)
    shapes = layer.entries(module)
    per_sequence = layer.positions_read(context) * sum(math.prod(shape) for shape in shapes) * dtype.itemsize
    batch = max(2, -(-2**20 // per_sequence))
    peak = step_peak_bytes(module, shapes, batch, context, hidden)
    read = batch * per_sequence
    assert peak is not None and peak < read / 2, f"a step allocated {peak:,} bytes, it reads {read:,} bytes of cache"


def test_each_row_says_whether_its_step_copied_its_cache(result):
    """`copies_cache`: the step's peak memory reached the bytes of the cache it reads. MLA's naive path, which expands
    the latent to every head's keys and values, does at 1,100 positions; its absorbed path, which reads the latent as
    it lies, does not. The validator recomputes the mark, takes a run recorded before it (no field), and the tables
    show it."""
    rows = result["decode"]["rows"]
    assert all(row["copies_cache"] == (row["peak_memory_bytes"] >= row["cache_bytes_read"]) for row in rows)
    marks = {row["kernel"]: row["copies_cache"] for row in rows if row["model"] == "MLA" and row["context"] == 1100}
    assert marks == {"absorbed": False, "naive": True}
    tampered = copy.deepcopy(result)
    index, row = next((i, r) for i, r in enumerate(tampered["decode"]["rows"]) if r["kernel"] == "naive")
    row["copies_cache"] = False
    assert any(f"decode.rows[{index}]" in problem and "copies_cache" in problem
               for problem in report.validate_result(tampered))
    older = copy.deepcopy(result)
    for row in older["decode"]["rows"]:
        del row["copies_cache"]
    assert report.validate_result(older) == []
    naive = next(row for row in rows if row["kernel"] == "naive" and row["context"] == 1100)
    absorbed = next(row for row in rows if row["kernel"] == "absorbed" and row["context"] == 1100)
    assert report.decode.cell(result, naive).endswith(" · copy")
    assert not report.decode.cell(result, absorbed).endswith(" · copy")
