"""The decode kernel and the decode profile of the benchmark (`attention/bench/decode.py`).

The profile runs here at toy sizes (8 heads of 16, contexts of 64 and 128): every row must be
checked correct against its float64 reference and pass the validator, which recomputes the derived
numbers; tampering with one must be caught.
"""

import copy
import math

import pytest
import torch
from helpers import tolerance
from matplotlib.figure import Figure

from attention.bench import render
from attention.bench.__main__ import main
from attention.bench.decode import DECODE_ROW_FIELDS, DecodeConfig, cache_bytes_per_token, kv_heads_of, run_decode
from attention.causal.gqa import GroupedQueryAttention, grouped_decode_attention


def dense_reference(q, k, v, mask):
    """float64 attention with K/V heads repeated per group; rows with no key give zeros."""
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.double() for t in (q, k, v))
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, S, D)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("queries", [1, 5])
def test_grouped_decode_attention_matches_the_reference(num_heads, num_kv_heads, queries):
    B, S, D = 2, 37, 16
    q = torch.randn(B, num_heads, queries, D)
    k, v = torch.randn(B, num_kv_heads, S, D), torch.randn(B, num_kv_heads, S, D)
    query_pos = torch.arange(S - queries, S)
    mask = query_pos[:, None] >= torch.arange(S)[None, :]  # (T, S) lower-right causal
    for m in (None, mask):
        out = grouped_decode_attention(q, k, v, m)
        assert out.shape == (B, num_heads, queries, D)
        torch.testing.assert_close(out.double(), dense_reference(q, k, v, m), **tolerance("cpu", torch.float32))


def test_grouped_decode_attention_gives_zeros_for_a_query_with_no_key():
    q, k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    out = grouped_decode_attention(q, k, v, mask)
    assert torch.isfinite(out).all()
    assert (out[:, :, 1] == 0).all()
    torch.testing.assert_close(out.double(), dense_reference(q, k, v, mask), **tolerance("cpu", torch.float32))


@pytest.mark.parametrize("decode_kernel", ["sdpa", "matmul", "auto"])
def test_every_decode_kernel_continues_the_full_forward(decode_kernel):
    module = GroupedQueryAttention(32, 32, 64, 0.0, 8, num_kv_heads=2, decode_kernel=decode_kernel).eval()
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        full = module(x)
        cache = module.new_cache(2, 20)
        steps = [module(x[:, :6], cache=cache)] + [module(x[:, t:t + 1], cache=cache) for t in range(6, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerance("cpu", torch.float32))


def test_decode_kernel_is_checked():
    with pytest.raises(ValueError, match="decode_kernel must be one of .* got decode_kernel='flash'"):
        GroupedQueryAttention(32, 32, 64, 0.0, 8, decode_kernel="flash")


def test_the_auto_kernel_runs_the_grouped_matmuls_on_cpu(monkeypatch):
    import attention.causal.gqa as gqa

    calls = []
    original = gqa.grouped_decode_attention
    monkeypatch.setattr(gqa, "grouped_decode_attention", lambda *args: calls.append(1) or original(*args))
    module = GroupedQueryAttention(32, 32, 64, 0.0, 8, num_kv_heads=2).eval()
    with torch.no_grad():
        cache = module.new_cache(1, 8)
        module(torch.randn(1, 3, 32), cache=cache)
        assert calls == [1]
        module(torch.randn(1, 3, 32))  # no cache: SDPA
        assert calls == [1]
        module(torch.randn(1, gqa.AUTO_MATMUL_MAX_TOKENS + 1, 32), cache=module.new_cache(1, 64))  # a prefill: SDPA
        assert calls == [1]
        module(torch.randn(1, gqa.AUTO_MATMUL_MAX_TOKENS, 32), cache=module.new_cache(1, 64))
        assert calls == [1, 1]


TOY = dict(device="cpu", num_heads=8, head_dim=16, contexts=(64, 128), batches=(1, 2), min_run_time=0.02,
           min_repeats=2, warmup_time=0.0, bandwidth_bytes=2**22)


@pytest.fixture(scope="module")
def decode_result():
    return run_decode(DecodeConfig(**TOY), progress=False)


def test_decode_profile_rows_are_complete_correct_and_valid(decode_result):
    rows = decode_result["decode"]["rows"]
    assert len(rows) == 3 * 2 * 2 * 2  # models x batches x kernels x contexts
    assert {row["model"]: row["num_kv_heads"] for row in rows} == {"MHA": 8, "GQA": 1, "MQA": 1}
    assert all(set(row) == set(DECODE_ROW_FIELDS) for row in rows)
    assert all(row["status"] == "ok" and row["correct"] is True for row in rows), [r["reason"] for r in rows]
    assert decode_result["complete"] is True
    assert render.validate_result(decode_result) == []
    sdpa = [row for row in rows if row["kernel"] == "sdpa"]
    assert all(row["sdpa_backends"] not in (None, ["n/a"]) for row in sdpa)  # SDPA ran, and the profiler saw it
    assert all(row["sdpa_backends"] == ["n/a"] for row in rows if row["kernel"] == "matmul")


def test_decode_bytes_follow_from_the_shapes(decode_result):
    for row in decode_result["decode"]["rows"]:
        assert row["cache_bytes_per_token"] == 2 * row["num_kv_heads"] * row["head_dim"] * 4  # keys and values, fp32
        d_model = row["num_heads"] * row["head_dim"]
        kv = row["num_kv_heads"] * row["head_dim"]
        parameters = d_model * d_model * 2 + d_model + 2 * kv * d_model  # query, out (+ bias), key, value
        assert row["weight_bytes"] == parameters * 4
        assert row["cache_bytes_read"] == row["batch"] * (row["context"] + 1) * row["cache_bytes_per_token"]
        core = 4 * row["batch"] * row["num_heads"] * (row["context"] + 1) * row["head_dim"]
        assert row["flops"] == 2 * row["batch"] * parameters + core
    assert cache_bytes_per_token(8, 128, torch.bfloat16) == 2 * 8 * 128 * 2


@pytest.mark.parametrize("field", ["tokens_per_s", "gbps", "share_of_paired_bandwidth", "bytes_read", "tflops",
                                   "share_of_matmul"])
def test_the_validator_recomputes_each_derived_number(decode_result, field):
    tampered = copy.deepcopy(decode_result)
    tampered["decode"]["rows"][3][field] *= 1.5
    problems = render.validate_result(tampered)
    assert any(field in problem for problem in problems), problems


def test_the_validator_refuses_a_decode_run_that_did_not_finish(decode_result):
    unfinished = copy.deepcopy(decode_result)
    unfinished["complete"] = False
    assert any("complete" in problem for problem in render.validate_result(unfinished))


def test_decode_tables_and_figures_show_every_measurement(decode_result):
    table = render.decode_table(decode_result, 2)
    assert table.count("tok/s") == 3 * 2 * 2
    summary = render.decode_summary_table(decode_result)
    assert summary.count("tok/s") == 2 * 3 * 2 and "KiB" in summary
    for metric in ("tokens_per_s", "share_of_paired_bandwidth"):
        fig = render.plot_decode(decode_result, metric)
        assert isinstance(fig, Figure)
        assert sum(len(ax.lines) for ax in fig.axes) == 2 * 3 * 2  # batches x models x kernels
    assert "Read bandwidth" in render.provenance_summary(decode_result)


def test_a_cache_past_the_memory_budget_is_skipped_with_the_reason():
    result = run_decode(DecodeConfig(**TOY | dict(memory_budget_bytes=10_000, models=("MQA",), batches=(2,))),
                        progress=False)
    rows = result["decode"]["rows"]
    assert rows and all(row["status"] == "skipped" and "memory budget" in row["reason"] for row in rows)


def test_decode_config_names_bad_values():
    with pytest.raises(ValueError, match="models must be a non-empty subset"):
        DecodeConfig(device="cpu", models=("GQA", "MLA")).resolve()
    with pytest.raises(ValueError, match="kernels must be"):
        DecodeConfig(device="cpu", kernels=("flash",)).resolve()
    with pytest.raises(ValueError, match="contexts must be positive ints"):
        DecodeConfig(device="cpu", contexts=(0,)).resolve()
    with pytest.raises(ValueError, match="num_heads must be divisible by 8 for GQA"):
        DecodeConfig(device="cpu", num_heads=12).resolve()
    assert [kv_heads_of(model, 32) for model in ("MHA", "GQA", "MQA")] == [32, 4, 1]


def test_the_command_line_runs_the_decode_profile(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert main(["--profile", "decode", "--device", "cpu", "--heads", "8", "--seq-lens", "64", "--batch", "1",
                 "--min-run-time", "0.02", "--repeats", "2", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tok/s" in printed and "Read bandwidth" in printed
    checked = render.check_file(out)
    assert checked["problems"] == []
    assert main(["--validate", str(out)]) == 0
