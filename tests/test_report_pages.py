"""The recorded-run sections of the teaching pages (`attention/report/long.py`, `attention.report.ring.page`).

Each page shows a recorded run through one call; these tests read the recorded runs in docs/results/ (and copies of
them, changed) and check that what a section says follows from the rows: the rows it shows, its verdicts, its
sentences, and how it names the device.
"""

import copy
import re

import pytest
from matplotlib.figure import Figure

from attention.bench.core import usable
from attention.bench.results import RESULTS_DIR, load_result
from attention.report import long, ring
from attention.report.block_sparse import crossovers
from attention.report.format import device_label, mebibytes, number
from attention.report.sequence import memory_slopes, tied


@pytest.fixture(scope="module")
def long_run():
    return long.recorded("long")


@pytest.fixture(scope="module")
def default_run():
    return long.recorded("")


def table_rows(markdown):
    """The body rows of the first Markdown table in `markdown`, as lists of cells."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_recorded_picks_the_newest_run_of_a_dtype_and_never_a_compiled_one(default_run):
    path, result = default_run
    assert path.startswith("docs/results/") and path.count("/") == 2 and result["dtype"] == "float32"
    assert not result["config"]["compile"]
    dated = [load_result(p) for p in RESULTS_DIR.glob("*.json")]
    newest = max(r["provenance"]["date_utc"] for r in dated if r["dtype"] == "float32" and not r["config"]["compile"])
    assert result["provenance"]["date_utc"] == newest
    assert long.recorded("", dtype="bfloat16")[1]["dtype"] == "bfloat16"
    with pytest.raises(FileNotFoundError, match="no recorded cpu float16 run in docs/results/long"):
        long.recorded("long", dtype="float16")


def test_a_run_without_cpu_flags_is_named_without_flags_unknown(long_run):
    _, result = long_run
    old = copy.deepcopy(result)
    old["provenance"]["device"]["cpu_flags"] = None
    assert long.run_device(old).endswith("(recorded before CPU flags were kept)")
    flagged = copy.deepcopy(result)
    flagged["provenance"]["device"]["cpu_flags"] = ["avx2", "fma"]
    assert long.run_device(flagged).endswith(", AVX2")
    for figure in (long.memory_chart(old), long.block_sparse_chart(old)):
        titles = [figure.get_suptitle()] + [ax.get_title() for ax in figure.axes]
        assert not any("flags unknown" in title for title in titles)
        assert any("recorded before CPU flags were kept" in title for title in titles)


def test_the_memory_chart_draws_each_class_so_that_it_stays_visible(long_run):
    """The tiled line lay exactly under sdpa_causal's: each class now has its own marker and line style."""
    figure = long.memory_chart(long_run[1])
    assert isinstance(figure, Figure)
    lines = {line.get_label().rsplit("(", 1)[-1].rstrip(")"): line for line in figure.axes[0].lines}
    drawn = [lines[label] for label in long.CLASSES]
    assert len({(line.get_marker(), line.get_linestyle()) for line in drawn}) == len(long.CLASSES)
    assert len({line.get_color() for line in drawn}) == len(long.CLASSES)


def test_the_tiled_section_shows_few_rows_read_from_the_run(long_run):
    path, result = long_run
    text = long.tiled_section(path, result)
    rows = table_rows(text)
    assert 0 < len(rows) <= 8
    training = {(r["label"], r["seq_len"]): r for r in result["rows"] if r["mode"] == "forward_backward" and usable(r)}
    for cells in rows:
        t = int(cells[0].replace(",", ""))
        for index, label in enumerate(long.CLASSES):
            row = training.get((label, t))
            assert cells[1 + index] == (mebibytes(row["peak_memory_bytes"]) if row else "—")
            assert cells[4 + index] == (number(row["ms_median"]) if row else "—")
    slopes = memory_slopes(result, "forward_backward")
    assert all(f"`T^{slopes[label]['slope']:.2f}`" in text for label in long.CLASSES)
    assert text.startswith(f"From the recorded run `{path}`") and "flags unknown" not in text


def test_the_block_sparse_section_counts_partial_blocks_from_the_masks(long_run):
    # causal at 512 positions, blocks of 128: 4 x 4 blocks, 4 on the diagonal (partial), 6 below it (full)
    assert long.partial_share("causal", 512) == 4 / 10
    path, result = long_run
    text = long.block_sparse_section(path, result, kinds_at=512)
    for pattern, entry in crossovers(result).items():
        line = next(line for line in text.splitlines() if line.startswith(f"- `{pattern}`"))
        assert (f"from `T = {entry['crossover']:,}`" in line) if entry["crossover"] else "does not overtake" in line
        assert f"{entry['speedup']:.2f} times as fast" in line
        assert f"{long.partial_share(pattern, 512):.0%} of its computed blocks at `T = 512` are partial" in line


def test_the_stacked_section_calls_a_tie_where_the_run_cannot_tell_them_apart(default_run):
    path, result = default_run
    rows = table_rows(long.stacked_section(path, result))
    assert 0 < len(rows) <= 8
    by_shape = {(r["label"], r["batch"], r["seq_len"]): r for r in result["rows"]
                if r["mode"] == "forward" and usable(r) and not r["compiled"]}
    for batch, t, stacked_ms, split_ms, verdict, *_ in rows:
        stacked, split = (by_shape[label, int(batch), int(t.replace(",", ""))] for label in ("stacked_heads", "split_heads"))
        assert (stacked_ms, split_ms) == (number(stacked["ms_median"]), number(split["ms_median"]))
        assert verdict == ("tied" if tied(stacked, split) else
                           "faster" if stacked["ms_median"] < split["ms_median"] else "slower")


def test_the_memory_section_shows_few_classes_and_the_measured_growth(default_run):
    path, result = default_run
    text = long.memory_section(path, result)
    rows = table_rows(text)
    assert [cells[0] for cells in rows] == [f"`{label}`" for label in
                                            ("split_heads", "stacked_heads", "sdpa_causal", "sdpa_mask", "flex")]
    peaks = {(r["label"], r["seq_len"]): r["peak_memory_bytes"] for r in result["rows"]
             if r["mode"] == "forward" and r["batch"] == result["config"]["sweep_batch"] and usable(r)}
    longest = max(t for _, t in peaks)
    grown = peaks["split_heads", longest] / peaks["split_heads", longest // 2]
    assert f"`split_heads` grew ×{grown:.1f} (`T²` would be ×4)" in text


def test_the_ring_page_section_names_its_run_and_says_when_a_call_was_wrong():
    path, result = long.recorded("ring")
    text = ring.page(result, images={}, path=path)
    assert text.startswith(f"From the recorded run `{path}`") and "Every call matched the reference" in text
    assert all(len(cells) == 8 for cells in table_rows(text))
    wrong = copy.deepcopy(result)
    wrong["ring"]["rows"][-1].update(correct=False)
    text = ring.page(wrong, images={}, path=path)
    assert "NOT every call matched the reference" in text
    assert re.search(r"\| incorrect \|", text) or "/ incorrect" in text
    benchmarks = ring.page(result, {"ring": "![chart](ring.png)"})  # the Benchmarks page: no path, no verdict line
    assert benchmarks.startswith("Context-parallel (ring) attention on") and "![chart](ring.png)" in benchmarks


# --- The decode teaching pages: KV cache, current models, MLA, grouped-query (attention.report.decode, .prefill) ----


@pytest.fixture(scope="module")
def decode_run():
    return long.recorded("decode")


def test_the_kv_cache_section_shows_six_rows_and_its_ratios_from_them(decode_run):
    from attention.report.decode import GRID, cache_section, decode_best, forced_only

    path, result = decode_run
    text = cache_section(path, result)
    rows = table_rows(text)
    assert [row[:2] for row in rows] == [[f"{m} ({k})", f"`{kernel}`"] for m, k in (("MHA", 32), ("GQA", 4), ("MQA", 1))
                                         for kernel in ("sdpa", "matmul")]
    assert all(len(row) == 5 for row in rows) and text.endswith(GRID) and path in text
    forced = forced_only(result)  # the page's tables and sentence: the forced kernels, not `auto`
    mha, gqa = (decode_best(forced, model, 1, 16384) for model in ("MHA", "GQA"))
    assert (f"GQA reads {mha['cache_bytes_per_token'] // gqa['cache_bytes_per_token']}x less cache per token than MHA "
            f"and runs {gqa['tokens_per_s'] / mha['tokens_per_s']:.1f}x as many tokens/s (`{gqa['kernel']}`)") in text


def test_the_models_section_shows_a_row_per_layer_and_compares_local_with_global(decode_run):
    from attention.report.decode import decode_best, layers_section

    path, result = decode_run
    layers = ["Llama-3", "Gemma-2-local", "Gemma-2-global", "gpt-oss-local", "gpt-oss-global"]
    text = layers_section(path, result, layers)
    assert len(table_rows(text)) == len(layers) <= 8
    local, full = (decode_best(result, name, 1, 16384) for name in ("Gemma-2-local", "Gemma-2-global"))
    assert (f"Gemma-2-local reads {local['cache_bytes_read'] / 2**20:,.1f} MiB of cache per step where Gemma-2-global "
            f"reads {full['cache_bytes_read'] / 2**20:,.1f} MiB") in text


def test_the_mla_sections_say_which_path_is_faster_from_the_rows(decode_run):
    from attention.report import decode, prefill

    path, result = decode_run
    text = decode.latent_section(path, result)
    assert [row[0].split(" ")[0] for row in table_rows(text)] == ["GQA", "GQA", "MQA", "MQA", "MLA", "MLA"]
    pairs = decode.mla_pairs(result)
    assert pairs and all(a["batch"] == n["batch"] and a["context"] == n["context"] for a, n in pairs)
    if all(a["tokens_per_s"] > n["tokens_per_s"] for a, n in pairs):
        assert f"in none of the {len(pairs)} pairs" in text
    prefill_path, prefill_run = long.recorded("prefill")
    section = prefill.latent_section(prefill_path, prefill_run, result)
    assert len(table_rows(section)) == len(prefill.by_length(prefill_run)) <= 8
    found, _ = prefill.naive_faster_from(prefill_run)
    same_device = device_label(prefill_run["provenance"]["device"]) == device_label(result["provenance"]["device"])
    assert ("**absorbed for decoding**" in section) == (same_device and found is not None and
                                                        all(a["tokens_per_s"] > n["tokens_per_s"] for a, n in pairs))
    slower = copy.deepcopy(result)  # naive faster somewhere while decoding: no verdict
    for row in slower["decode"]["rows"]:
        if row["model"] == "MLA" and row["kernel"] == "naive" and row["status"] == "ok":
            row["tokens_per_s"] *= 1000
    assert "**absorbed for decoding**" not in prefill.latent_section(prefill_path, prefill_run, slower)
    assert "The naive path is faster than the absorbed one at batch" in decode.latent_section(path, slower)


def test_the_grouped_query_section_shows_its_six_classes_at_the_headline_shape(default_run):
    from attention.report.prefill import GROUPED_QUERY_CLASSES, grouped_query_section

    path, result = default_run
    text = grouped_query_section(path, result)
    rows = table_rows(text)
    assert [row[0] for row in rows] == [f"`{name}`" for name in GROUPED_QUERY_CLASSES]
    assert [row[1] for row in rows][:4] == ["12", "12", "3", "1"] and path in text
    assert "forward FLOPs" in text and "gqa_flex" in text


@pytest.mark.parametrize("sizes, words", [
    (dict(seq_lens=[128, 1024], sweep_batch=2), "batch 2, `T` = 128, 1024"),  # a sweep over lengths: its batch
    (dict(seq_lens=None, sweep_batch=None), "batch 8, `T` = 512"),  # one length: the run's batch
    (dict(seq_lens=[], sweep_batch=None), "batch 8, `T` = 512"),
])
def test_a_runs_sizes_and_timing_are_said_in_words(sizes, words):
    from attention.report import profile_summary

    config = dict(batch=8, seq_len=512, d_model=768, num_heads=12, min_run_time=0.5, min_repeats=7, **sizes)
    assert profile_summary(config) == (f"{words}, d_model 768, 12 heads, timing of at least 0.5 s and 7 repeats "
                                       "per row")
