"""The mutation run's list, its runner and its recorded results (the run itself is slow: tests/mutation/run.py).

Fast checks only: every listed mutant still applies to the code as it is (a stale entry fails here,
not silently in the next run), the runner kills and spares as it should on a two-file toy tree, and
the recorded results cover the current list and are what the contributor page shows.
"""

import json
import pathlib
import re
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import run  # noqa: E402 -- tests/mutation/run.py, the runner
from mutant import Mutant  # noqa: E402

# The areas issue 35 asks for, the families that joined since (each its own mutants_<area>.py), and what only
# published sizes and transformers' config defaults reveal (model_configs, issue 50).
REQUIRED_AREAS = {"masks", "positional", "causal", "caches", "general", "metrics", "models", "latent", "ring", "gpt",
                  "model_configs"}


def test_every_entry_applies_to_the_code_as_it_is():
    mutants = run.load_mutants()
    assert REQUIRED_AREAS <= {area for area, _ in mutants}
    assert run.check_all(mutants) == []


def test_check_all_reports_each_kind_of_broken_entry(tmp_path):
    (tmp_path / "pkg.py").write_text("def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_pkg.py").write_text("")
    good = Mutant("good", "pkg.py", "def f(x):\n    return x + 1", "def f(x):\n    return x - 1", "sign", "tests/test_pkg.py")
    entries = [
        ("toy", good),
        ("toy", Mutant("twice", "pkg.py", "return x + 1", "return x - 1", "sign", "tests/test_pkg.py")),
        ("toy", Mutant("stale", "pkg.py", "return x * 2", "return x", "gone", "tests/test_pkg.py")),
        ("toy", Mutant("broken", "pkg.py", "def f(x):", "def f(x:", "syntax", "tests/test_pkg.py")),
        ("toy", Mutant("no_tests", "pkg.py", "def g(x):", "def g(y):", "name", "tests/test_missing.py -k g")),
        ("toy", Mutant("copies", "pkg.py", "def g(x):", "def g(y):", "name", "tests/test_copies.py")),
        ("toy", Mutant("silent", "pkg.py", "def g(x):", "def g(y):", " ", "tests/test_pkg.py")),
        ("toy", good),
    ]
    found = "\n".join(run.check_all(entries, root=tmp_path))
    for expected in ("toy/twice: the original text occurs 2 times", "toy/stale: the original text occurs 0 times",
                     "toy/broken: the mutated file does not compile", "toy/no_tests: test file tests/test_missing.py",
                     "toy/copies: test_copies.py", "toy/silent: say why", "toy/good: the name is used twice"):
        assert expected in found, found
    assert "toy/good:" not in found.replace("toy/good: the name is used twice", "")


def test_a_mutant_is_killed_or_survives_and_the_copy_is_restored(tmp_path):
    (tmp_path / "pkg.py").write_text("def double(x):\n    return 2 * x\n\n\ndef unused(x):\n    return x\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_pkg.py").write_text("import pkg\n\n\ndef test_double():\n    assert pkg.double(3) == 6\n")
    caught = Mutant("caught", "pkg.py", "return 2 * x", "return 2 + x", "plus for times", "tests/test_pkg.py")
    missed = Mutant("missed", "pkg.py", "    return x\n", "    return -x\n", "sign", "tests/test_pkg.py")
    before = (tmp_path / "pkg.py").read_text()
    killed = run.run_mutant(tmp_path, "toy", caught)
    survived = run.run_mutant(tmp_path, "toy", missed)
    assert (killed["outcome"], survived["outcome"]) == ("killed", "survived")
    assert killed["detail"] == "tests/test_pkg.py::test_double"
    assert (tmp_path / "pkg.py").read_text() == before
    results = [killed, survived, {**survived, "id": "toy/same", "equivalent": "no test can tell"}]
    assert run.score(results) == {"tried": 3, "equivalent": 1, "counted": 2, "killed": 1, "survived": 1,
                                  "errors": 0, "not_run": 0, "percent": 50.0}


def test_a_selection_that_fails_unmutated_is_reported_and_its_mutants_not_counted(tmp_path):
    (tmp_path / "pkg.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_ok.py").write_text("import pkg\n\n\ndef test_double():\n    assert pkg.double(3) == 6\n")
    (tmp_path / "tests" / "test_broken.py").write_text("def test_broken_before_any_mutant():\n    assert False\n")
    failing = run.baseline([tmp_path], ["tests/test_ok.py", "tests/test_broken.py"])
    assert list(failing) == ["tests/test_broken.py"] and "test_broken_before_any_mutant" in failing["tests/test_broken.py"]
    blind = Mutant("blind", "pkg.py", "return 2 * x", "return 2 + x", "plus for times", "tests/test_broken.py")
    caught = Mutant("caught", "pkg.py", "return 2 * x", "return 2 + x", "plus for times", "tests/test_ok.py")
    results = [run.not_run("toy", blind, failing[blind.tests]), run.run_mutant(tmp_path, "toy", caught)]
    assert [r["outcome"] for r in results] == ["not run", "killed"]
    assert run.score(results) == {"tried": 2, "equivalent": 0, "counted": 1, "killed": 1, "survived": 0,
                                  "errors": 0, "not_run": 1, "percent": 100.0}
    assert "**not run**: its tests fail without any mutant" in run.render({"areas": {"toy": {
        "commit": "0" * 40, "tree_clean": True, "date_utc": "2026-11-27", "torch": "2.13.0", "results": results}}})


def recorded():
    return json.loads(run.RESULTS.read_text(encoding="utf-8"))


def listed_ids():
    listed = {}
    for area, mutant in run.load_mutants():
        listed.setdefault(area, []).append(run.mutant_id(area, mutant))
    return listed


def require_a_recorded_run():
    if not recorded()["areas"]:
        pytest.skip("no mutation run is recorded yet (tests/mutation/results.json): run python tests/mutation/run.py")


def test_every_area_is_recorded():
    """Every listed area has a recorded run; while some have none, this skips naming them (as latest.md, which
    the contributor page shows, lists them and leaves them out of the score)."""
    require_a_recorded_run()
    missing = sorted(set(listed_ids()) - set(recorded()["areas"]))
    if missing:
        pytest.skip(f"mutation areas not recorded yet: {', '.join(missing)} "
                    f"(python tests/mutation/run.py {' '.join('--area ' + area for area in missing)})")
    assert sorted(recorded()["areas"]) == sorted(listed_ids())


def test_each_recorded_area_covers_its_current_list():
    """A mutant added, renamed or removed since the last run of its area: rerun that area
    (`python tests/mutation/run.py --area <area>`)."""
    areas, listed = recorded()["areas"], listed_ids()
    assert set(areas) <= set(listed), f"areas recorded but no longer listed: {sorted(set(areas) - set(listed))}"
    for area, record in areas.items():
        assert [r["id"] for r in record["results"]] == listed[area], f"rerun: python tests/mutation/run.py --area {area}"
        assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]) and record["date_utc"][:2] == "20"
        assert all(r["outcome"] in ("killed", "survived") for r in record["results"]), "a mutant ended in error"
        equivalents = {run.mutant_id(area, m): m.equivalent for a, m in run.load_mutants([area])}
        assert {r["id"]: r["equivalent"] for r in record["results"]} == equivalents, f"rerun area {area}"


def test_every_survivor_is_explained_and_the_goal_is_met():
    require_a_recorded_run()
    results = [r for record in recorded()["areas"].values() for r in record["results"]]
    unexplained = [r["id"] for r in results if r["outcome"] == "survived" and not r["equivalent"]]
    assert not unexplained, f"kill these with a test, or explain why they are equivalent: {unexplained}"
    assert run.score(results)["percent"] >= 95


def test_latest_md_is_rendered_from_the_recorded_results():
    assert run.SUMMARY.read_text(encoding="utf-8") == run.render(recorded()), "run: python tests/mutation/run.py --render"


def test_the_contributor_page_shows_the_summary_and_the_readme_section():
    page = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    assert '--8<-- "tests/mutation/latest.md"' in page
    assert '--8<-- "README.md:adding-an-implementation"' in page
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"\[start:adding-an-implementation\](.*)\[end:adding-an-implementation\]", readme, re.DOTALL)
    assert section and "attention/registry.py" in section.group(1)
    assert "python tests/mutation/run.py" in page
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n")[1]
    assert re.search(r"^ +- [^:\n]+: contributing\.md$", nav, re.MULTILINE), "mkdocs.yml's nav lacks contributing.md"
