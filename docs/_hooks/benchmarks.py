"""MkDocs hook: the benchmark's results on the Benchmarks, home, "Add your device" and schema pages.

`on_pre_build` validates every file under `docs/results/` (an invalid one fails the build in the validator's words),
reads each folder's runs, escaped, and runs the quick profile for the "CPU, this build" tab (`mkdocs build` always,
into `quick_run_path`; `mkdocs serve` reuses it, else shows the newest recorded CPU run and says so);
`examples/benchmark.py` gets the run's path in `ENV_VAR`.
`on_files` draws each run's charts (its sweeps' `charts`); `on_page_markdown` fills the `PLACEHOLDERS`.
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

from attention import bench  # noqa: E402 - after the filter: the import reaches inductor
from attention.bench import SWEEPS  # noqa: E402
from attention.bench.profiles import DTYPES  # noqa: E402
from attention import report  # noqa: E402
from attention.bench.results import fields_table, section  # noqa: E402
from attention.schema import escaped  # noqa: E402

QUICK_TIMEOUT_S, ENV_VAR, ASSETS = 15 * 60, "ATTENTION_BENCH_QUICK_RESULT", "assets/benchmarks"
# Device type -> (its tab, its title on "Add your device", the command that records a default-profile run).
DEVICES = {kind: (label, title, f"python -m attention.bench --device {kind} --dtype {dtype} --mode both{extra} --out "
                              f"docs/results/{kind}-my-{name}-{dtype}.json")
           for kind, label, title, dtype, extra, name in (
               ("cpu", "CPU, recorded", "CPU", "float32", "", "cpu"),
               ("cuda", "NVIDIA CUDA", "NVIDIA GPU", "bfloat16", " --compile", "gpu"),
               ("mps", "Apple MPS", "Apple silicon (MPS)", "float32", "", "mac"))}
NOT_MEASURED = ("Not measured by this preview: `mkdocs serve` runs no benchmark, and found no quick run for the "
                "current sources (`mkdocs build` measures one, which serve then reuses until `attention/` changes).")

state = {"command": "build", "build_result": None, "recorded": [], "runs": {}, "charts": {}}


def on_startup(command, dirty):
    state["command"] = command


def run_quick_benchmark(root, out):  # measured into a temporary folder, then moved in whole
    measured = pathlib.Path(tempfile.mkdtemp(prefix="attention-bench-")) / "cpu-quick.json"
    command = [sys.executable, "-m", "attention.bench", "--quick", "--device", "cpu", "--out", str(measured)]
    log.info("running the quick benchmark for the CPU tab: %s", " ".join(command[1:]))
    try:
        finished = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        raise PluginError(f"the quick benchmark ran past {QUICK_TIMEOUT_S} s") from error
    if finished.returncode != 0:
        raise PluginError(f"the quick benchmark failed:\n{finished.stderr[-4000:]}")
    shutil.copyfile(measured, partial := out.with_name(f"{out.stem}.{os.getpid()}.partial"))
    partial.replace(out)
    shutil.rmtree(measured.parent, ignore_errors=True)


def quick_run_path(root):  # the quick run of these sources: .cache/bench/, under a hash of attention/
    return root / ".cache" / "bench" / f"cpu-quick-{bench.source_hash()[:16]}.json"


def on_pre_build(config):
    root = pathlib.Path(config.config_file_path).resolve().parent
    results_dir = root / "docs" / "results"
    checked = {path: report.check_file(path) for path in sorted(results_dir.rglob("*.json"))}
    invalid = [report.check_report(path.relative_to(root).as_posix(), verdict) for path, verdict in checked.items()
               if verdict["problems"]]
    # The glob does not enter a linked folder, so its files would be shown unchecked: refused, as linked files are.
    invalid += [f"{path.relative_to(root).as_posix()}: NOT valid: a symbolic link to a folder, not read: refused"
                for path in sorted(results_dir.rglob("*")) if path.is_symlink() and path.is_dir()]
    if invalid:
        raise PluginError("results files that are not valid (python -m attention.bench --validate FILE):\n" + "\n".join(invalid))
    shown = re.findall(r"<!-- runs: ([\w-]+) -->", (pathlib.Path(config.docs_dir) / "benchmarks.md").read_text("utf-8"))
    for folder in [results_dir, *(results_dir / name for name in shown if (results_dir / name).is_dir())]:
        runs = [(path, escaped(checked[path]["result"])) for path in report.find_results(folder)]
        state["runs"][folder.relative_to(results_dir).as_posix()] = sorted(
            runs, key=lambda run: (run[1]["profile"] != "default", run[1]["dtype"] != "float32"))
    state["recorded"] = state["runs"]["."]
    out = quick_run_path(root)
    if state["command"] != "serve":
        out.parent.mkdir(parents=True, exist_ok=True)
        run_quick_benchmark(root, out)
    elif not out.exists():
        log.info("mkdocs serve runs no benchmark and found none for these sources: 'CPU, this build' shows the newest "
                 "recorded CPU run; `mkdocs build` measures one that serve then reuses")
        state["build_result"] = None
        os.environ.update({ENV_VAR: str(newest_cpu_run()[0])} if newest_cpu_run() else {})
        return
    os.environ[ENV_VAR] = str(out)
    state["build_result"] = report.load_result(out)


def newest_cpu_run():  # by its recorded date: a clone gives every file one mtime
    cpu = [(path, result) for path, result in state["recorded"] if result["device_type"] == "cpu"]
    return max(cpu, key=lambda run: run[1]["provenance"]["date_utc"], default=None)


def sweeps_of(result):  # {sweep name: the module that shows it} for the sweeps the run has
    return {name: page for name, page in report.PAGES.items() if section(result, name) is not None}


def chart_set(slug, result):  # {sweep: {kind: (uri, alt text, png bytes, width in CSS pixels)}}
    from attention.plotting import figure_png

    charts = {}
    for name, page in sweeps_of(result).items():
        for kind, (figure, alt) in page.charts(result).items():
            png, width, _height = figure_png(figure)
            charts.setdefault(name, {})[kind] = (f"{ASSETS}/{slug}-{name}-{kind}.png", alt, png, width)
    return charts


def on_files(files, config):
    state["charts"] = {"build": chart_set("cpu-build", state["build_result"])} if state["build_result"] else {}
    state["charts"] |= {slug(folder, path): chart_set(slug(folder, path), result)
                        for folder, runs in state["runs"].items() for path, result in runs}
    for charts in state["charts"].values():
        for uri, _alt, png, _width in (chart for kinds in charts.values() for chart in kinds.values()):
            files.append(File.generated(config, uri, content=png))
    return files


def slug(folder, path):  # a run's name in chart files: its file's, with its folder
    return path.stem if folder == "." else f"{folder}-{path.stem}"


def images(charts):  # {kind: Markdown image} at the on-page width (the PNG holds twice the pixels)
    return {kind: f'![{alt}]({uri}){{ width="{width}" }}' for kind, (uri, alt, _png, width) in charts.items()}


def run_body(result, charts, heading=""):  # its sweeps' sections, then what it was measured on
    sections = [page.page(result, images(charts.get(name, {}))) for name, page in sweeps_of(result).items()]
    return "\n\n".join([heading, report.format.run_line(None, result) + ".", *sections, report.format.collapsed(
        "What this run was measured on", report.format.provenance_summary(result), "info")]).strip()


def tab(title, body):
    return f'=== "{title}"\n\n' + textwrap.indent(body, "    ") + "\n"


def runs_section(folder):  # the runs recorded in docs/results/<folder>/
    runs = state["runs"].get(folder)
    if not runs:
        dtype = DTYPES.get(folder, "float32")
        return (f"No run is recorded in `docs/results/{folder}/` yet: `python -m attention.bench --profile {folder} "
                f"--out docs/results/{folder}/<device>-{folder}-{dtype}.json` records one.")
    return "\n".join(tab(f"{report.format.device_label(result['provenance']['device'])}, {result['dtype']}", run_body(
        result, state["charts"][slug(folder, path)], f"**`docs/results/{folder}/{path.name}`**")) for path, result in runs)


def benchmark_tabs(_=None):
    """The build's quick run, then a tab per device type with a nested tab per file (any valid file, any device)."""
    if state["build_result"] is not None:
        tabs = [tab("CPU, this build", run_body(state["build_result"], state["charts"]["build"],
                                                "Measured while this site was built (quick profile)."))]
    else:
        newest = newest_cpu_run()
        tabs = [tab("CPU, this build", NOT_MEASURED + ("" if newest is None else f" Shown instead: the newest "
                    f"recorded CPU run.\n\n" + run_body(newest[1], state["charts"][newest[0].stem],
                                                       f"**`docs/results/{newest[0].name}`**")))]
    by_type = {kind: [run for run in state["recorded"] if run[1]["device_type"] == kind]
               for kind in dict.fromkeys([*DEVICES, *(result["device_type"] for _, result in state["recorded"])])}
    for kind in by_type:
        title, _, command = DEVICES.get(kind, (kind.upper(), None, None))
        bodies = [(f"{report.format.device_label(r['provenance']['device'])}, {r['dtype']}, {r['profile']} profile",
                   run_body(r, state["charts"][path.stem], f"**`docs/results/{path.name}`**")) for path, r in by_type[kind]]
        if bodies:  # a tab per file, the only one of its device type too: each is named (device, dtype, profile)
            tabs.append(tab(title, "\n".join(tab(*body) for body in bodies)))
        elif command:
            tabs.append(tab(title, f"No {title} run has been recorded yet. On a machine with one, run\n\n```bash\n"
                                   f"{command}\n```\n\nand commit the JSON file under `docs/results/`: this tab then "
                                   "shows it, with its provenance."))
    return "\n".join(tabs)


def fastest_section(_=None):
    runs = ([] if state["build_result"] is None else [("CPU, this build (quick)", state["build_result"])]) + [
        (f"`{path.name}`", result) for path, result in state["recorded"]]
    parts = [report.format.devices_line(runs)]
    for index, (name, result) in enumerate(runs):
        body = f"{report.format.run_line(None, result)}.\n\n{report.sequence.fastest_table(result)}"
        parts.append(report.format.collapsed(f"{name}: {report.format.device_label(result['provenance']['device'])}, {result['dtype']}, "
                               f"{result['profile']} profile", body).replace("???", "???+" if index == 0 else "???", 1))
    return "\n\n".join(parts)


def dtype_section(_=None):
    """bfloat16 against float32 for every device (by identity) with recorded runs of one profile in both dtypes: what
    changed, per mode, in words; the table per class collapsed."""
    parts = [part for fp32, bf16 in report.compare.dtype_pairs(state["recorded"]) for part in [
        f"**{report.format.device_label(fp32['provenance']['device'])}** ({fp32['profile']} profile; float32 recorded "
        f"{fp32['provenance']['date_utc'][:10]}, bfloat16 {bf16['provenance']['date_utc'][:10]})."] + [
        report.compare.dtype_verdict(fp32, bf16, mode) for mode in report.compare.dtype_comparison(fp32, bf16)["modes"]] + [
        report.format.collapsed("Every class, both dtypes", report.compare.dtype_comparison_table(fp32, bf16))]]
    return "\n\n".join(parts + ["Why, measured piece by piece (the projections' matmuls, the attention core, the softmax): "
                                "[bfloat16 on a CPU](examples/benchmark.py#bfloat16-on-a-cpu)."]) if parts else \
        "No device has recorded runs in both float32 and bfloat16 yet."


def headline_charts(_=None):
    """One tab per device type with the bar chart at the headline shape (the build's run, then recorded runs)."""
    build = state["build_result"]
    tabs = [tab("CPU, this build", NOT_MEASURED if build is None else f"{report.format.run_line(None, build)}.\n\n"
                + images(state["charts"]["build"]["sequence"])["bars"])]
    for kind, (title, _, _) in DEVICES.items():
        path, result = next(((path, result) for path, result in state["recorded"] if result["device_type"] == kind),
                            (None, None))
        tabs += [tab(title, f"{report.format.run_line(None, result)}.\n\n" + images(state["charts"][path.stem]["sequence"])["bars"])
                 if result else tab(title, "No recorded run yet: see [Benchmarks](benchmarks.md) for how to make one.")]
    return "\n".join(tabs) + "\nFull tables, sweeps and provenance: [Benchmarks](benchmarks.md).\n"


def record_commands(_=None):  # the file on a line of its own, for phones
    return "\n".join(tab(title, "```bash\n" + command.replace(" --out ", " \\\n    --out ") + "\n```\n")
                     for _, title, command in DEVICES.values())


# page -> {placeholder (a pattern): what fills it, from the match}
PLACEHOLDERS = {
    "add-your-device.md": {
        "<!-- record-commands -->": record_commands,
        "<!-- record-duration -->": lambda _: f"The runs recorded for this site took: {report.recorded_durations()}.",
        "<!-- validate-example -->": lambda _: "```text\n" + "\n".join(report.check_report(
            f"docs/results/{path.name}", report.check_file(path)) for path, _ in state["recorded"]) + "\n```"},
    "benchmark-schema.md": {r"<!-- fields: (\w+) -->": lambda match: fields_table(SWEEPS[match[1]].Row)},
    "benchmarks.md": {r"<!-- runs: ([\w-]+) -->": lambda match: runs_section(match[1]), "<!-- benchmark-tabs -->":
                      benchmark_tabs, "<!-- fastest -->": fastest_section, "<!-- dtype-comparison -->": dtype_section},
    "index.md": {"<!-- headline-charts -->": headline_charts}}


def on_page_markdown(markdown, page, config, files):
    for placeholder, fill in PLACEHOLDERS.get(page.file.src_uri, {}).items():
        markdown = re.sub(placeholder, fill, markdown)  # a function's text goes in as it is
    return markdown
