"""MkDocs hook: the benchmark results on the Benchmarks page and the home page.

* `on_pre_build` runs the benchmark's quick profile on this machine's CPU
  (`python -m attention.bench --quick --device cpu`), so the "CPU, this build" tab shows numbers
  measured by the very build that publishes them. `mkdocs build` (CI) always measures afresh and
  keeps the run in `.cache/bench/`, named after a hash of the `attention/` sources. `mkdocs serve`
  never measures (it would hold back the first page by a minute and a half): it reuses that cached
  run while the sources are unchanged, and otherwise leaves the tab empty with the command that
  fills it. The path of the run is exported as `ATTENTION_BENCH_QUICK_RESULT` so
  `examples/benchmark.py`, executed later in the same build, renders the same run instead of timing
  a second one (under serve without a run: the newest recorded CPU run, which the page says).
* `on_files` draws the charts (matplotlib, PNG at twice their on-page size, for high-density
  screens) of that run and of every recorded results file in `docs/results/` and adds them to the
  site as generated files.
* `on_page_markdown` replaces `<!-- benchmark-tabs -->` in `benchmarks.md` with one content tab per
  device (CPU this build, CPU recorded, NVIDIA CUDA, Apple MPS), each with its provenance, tables
  and charts, and `<!-- headline-charts -->` in `index.md` with one headline chart per device.
  A device with no recorded run says how to produce one. It also replaces `<!-- row-fields -->` in
  `benchmark-schema.md` with the table of the result rows' fields, written from their type.
"""

import logging
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.benchmarks")

# `import attention` reaches torch's inductor, which imports a module built on the deprecated
# `torch.jit.script_method`; mkdocs would print that DeprecationWarning with a stack trace on every
# build, and a reader can do nothing about it.
warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning)

QUICK_TIMEOUT_S = 15 * 60
ENV_VAR = "ATTENTION_BENCH_QUICK_RESULT"
ASSETS = "assets/benchmarks"
# The command that records a default-profile run, per device type: shown on the Benchmarks page (tabs
# without a run) and on "Add your device". Each runs as written; rename the file after your device.
RECORD_COMMANDS = {
    "cuda": "python -m attention.bench --device cuda --dtype bfloat16 --mode both --compile "
            "--out docs/results/cuda-my-gpu-bfloat16.json",
    "mps": "python -m attention.bench --device mps --dtype float32 --mode both --out docs/results/mps-my-mac-float32.json",
    "cpu": "python -m attention.bench --device cpu --dtype float32 --mode both --out docs/results/cpu-my-cpu-float32.json",
}
DEVICES = {  # device type -> tab title and the command that records a run
    "cuda": ("NVIDIA CUDA", RECORD_COMMANDS["cuda"]),
    "mps": ("Apple MPS", RECORD_COMMANDS["mps"]),
}
RECORD_TITLES = {"cuda": "NVIDIA GPU", "mps": "Apple silicon (MPS)", "cpu": "CPU"}

state = {"command": "build", "build_result": None, "recorded": [], "charts": {}}


def on_startup(command, dirty):
    state["command"] = command


def project_root(config):
    return pathlib.Path(config.config_file_path).resolve().parent


def run_quick_benchmark(root, out):
    """Run the quick profile into `out`: measured into a temporary folder (the command recorded in the
    provenance names that file), then copied in and renamed, so a parallel build never reads half a file."""
    measured = pathlib.Path(tempfile.mkdtemp(prefix="attention-bench-")) / "cpu-quick.json"
    command = [sys.executable, "-m", "attention.bench", "--quick", "--device", "cpu", "--out", str(measured)]
    log.info("running the quick benchmark for the CPU tab: %s", " ".join(command[1:]))
    started = time.perf_counter()
    try:
        finished = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        raise PluginError(f"the quick benchmark ran past {QUICK_TIMEOUT_S} s") from error
    if finished.returncode != 0:
        raise PluginError(f"the quick benchmark failed:\n{finished.stderr[-4000:]}")
    partial = out.with_name(f"{out.stem}.{os.getpid()}.partial")
    shutil.copyfile(measured, partial)
    partial.replace(out)
    shutil.rmtree(measured.parent, ignore_errors=True)
    log.info("quick benchmark done in %.0f s", time.perf_counter() - started)


def on_pre_build(config):
    from attention.bench import render, source_hash

    root = project_root(config)
    results_dir = root / "docs" / "results"
    # Every file there is checked, readable or not: a file the pages cannot show honestly fails the build,
    # with the words of `python -m attention.bench --validate`.
    # (Files in subfolders, such as repeats/, are read by example pages rather than shown in tabs.)
    checked = {path: render.check_file(path) for path in sorted(results_dir.rglob("*.json"))}
    invalid = [render.check_report(path.relative_to(root).as_posix(), verdict) for path, verdict in checked.items()
               if verdict["problems"]]
    if invalid:
        raise PluginError("results files that are not valid (python -m attention.bench --validate FILE):\n"
                          + "\n".join(invalid))
    recorded = [(path, checked[path]["result"]) for path in render.find_results(results_dir)]
    # Full default-profile runs first, float32 before other dtypes (newest first within each group): the
    # headline charts and the short answer read the first run of each device.
    state["recorded"] = sorted(recorded, key=lambda item: (item[1]["config"].get("profile") != "default",
                                                           item[1]["dtype"] != "float32"))
    # Long-profile runs (`--profile long`) live in docs/results/long/ and have their own section; so do
    # decode-profile runs (`--profile decode`), in docs/results/decode/.
    state["long"] = [(path, checked[path]["result"]) for path in render.find_results(results_dir / "long")]
    state["decode"] = [(path, checked[path]["result"]) for path in render.find_results(results_dir / "decode")]
    out = root / ".cache" / "bench" / f"cpu-quick-{source_hash()[:16]}.json"
    if state["command"] != "serve":
        out.parent.mkdir(parents=True, exist_ok=True)
        run_quick_benchmark(root, out)
    elif not out.exists():
        log.info("mkdocs serve does not run the quick benchmark and found none for the current sources, so "
                 "the 'CPU, this build' tab stays empty; `mkdocs build` measures one (about 1.5 minutes) "
                 "that serve then reuses until attention/ changes")
        cpu_runs = [(path, result) for path, result in recorded if result["device_type"] == "cpu"]
        state["build_result"] = None
        if cpu_runs:  # the newest by its recorded date (a fresh clone gives every file the same mtime)
            newest, _ = max(cpu_runs, key=lambda item: item[1]["provenance"]["date_utc"])
            os.environ[ENV_VAR] = str(newest)
        return
    os.environ[ENV_VAR] = str(out)
    state["build_result"] = render.load_result(out)


def chart_set(slug, result):
    """The charts of one result as {kind: (uri, alt text, png bytes, width in CSS pixels)}."""
    from attention.bench import render

    device = result["provenance"]["device"]["name"]
    charts = {"bars": (render.plot_bars(result), f"median time per implementation at the headline shape, {device}"),
              "share": (render.plot_share(result), f"share of the matmul rate per implementation at the headline "
                                                   f"shape, {device}")}
    if render.sweep_rows(result, "forward"):
        charts["time"] = (render.plot_time_vs_seq_len(result, "forward"), f"forward time against sequence length, {device}")
        charts["memory"] = (render.plot_memory_vs_seq_len(result, "forward"), f"forward peak memory against sequence length, {device}")
    if render.sweep_rows(result, "forward_backward"):
        charts["time_fb"] = (render.plot_time_vs_seq_len(result, "forward_backward"),
                             f"forward + backward time against sequence length, {device}")
    return chart_files(slug, charts)


def chart_files(slug, charts):
    """`{kind: (fig, alt)}` drawn to PNG: {kind: (uri, alt text, png bytes, width in CSS pixels)}."""
    from attention.plotting import figure_png

    files = {}
    for kind, (fig, alt) in charts.items():
        png, width, _height = figure_png(fig)
        files[kind] = (f"{ASSETS}/{slug}-{kind}.png", alt, png, width)
    return files


def long_chart_set(slug, result):
    """The charts of one long-profile run, as `chart_set` returns them."""
    from attention.bench import render

    device = result["provenance"]["device"]["name"]
    charts = {f"memory-{mode}": (render.plot_memory_vs_seq_len(result, mode),
                                 f"{render.MODE_TITLES[mode]} peak memory against sequence length, {device}")
              for mode in result["config"]["modes"]}
    if render.block_sparse_rows(result):
        charts["block-sparse"] = (render.plot_block_sparse(result),
                                  f"FlexAttention with a BlockMask against SDPA with a dense mask, time against "
                                  f"sequence length per mask pattern, {device}")
    return chart_files(slug, charts)


def long_section():
    """The Benchmarks page's long-context section: every recorded long-profile run."""
    from attention.bench import render

    if not state["long"]:
        return ("No long-profile run is recorded yet: `python -m attention.bench --profile long --out "
                "docs/results/long/<device>-long-float32.json` records one.")
    parts = []
    for path, result in state["long"]:
        charts = state["charts"][f"long-{path.stem}"]
        provenance = provenance_block(result)
        section = result["block_sparse"] or {}
        parts += [f"**`docs/results/long/{path.name}`**: {run_line(result)}",
                  "Peak memory of one call against T, with the growth fitted over T ≥ 2048 (below it the weights' "
                  "gradients and other fixed costs hide the growth):", render.memory_slope_table(result),
                  images({k: v for k, v in charts.items() if k.startswith("memory-")}, ""),
                  render.markdown_tables(result, include_sweep=True),
                  f"Block sparsity, forward, batch {section.get('batch')}, {section.get('num_heads')} heads of "
                  f"{section.get('head_dim')}: where FlexAttention with a `BlockMask` overtakes SDPA with the same "
                  f"mask as a dense boolean tensor, read from the measurements.", render.crossover_table(result),
                  images({k: v for k, v in charts.items() if k == "block-sparse"}, ""),
                  '??? note "Every length, both kernels"\n\n' + textwrap.indent(render.block_sparse_table(result), "    "),
                  provenance]
    return "\n\n".join(part.strip() for part in parts if part.strip())


def decode_chart_set(slug, result):
    """The charts of one decode-profile run, as `chart_set` returns them."""
    from attention.bench import render

    device = result["provenance"]["device"]["name"]
    return chart_files(slug, {
        "tokens": (render.plot_decode(result, "tokens_per_s"), f"decode tokens per second against context, {device}"),
        "share": (render.plot_decode(result, "share_of_paired_bandwidth"),
                  f"decode step's share of the measured read bandwidth against context, {device}")})


def decode_section():
    """The Benchmarks page's decoding section: every recorded decode-profile run."""
    from attention.bench import render

    if not state["decode"]:
        return ("No decode-profile run is recorded yet: `python -m attention.bench --profile decode --out "
                "docs/results/decode/<device>-decode-float32.json` records one.")
    parts = []
    for path, result in state["decode"]:
        charts = state["charts"][f"decode-{path.stem}"]
        config = result["config"]
        parts += [f"**`docs/results/decode/{path.name}`**: {run_line(result)}",
                  f"The fastest kernel per model, {config['num_heads']} query heads of {config['head_dim']} "
                  f"(d_model {config['d_model']}), one attention layer; each cell: tokens per second and the share "
                  f"of the read bandwidth measured beside the row:", render.decode_summary_table(result),
                  images(charts, "")]
        for batch in config["batches"]:
            parts.append(f'??? note "Batch {batch}: every kernel and context"\n\n'
                         + textwrap.indent(render.decode_table(result, batch), "    "))
        parts.append(provenance_block(result))
    return "\n\n".join(part.strip() for part in parts if part.strip())


def on_files(files, config):
    state["charts"] = {"build": chart_set("cpu-build", state["build_result"])} if state["build_result"] else {}
    for path, result in state["recorded"]:
        state["charts"][path.stem] = chart_set(path.stem, result)
    for path, result in state["long"]:
        state["charts"][f"long-{path.stem}"] = long_chart_set(f"long-{path.stem}", result)
    for path, result in state["decode"]:
        state["charts"][f"decode-{path.stem}"] = decode_chart_set(f"decode-{path.stem}", result)
    for charts in state["charts"].values():
        for uri, _alt, png, _width in charts.values():
            files.append(File.generated(config, uri, content=png))
    return files


def images(charts, page_dir):
    """Markdown image lines for one chart set, with links relative to the page's source folder.

    Each image is given its on-page width: the PNG holds twice as many pixels, for high-density screens.
    """
    prefix = "../" * page_dir.count("/") if page_dir else ""
    return "\n\n".join(f'![{alt}]({prefix}{uri}){{ width="{width}" }}' for uri, alt, _png, width in charts.values())


def provenance_block(result):
    """A collapsed admonition with the run's provenance summary."""
    from attention.bench import render

    return '??? info "What this run was measured on"\n\n' + textwrap.indent(render.provenance_summary(result), "    ")


def result_section(title, result, charts):
    from attention.bench import render

    config = result["config"]
    shape = (f"Headline shape: batch {config['batch']}, T = {config['seq_len']} (profile `{config['profile']}`); "
             f"the sweep runs batch {config['sweep_batch']}.")
    provenance = provenance_block(result)
    parts = [f"**{title}**", shape, render.markdown_tables(result, include_sweep=True), images(charts, ""), provenance]
    return "\n\n".join(part.strip() for part in parts if part.strip())


def all_results():
    """(name, result) for this build's quick run (if any) and every recorded run."""
    named = [] if state["build_result"] is None else [("CPU, this build (quick)", state["build_result"])]
    return named + [(f"`{path.name}`", result) for path, result in state["recorded"]]


def run_line(result):
    """What a recorded run is, in one sentence: device, dtype, date, and whether the code has changed since."""
    from attention.bench import render

    return (f"{result['provenance']['device']['name']}, {result['dtype']}, recorded {result['provenance']['date_utc'][:10]}"
            + (" (predates the current code)" if render.is_stale(result) else "") + ".")


def fastest_section():
    from attention.bench import render

    results = all_results()
    parts = [render.devices_line(results)]
    for name, result in results:
        parts.append(f"**{name}**: {run_line(result)}\n\n" + render.fastest_table(result))
    parts.append("Only classes that compute multi-head attention compete here. Grouped-query and multi-query rows "
                 "(fewer K/V heads: another model, with smaller key and value projections) appear in the full tables "
                 "and on the [grouped-query page](examples/gqa.py#prefill-and-training-measured).")
    parts.append("Tied: the row's interquartile range overlaps the fastest's, so the run cannot tell them apart. "
                 "Rows are measured one after another, so on a machine whose speed drifts, gaps of a few percent "
                 "are within the noise too.")
    return "\n\n".join(parts)


def short_answer():
    """Home's recommendation, read from the recorded default-profile runs (never typed in): per device and
    dtype, the fastest correct class at the headline shape in each mode."""
    from attention.bench import render

    blocks = []
    for path, result in sorted(state["recorded"], key=lambda item: item[1]["dtype"] != "float32"):
        if result["config"]["profile"] != "default":
            continue
        device, config = result["provenance"]["device"]["name"], result["config"]
        lines = []
        for entry in render.fastest(result):
            if (entry["batch"], entry["seq_len"], entry["compiled"]) != (config["batch"], config["seq_len"], False):
                continue
            tied = ", ".join(f"`{r['label']}`" for r in entry["tied"])
            after = entry["next"]
            lines.append(f"{render.MODE_TITLES[entry['mode']]}: `{entry['fastest']['label']}` "
                         f"({render.number(entry['fastest']['ms_median'])} ms)"
                         + (f", tied with {tied}" if tied else "")
                         + (f"; next `{after['label']}`, {render.slower_by(after, entry['fastest'])[1:]} slower"
                            if after else ""))
        if lines:
            # Indented to stay inside the admonition that holds the placeholder.
            blocks.append(f"On {device} in {result['dtype']} (B={config['batch']}, T={config['seq_len']}, recorded "
                          f"{result['provenance']['date_utc'][:10]}):\n\n" + "\n".join(f"    * {line}" for line in lines))
    if not blocks:
        return "No default-profile run is recorded yet; see [Benchmarks](benchmarks.md)."
    return "\n\n    ".join(blocks)


def dtype_section():
    """bfloat16 against float32 for every device with recorded runs of one profile in both dtypes."""
    from attention.bench import render

    pairs = render.dtype_pairs(state["recorded"])
    if not pairs:
        return "No device has recorded runs in both float32 and bfloat16 yet."
    parts = []
    for fp32, bf16 in pairs:
        parts += [f"**{fp32['provenance']['device']['name']}** ({fp32['config']['profile']} profile; float32 "
                  f"recorded {fp32['provenance']['date_utc'][:10]}, bfloat16 {bf16['provenance']['date_utc'][:10]}). "
                  + render.dtype_comparison_table(fp32, bf16)]
        parts += [render.dtype_verdict(fp32, bf16, mode) for mode in render.dtype_comparison(fp32, bf16)["modes"]]
    parts.append("Why, measured piece by piece (the projections' matmuls, the attention core, the softmax): "
                 "[bfloat16 on this CPU](examples/benchmark.py#bfloat16-on-this-cpu).")
    return "\n\n".join(parts)


def tab(title, body):
    return f'=== "{title}"\n\n' + textwrap.indent(body, "    ") + "\n"


NOT_MEASURED = ("Not measured: `mkdocs serve` found no quick run for the current sources and does not run one "
                "itself. `mkdocs build` measures it (about 1.5 minutes on 2 cores); serve then reuses that run "
                "until `attention/` changes.")


def run_title(path, result):
    """A recorded run's tab title: its dtype and profile, then the file."""
    return f"{result['dtype']}, {result['config']['profile']} profile ({path.name})"


def device_tab(title, runs):
    """One device type's tab: its only run, or one nested tab per results file."""
    if len(runs) == 1:
        path, result = runs[0]
        return tab(title, result_section(f"`docs/results/{path.name}`", result, state["charts"][path.stem]))
    return tab(title, "\n".join(tab(run_title(path, result), result_section(f"`docs/results/{path.name}`", result,
                                                                          state["charts"][path.stem]))
                                for path, result in runs))


def benchmark_tabs():
    """A tab for the build's quick run, then one per device type with a tab per results file in it; every
    valid file in docs/results/ appears, whatever its device, with no code change."""
    recorded = state["recorded"]
    if state["build_result"] is None:
        tabs = [tab("CPU, this build", NOT_MEASURED)]
    else:
        tabs = [tab("CPU, this build", result_section(
            "Measured while this site was built (quick profile).", state["build_result"], state["charts"]["build"]))]
    by_type = {}
    for path, result in recorded:
        by_type.setdefault(result["device_type"], []).append((path, result))
    titles = {"cpu": "CPU, recorded", **{device_type: title for device_type, (title, _) in DEVICES.items()}}
    for device_type in dict.fromkeys(["cpu", *DEVICES, *by_type]):
        runs = by_type.get(device_type)
        title = titles.get(device_type, device_type.upper())
        if runs:
            tabs.append(device_tab(title, runs))
        elif device_type in DEVICES:
            command = DEVICES[device_type][1]
            tabs.append(tab(title, f"No {title} run has been recorded yet. On a machine with one, run\n\n"
                                   f"```bash\n{command}\n```\n\nand commit the JSON file under `docs/results/`: "
                                   "this tab then shows it, with its provenance."))
    return "\n".join(tabs)


def headline_charts():
    """One tab per device with a bar chart at the headline shape (the build's run, then recorded runs)."""
    from attention.bench import render

    build = state["build_result"]
    if build is None:
        tabs = [tab("CPU, this build", NOT_MEASURED)]
    else:
        tabs = [tab("CPU, this build", f"{build['provenance']['device']['name']}, quick profile, {build['dtype']}.\n\n"
                    + images({"bars": state["charts"]["build"]["bars"]}, ""))]
    for device_type, (title, _command) in {"cpu": ("CPU, recorded", None), **DEVICES}.items():
        runs = [(path, result) for path, result in state["recorded"] if result["device_type"] == device_type]
        if runs:
            path, result = runs[0]
            tabs.append(tab(title, f"{run_line(result)}\n\n" + images({"bars": state["charts"][path.stem]["bars"]}, "")))
        elif device_type != "cpu":
            tabs.append(tab(title, f"No recorded run yet: see [Benchmarks](benchmarks.md) for how to make one."))
    return "\n".join(tabs) + "\nFull tables, sweeps and provenance: [Benchmarks](benchmarks.md).\n"


def record_commands():
    """Content tabs with the command that records a run on each device type."""
    # The file name on a line of its own (a shell line continuation), so a phone shows it without scrolling.
    return "\n".join(tab(RECORD_TITLES[device_type], "```bash\n" + command.replace(" --out ", " \\\n    --out ")
                          + "\n```\n") for device_type, command in RECORD_COMMANDS.items())


def record_duration():
    """How long the recorded default-profile runs took, read from their provenance."""
    runs = [result for _, result in state["recorded"] if result["config"]["profile"] == "default"]
    if not runs:
        return ""
    spans = "; ".join(f"{result['provenance']['device']['name']}, {result['dtype']}: "
                      f"{result['provenance']['duration_s'] / 60:.0f} minutes" for result in runs)
    return f"The default-profile runs recorded for this site took: {spans}."


def validate_example():
    """`python -m attention.bench --validate` run on each recorded file, as the reader would see it."""
    from attention.bench import render

    reports = [render.check_report(f"docs/results/{path.name}", render.check_file(path)) for path, _ in state["recorded"]]
    return "```text\n" + "\n".join(reports) + "\n```"


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "add-your-device.md":
        return (markdown.replace("<!-- record-commands -->", record_commands())
                .replace("<!-- record-duration -->", record_duration())
                .replace("<!-- validate-example -->", validate_example()))
    if page.file.src_uri == "benchmark-schema.md":
        from attention.bench import render

        return (markdown.replace("<!-- row-fields -->", render.row_fields_table())
                .replace("<!-- block-sparse-fields -->", render.block_sparse_fields_table())
                .replace("<!-- decode-fields -->", render.decode_fields_table()))
    if page.file.src_uri == "benchmarks.md":
        return (markdown.replace("<!-- benchmark-tabs -->", benchmark_tabs()).replace("<!-- fastest -->", fastest_section())
                .replace("<!-- dtype-comparison -->", dtype_section()).replace("<!-- long-context -->", long_section())
                .replace("<!-- decode -->", decode_section()))
    if page.file.src_uri == "index.md":
        return (markdown.replace("<!-- headline-charts -->", headline_charts())
                .replace("<!-- short-answer -->", short_answer()))
    return markdown
