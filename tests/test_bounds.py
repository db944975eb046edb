"""The bounds sweep of the benchmark (`attention/bench/sweeps/bounds.py`): PyTorch's kernels alone, beside the
yardsticks the other profiles measure against, and the sentences the Benchmarks page writes from them.

A tiny run must give every kernel's rows checked correct against float64, with the work counted from the sizes; a
kernel that returns a wrong answer must be marked so; the validator must refuse a wrong count, a wrong bound, an
unknown field or a hostile string, naming the field; a cache past the memory budget is skipped, the others run.
"""

import copy

import pytest
import torch

from attention import report
from attention.bench import core, profiles, results
from attention.bench.sweeps import bounds

TINY = dict(batch=2, num_heads=2, seq_len=32, head_dim=8, decode_batch=1, decode_heads=4, decode_head_dim=16,
            contexts=(256, 64), min_run_time=0.01, min_repeats=2, warmup_time=0.0, matmul_size=64,
            bandwidth_bytes=2**16)


def run_bounds(dtype="float32", **config):
    return core.run(profiles.plan("bounds", TINY | config), "cpu", dtype, progress=False)


@pytest.fixture(scope="module")
def result():
    return run_bounds()


def test_every_kernel_gives_correct_valid_rows_with_its_work(result):
    rows = result["bounds"]["rows"]
    assert [(r["kernel"], r["keys"]) for r in rows] == [("sdpa_causal", 32), ("sdpa_decode", 64), ("sdpa_decode", 256),
                                                       ("scores_matmul", 64), ("scores_matmul", 256)]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), [r["reason"] for r in rows]
    assert results.validate(result) == []
    work = {(r["kernel"], r["keys"]): r["work"] for r in rows}
    assert work["sdpa_causal", 32] == 2 * 2 * 2 * 32 * 32 * 8  # 4 B H T T D / 2: the causal half
    assert work["sdpa_decode", 256] == 1 * 4 * 256 * 16 * 4 * 2  # keys and values, 4 bytes each
    assert work["scores_matmul", 64] == 1 * 4 * 64 * 16 * 4  # the keys alone
    assert {r["bound"] for r in rows if r["kernel"] == "sdpa_causal"} == {"matmul"}
    for row in rows:
        unit = 1e12 if row["bound"] == "matmul" else 1e9
        assert row["rate"] == pytest.approx(row["work"] / (row["ms_median"] * 1e-3) / unit)
        assert row["share_of_paired_yardstick"] == pytest.approx(row["rate"] / row["yardstick_rate_paired"])


def test_bfloat16_rows_count_two_bytes_an_element():
    rows = run_bounds("bfloat16", kernels=("scores_matmul",), contexts=(64,))["bounds"]["rows"]
    assert [(r["element_bytes"], r["work"], r["correct"]) for r in rows] == [(2, 4 * 64 * 16 * 2, True)]


def test_a_kernel_that_answers_wrong_is_marked_so(monkeypatch):
    monkeypatch.setattr(bounds.F, "scaled_dot_product_attention", lambda q, k, v, is_causal=False: torch.zeros_like(q))
    rows = run_bounds(kernels=("sdpa_causal", "sdpa_decode"), contexts=(64,))["bounds"]["rows"]
    assert [(r["correct"], r["reason"]) for r in rows] == [(False, "output differs from the float64 reference")] * 2


@pytest.mark.parametrize("field", ["work", "rate", "share_of_paired_yardstick", "element_bytes"])
def test_the_validator_recomputes_each_derived_number(result, field):
    tampered = copy.deepcopy(result)
    tampered["bounds"]["rows"][2][field] *= 3
    problems = results.validate(tampered)
    assert any("bounds.rows[2]" in problem and field in problem for problem in problems), problems


def test_the_validator_refuses_a_bound_that_is_not_the_kernels(result):
    tampered = copy.deepcopy(result)
    tampered["bounds"]["rows"][0]["bound"] = "read"
    assert "bounds.rows[0] (sdpa_causal, keys=32): bound 'read' is not its kernel's ('matmul')" in results.validate(
        tampered)


@pytest.mark.parametrize("where,place,field,value", [
    ("bounds.rows[0].'extra': unknown field", lambda r: r["bounds"]["rows"][0], "extra", 1),
    ("bounds.'note': unknown field", lambda r: r["bounds"], "note", "x"),
    ("bounds.rows[0].reason:", lambda r: r["bounds"]["rows"][0], "reason", "<script>alert(1)</script>"),
    ("bounds.rows[0].kernel:", lambda r: r["bounds"]["rows"][0], "kernel", '<img src=x onerror="alert(1)">'),
    ("bounds.kernels[0]:", lambda r: r["bounds"], "kernels", ["[click](javascript:alert(1))"]),
])
def test_the_validator_refuses_unknown_fields_and_hostile_strings(result, where, place, field, value):
    tampered = copy.deepcopy(result)
    place(tampered)[field] = value
    problems = results.validate(tampered)
    assert any(problem.startswith(where) for problem in problems), problems


def test_a_cache_past_the_memory_budget_is_skipped_and_the_others_run():
    rows = run_bounds(kernels=("sdpa_decode",), contexts=(64, 8192), memory_budget_bytes=2**22)["bounds"]["rows"]
    assert [(r["keys"], r["status"]) for r in rows] == [(64, "ok"), (8192, "skipped")]
    assert "exceeds the memory budget 4.0 MiB" in rows[1]["reason"] and rows[1]["work"] == 4 * 8192 * 16 * 4 * 2


def test_bad_configs_name_the_value():
    with pytest.raises(ValueError, match=r"kernels\[0\]: .*flash"):
        run_bounds(kernels=("flash",))
    with pytest.raises(ValueError, match="contexts: must not be empty"):
        run_bounds(contexts=())
    with pytest.raises(ValueError, match="seq_len"):
        run_bounds(seq_len=0)


def with_shares(result, shares, dtype="float32", flags=("avx2", "fma")):
    """`result` with each row's share set from `shares` ({(kernel, keys): share}), its dtype and CPU flags."""
    changed = copy.deepcopy(result)
    changed["dtype"], changed["provenance"]["device"]["cpu_flags"] = dtype, list(flags)
    for row in changed["bounds"]["rows"]:
        row["share_of_paired_yardstick"] = shares.get((row["kernel"], row["keys"]), 0.5)
    return changed


def test_the_sentences_name_the_fastest_read_and_what_is_pytorchs(result):
    changed = with_shares(result, {("sdpa_causal", 32): 0.58, ("sdpa_decode", 256): 0.41, ("scores_matmul", 256): 0.77})
    prompt, *reads = report.bounds.sentences(changed)
    assert "58% of the float32 matmul (64²) timed beside it" in prompt and "What separates this share from 100% is PyTorch's kernel" in prompt
    assert "So 90% of the paired matmul in float32 is not a goal" in prompt
    assert len(reads) == 2 and "Over a cache of 64 positions" in reads[0]
    assert "fastest single PyTorch operation here is `scores_matmul`" in reads[1] and "77% of the plain read" in reads[1]
    assert "`sdpa_decode` reads at" in reads[1] and "(41%)" in reads[1]
    met = with_shares(result, {("sdpa_causal", 32): 0.95})
    assert "not a goal" not in report.bounds.sentences(met)[0]


@pytest.mark.parametrize("flags, words", [
    (("avx2", "amx_tile", "amx_bf16", "avx512_bf16"), "On this CPU (AMX), bfloat16 matrices multiply on AMX tiles."),
    (("avx2", "avx512f", "avx512_bf16"), "(AVX-512 BF16), bfloat16 matrices multiply with AVX-512 BF16 dot products"),
    (("avx2", "fma"), "On this CPU (AVX2), no instruction multiplies bfloat16 numbers"),
])
def test_a_bfloat16_run_says_how_its_cpu_multiplies_bfloat16(result, flags, words):
    prompt = report.bounds.sentences(with_shares(result, {("sdpa_causal", 32): 0.3}, "bfloat16", flags))[0]
    assert words in prompt and "60% of the paired matmul in bfloat16 is not a goal" in prompt


def test_the_table_and_page_show_every_row_and_why_one_has_no_number(result):
    changed = copy.deepcopy(result)
    changed["bounds"]["rows"][1].update(status="skipped", reason="too big")
    text = report.bounds.tables(changed)
    assert text.count("\n| `") == 5 and "| skipped |" in text and "TFLOP/s" in text and "GB/s" in text
    page = report.bounds.page(results.escaped(changed), {}, "docs/results/bounds/x.json")
    assert "`sdpa_causal`: `F.scaled_dot_product_attention(q, k, v, is_causal=True)` over a whole prompt" in page
    assert "`docs/results/bounds/x.json`" in page and report.bounds.charts(changed) == {}


def test_the_profile_runs_the_sweep_alone():
    plan = profiles.plan("bounds", {"seq_lens": None})
    assert [sweep.NAME for sweep, _ in plan.sweeps] == ["bounds"] and plan.profile == "bounds"
