"""The linear sweep of the benchmark (`attention/bench/sweeps/linear.py`): the gated delta rule's forms against SDPA.

A tiny run (2 heads of 16, prompts of 24 and 70 tokens, chunks of 8 and 16, caches of 40 and 90 positions) must give
every row checked correct against the float64 reference, with FLOPs and bytes from the row's sizes; the recurrent and
quadratic forms past their lengths are skipped with the reason; the validator refuses a wrong number, a kernel in the
wrong part or a chunk size on another kernel, naming the field; the report says where each kernel wins from the rows.
"""

import copy

import pytest
import torch

from attention import report
from attention.bench import core, profiles, results
from attention.bench.sweeps import linear
from attention.linear import gated_delta_rule
from attention.reference import reference_delta_rule

TINY = dict(num_heads=2, head_dim=16, seq_lens=(70, 24), chunk_size=16, recurrent_max_len=64, quadratic_max_len=64,
            chunk_len=40, chunk_sizes=(16, 8), contexts=(90, 40), check_len=30, min_run_time=0.01, min_repeats=2,
            warmup_time=0.0, matmul_size=64)


def run_linear(**config):
    return core.run(profiles.plan("linear", TINY | config), "cpu", progress=False)


@pytest.fixture(scope="module")
def result():
    return run_linear()


def test_every_part_gives_checked_valid_rows_with_their_flops(result):
    rows = result["linear"]["rows"]
    assert [(r["part"], r["kernel"], r["seq_len"], r["chunk_size"]) for r in rows] == [
        ("prefill", "recurrent", 24, None), ("prefill", "chunked", 24, 16), ("prefill", "quadratic", 24, None),
        ("prefill", "sdpa", 24, None), ("prefill", "recurrent", 70, None), ("prefill", "chunked", 70, 16),
        ("prefill", "quadratic", 70, None), ("prefill", "sdpa", 70, None),
        ("chunk", "chunked", 40, 8), ("chunk", "chunked", 40, 16),
        ("decode", "state_step", 40, None), ("decode", "kv_cache_step", 40, None),
        ("decode", "state_step", 90, None), ("decode", "kv_cache_step", 90, None)]
    skipped = {(r["kernel"], r["seq_len"]): r["reason"] for r in rows if r["status"] == "skipped"}
    assert set(skipped) == {("recurrent", 70), ("quadratic", 70)}
    assert skipped["recurrent", 70].startswith("past recurrent_max_len 64")
    assert all(r["correct"] is True for r in rows if r["status"] == "ok"), [r["reason"] for r in rows]
    assert results.validate(result) == []
    by = {(r["part"], r["kernel"], r["seq_len"], r["chunk_size"]): r for r in rows}
    assert by["prefill", "sdpa", 24, None]["flops"] == 2 * 2 * 24 * 24 * 16
    assert by["prefill", "recurrent", 24, None]["flops"] == 7 * 2 * 24 * 16 * 16
    # chunks of 16 over 24 positions: one of 16 and one of 8
    assert by["prefill", "chunked", 24, 16]["flops"] == 2 * sum(7 * c * c * 16 + 6 * c * 16 * 16 for c in (16, 8))
    assert by["prefill", "quadratic", 24, None]["flops"] == 2 * (7 * 24 * 24 * 16 + 6 * 24 * 16 * 16)
    assert by["decode", "state_step", 90, None]["memory_bytes"] == 2 * 16 * 16 * 4  # the same at every context
    assert by["decode", "kv_cache_step", 90, None]["memory_bytes"] == 2 * 2 * 90 * 16 * 4


def test_the_reference_is_the_rules_definition():
    """`reference_delta_rule`, written apart from `attention.linear`, agrees with every form of the gated delta rule
    in float64 (gates per head) and with no gate and no beta (DeltaNet); the sweep checks its rows against it."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.nn.functional.normalize(torch.randn(2, 3, 13, 8, generator=generator, dtype=torch.float64), dim=-1)
               for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(2, 3, 13, generator=generator, dtype=torch.float64) + 2)
    beta = torch.rand(2, 3, 13, generator=generator, dtype=torch.float64)
    expected, state = reference_delta_rule(q, k, v, g, beta)
    for form in ("recurrent", "chunked", "quadratic"):
        out, final = gated_delta_rule(q, k, v, g, beta, form=form, chunk_size=5)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(final, state, rtol=0, atol=1e-12)
    plain, _ = reference_delta_rule(q, k, v)
    ones, _ = gated_delta_rule(q, k, v, torch.zeros_like(g), torch.ones_like(beta), form="recurrent")
    torch.testing.assert_close(plain, ones, rtol=0, atol=1e-12)


@pytest.mark.parametrize("field", ["flops", "tflops", "share_of_paired_matmul", "tokens_per_s", "memory_bytes"])
def test_the_validator_recomputes_each_derived_number(result, field):
    tampered = copy.deepcopy(result)
    index = next(i for i, row in enumerate(tampered["linear"]["rows"])
                 if row["status"] == "ok" and row[field] is not None)
    tampered["linear"]["rows"][index][field] *= 1.5
    problems = results.validate(tampered)
    assert any(f"linear.rows[{index}]" in problem and field in problem for problem in problems), problems


@pytest.mark.parametrize("change,message", [
    ({"kernel": "state_step"}, "kernel 'state_step' does not belong to part 'prefill'"),
    ({"chunk_size": 8}, "chunk_size 8: set on the chunked form's rows only"),
    ({"memory_bytes": 100}, "memory_bytes 100: set on decode rows only"),
    ({"kernel": "<script>"}, "linear.rows[3].kernel:"),
])
def test_the_validator_refuses_rows_that_do_not_fit_their_part(result, change, message):
    tampered = copy.deepcopy(result)
    tampered["linear"]["rows"][3].update(change)  # prefill, sdpa, 24
    assert any(message in problem for problem in results.validate(tampered)), results.validate(tampered)


def test_a_bad_config_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="chunk_sizes: must not be empty"):
        linear.Config(chunk_sizes=()).resolve("cpu")
    with pytest.raises(ValueError, match="parts"):
        linear.Config(parts=("prefill", "training")).resolve("cpu")


def test_the_sentences_say_where_each_kernel_wins_from_the_rows(result):
    """The crossovers are read from the rows: rewritten times move them."""
    timed = copy.deepcopy(result)
    rows = {(r["part"], r["kernel"], r["seq_len"], r["chunk_size"]): r for r in timed["linear"]["rows"]}
    for key, ms in [(("prefill", "chunked", 24, 16), 2.0), (("prefill", "sdpa", 24, None), 1.0),
                    (("prefill", "chunked", 70, 16), 3.0), (("prefill", "sdpa", 70, None), 6.0),
                    (("decode", "state_step", 40, None), 1.0), (("decode", "kv_cache_step", 40, None), 2.0),
                    (("decode", "state_step", 90, None), 1.0), (("decode", "kv_cache_step", 90, None), 4.0)]:
        rows[key]["ms_median"] = ms
    summary = report.linear.summary(timed)
    assert ("The chunked form is faster than SDPA's causal attention from 70 tokens on (of 24 to 70 tokens); "
            "at 70 it takes 3.00 ms against 6.00 ms (2.00x).") in summary
    assert ("The state step is faster than the KV cache step at every length measured (of 40 to 90 cached "
            "positions); at 90 it takes 1.00 ms against 4.00 ms (4.00x).") in summary
    rows["prefill", "chunked", 70, 16]["ms_median"] = 7.0
    assert "faster than SDPA's causal attention at no length measured" in report.linear.summary(timed)
    assert report.linear.summary({"linear": {"rows": []}}) == ""
    page = report.linear.page(result, {})
    assert "Every crossover, every prompt length, each chunk size, a decode step" in page
    assert "| kernel | chunk 8 | chunk 16 |" in page and page.startswith("The chunked form is faster than SDPA")
    assert set(report.linear.charts(result)) == {"prefill"}


def test_the_pages_section_has_a_compact_table_and_the_decode_table(result):
    section = report.linear.linear_section("docs/results/linear/x.json", result)
    assert "| T (prompt) | recurrent ms | chunked ms | quadratic ms | sdpa ms |" in section
    assert "| 70 | skipped |" in section and "| cached positions | state step | KV cache step |" in section
    assert "???" not in section  # a notebook's markdown output has no collapsed blocks
    limits = result["linear"]
    equal = copy.deepcopy(result)
    equal["linear"]["quadratic_max_len"] = limits["recurrent_max_len"]
    assert (f"the recurrent and quadratic forms timed to {limits['recurrent_max_len']:,} tokens."
            in report.linear.linear_section("x.json", equal))
    unequal = copy.deepcopy(result)
    unequal["linear"]["quadratic_max_len"] = limits["recurrent_max_len"] + 1
    assert (f"forms timed to {limits['recurrent_max_len']:,} and {limits['recurrent_max_len'] + 1:,} tokens."
            in report.linear.linear_section("x.json", unequal))
