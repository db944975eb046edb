"""Session fixtures shared by the docs and browser tests."""

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

# Triton's kernels run on a CPU only in its interpreter, chosen when Triton is first imported: set it before any test
# (or torch.compile) imports Triton, as attention/kernels/triton_flash.py does when it is imported first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A hung notebook cell must not hang CI. Under the README's coverage tracing the build took about 17.5 min on 2 cores,
# and past 20 once Triton joined the docs extra (every notebook's kernel imports it through FlexAttention, traced too)
# and the FlashAttention in Triton page joined the site (2026-11-27).
DOCS_BUILD_TIMEOUT_S = 40 * 60
SCRIPT_TIMEOUT_S = 600


def script_env():
    """The environment an example script runs in: no display (Agg), the package from this checkout."""
    return {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}


@dataclasses.dataclass
class ExampleRun:
    command: str
    returncode: int
    stdout: str
    stderr: str
    figures: int | None  # how many matplotlib Figures the script made; None if it never got to count


# Examples that show the docs build's quick benchmark run: as a plain script they read the run the strict build
# of this session measured (the ATTENTION_BENCH_QUICK_RESULT the docs hook sets), so the suite measures it once.
READS_THE_QUICK_RUN = {"benchmark.py"}


def quick_run_of_this_build(request):
    """The quick benchmark run the session's strict build measured (`.cache/bench/`, keyed by the sources)."""
    request.getfixturevalue("built_site")
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmarks_hook", ROOT / "docs" / "_hooks" / "benchmarks.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    found = hook.quick_run_path(ROOT)
    if not found.exists():
        pytest.fail(f"the strict build left no quick benchmark run at {found}")
    return found


@pytest.fixture(scope="session")
def run_example(tmp_path_factory, request):
    """`run_example(script)` runs `examples/<script>` once per session as a plain script (through
    tests/run_example.py, which counts the figures it makes) and returns an `ExampleRun`."""
    runs = {}

    def run(script):
        script = pathlib.Path(script)
        if script.name not in runs:
            counts = tmp_path_factory.mktemp("example-run") / "counts.json"
            command = [sys.executable, str(ROOT / "tests" / "run_example.py"), str(script.relative_to(ROOT)), str(counts)]
            env = script_env()
            env.pop("ATTENTION_BENCH_QUICK_RESULT", None)
            if script.name in READS_THE_QUICK_RUN:
                env["ATTENTION_BENCH_QUICK_RESULT"] = str(quick_run_of_this_build(request))
            result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
            figures = json.loads(counts.read_text())["figures"] if counts.exists() else None
            runs[script.name] = ExampleRun(" ".join(command[1:3]), result.returncode, result.stdout, result.stderr, figures)
        return runs[script.name]

    return run


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The site built once per session with `mkdocs build --strict`; its folder.

    Fails (with the build's output) if the strict build fails or runs past the timeout.
    """
    site_dir = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=DOCS_BUILD_TIMEOUT_S,
    )
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed after {elapsed:.0f} s:\n{result.stdout[-6000:]}\n{result.stderr[-12000:]}")
    print(f"\nmkdocs build --strict took {elapsed:.0f} s")
    return site_dir


# The floor of every file's coverage (statements and branches, as coverage's own total counts them), where the README's
# test command measures coverage (`--cov`): pyproject's `fail_under` holds the total, this holds each file, so that a
# file no test reaches cannot hide behind the others.
FILE_COVERAGE_FLOOR = 90.0
# Files that run only with an optional dependency, which installs on some platforms only: where it is missing, their
# tests skip (saying why) and the floor leaves them out, rather than fail a machine for what it cannot install.
NEEDS = {"attention/kernels/triton_flash.py": "triton"}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtestloop(session):
    """After pytest-cov has combined and reported the coverage (its own wrapper runs inside this one): fail the
    session, naming each file and its share, where a file of `attention/` is below `FILE_COVERAGE_FLOOR`."""
    yield
    plugin = session.config.pluginmanager.getplugin("_cov")
    controller = getattr(plugin, "cov_controller", None)
    if controller is None or getattr(plugin, "cov_total", None) is None:
        return  # coverage not measured (the quick loop) or not reported (a worker)
    below = files_below(controller.cov, FILE_COVERAGE_FLOOR)
    if below:
        lines = "\n".join(f"  {name}: {share:.1f}%" for name, share in below)
        session.config.pluginmanager.getplugin("terminalreporter").write(
            f"\nERROR: coverage below {FILE_COVERAGE_FLOOR:.0f}% in {len(below)} file(s) of attention/:\n{lines}\n",
            red=True, bold=True)
        session.testsfailed += 1


def files_below(cov, floor):
    """`[(file, percent)]` of the files `cov` measured whose statements and branches covered fall below `floor`."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        report = pathlib.Path(folder) / "coverage.json"
        cov.json_report(outfile=str(report))
        files = json.loads(report.read_text())["files"]
    missing = [path for path, module in NEEDS.items() if importlib.util.find_spec(module) is None]
    shares = {name: data["summary"]["percent_covered"] for name, data in files.items()
              if not any(pathlib.Path(name).as_posix().endswith(path) for path in missing)}
    return sorted((name, share) for name, share in shares.items() if share < floor)
