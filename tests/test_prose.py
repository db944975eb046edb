"""The sentences pages write about measured numbers (attention/prose.py), built from two hosts' numbers.

The site is built on an AMD EPYC without AVX-512 (bfloat16 matmuls slower than float32) and on Intel
Xeons with AMX (bfloat16 matmuls about 8x float32). Each test builds a page's claim from both hosts'
numbers, recorded (docs/results/) or as such a host measures them, and checks that the wording follows
the numbers: the sentence that was true on one host must not be printed on the other.
"""

import copy
import pathlib

import pytest

from attention.report import decision, prose
from attention import report

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"
AMD_EPYC_FLAGS = ["avx2", "fma"]  # no AVX-512, no AMX: what this project's AMD EPYC build host reports
XEON_AMX_FLAGS = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"]


@pytest.fixture(scope="module")
def amd_run():
    return report.load_result(RESULTS / "cpu-amd-epyc-2c-float32.json")


@pytest.fixture(scope="module")
def xeon_amx_run(amd_run):
    """The AMD run's rows as an Intel Xeon with AMX would have measured them (synthetic): another CPU, and
    FlexAttention 30% faster than SDPA in both modes, so the fastest class is another."""
    run = copy.deepcopy(amd_run)
    run["provenance"]["device"]["name"] = run["provenance"]["device"]["cpu"] = "Intel(R) Xeon(R) Platinum 8480+"
    run["provenance"]["device"]["cpu_flags"] = XEON_AMX_FLAGS
    sdpa = {row["mode"]: row for row in report.sequence.shape_rows(run, "forward") + report.sequence.shape_rows(run, "forward_backward")
            if row["implementation"] == "sdpa_causal" and not row["compiled"]}
    for row in run["rows"]:
        if row["implementation"] == "flex" and not row["compiled"] and (row["batch"], row["seq_len"]) == (
                run["config"]["batch"], run["config"]["seq_len"]):
            for key in ("ms_median", "ms_q1", "ms_q3"):
                row[key] = sdpa[row["mode"]][key] * 0.7
    return run


# --- bfloat16 on a CPU (examples/benchmark.py) ------------------------------------------------------------


def test_bf16_matmul_sentence_explains_the_speed_by_the_cpu_flags():
    amd = prose.bf16_matmul_sentence("AMD EPYC", AMD_EPYC_FLAGS, 0.21, 0.065)
    xeon = prose.bf16_matmul_sentence("Intel Xeon", XEON_AMX_FLAGS, 0.44, 3.5)
    assert "neither AMX nor AVX-512 BF16" in amd and "at 0.31x the speed of" in amd and "faster" not in amd
    assert "with AMX" in xeon and "8.0x faster than" in xeon and "neither" not in xeon
    unknown = prose.bf16_matmul_sentence("Intel(R) Xeon(R) Processor", None, 0.33, 0.17)
    assert "not recorded" in unknown and "0.52x the speed of" in unknown


def test_bf16_conclusion_follows_the_projections():
    amd = prose.bf16_conclusion(projection_speed=0.3, elementwise_speed=1.4, amx=False)
    xeon = prose.bf16_conclusion(projection_speed=6.5, elementwise_speed=1.6, amx=True)
    assert "pays for slower projections" in amd and "emulated" in amd
    assert "gains from faster projections" in xeon and "AMX multiplies bfloat16" in xeon
    assert "pays" not in xeon and "slower" not in xeon
    assert "about the same" in prose.bf16_conclusion(1.02, 1.0, None)


def test_bf16_pieces_sentence_says_faster_or_slower_per_piece():
    speeds = {"matmul": 0.3, "projections": 0.35, "sdpa": 0.9, "scores": 0.5, "mask": 1.6, "softmax": 1.3,
              "weights_v": 0.4, "written_out": 0.8}
    amd = prose.bf16_pieces_sentence(speeds)
    xeon = prose.bf16_pieces_sentence({key: 8.0 if key in ("matmul", "projections") else 1.5 for key in speeds})
    assert "at 0.30× (slower) its float32 speed" in amd and "1.6× (faster) (the mask)" in amd
    assert "at 8.0× (faster) its float32 speed" in xeon and "(slower)" not in xeon
    tiny = prose.bf16_pieces_sentence(dict(speeds, matmul=0.005))
    assert "at 0.005× (slower)" in tiny and "0.00×" not in tiny


# --- Tiled page (examples/tiled.py) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_run():
    return report.load_result(RESULTS / "long" / "cpu-intel-xeon-2c-float32-long.json")


def training_times(run, label):
    return {row["seq_len"]: row["ms_median"] for row in report.sequence.sweep_rows(run, "forward_backward")
            if row["label"] == label and row["status"] == "ok"}


def test_tiled_sentence_from_the_recorded_run_and_its_opposite(long_run):
    tiled, naive = training_times(long_run, "tiled"), training_times(long_run, "split_heads")
    recorded = prose.tiled_against_naive_sentence("`long.json`", tiled, naive)
    assert "`split_heads` is faster below `T = 512`, `tiled` from there on" in recorded
    assert "4.5x faster" in recorded and "slow" not in recorded
    swapped = prose.tiled_against_naive_sentence("`other.json`", naive, tiled)  # a host where tiles lose
    assert "`tiled` is not the faster of the two" in swapped


def test_compiled_sentence_per_mode():
    sentence = prose.compiled_sentence("`compiled.json`", 1024, {"forward": (28.06, 27.18),
                                                                 "forward + backward": (516.2, 84.6)})
    assert "forward, `tiled` takes 28.1 ms, within 3% of" in sentence
    assert "6.1x as long as" in sentence


# --- Grouped-query page (examples/gqa.py) ---------------------------------------------------------------


def headline_rows(run, names=("gqa", "gqa_flex", "sdpa_mask", "flex")):
    found = {}
    for mode in ("forward", "forward_backward"):
        for row in report.sequence.shape_rows(run, mode):
            if row["implementation"] in names and not row["compiled"]:
                found.setdefault(row["implementation"], {})[mode] = (row["ms_median"], row["peak_memory_bytes"] / 2**20)
    return found


def test_custom_mask_advice_follows_the_training_cost(amd_run):
    # Rows made up for the test: FlexAttention as fast as SDPA forward, 2.5x the time and 14x the memory to train.
    rows = {"gqa": {"forward": (200.0, 80.0), "forward_backward": (700.0, 150.0)},
            "gqa_flex": {"forward": (205.0, 80.0), "forward_backward": (1750.0, 2100.0)},
            "sdpa_mask": {"forward": (300.0, 120.0), "forward_backward": (1000.0, 220.0)},
            "flex": {"forward": (290.0, 140.0), "forward_backward": (1800.0, 2100.0)}}
    cpu = prose.custom_mask_sentence("cpu.json", True, rows, score_tensor_mib=384)
    assert "it costs no more than `gqa`" in cpu and "(stale)" in cpu
    assert "2.5x the time and 14.0x the memory (5.5 score tensors' worth)" in cpu
    assert "`gqa_flex` suits a custom mask or score for inference; to train with a mask, pass it" in cpu
    # The recorded run's sentence quotes its own rows.
    recorded = headline_rows(amd_run)
    sentence = prose.custom_mask_sentence("cpu.json", False, recorded, score_tensor_mib=384)
    flex_ms, gqa_ms = recorded["gqa_flex"]["forward_backward"][0], recorded["gqa"]["forward_backward"][0]
    assert f"takes {flex_ms:,.0f} ms" in sentence and f"`gqa`'s {gqa_ms:,.0f} ms" in sentence
    # A device whose FlexAttention trains as cheaply as SDPA (as on a GPU, with its fused backward).
    cheap = copy.deepcopy(rows)
    cheap["gqa_flex"]["forward_backward"] = rows["gqa"]["forward_backward"]
    other = prose.custom_mask_sentence("gpu.json", False, cheap, score_tensor_mib=384)
    assert "for inference and training alike" in other and "costs no more" in other


def test_flops_and_time_sentence():
    assert "the time follows the FLOPs" in prose.flops_and_time_sentence("sdpa_causal", {"gqa": (0.72, 0.76),
                                                                                         "mqa": (0.66, 0.71)})
    assert "falls less than the FLOPs" in prose.flops_and_time_sentence("sdpa_causal", {"gqa": (0.72, 0.95),
                                                                                        "mqa": (0.66, 0.93)})


def test_memory_growth_sentence():
    sentence = prose.memory_growth_sentence("this run", 512, 1024, {"split_heads": (100.0, 380.0),
                                                                    "sdpa_causal": (40.0, 75.0), "flex": (30.0, 33.0)})
    assert "`split_heads` ×3.80 (like T²)" in sentence and "`sdpa_causal` ×1.88 (like T)" in sentence
    assert "mostly fixed memory" in sentence


# --- Home page: the decision table (docs/_hooks/generated.py) ---------------------------------------------


def test_decision_table_from_two_hosts(amd_run, xeon_amx_run):
    """Devices as readers name them (not results files), a class named alone only outside the run's tie, and a why
    per row; the other host's fastest class is named for that host only."""
    runs = decision.split_by_device([("cpu-amd-epyc-2c-float32.json", amd_run)])
    table = decision.decision_table(runs, decision.split_by_device([]), decision.split_by_device([]))
    lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert set(lines) == {"Training (forward + backward)", "Prefill (a prompt's forward pass, no cache yet)",
                          "Decoding with a KV cache", "A GQA model (fewer K/V heads)", "A custom mask"}
    assert all(line.rstrip(" |").endswith(decision.NOT_MEASURED) for line in lines.values()), "no GPU run is recorded"
    assert "Decoding with a KV cache | not measured yet" in table  # no decode run given
    assert ".json" not in table and " on AMD EPYC, 2 cores (float32)" in table
    prefill = lines["Prefill (a prompt's forward pass, no cache yet)"]
    assert "`flex` ≈ " in prefill and "`sdpa_causal`" in prefill  # flex leads only after the drift correction
    assert "fused kernels, which never write the (T, T) scores out" in lines["Training (forward + backward)"]
    # said once where the AMD run predates the code, not at all where it is current
    assert prefill.count("(Recorded with older code.)") == (1 if decision.is_stale(amd_run) else 0)
    # The other host: flex is clearly the fastest there (30% ahead), and the table names it alone for that host.
    both = decision.split_by_device([("cpu-amd-epyc-2c-float32.json", amd_run), ("cpu-xeon-amx.json", xeon_amx_run)])
    table = decision.decision_table(both, decision.split_by_device([]), decision.split_by_device([]))
    training = next(line for line in table.splitlines() if line.startswith("| Training"))
    assert "`flex` on Intel Xeon Platinum 8480+, 2 cores (float32)" in training and "`sdpa_causal`" in training


def test_decision_table_gpu_column_fills_from_a_cuda_run(amd_run):
    cuda = copy.deepcopy(amd_run)
    cuda["device_type"] = "cuda"
    cuda["provenance"]["device"] |= {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}
    table = decision.decision_table(decision.split_by_device([("cpu.json", amd_run), ("cuda-h100.json", cuda)]),
                                 decision.split_by_device([]), decision.split_by_device([]))
    training = next(line for line in table.splitlines() if line.startswith("| Training"))
    assert "on NVIDIA H100 80GB HBM3 (float32)" in training.split(" | ")[2]
    assert "NVIDIA" not in training.split(" | ")[1]


def test_decision_table_decode_and_mask_rows_name_their_devices_and_say_why(long_run):
    decode = report.load_result(RESULTS / "decode" / "cpu-amd-epyc-2c-float32-decode.json")
    table = decision.decision_table(decision.split_by_device([]),
                                 decision.split_by_device([("cpu-amd-epyc-2c-float32-decode.json", decode)]),
                                 decision.split_by_device([("cpu-intel-xeon-2c-float32-long.json", long_run)]))
    decoding = next(line for line in table.splitlines() if line.startswith("| Decoding"))
    best = report.decode.decode_best(report.decode.forced_only(decode), "GQA", 1, 32768)  # what `auto` chooses between
    assert ("`gqa` (its default, `decode_kernel=\"auto\"`, times the kernels where it runs: "
            f"`{best['kernel']}` was the faster here) on AMD EPYC, 2 cores") in decoding
    assert (f"one attention layer (32 query heads of 128, 4 K/V heads), batch 1, a 32,768-token cache: "
            f"{best['tokens_per_s']:,.0f} tokens/s in float32") in decoding
    assert "A model runs this once per layer" in decoding and "memory-bound" in decoding
    assert "sliding window from `T = 2,048`" in table and "on Intel Xeon, 2 cores (float32)" in table
    assert "pays per block it computes, not per pair" in table and "`sdpa_causal` (`is_causal=True`)" in table


def test_ratio_words_refuses_non_positive_numbers():
    with pytest.raises(ValueError, match="value=0"):
        prose.ratio_words(0, 1.0)


def test_phone_labels_of_the_decision_table_name_its_columns():
    """On phones the table stacks its cells, and docs/stylesheets/extra.css labels them: the same devices."""
    css = (RESULTS.parents[0] / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    labels = [f'.decision-table td:nth-child({index + 2})::before {{\n    content: "{title}: ";'
              for index, title in enumerate(decision.DECISION_DEVICES.values())]
    assert all(label in css for label in labels), labels
