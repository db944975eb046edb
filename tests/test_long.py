"""The long-context profile (`--profile long`): the memory guard, the block-sparse rows, their checks and
their rendering, at tiny sizes. No assertion depends on a measured time."""

import copy
import math

import pytest
import torch

from attention.bench import render
from attention.bench.__main__ import build_parser, config_from_args
from attention.bench.harness import predicted_peak
from attention.bench.long import LONG_IMPLEMENTATIONS, LONG_SEQ_LENS, SPARSE_PATTERNS, document_ids, long_config, run_long
from attention.masks import bigbird, dense_mask

TINY = dict(device="cpu", seq_lens=(128, 256), d_model=32, num_heads=2, min_run_time=0.01, min_repeats=2,
            warmup_time=0.0, matmul_size=64)


@pytest.fixture(scope="module")
def long_result():
    return run_long(long_config(**TINY), progress=False, patterns=("causal", "document"))


def test_long_profile_settings():
    config = config_from_args(build_parser().parse_args(["--profile", "long", "--device", "cpu"])).resolve()
    assert config.profile == "long" and config.seq_lens == LONG_SEQ_LENS == tuple(2**i for i in range(7, 15))
    assert config.implementations == LONG_IMPLEMENTATIONS and config.sweep_batch == config.batch == 1
    assert config.shapes() == [(1, t) for t in LONG_SEQ_LENS]
    assert config.memory_budget_bytes > 0  # 3/4 of MemAvailable on Linux


def test_long_run_checks_every_row_and_counts_blocks(long_result):
    assert long_result["complete"] and render.validate_result(long_result) == []
    assert {r["implementation"] for r in long_result["rows"]} == set(LONG_IMPLEMENTATIONS)
    assert all(r["status"] == "ok" and r["correct"] is True for r in long_result["rows"])
    sparse = render.block_sparse_rows(long_result)
    assert len(sparse) == 2 * 2 * 2  # patterns x lengths x kernels
    assert all(r["status"] == "ok" and r["correct"] is True and r["max_abs_error"] < 1e-4 for r in sparse)
    by = {(r["pattern"], r["kernel"], r["seq_len"]): r for r in sparse}
    # Causal at T=256 has 2 x 2 blocks of 128, of which the one above the diagonal is empty.
    assert by["causal", "flex_block_mask", 256]["block_share"] == 0.75
    assert by["causal", "sdpa_dense_mask", 256]["block_share"] == 1.0
    assert by["causal", "flex_block_mask", 256]["mask_density"] == (256 * 257 / 2) / 256**2
    assert by["causal", "sdpa_dense_mask", 256]["mask_bytes"] == 256 * 256  # one bool per pair
    for row in sparse:
        assert row["flops_useful"] == 4 * 1 * 2 * 16 * round(row["mask_density"] * row["seq_len"] ** 2)
        assert math.isclose(row["tflops_useful"], row["flops_useful"] / row["ms_median"] / 1e9)


def test_block_sparse_rows_are_checked_against_the_reference(monkeypatch):
    """A kernel that ignores the mask must come out incorrect."""
    import attention.bench.long as long

    real = long.F.scaled_dot_product_attention
    monkeypatch.setattr(long.F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None: real(q, k, v))  # the mask dropped
    rows = long.sparse_rows(long_config(**TINY).resolve(), "causal", 128, torch.device("cpu"), torch.float32,
                            (lambda: None, 1))
    assert {r["kernel"]: r["correct"] for r in rows} == {"flex_block_mask": True, "sdpa_dense_mask": False}


def test_memory_guard_skips_rows_predicted_past_the_budget():
    assert predicted_peak(None, 1, 256) is None
    assert predicted_peak((2, 128, 1000), 1, 256) == 2000  # half the batch, four times the scores
    result = run_long(long_config(**TINY, memory_budget_bytes=1), progress=False, patterns=())
    first, second = ([r for r in result["rows"] if r["seq_len"] == t] for t in (128, 256))
    assert all(r["status"] == "ok" for r in first)  # nothing to predict from: measured
    assert all(r["status"] == "skipped" and "exceeds the memory budget" in r["reason"] and r["ms_median"] is None
               for r in second)
    assert render.validate_result(result) == []


def test_validator_catches_inconsistent_block_sparse_rows(long_result):
    broken = copy.deepcopy(long_result)
    row = broken["block_sparse"]["rows"][0]
    row["tflops_useful"] *= 2
    broken["block_sparse"]["rows"][1]["block_share"] = 0.0
    del broken["block_sparse"]["rows"][2]["mask_bytes"]
    problems = render.validate_result(broken)
    assert len(problems) == 3
    assert "tflops_useful" in problems[0] and "block_share" in problems[1] and "mask_bytes" in problems[2]


def _synthetic(times):
    """A long result whose block-sparse rows have the given `{T: (flex ms, dense ms)}` for one pattern."""
    rows = []
    for t, (flex, dense) in times.items():
        for kernel, ms in (("flex_block_mask", flex), ("sdpa_dense_mask", dense)):
            rows.append(dict(pattern="p", kernel=kernel, seq_len=t, status="ok", correct=True, ms_median=ms,
                             block_share=0.5 if kernel == "flex_block_mask" else 1.0, mask_density=0.4,
                             peak_memory_bytes=2**20, mask_bytes=t * t, reason=None))
    return {"block_sparse": {"patterns": {"p": "a pattern"}, "rows": rows}}


def test_crossover_is_the_shortest_length_from_which_flex_stays_faster():
    found = render.crossovers(_synthetic({256: (2, 1), 512: (1, 2), 1024: (3, 2), 2048: (2, 4), 4096: (2, 6)}))["p"]
    assert found["crossover"] == 2048 and found["longest"] == 4096 and found["speedup"] == 3
    assert render.crossovers(_synthetic({256: (1, 2), 512: (3, 2)}))["p"]["crossover"] is None
    table = render.crossover_table(_synthetic({256: (1, 2), 512: (3, 2)}))
    assert "not within the lengths measured" in table and "0.67x" in table


def test_memory_slopes_fit_the_growth():
    rows = [dict(label=name, mode="forward", batch=1, seq_len=t, status="ok", correct=True,
                 peak_memory_bytes=scale * t**power)
            for name, scale, power in (("quadratic", 48, 2), ("linear", 1000, 1)) for t in (1024, 2048, 4096, 8192)]
    result = {"config": {"seq_lens": [1024, 2048, 4096, 8192], "sweep_batch": 1, "modes": ["forward"]}, "rows": rows}
    slopes = render.memory_slopes(result, "forward", shortest=2048)
    assert slopes["quadratic"]["lengths"] == [2048, 4096, 8192]
    assert slopes["quadratic"]["slope"] == pytest.approx(2) and slopes["linear"]["slope"] == pytest.approx(1)
    assert "| `quadratic` | forward | 2.00 | 2048..8192 |" in render.memory_slope_table(result)


def test_long_renderers_fill_tables_and_figure(long_result):
    table = render.block_sparse_table(long_result)
    assert table.count("| 256 |") == 2 and "incorrect" not in table and "—" not in table
    figure = render.plot_block_sparse(long_result)
    assert len([ax for ax in figure.axes if ax.get_visible()]) == 2
    assert all(len(ax.get_lines()) >= 2 for ax in figure.axes if ax.get_visible())


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
    ids = document_ids(5000, seed=1)
    lengths = torch.unique_consecutive(ids, return_counts=True)[1]
    assert ids.shape == (5000,) and (ids.diff() >= 0).all()
    assert ((lengths >= 256) & (lengths <= 2048))[:-1].all()  # the last one is cut at seq_len


def test_every_pattern_builds_at_every_length_of_the_profile():
    for name, (description, build) in SPARSE_PATTERNS.items():
        for t in (128, 300):
            assert dense_mask(build(t, "cpu"), t, t).any(-1).all(), (name, t)  # every query attends somewhere


def test_benchmarks_page_shows_long_runs_in_their_own_section(long_result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    import json
    from pathlib import Path

    from mkdocs.config import load_config

    root = Path(__file__).resolve().parents[1]
    config = load_config(str(root / "mkdocs.yml"))
    hook = config.hooks["docs/_hooks/benchmarks.py"]
    (tmp_path / "docs" / "results" / "long").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "long" / "cpu-long-test.json").write_text(json.dumps(long_result))
    config.config_file_path = str(tmp_path / "mkdocs.yml")
    monkeypatch.delenv(hook.ENV_VAR, raising=False)
    monkeypatch.setitem(hook.state, "command", "serve")
    hook.on_pre_build(config)
    assert hook.state["recorded"] == [] and [path.name for path, _ in hook.state["long"]] == ["cpu-long-test.json"]
    monkeypatch.setitem(hook.state, "charts", {"long-cpu-long-test": hook.long_chart_set("long-cpu-long-test",
                                                                                          long_result)})
    section = hook.long_section()
    assert "**`docs/results/long/cpu-long-test.json`**" in section
    assert "| pattern | Flex faster from |" in section and "| causal |" in section and "| document |" in section
    assert "fitted slope" in section and section.count("![") == 3  # memory forward, forward + backward, block sparse
    assert "| 256 | 50% | 75% |" in section  # causal at T=256: 50% of the pairs (rounded), 3 of 4 blocks
    page = type("Page", (), {"file": type("File", (), {"src_uri": "benchmarks.md"})()})()
    markdown = hook.on_page_markdown((root / "docs" / "benchmarks.md").read_text(), page, config, None)
    assert "<!-- long-context -->" not in markdown and "**`docs/results/long/cpu-long-test.json`**" in markdown


def test_validator_refuses_a_run_that_did_not_finish(long_result):
    partial = copy.deepcopy(long_result)
    partial["complete"] = False
    assert any("did not finish" in problem for problem in render.validate_result(partial))
