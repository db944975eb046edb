"""The prefill sweep of the benchmark (`attention/bench/sweeps/prefill.py`): MLA's two paths on whole prompts.

A tiny run (8 heads of 16, prompts of 16 and 70 tokens, batch 2) must give both paths' rows checked correct against
the float64 reference, with FLOPs from `latent_attention_flops`; the validator must refuse a wrong count, an unknown
field or a hostile string, naming the field; a prompt past the memory budget is skipped, the shorter ones run.
"""

import copy

import pytest
import torch

from attention import report
from attention.bench import SWEEPS, core, profiles, results
from attention.bench.sweeps import prefill
from attention.models.deepseek_v3 import DeepseekV3Attention, latent_attention_flops, latent_config
from attention.reference import randomised_parameters, reference_latent_attention

TINY = dict(num_heads=8, head_dim=16, tokens=(70, 16), batch=2, min_run_time=0.01, min_repeats=2, warmup_time=0.0,
            matmul_size=64)


def run_prefill(**config):
    return core.run(profiles.plan("prefill", TINY | config), "cpu", progress=False)


@pytest.fixture(scope="module")
def result():
    return run_prefill()


def test_both_paths_give_correct_valid_rows_with_their_flops(result):
    rows = result["prefill"]["rows"]
    assert [(r["tokens"], r["path"]) for r in rows] == [(16, "absorbed"), (16, "naive"), (70, "absorbed"), (70, "naive")]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), [r["reason"] for r in rows]
    assert results.validate(result) == []
    for row in rows:
        assert row["flops"] == 2 * latent_attention_flops(latent_config(8, 16), row["tokens"], row["tokens"], row["path"])
    # The absorbed path's scores run over the latent (4.5 head sizes) where the naive path's run over 1.5 and 1:
    # a whole prompt costs it more matmul work, at any length.
    for absorbed, naive in zip(rows[::2], rows[1::2]):
        assert absorbed["flops"] > naive["flops"]
    assert result["prefill"]["tokens"] == [16, 70]  # sorted


def test_what_the_rows_are_checked_against_is_the_papers_equations():
    """The sweep's reference is `reference_latent_attention` on the weights both paths hold: here it agrees with
    either path run in float64, so a row's `correct` is the path's, not the reference's."""
    x = torch.randn(1, 20, 128, dtype=torch.float64)
    c = latent_config(8, 16)
    for path in ("absorbed", "naive"):
        module = randomised_parameters(DeepseekV3Attention.from_config(c, path=path), 0).to(torch.float64)
        expected, _ = reference_latent_attention(x, module.state_dict(), 8, c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                                 c["v_head_dim"], c["rope_theta"], c["rope_scaling"])
        with torch.no_grad():
            torch.testing.assert_close(module(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("field", ["flops", "tflops", "share_of_paired_matmul"])
def test_the_validator_recomputes_each_derived_number(result, field):
    tampered = copy.deepcopy(result)
    tampered["prefill"]["rows"][1][field] *= 1.5
    problems = results.validate(tampered)
    assert any("prefill.rows[1]" in problem and field in problem for problem in problems), problems


@pytest.mark.parametrize("where,place,field,value", [
    ("prefill.rows[0].'extra': unknown field", lambda r: r["prefill"]["rows"][0], "extra", 1),
    ("prefill.'note': unknown field", lambda r: r["prefill"], "note", "x"),
    ("prefill.rows[0].reason:", lambda r: r["prefill"]["rows"][0], "reason", "<script>alert(1)</script>"),
    ("prefill.rows[0].path:", lambda r: r["prefill"]["rows"][0], "path", '<img src=x onerror="alert(1)">'),
    ("prefill.paths[0]:", lambda r: r["prefill"], "paths", ["[click](javascript:alert(1))"]),
])
def test_the_validator_refuses_unknown_fields_and_hostile_strings(result, where, place, field, value):
    tampered = copy.deepcopy(result)
    place(tampered)[field] = value
    problems = results.validate(tampered)
    assert any(problem.startswith(where) for problem in problems), problems


def test_a_prompt_past_the_memory_budget_is_skipped_and_the_shorter_ones_run():
    rows = run_prefill(tokens=(16, 512), memory_budget_bytes=2**20)["prefill"]["rows"]
    assert {(r["tokens"], r["status"]) for r in rows} == {(16, "ok"), (512, "skipped")}
    assert all("exceeds the memory budget 1.0 MiB" in r["reason"] for r in rows if r["status"] == "skipped")
    assert all(r["flops"] > 0 for r in rows)  # counted from the sizes, measured or not


def test_bad_configs_name_the_value():
    with pytest.raises(ValueError, match="head_dim must be divisible by 4"):
        run_prefill(head_dim=18)
    with pytest.raises(ValueError, match="tokens: must not be empty"):
        run_prefill(tokens=())
    with pytest.raises(ValueError, match=r"paths\[0\]: .*fused"):
        run_prefill(paths=("fused",))


def test_tables_summary_and_chart_read_the_rows(result):
    text = report.prefill.tables(result)
    assert "| 16 |" in text and "| 70 |" in text and "TFLOP/s" in text
    naive_faster, both = report.prefill.naive_faster_from(result)
    assert both == [16, 70]
    pairs = report.prefill.by_length(result)
    faster = [t for t in both if pairs[t]["naive"]["ms_q3"] < pairs[t]["absorbed"]["ms_q1"]]
    assert naive_faster is None or naive_faster in faster
    assert (naive_faster is None) == (70 not in faster)


def ranges(absorbed, naive):  # a pair of rows with only the quartiles faster_path reads
    return {"absorbed": {"ms_q1": absorbed[0], "ms_q3": absorbed[1]}, "naive": {"ms_q1": naive[0], "ms_q3": naive[1]}}


def test_a_path_is_faster_only_where_the_interquartile_ranges_part():
    assert report.prefill.faster_path(ranges((10, 11), (8, 9.9))) == "naive"
    assert report.prefill.faster_path(ranges((8, 9.9), (10, 11))) == "absorbed"
    assert report.prefill.faster_path(ranges((10, 11), (9, 10.5))) == "tie"  # overlapping: the median's order is noise
    assert report.prefill.faster_path(ranges((10, 11), (11, 12))) == "tie"  # touching


def test_the_summary_names_ties_and_where_the_naive_path_wins(result):
    tied = copy.deepcopy(result)
    rows = {(r["tokens"], r["path"]): r for r in tied["prefill"]["rows"]}
    for (tokens, path), quartiles in {(16, "absorbed"): (5.0, 6.0), (16, "naive"): (5.5, 6.5),
                                      (70, "absorbed"): (20.0, 21.0), (70, "naive"): (10.0, 11.0)}.items():
        rows[tokens, path].update(ms_q1=quartiles[0], ms_median=sum(quartiles) / 2, ms_q3=quartiles[1])
    assert report.prefill.naive_faster_from(tied) == (70, [16, 70])
    assert report.prefill.summary(tied) == ("The naive path is faster from 70 tokens on; the absorbed path takes 0.92x to "
                                     "1.95x the naive path's time over 16 to 70 tokens (a tie at 16 tokens: the two "
                                     "times' interquartile ranges overlap).")
    rows[16, "naive"].update(ms_q1=4.0, ms_median=4.5, ms_q3=4.9)  # naive faster at 16 tokens, now tied at 70:
    rows[70, "naive"].update(ms_q1=20.5, ms_median=21.0, ms_q3=21.5)  # "faster from 16 on" would be false at 70
    assert report.prefill.naive_faster_from(tied) == (None, [16, 70])
    assert report.prefill.summary(tied).startswith("The naive path is not faster at the longest prompt measured;")
    figure, alt = report.prefill.charts(result)["prefill"]
    assert [len(line.get_xdata()) for line in figure.axes[0].get_lines()] == [2, 2] and "MLA prefill" in alt
    page = report.prefill.page(results.escaped(result), {"prefill": "![chart](prefill.png)"})
    assert "![chart](prefill.png)" in page and "absorbed" in page


def test_the_profile_runs_the_sweep_alone_with_the_command_lines_lengths():
    plan = profiles.plan("prefill", {"seq_lens": (64, 32), "sweep_batch": 3})
    assert [sweep.NAME for sweep, _ in plan.sweeps] == ["prefill"]
    config = plan.sweeps[0][1].resolve("cpu")
    assert config.tokens == (32, 64) and config.batch == 3
