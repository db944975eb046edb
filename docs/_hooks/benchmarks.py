"""MkDocs hook: the benchmark's results on the Benchmarks, home, "Add your device" and schema pages.

* `on_pre_build` validates every file under `docs/results/` (one that is not valid fails the build, in the
  words of `python -m attention.bench --validate`), reads the runs of each folder, and runs the quick
  profile on this machine's CPU, so the "CPU, this build" tab shows numbers measured by the build that
  publishes them. `mkdocs build` always measures, keeping the run in `.cache/bench/` under a hash of the
  `attention/` sources; `mkdocs serve` never measures: it reuses that run while the sources are unchanged,
  else shows the newest recorded CPU run in that tab and says so. The run's path goes to
  `examples/benchmark.py` in `ATTENTION_BENCH_QUICK_RESULT`, so that page shows the same run.
* `on_files` draws each run's charts (its sweeps' `charts`, PNG at twice their on-page size).
* `on_page_markdown` fills the placeholders: on `benchmarks.md` `<!-- benchmark-tabs -->` (a tab per device
  type, a nested tab per results file), `<!-- fastest -->`, `<!-- dtype-comparison -->` and
  `<!-- runs: NAME -->` (the runs in `docs/results/NAME/`); on `index.md` `<!-- headline-charts -->` and
  `<!-- short-answer -->`; on `add-your-device.md` the commands, durations and a validator's verdict; on
  `benchmark-schema.md` `<!-- fields: SWEEP -->`, each sweep's row fields from its `Row`.
Every string from a results file reaches the page escaped (`results.escaped`, applied when a file is read).
"""

import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.benchmarks")
# `import attention` reaches inductor, which imports a module built on the deprecated `torch.jit.script_method`.
warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning)

QUICK_TIMEOUT_S = 15 * 60
ENV_VAR = "ATTENTION_BENCH_QUICK_RESULT"
ASSETS = "assets/benchmarks"
# Device type -> (its tab, its title on "Add your device", the command that records a default-profile run).
DEVICES = {
    "cpu": ("CPU, recorded", "CPU", "python -m attention.bench --device cpu --dtype float32 --mode both "
                                    "--out docs/results/cpu-my-cpu-float32.json"),
    "cuda": ("NVIDIA CUDA", "NVIDIA GPU", "python -m attention.bench --device cuda --dtype bfloat16 --mode both "
                                          "--compile --out docs/results/cuda-my-gpu-bfloat16.json"),
    "mps": ("Apple MPS", "Apple silicon (MPS)", "python -m attention.bench --device mps --dtype float32 --mode both "
                                                "--out docs/results/mps-my-mac-float32.json"),
}
RECORD_COMMANDS = {kind: command for kind, (_, _, command) in DEVICES.items()}
RECORD_TITLES = {kind: title for kind, (_, title, _) in DEVICES.items()}
NOT_MEASURED = ("Not measured by this preview: `mkdocs serve` runs no benchmark, and found no quick run for the "
                "current sources (`mkdocs build` measures one, which serve then reuses until `attention/` changes).")

state = {"command": "build", "build_result": None, "recorded": [], "runs": {}, "charts": {}}


def on_startup(command, dirty):
    state["command"] = command


def run_quick_benchmark(root, out):
    """Run the quick profile into `out`, measured into a temporary folder, then moved in whole."""
    measured = pathlib.Path(tempfile.mkdtemp(prefix="attention-bench-")) / "cpu-quick.json"
    command = [sys.executable, "-m", "attention.bench", "--quick", "--device", "cpu", "--out", str(measured)]
    log.info("running the quick benchmark for the CPU tab: %s", " ".join(command[1:]))
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


def on_pre_build(config):
    from attention.bench import render, source_hash
    from attention.bench.results import escaped

    root = pathlib.Path(config.config_file_path).resolve().parent
    results_dir = root / "docs" / "results"
    checked = {path: render.check_file(path) for path in sorted(results_dir.rglob("*.json"))}
    invalid = [render.check_report(path.relative_to(root).as_posix(), verdict) for path, verdict in checked.items()
               if verdict["problems"]]
    if invalid:
        raise PluginError("results files that are not valid (python -m attention.bench --validate FILE):\n"
                          + "\n".join(invalid))
    for folder in [results_dir, *(path for path in results_dir.iterdir() if path.is_dir())]:
        # Default-profile runs first, float32 before other dtypes, newest first within each: tabs and charts read so.
        runs = [(path, escaped(checked[path]["result"])) for path in render.find_results(folder)]
        state["runs"][folder.relative_to(results_dir).as_posix()] = sorted(
            runs, key=lambda run: (run[1]["profile"] != "default", run[1]["dtype"] != "float32"))
    state["recorded"] = state["runs"]["."]
    out = root / ".cache" / "bench" / f"cpu-quick-{source_hash()[:16]}.json"
    if state["command"] != "serve":
        out.parent.mkdir(parents=True, exist_ok=True)
        run_quick_benchmark(root, out)
    elif not out.exists():
        log.info("mkdocs serve runs no benchmark and found none for the current sources: the 'CPU, this build' tab "
                 "shows the newest recorded CPU run; `mkdocs build` measures one that serve then reuses")
        state["build_result"] = None
        cpu = [(path, result) for path, result in state["recorded"] if result["device_type"] == "cpu"]
        if cpu:  # the newest by its recorded date (a fresh clone gives every file the same mtime)
            os.environ[ENV_VAR] = str(max(cpu, key=lambda run: run[1]["provenance"]["date_utc"])[0])
        return
    os.environ[ENV_VAR] = str(out)
    state["build_result"] = render.load_result(out)


def sweeps_of(result):
    from attention.bench import SWEEPS
    from attention.bench.results import section

    return {name: sweep for name, sweep in SWEEPS.items() if section(result, name) is not None}


def chart_set(slug, result):
    """Every chart of one run: `{sweep: {kind: (uri, alt text, png bytes, width in CSS pixels)}}`."""
    from attention.plotting import figure_png

    charts = {}
    for name, sweep in sweeps_of(result).items():
        for kind, (figure, alt) in sweep.charts(result).items():
            png, width, _height = figure_png(figure)
            charts.setdefault(name, {})[kind] = (f"{ASSETS}/{slug}-{name}-{kind}.png", alt, png, width)
    return charts


def on_files(files, config):
    state["charts"] = {"build": chart_set("cpu-build", state["build_result"])} if state["build_result"] else {}
    for folder, runs in state["runs"].items():
        for path, result in runs:
            state["charts"][slug(folder, path)] = chart_set(slug(folder, path), result)
    for charts in state["charts"].values():
        for uri, _alt, png, _width in (chart for kinds in charts.values() for chart in kinds.values()):
            files.append(File.generated(config, uri, content=png))
    return files


def slug(folder, path):
    return path.stem if folder == "." else f"{folder}-{path.stem}"


def images(charts):
    """`{kind: Markdown image}` of one sweep's charts, each at its on-page width (the PNG holds twice the pixels)."""
    return {kind: f'![{alt}]({uri}){{ width="{width}" }}' for kind, (uri, alt, _png, width) in charts.items()}


def run_body(result, charts, heading=""):
    """One run on a page: its sweeps' sections, then what it was measured on (collapsed)."""
    from attention.bench import render

    sections = [sweep.page(result, images(charts.get(name, {}))) for name, sweep in sweeps_of(result).items()]
    return "\n\n".join([heading, render.run_line(result), *sections, collapsed(
        "What this run was measured on", render.provenance_summary(result), "info")]).strip()


def collapsed(title, body, kind="note"):
    from attention.bench.format import collapsed as block

    return block(title, body, kind)


def tab(title, body):
    return f'=== "{title}"\n\n' + textwrap.indent(body, "    ") + "\n"


def runs_section(folder):
    """The runs recorded in `docs/results/<folder>/`, each with its sweeps' sections and provenance."""
    runs = state["runs"].get(folder)
    if not runs:
        return (f"No run is recorded in `docs/results/{folder}/` yet: `python -m attention.bench --profile {folder} "
                f"--out docs/results/{folder}/<device>-{folder}-float32.json` records one.")
    return "\n\n".join(run_body(result, state["charts"][slug(folder, path)], f"**`docs/results/{folder}/{path.name}`**")
                       for path, result in runs)


def benchmark_tabs():
    """A tab for the build's quick run, then one per device type with a nested tab per results file; every valid
    file in docs/results/ appears, whatever its device, with no code change."""
    from attention.bench.format import device_label

    if state["build_result"] is not None:
        tabs = [tab("CPU, this build", run_body(state["build_result"], state["charts"]["build"],
                                                "Measured while this site was built (quick profile)."))]
    else:
        cpu = [(path, result) for path, result in state["recorded"] if result["device_type"] == "cpu"]
        newest = max(cpu, key=lambda run: run[1]["provenance"]["date_utc"], default=None)
        tabs = [tab("CPU, this build", NOT_MEASURED + ("" if newest is None else f" Shown instead: the newest "
                    f"recorded CPU run.\n\n" + run_body(newest[1], state["charts"][newest[0].stem],
                                                       f"**`docs/results/{newest[0].name}`**")))]
    by_type = {}
    for path, result in state["recorded"]:
        by_type.setdefault(result["device_type"], []).append((path, result))
    for kind in dict.fromkeys([*DEVICES, *by_type]):
        title, _, command = DEVICES.get(kind, (kind.upper(), None, None))
        bodies = [(f"{device_label(r['provenance']['device'])}, {r['dtype']}, {r['profile']} profile",
                   run_body(r, state["charts"][path.stem], f"**`docs/results/{path.name}`**"))
                  for path, r in by_type.get(kind, [])]
        if len(bodies) == 1:
            tabs.append(tab(title, bodies[0][1]))
        elif bodies:
            tabs.append(tab(title, "\n".join(tab(*body) for body in bodies)))
        elif command:
            tabs.append(tab(title, f"No {title} run has been recorded yet. On a machine with one, run\n\n```bash\n"
                                   f"{command}\n```\n\nand commit the JSON file under `docs/results/`: this tab then "
                                   "shows it, with its provenance."))
    return "\n".join(tabs)


def all_results():
    """(name, result) for this build's quick run (if any) and every recorded run of the main folder."""
    named = [] if state["build_result"] is None else [("CPU, this build (quick)", state["build_result"])]
    return named + [(f"`{path.name}`", result) for path, result in state["recorded"]]


def fastest_section():
    from attention.bench import render

    parts = [render.devices_line(all_results())]
    for index, (name, result) in enumerate(all_results()):
        body = f"{render.run_line(result)}\n\n{render.fastest_table(result)}"
        parts.append(collapsed(f"{name}: {render.device_label(result['provenance']['device'])}, {result['dtype']}, "
                               f"{result['profile']} profile", body).replace("???", "???+" if index == 0 else "???", 1))
    parts.append("Ranked by the median time corrected for the machine's drift: each row's median times the matmul "
                 "rate timed beside it (the paired yardstick), so rows timed minutes apart compare as at one machine "
                 "speed. Tied: the row's interquartile range, corrected the same way, overlaps the fastest's, so the "
                 "run cannot tell them apart; at small shapes (B=1, short T) most rows tie, and the order among them "
                 "is noise. Only classes that compute multi-head attention compete here: grouped-query and "
                 "multi-query rows (fewer K/V heads, another model) are in the full tables and on the "
                 "[grouped-query page](examples/gqa.py#prefill-and-training-measured).")
    return "\n\n".join(parts)


def short_answer():
    """Home's recommendation, read from the recorded default-profile runs: per device and dtype, the fastest
    correct class at the headline shape in each mode, with the classes tied with it."""
    from attention.bench import render

    blocks = []
    for _, result in state["recorded"]:
        config = result["config"]
        lines = [f"{render.MODE_TITLES[entry['mode']]}: `{entry['fastest']['label']}` "
                 f"({render.number(entry['fastest']['ms_median'])} ms)"
                 + (", tied with " + ", ".join(f"`{r['label']}`" for r in entry["tied"]) if entry["tied"] else "")
                 + (f"; next `{entry['next']['label']}`, {render.slower_by(entry['next'], entry['fastest'])[1:]} "
                    "slower" if entry["next"] else "")
                 for entry in render.fastest(result) if result["profile"] == "default"
                 and (entry["batch"], entry["seq_len"], entry["compiled"]) == (config["batch"], config["seq_len"], False)]
        if lines:  # indented to stay inside the admonition that holds the placeholder
            blocks.append(f"On {render.device_label(result['provenance']['device'])} in {result['dtype']} "
                          f"(B={config['batch']}, T={config['seq_len']}, recorded {result['provenance']['date_utc'][:10]}"
                          + (", predates the current code" if render.is_stale(result) else "") + "):\n\n"
                          + "\n".join(f"    * {line}" for line in lines))
    return "\n\n    ".join(blocks) or "No default-profile run is recorded yet; see [Benchmarks](benchmarks.md)."


def dtype_section():
    """bfloat16 against float32 for every device (by identity) with recorded runs of one profile in both dtypes."""
    from attention.bench import render

    parts = []
    for fp32, bf16 in render.dtype_pairs(state["recorded"]):
        parts += [f"**{render.device_label(fp32['provenance']['device'])}** ({fp32['profile']} profile; float32 recorded "
                  f"{fp32['provenance']['date_utc'][:10]}, bfloat16 {bf16['provenance']['date_utc'][:10]}). "
                  + render.dtype_comparison_table(fp32, bf16)]
        parts += [render.dtype_verdict(fp32, bf16, mode) for mode in render.dtype_comparison(fp32, bf16)["modes"]]
    if not parts:
        return "No device has recorded runs in both float32 and bfloat16 yet."
    return "\n\n".join(parts + ["Why, measured piece by piece (the projections' matmuls, the attention core, the "
                                "softmax): [bfloat16 on this CPU](examples/benchmark.py#bfloat16-on-this-cpu)."])


def headline_charts():
    """One tab per device type with the bar chart at the headline shape (the build's run, then recorded runs)."""
    from attention.bench import render

    build = state["build_result"]
    tabs = [tab("CPU, this build", NOT_MEASURED if build is None else f"{render.run_line(build)}\n\n"
                + images(state["charts"]["build"]["sequence"])["bars"])]
    for kind, (title, _, _) in DEVICES.items():
        runs = [(path, result) for path, result in state["recorded"] if result["device_type"] == kind]
        if runs:
            tabs.append(tab(title, f"{render.run_line(runs[0][1])}\n\n"
                            + images(state["charts"][runs[0][0].stem]["sequence"])["bars"]))
        elif kind != "cpu":
            tabs.append(tab(title, "No recorded run yet: see [Benchmarks](benchmarks.md) for how to make one."))
    return "\n".join(tabs) + "\nFull tables, sweeps and provenance: [Benchmarks](benchmarks.md).\n"


def add_your_device(markdown):
    from attention.bench import profiles, render

    commands = "\n".join(tab(RECORD_TITLES[kind], "```bash\n" + command.replace(" --out ", " \\\n    --out ") + "\n```\n")
                         for kind, command in RECORD_COMMANDS.items())  # the file on a line of its own, for phones
    verdicts = "\n".join(render.check_report(f"docs/results/{path.name}", render.check_file(path))
                         for path, _ in state["recorded"])
    return (markdown.replace("<!-- record-commands -->", commands)
            .replace("<!-- record-duration -->", f"The runs recorded for this site took: {profiles.recorded_durations()}.")
            .replace("<!-- validate-example -->", f"```text\n{verdicts}\n```"))


def on_page_markdown(markdown, page, config, files):
    from attention.bench import SWEEPS
    from attention.bench.results import fields_table

    if page.file.src_uri == "add-your-device.md":
        return add_your_device(markdown)
    if page.file.src_uri == "benchmark-schema.md":
        return re.sub(r"<!-- fields: (\w+) -->", lambda match: fields_table(SWEEPS[match[1]].Row), markdown)
    if page.file.src_uri == "benchmarks.md":
        markdown = re.sub(r"<!-- runs: ([\w-]+) -->", lambda match: runs_section(match[1]), markdown)
        return (markdown.replace("<!-- benchmark-tabs -->", benchmark_tabs()).replace("<!-- fastest -->", fastest_section())
                .replace("<!-- dtype-comparison -->", dtype_section()))
    if page.file.src_uri == "index.md":
        return markdown.replace("<!-- headline-charts -->", headline_charts()).replace("<!-- short-answer -->",
                                                                                      short_answer())
    return markdown
