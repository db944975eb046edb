"""A recorded row goes stale only when code it measured with changed: its class, its sweep, the measuring core and
what they import; never a table, a chart or a page's sentence (`attention/report/`). `--stale` lists stale files and
`--refresh` measures only their stale rows again, on the machine that recorded them."""

import copy
import json
import shutil

import pytest

from attention.bench import provenance, results, run_benchmark
from attention.bench.__main__ import main
from attention.bench.sweeps.sequence import Config

SMALL = dict(device="cpu", batch=1, seq_len=16, sweep_batch=1, seq_lens=(), d_model=32, num_heads=2, modes=("forward",),
             min_run_time=0.01, min_repeats=2, warmup_time=0.0, matmul_size=64)


@pytest.fixture(scope="module")
def recorded():
    """A small run of two classes, as recorded: every row current."""
    return run_benchmark(Config(**SMALL, implementations=("split_heads", "sdpa_causal")), progress=False,
                         argv=["pytest", "tests/test_stale.py"])


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the package that a test edits; staleness is judged against it."""
    package = tmp_path / "attention"
    shutil.copytree(provenance.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(results, "dependencies", lambda modules: provenance.dependencies(modules, package))
    return package


def stale_labels(result, package):
    found = results.stale_rows(result, provenance.source_files(package))
    return sorted({result["rows"][index]["label"] for index in found.get("sequence", {})})


def test_a_fresh_run_is_current(recorded):
    assert results.stale_rows(recorded) == {} and not results.is_stale(recorded) and results.changed_sources(recorded) == []


@pytest.mark.parametrize("edited", ["report/sequence.py", "report/format.py", "report/new_chart.py", "gpt/model.py",
                                    "bench/results.py", "bench/__main__.py", "files.py", "distributed/ring.py",
                                    "models/gemma2.py", "causal/einsum.py"])
def test_an_edit_elsewhere_stales_no_row(recorded, tree, edited):
    (tree / edited).write_text((tree / edited).read_text() + "\n# an edit\n" if (tree / edited).exists() else "# new\n")
    assert stale_labels(recorded, tree) == []


@pytest.mark.parametrize("edited, stale", [
    ("causal/split_heads.py", ["split_heads"]),  # a class: its own rows only
    ("causal/sdpa_causal.py", ["sdpa_causal"]),
    ("bench/core.py", ["sdpa_causal", "split_heads"]),  # the measuring core: every row
    ("bench/metrics.py", ["sdpa_causal", "split_heads"]),
    ("bench/sweeps/sequence.py", ["sdpa_causal", "split_heads"]),  # the sweep's measuring file
    ("reference.py", ["sdpa_causal", "split_heads"]),  # what every row is checked against
    ("registry.py", ["sdpa_causal", "split_heads"]),  # the catalogue the sweep reads its classes from
])
def test_an_edit_to_what_measured_a_row_stales_it(recorded, tree, edited, stale):
    (tree / edited).write_text((tree / edited).read_text() + "\n# an edit\n")
    assert stale_labels(recorded, tree) == stale
    changed = results.stale_rows(recorded, provenance.source_files(tree))["sequence"]
    assert all(changed_files == [f"attention/{edited}"] for changed_files in changed.values())


def test_dependencies_follow_imports_not_catalogues():
    files = provenance.dependencies(["attention.causal.gqa"])
    assert "attention/causal/gqa.py" in files and "attention/registry.py" not in files
    assert not any(path.startswith("attention/report/") for path in provenance.dependencies(["attention.report.sequence"]))
    decode = provenance.dependencies(["attention.bench.sweeps.decode"])
    assert "attention/models/__init__.py" in decode and "attention/models/gemma2.py" not in decode  # a catalogue's lines
    assert "attention/bench/results.py" not in decode and "attention/bench/core.py" in decode  # bookkeeping left out


def test_stale_cli_lists_stale_files_and_exits_1(recorded, tmp_path, capsys):
    current, old = tmp_path / "cpu-current.json", tmp_path / "cpu-old.json"
    current.write_text(json.dumps(recorded))
    edited = copy.deepcopy(recorded)
    edited["provenance"]["source_files"]["attention/causal/split_heads.py"] = "0" * 64
    old.write_text(json.dumps(edited))
    assert main(["--stale", str(current)]) == 0
    assert capsys.readouterr().out == f"{current}: current\n"
    assert main(["--stale", str(current), str(old)]) == 1
    assert (f"{old}: stale: sequence 1 of 2 rows; changed since: attention/causal/split_heads.py"
            in capsys.readouterr().out)


def test_refresh_measures_only_the_stale_rows_again(recorded, tmp_path, capsys):
    edited = copy.deepcopy(recorded)
    edited["provenance"]["source_files"]["attention/causal/split_heads.py"] = "0" * 64
    path = tmp_path / "cpu-run.json"
    path.write_text(json.dumps(edited))
    split = next(index for index, row in enumerate(edited["rows"]) if row["implementation"] == "split_heads")
    kept = next(row for row in edited["rows"] if row["implementation"] == "sdpa_causal")
    assert main(["--refresh", str(path), "--quiet"]) == 0
    assert capsys.readouterr().out == f"{path}: measured again: sequence 1 rows\n"
    refreshed = json.loads(path.read_text())
    assert results.validate(refreshed) == [] and results.stale_rows(refreshed) == {}
    (entry,) = refreshed["provenance"]["refreshes"]
    assert entry["rows"] == {"sequence": [split]} and entry["source_files"] == provenance.source_files()
    assert next(row for row in refreshed["rows"] if row["implementation"] == "sdpa_causal") == kept  # not measured again
    assert refreshed["rows"][split]["ms_median"] != edited["rows"][split]["ms_median"]  # a new measurement
    assert main(["--refresh", str(path), "--quiet"]) == 0  # nothing stale now: nothing measured
    assert capsys.readouterr().out == f"{path}: measured again: nothing (no stale row)\n"


def test_refresh_refuses_a_file_from_another_machine(recorded, tmp_path, capsys):
    other = copy.deepcopy(recorded)
    other["provenance"]["device"]["cpu_count"] += 64
    other["provenance"]["source_files"]["attention/causal/split_heads.py"] = "0" * 64
    path = tmp_path / "cpu-elsewhere.json"
    path.write_text(json.dumps(other))
    with pytest.raises(SystemExit):
        main(["--refresh", str(path), "--quiet"])
    error = capsys.readouterr().err
    assert "recorded on another machine: cpu_count" in error and f"{other['provenance']['device']['cpu_count']}" in error
    assert json.loads(path.read_text()) == other  # untouched
