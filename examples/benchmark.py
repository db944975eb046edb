# %% [markdown]
# # Benchmark
#
# How fast is each implementation, and how far is it from the speed of a plain matrix multiply on
# the same machine? This page runs the benchmark's quick profile while the documentation is built
# (`python -m attention.bench --quick`: GPT-2-small widths, d_model = 768 and 12 heads, batch 1,
# T = 256, 512, 1024, forward and forward + backward), then shows recorded runs from `docs/results/`.
#
# What the harness guarantees for every row (`attention/bench/`, file format in
# `docs/benchmark-schema.md`):
#
# * **The same work.** One set of weights drawn from one seed, loaded into every class through its
#   canonical state dict; one input; one output gradient.
# * **Correct before timed.** The first call's output is compared with the float64 reference
#   (`attention/reference.py`). A mismatch marks the row incorrect and removes it from the ranking.
# * **Honest timing.** Warm-up, device synchronization around each block of calls, median and
#   interquartile range over several blocks; the first call (which includes any compilation, such
#   as FlexAttention's) is reported apart.
# * **A yardstick from the same run.** A dense matmul timed in the same process gives the device's
#   matmul rate; each row's TFLOP/s (useful FLOPs, the same count for every implementation) is
#   shown as a share of it.
# * **Provenance.** Device, versions, git commit, command line and a hash of the sources that ran,
#   so a recorded result says when it predates the current code.
#
# Timings on a shared 2-core machine are noisy: read the ordering and the orders of magnitude,
# not the third digit.

# %%
import os
import time

from attention.bench import quick_config, render, run_benchmark
from attention.display import show, show_markdown

# %% [markdown]
# ## The quick profile, run now
#
# Progress goes to stderr, one line per measurement. On 2 idle CPU cores this takes about a minute,
# FlexAttention's compilations included (the very first one on a fresh machine adds about 15 s).

# %%
# The docs build runs the quick profile once (docs/_hooks/benchmarks.py) and passes its result file
# here through ATTENTION_BENCH_QUICK_RESULT, so this page and the Benchmarks page show the same run.
# (`mkdocs serve` measures nothing: without a cached quick run it passes the newest recorded run.)
# Run as a plain script, this cell measures afresh.
build_result = os.environ.get("ATTENTION_BENCH_QUICK_RESULT")
if build_result:
    result = render.load_result(build_result)
    if result["config"]["profile"] == "quick":
        print(f"the quick run of this docs build: {len(result['rows'])} rows, {result['provenance']['duration_s']} s")
    else:
        print(f"not the quick profile: mkdocs serve found no quick run for the current sources, so this preview "
              f"shows the recorded run {os.path.basename(build_result)} ({result['config']['profile']} profile)")
else:
    started = time.perf_counter()
    result = run_benchmark(quick_config(device="cpu"), progress=False, argv=["python", "-m", "attention.bench", "--quick"])
    print(f"{len(result['rows'])} rows in {time.perf_counter() - started:.0f} s")
show_markdown(render.provenance_summary(result))

# %% [markdown]
# ## Results at T = 1024
#
# Ranked by median time. "% of matmul" divides the row's rate (useful FLOPs: the projections and
# the unmasked half of the attention matmuls, the same count for every implementation) by the rate
# of the square matmul timed in the same run: 100% would turn those FLOPs into time as fast as a
# large matmul does. "peak MiB" is the tensor memory of one call at its worst moment. "SDPA
# backend" names the `scaled_dot_product_attention` kernel the profiler saw run, "n/a" where none
# ran. A note under a table flags rows measured while other processes took the CPU.

# %%
show_markdown(render.markdown_tables(result))

# %%
show(render.plot_bars(result))

# %% [markdown]
# ## Against sequence length
#
# Time and memory of one call, log-log. Implementations that build the `(T, T)` score matrix grow
# like T² in memory; the fused kernels (SDPA's flash kernel, FlexAttention) grow like T.

# %%
show(render.plot_time_vs_seq_len(result, "forward"))

# %%
show(render.plot_memory_vs_seq_len(result, "forward"))

# %%
show_markdown(render.sweep_table(result, "forward", "ms_median"))

# %% [markdown]
# ## Recorded runs
#
# Longer runs, recorded with `python -m attention.bench ... --out docs/results/<device>-<name>.json`,
# are shown per device on the [Benchmarks](../../benchmarks/) page, each with its provenance; a run
# that predates the current sources is marked stale there.

# %%
for path in render.find_results():
    recorded = render.load_result(path)
    print(f"{path.name}: {recorded['provenance']['device']['name']}, {recorded['dtype']}, "
          f"{recorded['provenance']['date_utc']}, stale: {render.is_stale(recorded)}")
