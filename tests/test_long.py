"""The long profile (`--profile long`): the sequence sweep to long lengths with the memory guard, then the
block-sparse sweep: its rows, checks, tables and page, at tiny sizes. No assertion depends on a measured time."""

import copy
import re

import pytest
import torch
from bench_tables import BEFORE, TINY, structure

from attention import report
from attention.bench import core, profiles
from attention.bench.__main__ import build_parser, config_from_args
from attention.bench.sweeps import block_sparse, sequence
from attention.bench.sweeps.sequence import predicted_peak
from attention.masks import bigbird, dense_mask


def long_plan(**options):
    return profiles.plan("long", TINY | dict(seq_lens=(128, 256), patterns=("causal", "document")) | options)


@pytest.fixture(scope="module")
def long_result():
    return core.run(long_plan(), "cpu", progress=False)


def test_long_profile_settings():
    plan = config_from_args(build_parser().parse_args(["--profile", "long", "--device", "cpu", "--heads", "4"]))
    (sequence, config), (sparse, sparse_config) = plan.sweeps
    config = config.resolve(torch.device("cpu"))
    assert config.profile == "long" and config.seq_lens == profiles.LONG_SEQ_LENS == tuple(2**i for i in range(7, 15))
    assert config.implementations == ("split_heads", "tiled", "sdpa_causal") and config.sweep_batch == config.batch == 1
    assert config.shapes() == [(1, t) for t in profiles.LONG_SEQ_LENS] and config.memory_budget_bytes > 0
    assert sparse_config.seq_lens == profiles.LONG_SEQ_LENS and sparse_config.num_heads == config.num_heads == 4


def test_long_run_checks_every_row_and_counts_blocks(long_result):
    assert long_result["complete"] and report.validate_result(long_result) == []
    assert all(r["status"] == "ok" and r["correct"] is True for r in long_result["rows"])
    sparse = report.block_sparse.block_sparse_rows(long_result)
    assert len(sparse) == 2 * 2 * 2  # patterns x lengths x kernels
    assert all(r["status"] == "ok" and r["correct"] is True and r["max_abs_error"] < 1e-4 for r in sparse)
    by = {(r["pattern"], r["kernel"], r["seq_len"]): r for r in sparse}
    # Causal at T=256 has 2 x 2 blocks of 128, of which the one above the diagonal is empty.
    assert by["causal", "flex_block_mask", 256]["block_share"] == 0.75
    assert by["causal", "sdpa_dense_mask", 256]["block_share"] == 1.0
    assert by["causal", "flex_block_mask", 256]["mask_density"] == (256 * 257 / 2) / 256**2
    assert by["causal", "sdpa_dense_mask", 256]["mask_bytes"] == 256 * 256  # one bool per pair
    for row in sparse:
        assert row["flops"] == 4 * 1 * 2 * 16 * round(row["mask_density"] * row["seq_len"] ** 2)
        assert row["tflops"] == pytest.approx(row["flops"] / row["ms_median"] / 1e9)
    # The load average after the run is taken after both sweeps, once.
    assert long_result["provenance"]["load_average_end"] is not None and long_result["block_sparse"]["rows"]


def test_the_long_profile_makes_the_tables_it_made_before(long_result):
    before = BEFORE["long"]
    assert structure(report.sequence.markdown_tables(long_result, include_sweep=True)) == before["markdown_tables_sweep"]
    assert structure(report.sequence.memory_slope_table(long_result, shortest=128)) == before["memory_slope_table"]
    # The block-sparse tables keep their columns and rows; issue 45 put the speed-up second (it was cut off at the right).
    for table, name in ((report.block_sparse.crossover_table(long_result), "crossover_table"),
                        (report.block_sparse.block_sparse_table(long_result), "block_sparse_table")):
        assert [dict(t, header=sorted(t["header"])) for t in structure(table)] == [
            dict(t, header=sorted(t["header"])) for t in before[name]]


def test_block_sparse_rows_are_checked_against_the_reference(monkeypatch):
    """A kernel that ignores the mask must come out incorrect."""
    real = block_sparse.F.scaled_dot_product_attention
    monkeypatch.setattr(block_sparse.F, "scaled_dot_product_attention", lambda q, k, v, attn_mask=None: real(q, k, v))
    config = block_sparse.Config(**{key: TINY[key] for key in ("d_model", "num_heads", "min_run_time", "min_repeats",
                                                                "warmup_time", "matmul_size")}).resolve("cpu")
    envelope = core.Envelope("block_sparse", "cpu")
    envelope.result["dtype"] = "float32"
    rows = list(block_sparse.pattern_rows(config, "causal", 128, envelope, core.matmul_yardstick("cpu", torch.float32, 64)))
    assert {r["kernel"]: r["correct"] for r in rows} == {"flex_block_mask": True, "sdpa_dense_mask": False}
    assert rows[1]["reason"] == "output differs from the float64 reference"


def test_memory_guard_skips_rows_predicted_past_the_budget(monkeypatch):
    assert predicted_peak(None, 1, 256) is None
    assert predicted_peak((2, 128, 1000), 1, 256) == 2000  # half the batch, four times the scores
    monkeypatch.setattr(sequence, "first_peak_bound", lambda *shape: 0)  # the first shape let through: measured
    result = core.run(long_plan(memory_budget_bytes=1, patterns=()), "cpu", progress=False)
    first, second = ([r for r in result["rows"] if r["seq_len"] == t] for t in (128, 256))
    assert all(r["status"] == "ok" for r in first)
    assert all(r["status"] == "skipped" and "exceeds the memory budget" in r["reason"] and r["ms_median"] is None
               and "times the batch ratio and the squared length ratio" in r["reason"] for r in second)
    assert report.validate_result(result) == []


def test_validator_catches_inconsistent_block_sparse_rows(long_result):
    broken = copy.deepcopy(long_result)
    rows = broken["block_sparse"]["rows"]
    rows[0]["tflops"] *= 2
    rows[1]["block_share"] = 0.0
    del rows[2]["mask_bytes"]
    rows[3]["flops"] *= 2
    problems = report.validate_result(broken)
    assert "block_sparse.rows[2].mask_bytes: missing" in problems  # the rules first
    del rows[2]
    problems = report.validate_result(broken)
    assert {p.split(" (")[0] for p in problems} == {"block_sparse.rows[0]", "block_sparse.rows[1]", "block_sparse.rows[2]"}
    assert any(p.startswith("block_sparse.rows[0]") and ": tflops" in p for p in problems)
    assert any(p.startswith("block_sparse.rows[1]") and "mask_density <= block_share" in p for p in problems)
    assert any(p.startswith("block_sparse.rows[2]") and ": flops" in p for p in problems)


def _synthetic(times):
    """A long result whose block-sparse rows have the given `{T: (flex ms, dense ms)}` for one pattern."""
    rows = [dict(pattern="p", kernel=kernel, seq_len=t, status="ok", correct=True, ms_median=ms, reason=None,
                 block_share=0.5 if kernel == "flex_block_mask" else 1.0, mask_density=0.4, peak_memory_bytes=2**20,
                 mask_bytes=t * t) for t, pair in times.items() for kernel, ms in zip(block_sparse.KERNELS, pair)]
    return {"block_sparse": {"patterns": {"p": "a pattern"}, "rows": rows}}


def test_crossover_is_the_shortest_length_from_which_flex_stays_faster():
    found = report.block_sparse.crossovers(_synthetic({256: (2, 1), 512: (1, 2), 1024: (3, 2), 2048: (2, 4), 4096: (2, 6)}))["p"]
    assert found["crossover"] == 2048 and found["longest"] == 4096 and found["speedup"] == 3
    assert report.block_sparse.crossovers(_synthetic({256: (1, 2), 512: (3, 2)}))["p"]["crossover"] is None
    table = report.block_sparse.crossover_table(_synthetic({256: (1, 2), 512: (3, 2)}))
    assert "not within the lengths measured" in table and "0.67x" in table


def test_memory_slopes_fit_the_growth():
    rows = [dict(label=name, mode="forward", batch=1, seq_len=t, status="ok", correct=True,
                 peak_memory_bytes=scale * t**power)
            for name, scale, power in (("quadratic", 48, 2), ("linear", 1000, 1)) for t in (1024, 2048, 4096, 8192)]
    result = {"config": {"seq_lens": [1024, 2048, 4096, 8192], "sweep_batch": 1, "modes": ["forward"]}, "rows": rows}
    slopes = report.sequence.memory_slopes(result, "forward", shortest=2048)
    assert slopes["quadratic"]["lengths"] == [2048, 4096, 8192]
    assert slopes["quadratic"]["slope"] == pytest.approx(2) and slopes["linear"]["slope"] == pytest.approx(1)
    assert "| `quadratic` | forward | 2.00 | 2048..8192 |" in report.sequence.memory_slope_table(result)


def test_long_renderers_fill_tables_and_figure(long_result):
    table = report.block_sparse.block_sparse_table(long_result)
    assert table.count("| 256 |") == 2 and "incorrect" not in table and "—" not in table
    figure = report.block_sparse.plot_block_sparse(long_result)
    visible = [ax for ax in figure.axes if ax.get_visible()]
    assert len(visible) == 2 and all(len(ax.get_lines()) >= 2 for ax in visible)


def test_memory_guides_start_at_the_data(long_result):
    """The O(T) and O(T²) guides start at the measured values of the shortest length, not decades below them."""
    ax = report.sequence.plot_memory_vs_seq_len(long_result, "forward").axes[0]
    guides = [line for line in ax.get_lines() if line.get_label() in ("O(T)", "O(T²)")]
    data = [line.get_ydata()[0] for line in ax.get_lines() if line.get_label().endswith(")") and line not in guides
            and line.get_xdata().size]
    assert len(guides) == 2 and all(min(data) <= guide.get_ydata()[0] <= max(data) for guide in guides)


def test_bigbird_random_blocks_fill_whole_tiles():
    mask = dense_mask(bigbird(0, 0, 2, max_len=512, seed=3, block_size=128), 512, 512)
    tiles = mask.view(4, 128, 4, 128).permute(0, 2, 1, 3).reshape(4, 4, -1)  # (q block, k block, 128*128)
    off_diagonal = ~torch.eye(4, dtype=torch.bool)
    assert (tiles.all(-1) | ~tiles.any(-1))[off_diagonal].all()  # each random tile all in or all out
    random_blocks = bigbird(0, 0, 2, max_len=512, seed=3, block_size=128).random_keys
    assert random_blocks.shape == (4, 4) and (random_blocks.sum(-1) == 2).all()
    with pytest.raises(ValueError, match="at most the 4 blocks of max_len=512"):
        bigbird(0, 0, 5, max_len=512, block_size=128)


def test_document_ids_are_packed_documents():
    ids = block_sparse.document_ids(5000, seed=1)
    lengths = torch.unique_consecutive(ids, return_counts=True)[1]
    assert ids.shape == (5000,) and (ids.diff() >= 0).all()
    assert ((lengths >= 256) & (lengths <= 2048))[:-1].all()  # the last one is cut at seq_len


def test_every_pattern_builds_at_every_length_of_the_profile():
    for name, (description, build) in block_sparse.PATTERNS.items():
        for t in (128, 300):
            assert dense_mask(build(t, "cpu"), t, t).any(-1).all(), (name, t)  # every query attends somewhere


def test_benchmarks_page_shows_long_runs_in_their_own_section(long_result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    from test_bench import ROOT, bench_page_hook

    hook = bench_page_hook(tmp_path, monkeypatch, {"long/cpu-long-test.json": long_result})
    assert hook.state["recorded"] == [] and [p.name for p, _ in hook.state["runs"]["long"]] == ["cpu-long-test.json"]
    section = hook.runs_section("long")
    assert "**`docs/results/long/cpu-long-test.json`**" in section
    assert "| pattern | speed-up | at T | Flex faster from |" in section and "| causal |" in section
    assert "| document |" in section and section.count("![") == 6  # bars, time and memory per mode, block sparsity
    assert re.search(r"\| 256 \| [^|]+ \| [^|]+ \| [^|]+ \| 50% \| 75% \|", section)  # causal at T=256: 50% of the pairs, 3 of 4 blocks
    page = type("Page", (), {"file": type("File", (), {"src_uri": "benchmarks.md"})()})()
    markdown = hook.on_page_markdown((ROOT / "docs" / "benchmarks.md").read_text(), page, None, None)
    assert "<!-- runs: long -->" not in markdown and "**`docs/results/long/cpu-long-test.json`**" in markdown


def test_validator_refuses_a_run_that_did_not_finish(long_result):
    partial = copy.deepcopy(long_result)
    partial["complete"] = False
    assert any("did not finish" in problem for problem in report.validate_result(partial))
