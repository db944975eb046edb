# %% [markdown]
# # The quick run, explained
#
# This page teaches how the benchmark measures the implementations and how to read its numbers,
# using the quick profile that runs while the documentation is built. It assumes you know what the
# implementations are (the pages under Implementations); the per-device tables and the fastest
# class per shape are on [Benchmarks per device](../../benchmarks/), and the terms are in the
# [glossary](../../glossary/).
#
# How fast is each implementation, and how far is it from the speed of a plain matrix multiply on
# the same machine? The quick profile (`python -m attention.bench --quick`) measures GPT-2-small
# widths, forward and forward + backward, at the lengths printed below.
#
# What the harness guarantees for every row (`attention/bench/`, file format in
# `docs/benchmark-schema.md`):
#
# * **The same work.** One set of weights drawn from one seed, loaded into every class through its
#   [canonical state dict](../../glossary/#canonical-state-dict); one input; one output gradient.
# * **Correct before timed.** The first call's output is compared with the float64 reference
#   (`attention/reference.py`). A mismatch marks the row incorrect and removes it from the ranking.
# * **Honest timing.** Warm-up, device synchronization around each block of calls, median and
#   [interquartile range](../../glossary/#iqr) over several blocks; the first call (which includes any compilation, such
#   as FlexAttention's) is reported apart.
# * **A yardstick timed beside each row.** A dense matmul, timed in blocks that alternate with the
#   row's own blocks (matmul, row, matmul, ...), gives the device's matmul rate at that moment; each
#   row's TFLOP/s (useful FLOPs, the same count for every implementation) is shown as a share of it.
# * **Provenance.** Device, versions, git commit, command line and a hash of the sources that ran,
#   so a recorded result says when it predates the current code.
#
# Timings on a shared or small machine are noisy: read the ordering and the orders of magnitude,
# not the third digit.

# %%
import os
import time

from attention.report import prose
from attention.bench import quick_config, run_benchmark
from attention import report
from attention.display import show, show_markdown

# %% [markdown]
# ## The quick profile, run now
#
# Run it yourself with `python -m attention.bench --quick` (progress goes to stderr, one line per
# measurement), or from Python with `run_benchmark(quick_config(device="cpu"))` from
# `attention.bench`. The run's own duration is printed below.

# %% tags=["hide-input"]
# The docs build runs the quick profile once (docs/_hooks/benchmarks.py) and passes its result file
# here through ATTENTION_BENCH_QUICK_RESULT, so this page and the Benchmarks page show the same run.
# (`mkdocs serve` measures nothing: without a cached quick run it passes the newest recorded run.)
# Run as a plain script, this cell measures afresh.
build_result = os.environ.get("ATTENTION_BENCH_QUICK_RESULT")
if build_result:
    result = report.load_result(build_result)
    if result["config"]["profile"] == "quick":
        print(f"the quick run measured for this site: {len(result['rows'])} rows in {result['provenance']['duration_s']:.0f} s")
    else:
        print(f"a preview without a quick run: this page shows the recorded run {os.path.basename(build_result)} "
              f"({result['config']['profile']} profile)")
else:
    started = time.perf_counter()
    result = run_benchmark(quick_config(device="cpu"), progress=False, argv=["python", "-m", "attention.bench", "--quick"])
    print(f"{len(result['rows'])} rows in {time.perf_counter() - started:.0f} s")
show_markdown(f"Profile `{result['config']['profile']}`: {report.profile_summary(result['config'])}; modes "
              f"{', '.join(result['config']['modes'])}.")
show_markdown(report.provenance_summary(result))

# %% [markdown]
# ## Results at the headline shape
#
# Ranked by median time. "% of matmul" divides the row's rate (useful FLOPs: the projections and
# the unmasked half of the attention matmuls, the same count for every implementation) by the rate
# of the square matmul timed beside it: 100% would turn those FLOPs into time as fast as a large
# matmul does. "peak MiB" is the tensor memory of one call at its worst moment. "SDPA
# backend" names the `scaled_dot_product_attention` kernel the profiler saw run, "n/a" where none
# ran. A note under a table flags rows measured while other processes took the CPU.

# %% tags=["hide-input"]
show_markdown(report.markdown_tables(result))

# %% tags=["hide-input"]
show(report.plot_bars(result))

# %% [markdown]
# ## Against sequence length
#
# Time and memory of one call, log-log. An implementation that builds the `(T, T)` score matrix
# needs memory that grows like T² once the scores outweigh the fixed costs (weights, inputs); a
# fused kernel (SDPA's flash kernel, FlexAttention's forward) works through blocks of keys and needs
# memory like T. How each class grew in this run is written under the charts.

# %% tags=["hide-input"]
show(report.plot_time_vs_seq_len(result, "forward"))

# %% tags=["hide-input"]
show(report.plot_memory_vs_seq_len(result, "forward"))

# %% tags=["hide-input"]
show_markdown(report.sweep_table(result, "forward", "ms_median"))
lengths = sorted(result["config"]["seq_lens"])
memory_at = {(row["label"], row["seq_len"]): row["peak_memory_bytes"] for row in report.sweep_rows(result, "forward")
             if row["status"] == "ok" and row["peak_memory_bytes"]}
grown = {label: (memory_at[label, lengths[-2]], memory_at[label, lengths[-1]])
         for label in ("split_heads", "sdpa_causal", "flex", "tiled")
         if (label, lengths[-2]) in memory_at and (label, lengths[-1]) in memory_at}
if len(lengths) > 1 and grown:
    show_markdown(prose.memory_growth_sentence("this run", lengths[-2], lengths[-1], grown))

# %% [markdown]
# ## Recorded runs
#
# Longer runs, recorded with `python -m attention.bench ... --out docs/results/<device>-<name>.json`,
# are shown per device on the [Benchmarks](../../benchmarks/) page, each with its provenance; a run
# that predates the current sources is marked stale there.

# %% tags=["hide-input"]
for path in report.find_results():
    recorded = report.load_result(path)
    print(f"{path.name}: {recorded['provenance']['device']['name']}, {recorded['dtype']}, "
          f"{recorded['provenance']['date_utc']}, stale: {report.is_stale(recorded)}")

# %% [markdown]
# ## Is the share stable?
#
# A share of the matmul rate is only useful if it moves with the code, not with the machine. On a
# shared host the machine's speed drifts during a half-hour run, so a yardstick timed minutes away
# from a row (the run-level rate: the median of matmul samples taken at the start and after each
# shape) moves every share with it. The paired yardstick is timed in the same minute as the row.
# The default profile was recorded twice with the same sources on the same machine, with a
# bfloat16 run in between (both files are kept in `docs/results/repeats/`); the table gives each
# class's share at the headline shape in both runs, against either yardstick, and the gap in
# percentage points.

# %% tags=["hide-input"]
first_path = report.RESULTS_DIR / "repeats" / "cpu-intel-xeon-2c-float32-run1.json"
second_path = report.RESULTS_DIR / "repeats" / "cpu-intel-xeon-2c-float32-repeat.json"
first, second = report.load_result(first_path), report.load_result(second_path)
same_sources = first["provenance"]["source_hash"] == second["provenance"]["source_hash"]
print(f"Both runs measured the same sources: {same_sources} (commit {first['provenance']['git']['commit'][:7]}"
      + (", older than the code of this page: the question is the machine's, not the code's)" if report.is_stale(first)
         else ")"))
assert same_sources, "the stability pair must come from the same sources"
for name, run in (("run 1", first), ("run 2", second)):
    paired, samples = run["matmul_peak"]["paired"], run["matmul_peak"]["samples"]
    print(f"{name}: {run['provenance']['date_utc']}, {run['provenance']['duration_s'] / 60:.0f} min; matmul rate "
          f"beside the rows {report.number(paired['lowest_tflops'])} to {report.number(paired['highest_tflops'])} "
          f"TFLOP/s, run-level samples {report.number(min(s['tflops'] for s in samples))} to "
          f"{report.number(max(s['tflops'] for s in samples))}")
stability = report.share_stability(first, second)
for entry in stability:
    fastest_row = entry["rows"][0]
    paired, run_level = fastest_row["paired"], fastest_row["run_level"]
    show_markdown(f"{report.MODE_TITLES[entry['mode']].capitalize()}: the fastest class, `{entry['fastest']}`, "
                  f"takes {paired[0]:.0%} and {paired[1]:.0%} of the paired matmul rate in the two runs "
                  f"({abs(paired[0] - paired[1]) * 100:.1f} points apart), and {run_level[0]:.0%} and "
                  f"{run_level[1]:.0%} of the run-level rate ({abs(run_level[0] - run_level[1]) * 100:.1f} points "
                  f"apart). Over all classes, the largest gap is "
                  f"{max(abs(r['paired'][0] - r['paired'][1]) for r in entry['rows']) * 100:.0f} points paired "
                  f"and {max(abs(r['run_level'][0] - r['run_level'][1]) for r in entry['rows']) * 100:.0f} run-level.")
run_level_rates = [run["matmul_peak"]["tflops"] for run in (first, second)]
paired_range = [first["matmul_peak"]["paired"][key] for key in ("lowest_tflops", "highest_tflops")]
rates_kind, _ = prose.ratio_words(run_level_rates[0], run_level_rates[1], within=0.05)
show_markdown(f"The two runs' run-level matmul rates (`{first_path.name}` and `{second_path.name}`) were "
              f"{report.number(run_level_rates[0])} and {report.number(run_level_rates[1])} TFLOP/s, "
              f"{abs(run_level_rates[0] / run_level_rates[1] - 1):.0%} apart, so here both yardsticks give "
              + ("nearly the same shares" if rates_kind == "about the same" else "different shares")
              + ". The paired one is what keeps a share "
              f"put when the machine's speed does move: within run 1, the matmul timed beside the rows ran from "
              f"{report.number(paired_range[0])} to {report.number(paired_range[1])} TFLOP/s.")
show_markdown(report.share_stability_table(first, second))

# %% [markdown]
# Each row's time is measured once per run, so a class whose own time moved between runs (other
# work on the machine during its blocks, which the yardstick beside it did not see) still moves;
# the CPU-share column of the provenance flags rows measured on a contended CPU.

# %% [markdown]
# ## bfloat16 on a CPU
#
# The [Benchmarks](../../benchmarks/#bfloat16-against-float32) page compares the recorded float32
# and bfloat16 runs class by class. Whether bfloat16 makes a CPU faster depends first on whether
# the CPU can multiply bfloat16 numbers: Intel's AMX tile units (Sapphire Rapids and later) and
# AVX-512 BF16 do; a CPU with neither widens each bfloat16 number to float32 before it multiplies.
# To see why some classes gain and others lose, time the pieces every class is made of, in both
# dtypes, at batch 1 of the recorded runs' headline shape, on the machine building this page: the projections
# (one `(B·T, d_model) @ (d_model, 3·d_model)` matmul), the attention core through SDPA's fused
# kernel, and the four steps of the written-out core (`Q Kᵀ`, the causal mask, the softmax over the
# `(B, H, T, T)` scores, and the weights times `V`).

# %% tags=["hide-input"]
import sys
import tempfile

import torch
import torch.nn.functional as F

from attention.bench import metrics


def onednn_primitives(call):
    """The oneDNN primitive implementations `call()` ran, from oneDNN's verbose log (C stdout)."""
    with tempfile.TemporaryFile(mode="w+") as capture:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(capture.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                call()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        capture.seek(0)
        lines = capture.read().splitlines()
    return sorted({line.split(",")[6] for line in lines if line.startswith("onednn_verbose") and ",exec," in line})


SLOW_CALL_S = 1.0  # a piece whose first call takes longer is timed by that call alone
recorded = report.load_result(report.RESULTS_DIR / "cpu-intel-xeon-2c-float32.json")["config"]
B, T, C, H = recorded["batch"], recorded["seq_len"], recorded["d_model"], recorded["num_heads"]  # the headline shape
B = 1  # batch 1 of it: a CPU without bfloat16 instructions takes minutes for the full batch's bfloat16 pieces
MATMUL_SIZE = 1024  # the yardstick's kind of matmul, smaller for the same reason
generator = torch.Generator().manual_seed(0)
causal = torch.ones(T, T, dtype=torch.bool).tril()
pieces = {}
for dtype in (torch.float32, torch.bfloat16):
    x = torch.randn(B * T, C, generator=generator).to(dtype)
    w_qkv = torch.randn(C, 3 * C, generator=generator).to(dtype)
    q, k, v = (torch.randn(B, H, T, C // H, generator=generator).to(dtype) for _ in range(3))
    scores = torch.randn(B, H, T, T, generator=generator).to(dtype)  # (B, H, T, T)
    calls = {
        f"matmul {MATMUL_SIZE}² (the CPU yardstick's kind)": metrics.matmul_call("cpu", dtype, MATMUL_SIZE)[0],
        f"projections: ({B * T}, {C}) @ ({C}, {3 * C})": lambda: x @ w_qkv,
        "SDPA causal core (fused kernel)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "written-out core: Q Kᵀ": lambda: q @ k.transpose(-2, -1),
        "written-out core: causal masked_fill": lambda: scores.masked_fill(~causal, float("-inf")),
        "written-out core: softmax": lambda: torch.softmax(scores, dim=-1),
        "written-out core: weights @ V": lambda: scores @ v,
    }
    for piece, call in calls.items():  # timed now: the lambdas read this iteration's tensors
        # The first call, timed (and, in bfloat16, logged by oneDNN): a CPU without bfloat16 instructions can
        # take a minute for one bfloat16 matmul, and then that one call is the measurement.
        started = time.perf_counter()
        kernels = onednn_primitives(call) if dtype == torch.bfloat16 else []
        first_s = time.perf_counter() - started
        if first_s > SLOW_CALL_S:
            pieces.setdefault(piece, {})[dtype] = (first_s * 1e3, True, kernels)
        else:
            timing = metrics.time_callable(call, "cpu", metrics.Timing(0.3, 3, 0.05), warm=(first_s, first_s))
            pieces.setdefault(piece, {})[dtype] = (timing["ms_median"], False, kernels)
rows = []
for piece, timings in pieces.items():
    (fp32_ms, fp32_once, _), (bf16_ms, bf16_once, kernels) = timings[torch.float32], timings[torch.bfloat16]
    rows.append((piece, report.number(fp32_ms) + (" (one call)" if fp32_once else ""),
                 report.number(bf16_ms) + (" (one call)" if bf16_once else ""), prose.times(fp32_ms / bf16_ms, "×"),
                 ", ".join(f"`{kernel}`" for kernel in kernels if kernel) or "none (not oneDNN)"))
show_markdown(f"B = {B}, T = {T}, d_model {C}, {H} heads; bf16 speed = float32 ms / bfloat16 ms (above 1: "
              "bfloat16 is faster).\n\n| piece | float32 ms | bfloat16 ms | bf16 speed | oneDNN primitive in bfloat16 |\n"
              "|---|--:|--:|--:|---|\n" + "\n".join("| " + " | ".join(row) + " |" for row in rows))
ms = {piece: {dtype: timing[0] for dtype, timing in timings.items()} for piece, timings in pieces.items()}
if any(once for timings in pieces.values() for _, once, _ in timings.values()):
    show_markdown(f"(one call): a piece whose first call took over {SLOW_CALL_S:g} s is timed by that call alone.")
speed = {piece: times[torch.float32] / times[torch.bfloat16] for piece, times in ms.items()}

# %% tags=["hide-input"]
from attention.machine import cpu_flags, cpu_name

matmul_piece, projection_piece, core_piece, qk_piece, mask_piece, softmax_piece, pv_piece = pieces
written_out = (qk_piece, mask_piece, softmax_piece, pv_piece)


def speed_of(group):
    """bfloat16 speed (float32 ms / bfloat16 ms) of a group of pieces run one after another."""
    return sum(ms[p][torch.float32] for p in group) / sum(ms[p][torch.bfloat16] for p in group)


matmul_flops = 2 * MATMUL_SIZE**3
build_flags = cpu_flags()
show_markdown(prose.bf16_matmul_sentence(
    "This build's CPU", cpu_name(), build_flags, matmul_flops / ms[matmul_piece][torch.float32] / 1e9,
    matmul_flops / ms[matmul_piece][torch.bfloat16] / 1e9))
show_markdown(prose.bf16_pieces_sentence({
    "matmul": speed[matmul_piece], "projections": speed[projection_piece], "sdpa": speed[core_piece],
    "scores": speed[qk_piece], "mask": speed[mask_piece], "softmax": speed[softmax_piece],
    "weights_v": speed[pv_piece], "written_out": speed_of(written_out)}))
show_markdown(prose.bf16_conclusion(speed[projection_piece], speed_of((mask_piece, softmax_piece)),
                                    prose.has_amx(build_flags)))

# %% [markdown]
# The recorded runs, measured on another CPU, class by class. The classes fall into three kinds:
# those whose attention is one fused kernel (SDPA, and FlexAttention's forward), `tiled`, whose
# tiles keep the scores from ever being whole, and those that write the `(B, H, T, T)` scores out
# as tensors. FlexAttention's backward on a CPU is not fused: its peak memory in training (in the
# tables of the recorded runs) is that of several score tensors, so in forward + backward the Flex
# classes count as writing the scores out.

# %% tags=["hide-input"]
fp32_path = report.RESULTS_DIR / "cpu-intel-xeon-2c-float32.json"
bf16_path = report.RESULTS_DIR / "cpu-intel-xeon-2c-bfloat16.json"
fp32_run, bf16_run = report.load_result(fp32_path), report.load_result(bf16_path)


def kernel_kind(row, mode):
    """"fused", "tiled" or "written out": how a recorded row's attention handles the scores in `mode`."""
    if row["implementation"] == "tiled":
        return "tiled"
    if row["sdpa_backends"] != ["n/a"]:  # an SDPA kernel ran (forward and backward are fused on CPU)
        return "fused"
    if "flex" in row["implementation"]:
        return "fused" if mode == "forward" else "written out"
    return "written out"


run_labels = [prose.file_label(path.name, report.is_stale(run)) for path, run in ((fp32_path, fp32_run), (bf16_path, bf16_run))]
matmul_rates = report.dtype_comparison(fp32_run, bf16_run)["matmul"]
show_markdown(prose.bf16_matmul_sentence(
    f"The CPU of {' and '.join(run_labels)}", fp32_run["provenance"]["device"]["name"],
    fp32_run["provenance"]["device"].get("cpu_flags"), *matmul_rates))
comparison = report.dtype_comparison(fp32_run, bf16_run)["rows"]
for mode in ("forward", "forward_backward"):
    kinds = {row["label"]: kernel_kind(row, mode) for row in report.shape_rows(fp32_run, mode)}
    groups = {}
    for row in comparison:
        groups.setdefault(kinds[row["label"]], []).append(row[mode][2])
    show_markdown(prose.bf16_classes_sentence(run_labels,
                                              f"{report.MODE_TITLES[mode]}, B = {B}, T = {T}", groups))
flex_peak = max(row["peak_memory_bytes"] for row in report.shape_rows(fp32_run, "forward_backward")
                if row["implementation"] == "flex")
score_bytes = B * H * T * T * 4
assert flex_peak > 2 * score_bytes, "the text above says FlexAttention's CPU backward holds several score tensors"
show_markdown(f"(`flex` in forward + backward, in `{fp32_path.name}`: a peak of {flex_peak / 2**20:,.0f} MiB, "
              f"{flex_peak / score_bytes:.1f} times one `(B, H, T, T)` float32 score tensor of "
              f"{score_bytes / 2**20:,.0f} MiB.) To see how your CPU fares, run the benchmark in both dtypes and "
              "[add the files](../../add-your-device/).")
