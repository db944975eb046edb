"""The package's shape: what measures apart from what shows, imports that point down, files within their budgets.

Measuring (`attention/bench/`) never imports showing (`attention/report/`), except the command line that prints what
it measured; the trusted reference imports nothing of the package (least of all what it judges); the ring's algorithm
imports nothing of the benchmark; a model family imports torch and the decoding family only, which imports nothing
else of the package.
Budgets are in lines of the files as they stand, so that a sweep stays readable top to bottom.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "attention"


def imported(path):
    """The `attention.*` modules a file imports, anywhere in it (function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name.startswith("attention")}


def files(under=""):
    return sorted(path for path in (PACKAGE / under).rglob("*.py") if "__pycache__" not in path.parts)


def lines(paths):
    return sum(len(path.read_text().splitlines()) for path in paths)


def test_nothing_that_measures_imports_what_shows():  # so nothing there can call what shows
    allowed = {PACKAGE / "bench" / "__main__.py"}  # the command line prints the tables of what it measured
    importers = [path.relative_to(PACKAGE.parent).as_posix() for path in files()
                 if "report" not in path.relative_to(PACKAGE).parts[:1] and path not in allowed
                 and any(name == "attention.report" or name.startswith("attention.report.") for name in imported(path))]
    assert importers == []


@pytest.mark.parametrize("budget, paths, what", [
    # 1,400 until the GPU profile's --dry-run and CUDA memory budget joined it, 1,420 until the linear sweep's line.
    (1430, lambda: sorted((PACKAGE / "bench").glob("*.py")), "the measuring core, attention/bench/*.py"),
    # 1,800 until the bounds sweep's module and the decode page's `auto` sentences (issue 46) joined it, 2,000 until
    # the kernels sweep's (the GPU profile, issue 47), 2,060 until the linear sweep's (issue 48), 2,230 until the sparse
    # sweep's and the KV-cache calculator's data and table (issue 49).
    (2490, lambda: files("report"), "what shows results, attention/report/"),
])
def test_the_benchmark_stays_within_its_budget(budget, paths, what):
    assert lines(paths()) <= budget, f"{what}: {lines(paths())} lines, the budget is {budget}"


@pytest.mark.parametrize("sweep", sorted(path.name for path in (PACKAGE / "bench" / "sweeps").glob("*.py")))
def test_each_sweep_measures_in_at_most_450_lines(sweep):
    assert lines([PACKAGE / "bench" / "sweeps" / sweep]) <= 450


def test_no_function_of_bench_or_report_takes_more_than_six_parameters():
    many = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for path in files("bench") + files("report")
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.FunctionDef, ast.Lambda))
            and len(node.args.posonlyargs + node.args.args + node.args.kwonlyargs) > 6]
    assert many == []


def test_the_ring_imports_nothing_of_the_benchmark():  # the benchmark's ring sweep measures the ring, not the reverse
    importers = [path.name for path in files("distributed") if path.name != "__main__.py"
                 and any(name.startswith("attention.bench") for name in imported(path))]
    assert importers == []


def test_the_reference_imports_nothing_of_the_package():  # the trusted reference never imports what it judges
    assert imported(PACKAGE / "reference.py") == set()


FAMILY_FILES = ["llama.py", "qwen3.py", "olmo2.py", "gemma2.py", "gemma3.py", "gpt_oss.py", "llama4.py", "deepseek_v3.py",
                "qwen3_next.py", "kimi_linear.py", "minimax.py"]
HYBRID_FILES = ["qwen3_next.py", "kimi_linear.py", "minimax.py"]  # linear attention layers beside softmax ones: they also import attention/linear/


@pytest.mark.parametrize("family", FAMILY_FILES)
def test_a_model_family_imports_only_the_decoding_family(family):  # copy the file and attention/decoding/: it runs
    names = imported(PACKAGE / "models" / family)
    assert not any(name.startswith("attention.causal") for name in names)
    assert {name.split(".")[1] for name in names} <= ({"decoding", "linear"} if family in HYBRID_FILES else {"decoding"})


def test_the_decoding_family_imports_only_itself():
    assert {name for path in files("decoding") for name in imported(path)
            if not name.startswith("attention.decoding")} == set()
    assert {name.split(".")[1] for name in imported(PACKAGE / "causal" / "gqa.py")} == {"decoding"}


def test_the_linear_attention_rules_import_only_torch_and_each_other():  # copy attention/linear/: it runs
    assert {name for path in files("linear") for name in imported(path) if not name.startswith("attention.linear")} == set()



# What coverage's default exclusion matches (its DEFAULT_EXCLUDE), in any letter case.
PRAGMA = re.compile(r"#\s*pragma[:\s]?\s*no\s*cover", re.IGNORECASE)
MARKED_PRAGMA = re.compile(r"# pragma: no cover \((cuda|platform): [^()\s][^()]*\)$")


def unmarked_pragmas(sources):
    """`name:line` of each `pragma: no cover` in `sources` (name -> text) that is not exactly one
    `(cuda: why)` or `(platform: why)` ending its line: the only lines the coverage measurement may leave out are
    those that run on a GPU or another OS."""
    found = []
    for name, text in sources.items():
        for number, line in enumerate(text.splitlines(), 1):
            pragmas = list(PRAGMA.finditer(line))
            if pragmas and (len(pragmas) != 1 or not MARKED_PRAGMA.fullmatch(line[pragmas[0].start():])):
                found.append(f"{name}:{number}")
    return found


def test_every_line_left_out_of_coverage_says_it_needs_a_gpu_or_another_platform():
    sources = {path.relative_to(PACKAGE.parent).as_posix(): path.read_text() for path in files()}
    assert unmarked_pragmas(sources) == []


@pytest.mark.parametrize("line, marked", [
    ("if on_gpu:  # pragma: no cover (cuda: NCCL, the GPUs' backend)", True),
    ('elif device.type == "mps":  # pragma: no cover (platform: macOS only)', True),
    ("if x:  # pragma: no cover", False),  # no reason
    ("if x:  # pragma: no cover (cuda: )", False),  # an empty reason
    ("if x:  # pragma: no cover (slow: rarely run)", False),  # not one of the two kinds
    ("if x:  # pragma: no cover (cuda: a GPU) # pragma: no cover (platform: macOS)", False),  # two of them
    ("if x:  # pragma: no cover (cuda: a GPU) and more", False),  # text after the mark
    ("if x:  #pragma:no cover (cuda: a GPU)", False),  # coverage still excludes it; not the marked form
    ("if x:  # Pragma: No Cover (cuda: a GPU)", False),
    ("if x:  # pragma nocover", False),
])
def test_a_pragma_is_marked_only_in_one_of_the_two_forms(line, marked):
    assert unmarked_pragmas({"a.py": f"x = 1\n{line}\n    pass\n"}) == ([] if marked else ["a.py:2"])
