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
# * **A yardstick from the same run.** A dense matmul timed in the same process gives the device's
#   matmul rate; each row's TFLOP/s (useful FLOPs, the same count for every implementation) is
#   shown as a share of it.
# * **Provenance.** Device, versions, git commit, command line and a hash of the sources that ran,
#   so a recorded result says when it predates the current code.
#
# Timings on a shared or small machine are noisy: read the ordering and the orders of magnitude,
# not the third digit.

# %%
import os
import time

from attention.bench import quick_config, render, run_benchmark
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
show_markdown(f"Profile `{result['config']['profile']}`: {render.profile_summary(result['config'])}; modes "
              f"{', '.join(result['config']['modes'])}.")
show_markdown(render.provenance_summary(result))

# %% [markdown]
# ## Results at the headline shape
#
# Ranked by median time. "% of matmul" divides the row's rate (useful FLOPs: the projections and
# the unmasked half of the attention matmuls, the same count for every implementation) by the rate
# of the square matmul timed in the same run: 100% would turn those FLOPs into time as fast as a
# large matmul does. "peak MiB" is the tensor memory of one call at its worst moment. "SDPA
# backend" names the `scaled_dot_product_attention` kernel the profiler saw run, "n/a" where none
# ran. A note under a table flags rows measured while other processes took the CPU.

# %% tags=["hide-input"]
show_markdown(render.markdown_tables(result))

# %% tags=["hide-input"]
show(render.plot_bars(result))

# %% [markdown]
# ## Against sequence length
#
# Time and memory of one call, log-log. Implementations that build the `(T, T)` score matrix grow
# like T² in memory; the fused kernels (SDPA's flash kernel, FlexAttention) grow like T.

# %% tags=["hide-input"]
show(render.plot_time_vs_seq_len(result, "forward"))

# %% tags=["hide-input"]
show(render.plot_memory_vs_seq_len(result, "forward"))

# %% tags=["hide-input"]
show_markdown(render.sweep_table(result, "forward", "ms_median"))

# %% [markdown]
# ## Recorded runs
#
# Longer runs, recorded with `python -m attention.bench ... --out docs/results/<device>-<name>.json`,
# are shown per device on the [Benchmarks](../../benchmarks/) page, each with its provenance; a run
# that predates the current sources is marked stale there.

# %% tags=["hide-input"]
for path in render.find_results():
    recorded = render.load_result(path)
    print(f"{path.name}: {recorded['provenance']['device']['name']}, {recorded['dtype']}, "
          f"{recorded['provenance']['date_utc']}, stale: {render.is_stale(recorded)}")
