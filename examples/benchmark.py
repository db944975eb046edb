# %% [markdown]
# # The quick run, explained
#
# This page teaches how the benchmark measures the implementations and how to read its numbers,
# using the quick profile that runs while the documentation is built. It assumes you know what the
# implementations are (the pages under Implementations); every table of every recorded run is on
# [Benchmarks per device](../../benchmarks/), and the terms are in the [glossary](../../glossary/).
#
# How fast is each implementation, and how far is it from the speed of a plain matrix multiply on
# the same machine? What the harness (`attention/bench/`) guarantees for every row:
#
# * **The same work.** One set of weights drawn from one seed, loaded into every class through its
#   [canonical state dict](../../glossary/#canonical-state-dict); one input; one output gradient.
# * **Correct before timed.** The first call's output is compared with the float64 reference
#   (`attention/reference.py`). A mismatch marks the row incorrect and removes it from the ranking.
# * **Honest timing.** Warm-up, device synchronization around each block of calls, median and
#   [interquartile range](../../glossary/#iqr) over several blocks; the first call (which includes
#   any compilation, such as FlexAttention's) is reported apart.
# * **A yardstick timed beside each row.** A dense matmul, timed in blocks that alternate with the
#   row's own blocks (matmul, row, matmul, ...), gives the device's matmul rate at that moment; each
#   row's TFLOP/s (useful FLOPs, the same count for every implementation) is shown as a share of it.
# * **Provenance.** Device, versions, git commit, command line and a hash of the sources that ran,
#   so a recorded result says when it predates the current code (the file format:
#   [results file schema](../../benchmark-schema/)).

# %%
import os
import time

import torch
import torch.nn.functional as F

from attention import report
from attention.report import prose
from attention.bench import metrics, quick_config, run_benchmark
from attention.display import show, show_markdown
from attention.machine import cpu_flags, cpu_name

# %% [markdown]
# ## The quick profile, run now
#
# `python -m attention.bench --quick` runs it from a shell (progress on stderr, one line per
# measurement, the tables at the end); from Python it is one call. The docs build runs it once and
# hands its results file to this page and to the Benchmarks page, so both show the same run.

# %%
if os.environ.get("ATTENTION_BENCH_QUICK_RESULT"):  # set by the docs build (docs/_hooks/benchmarks.py)
    result = report.load_result(os.environ["ATTENTION_BENCH_QUICK_RESULT"])
else:  # run as a script: measure now
    result = run_benchmark(quick_config(device="cpu"), progress=False)
config = result["config"]
print(f"{config['profile']} profile: {len(result['rows'])} rows, measured in {result['provenance']['duration_s']:.0f} s")

# %% tags=["hide-input"]
show_markdown(f"{report.profile_summary(config)}; modes {', '.join(config['modes'])}.\n\n"
              + report.format.provenance_summary(result))

# %% [markdown]
# ## One row, as the file keeps it
#
# A run is a list of rows, one per class, mode and shape. Here is `sdpa_causal`'s forward at the
# headline shape, the fields the tables are made of. `flops` counts the useful work (the
# projections and the unmasked half of the attention matmuls, the same for every class);
# `tflops` divides it by the median time, and `matmul_tflops_paired` is the rate of the matmul timed
# in the blocks between this row's own. Their ratio is the row's share of the matmul rate, "% of
# matmul" in the tables: 100% would turn these FLOPs into time as fast as a large matmul does.

# %%
row = next(r for r in report.sequence.shape_rows(result, "forward") if r["label"] == "sdpa_causal")
for field in ("mode", "batch", "seq_len", "ms_median", "ms_q1", "ms_q3", "flops", "tflops", "matmul_tflops_paired",
              "share_of_paired_matmul", "peak_memory_bytes", "sdpa_backends", "correct", "max_abs_error"):
    print(f"{field:24} {row[field]}")
print(f"tflops / matmul_tflops_paired = {row['tflops'] / row['matmul_tflops_paired']:.1%} of the matmul rate")

# %% [markdown]
# ## Results at the headline shape
#
# Ranked by median time, here for one class of each kind of kernel (the full table of every class
# is in the **CPU, this build** tab of [Benchmarks](../../benchmarks/#results-per-device)):
# `split_heads` writes out the `(B, H, T, T)` scores, `sdpa_causal` runs SDPA's fused kernel,
# `tiled` runs FlashAttention's algorithm in plain PyTorch, `flex` runs FlexAttention. "peak MiB"
# is the tensor memory of one call at its worst moment; "SDPA backend" names the
# `scaled_dot_product_attention` kernel the profiler saw run, "n/a" where none ran.

# %%
kinds = ["split_heads", "sdpa_causal", "tiled", "flex"]  # one class per kind of kernel, as the charts colour them

# %% tags=["hide-input"]
for mode in config["modes"]:
    show_markdown(f"**{report.format.MODE_TITLES[mode]}**, B = {config['batch']}, T = {config['seq_len']}\n\n"
                  + report.sequence.results_table(result, mode, labels=kinds))

# %% [markdown]
# Which class is fastest? Rows are timed one after another, on a machine whose speed drifts, so a
# row's median is compared at one machine speed: times the matmul rate timed beside it. Even so,
# the correction is an estimate of a few percent, so one class is named the fastest only where it
# leads by both the raw and the corrected medians, each time by more than both rows' interquartile
# range; otherwise the table says "a ≈ b". Every class competes here:

# %% tags=["hide-input"]
show_markdown(report.sequence.fastest_table(result))

# %% [markdown]
# ## Against sequence length
#
# Time and memory of one call, log-log. A class that builds the `(T, T)` score matrix needs
# memory that grows like T² once the scores outweigh the fixed costs (weights, inputs); a fused
# kernel (SDPA's flash kernel, FlexAttention's forward) works through blocks of keys and needs
# memory like T. The growth from the two longest lengths, read from the rows:

# %%
peaks = {(r["label"], r["seq_len"]): r["peak_memory_bytes"] for r in report.sequence.sweep_rows(result, "forward")
         if r["status"] == "ok"}
shorter, longest = config["seq_lens"][-2:]
growth = {label: (peaks[label, shorter], peaks[label, longest]) for label in kinds
          if (label, shorter) in peaks and (label, longest) in peaks}

# %% tags=["hide-input"]
show(report.sequence.plot_time_vs_seq_len(result, "forward"))
show(report.sequence.plot_memory_vs_seq_len(result, "forward"))
show_markdown(prose.memory_growth_sentence("this run", shorter, longest, growth))

# %% [markdown]
# ## Is the share stable?
#
# A share of the matmul rate is only useful if it moves with the code, not with the machine. On a
# shared host the machine's speed drifts during a half-hour run, so a yardstick timed minutes away
# from a row (the run-level rate: the median of matmul samples taken at the start and after each
# shape) moves every share with it; the paired yardstick is timed in the same minute as the row.
# The default profile was recorded twice with the same sources on the same machine, with a
# bfloat16 run in between (both files are kept in `docs/results/repeats/`):

# %%
repeats = ["cpu-intel-xeon-2c-float32-run1.json", "cpu-intel-xeon-2c-float32-repeat.json"]
first, second = (report.load_result(report.RESULTS_DIR / "repeats" / name) for name in repeats)

# %% tags=["hide-input"]
show_markdown(report.compare.share_stability_section(first, second, repeats, kinds))

# %% [markdown]
# Each row's time is measured once per run, so a class whose own time moved between runs (other
# work on the machine during its blocks, which the yardstick beside it did not see) still moves;
# the CPU-share line of each run's provenance flags rows measured on a contended CPU.
#
# ## bfloat16 on a CPU
#
# Whether bfloat16 makes a CPU faster depends first on whether the CPU can multiply bfloat16
# numbers: Intel's AMX tile units (Sapphire Rapids and later) and AVX-512 BF16 do; a CPU with
# neither widens each bfloat16 number to float32 before it multiplies. To see why some classes
# gain and others lose, time the pieces every class is made of, in both dtypes, at batch 1 and the
# quick run's headline length, on the machine building this page: the projections, the attention
# core through SDPA's fused kernel, and the four steps of the written-out core.

# %%
B, T, C, H = 1, config["seq_len"], config["d_model"], config["num_heads"]
MATMUL_SIZE = 1024  # the yardstick's kind of matmul
causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = attend


def time_ms(call):
    """Median ms of `call()`; a call that takes over a second (bfloat16 without hardware support) is timed once."""
    started = time.perf_counter()
    call()
    first_s = time.perf_counter() - started
    if first_s > 1.0:
        return first_s * 1e3
    return metrics.time_callable(call, "cpu", metrics.Timing(0.3, 3, 0.05), warm=(first_s, first_s))["ms_median"]


ms = {}
for dtype in (torch.float32, torch.bfloat16):
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator).to(dtype) for _ in range(2))
    x = torch.randn(B * T, C, generator=generator).to(dtype)  # (B·T, C)
    w_qkv = torch.randn(C, 3 * C, generator=generator).to(dtype)  # (C, 3C)
    q, k, v = (torch.randn(B, H, T, C // H, generator=generator).to(dtype) for _ in range(3))  # (B, H, T, D)
    scores = torch.randn(B, H, T, T, generator=generator).to(dtype)  # (B, H, T, T)
    pieces = {"matmul": lambda: a @ b,
              "projections": lambda: x @ w_qkv,  # (B·T, 3C)
              "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),  # (B, H, T, D)
              "scores": lambda: q @ k.transpose(-2, -1),  # (B, H, T, T)
              "mask": lambda: scores.masked_fill(~causal, float("-inf")),
              "softmax": lambda: torch.softmax(scores, dim=-1),
              "weights_v": lambda: scores @ v}  # (B, H, T, D)
    for piece, call in pieces.items():  # timed now: the lambdas read this iteration's tensors
        ms.setdefault(piece, []).append(time_ms(call))

# %% tags=["hide-input"]
show_markdown(report.compare.bf16_pieces_section(ms, MATMUL_SIZE, cpu_name(), cpu_flags()))

# %% [markdown]
# The recorded runs, measured on another CPU, compare every class in both dtypes on the
# [Benchmarks](../../benchmarks/#bfloat16-against-float32) page. To see how your CPU fares, run the
# benchmark in both dtypes and [add the files](../../add-your-device/).
