"""The mutation run: one plausible bug at a time, in a copy of the tree, and the fast tests that should catch it.

Run from the repository root (slow, minutes: not part of `python -m pytest`):

    python tests/mutation/run.py                    # every mutant; records every area in results.json
    python tests/mutation/run.py --area masks       # one area file (mutants_masks.py); records that area only
    python tests/mutation/run.py --mutant masks/causal_excludes_the_diagonal   # one mutant; prints, records nothing
    python tests/mutation/run.py --render           # latest.md again from results.json, running nothing

The bugs are listed one entry each in `tests/mutation/mutants_<area>.py` (a `MUTANTS` list of
`Mutant`, see tests/mutation/mutant.py): the file, the exact original text, its replacement, the
mistake it stands for and the pytest arguments that should catch it. The working files are never
changed: attention/, tests/ and pyproject.toml are copied into a temporary folder, and each mutant is
written into the copy, its tests run there (`PYTHONPATH` = the copy), and the file restored. First every
distinct test selection runs once unmutated: it must pass, or a "kill" would mean nothing.

A mutant is killed when its tests fail (or cannot even be collected, or run past the time limit),
survives when they pass. The score is killed / tried over the mutants not marked `equivalent`.
results.json keeps one record per area (the commit, date and torch it ran on, and each mutant's
outcome), so a new area or a changed one is rerun alone; latest.md, which the contributor page
includes, is rendered from it.
"""

import argparse
import concurrent.futures
import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results.json"
SUMMARY = HERE / "latest.md"
COPIED = ("attention", "tests", "pyproject.toml")
TIMEOUT_S = 600  # per mutant; a mutant that hangs its tests counts as killed (as a hung CI run would fail)
# pytest's exit codes: 0 passed, 1 a test failed, 2 interrupted (a collection error), 5 no test selected.
PASSED, FAILED, INTERRUPTED, NO_TESTS = 0, 1, 2, 5
COMMAND = "python tests/mutation/run.py"

sys.path.insert(0, str(HERE))
from mutant import Mutant  # noqa: E402 -- the area files import it the same way


def area_files():
    """`{area: path}` of every `mutants_<area>.py` beside this script."""
    return {path.stem.removeprefix("mutants_"): path for path in sorted(HERE.glob("mutants_*.py"))}


def load_mutants(areas=None):
    """Every mutant of the given areas (all by default), as `(area, Mutant)` pairs in file order."""
    found = []
    for area, path in area_files().items():
        if areas and area not in areas:
            continue
        spec = importlib.util.spec_from_file_location(f"mutants_{area}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for mutant in module.MUTANTS:
            if not isinstance(mutant, Mutant):
                raise TypeError(f"{path.name}: MUTANTS must hold Mutant entries, got {type(mutant).__name__}")
            found.append((area, mutant))
    return found


def mutant_id(area, mutant):
    return f"{area}/{mutant.name}"


def problems(area, mutant, root=ROOT):
    """What is wrong with an entry (empty if nothing): stale original text, a mutation that does not compile,
    tests that do not exist, missing explanations."""
    found = []
    where = mutant_id(area, mutant)
    path = root / mutant.file
    if not path.is_file():
        return [f"{where}: file {mutant.file} does not exist"]
    text = path.read_text(encoding="utf-8")
    count = text.count(mutant.original)
    if count != 1:
        found.append(f"{where}: the original text occurs {count} times in {mutant.file}, not once "
                     f"(the code changed: update the entry)")
    elif mutant.original == mutant.replacement:
        found.append(f"{where}: replacement equals the original")
    else:
        try:
            compile(text.replace(mutant.original, mutant.replacement), mutant.file, "exec")
        except SyntaxError as error:
            found.append(f"{where}: the mutated file does not compile: {error}")
    if not mutant.why.strip():
        found.append(f"{where}: say why the bug is plausible (why)")
    args = shlex.split(mutant.tests)
    paths = [arg.split("::")[0] for arg in args if arg.endswith(".py") or "::" in arg]
    if not paths:
        found.append(f"{where}: tests names no test file")
    for test_path in paths:
        if not (root / test_path).is_file():
            found.append(f"{where}: test file {test_path} does not exist")
        if pathlib.PurePath(test_path).name == "test_copies.py":
            found.append(f"{where}: test_copies.py catches any edit of a marked copy; select behaviour tests")
    return found


def check_all(mutants, root=ROOT):
    """Problems of every entry, plus duplicate names."""
    found = [problem for area, mutant in mutants for problem in problems(area, mutant, root)]
    ids = [mutant_id(area, mutant) for area, mutant in mutants]
    found += [f"{name}: the name is used twice" for name in sorted({i for i in ids if ids.count(i) > 1})]
    return found


def make_copy():
    """A fresh copy of the tree's attention/, tests/ and pyproject.toml in a temporary folder."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="attention-mutation-"))
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, folder / name, ignore=ignore)
        else:
            shutil.copy2(source, folder / name)
    return folder


def run_pytest(copy, tests, timeout=TIMEOUT_S):
    """Run `pytest <tests>` in `copy` with the copy's package on the path: `(exit code, output)`; code None on timeout."""
    env = {**os.environ, "PYTHONPATH": str(copy), "NO_MKDOCS_2_WARNING": "1", "MPLBACKEND": "Agg"}
    # -rfE: the short summary names the failing test (the project's addopts has -rs, which would leave it out).
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", "--no-header",
               *shlex.split(tests)]
    try:
        result = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        return None, output
    return result.returncode, result.stdout + result.stderr


def first_failure(output):
    """The first failing test named in pytest's short summary, or the first collection error."""
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return match.group(1) if match else ""


def check_the_copy_is_imported(copy):
    """The tests in the copy must import the copy's package, not an installed one."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    found = subprocess.run([sys.executable, "-c", "import attention; print(attention.__file__)"], cwd=copy, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not pathlib.Path(found).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy's tests import attention from {found}, not from {copy}")


def baseline(copies, selections):
    """Each distinct selection, unmutated: `{selection: why}` of those that fail. A mutant of a failing selection would
    be "killed" by a failure it did not cause, so its mutants are reported as not run, and the others still run."""
    failures = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(copies)) as pool:
        runs = pool.map(lambda job: (job[1], *run_pytest(copies[job[0] % len(copies)], job[1])), enumerate(selections))
        for tests, code, output in runs:
            print(f"  baseline {'ok  ' if code == PASSED else 'FAIL'} {tests}", flush=True)
            if code != PASSED:
                failures[tests] = f"its tests fail without any mutant (exit {code}): {first_failure(output) or output[-500:]}"
    return failures


def run_mutant(copy, area, mutant):
    """Apply `mutant` to the copy, run its tests, restore the file: a result dict."""
    path = copy / mutant.file
    original = path.read_text(encoding="utf-8")
    path.write_text(original.replace(mutant.original, mutant.replacement, 1), encoding="utf-8")
    try:
        code, output = run_pytest(copy, mutant.tests)
    finally:
        path.write_text(original, encoding="utf-8")
    if code is None:
        outcome, detail = "killed", f"timeout after {TIMEOUT_S} s"
    elif code == FAILED:
        outcome, detail = "killed", first_failure(output)
    elif code == INTERRUPTED:
        outcome, detail = "killed", f"collection error: {first_failure(output)}"
    elif code == PASSED:
        outcome, detail = "survived", ""
    else:
        outcome, detail = "error", f"pytest exit {code}: {output[-1000:]}"
    return {"id": mutant_id(area, mutant), "area": area, "file": mutant.file, "why": mutant.why,
            "tests": mutant.tests, "equivalent": mutant.equivalent, "outcome": outcome, "detail": detail}


def not_run(area, mutant, why):
    """The result of a mutant whose tests fail unmutated (`baseline`): not run, not counted."""
    return {"id": mutant_id(area, mutant), "area": area, "file": mutant.file, "why": mutant.why,
            "tests": mutant.tests, "equivalent": mutant.equivalent, "outcome": "not run", "detail": why}


def score(results):
    """`{"tried", "equivalent", "counted", "killed", "survived", "errors", "not_run", "percent"}` of a run's results;
    mutants not run (their tests fail unmutated) are not counted."""
    counted = [r for r in results if not r["equivalent"] and r["outcome"] != "not run"]
    killed = sum(r["outcome"] == "killed" for r in counted)
    return {"tried": len(results), "equivalent": sum(bool(r["equivalent"]) for r in results), "counted": len(counted),
            "killed": killed, "survived": sum(r["outcome"] == "survived" for r in counted),
            "errors": sum(r["outcome"] == "error" for r in results),
            "not_run": sum(r["outcome"] == "not run" for r in results),
            "percent": round(100 * killed / len(counted), 1) if counted else 0.0}


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def render(recorded):
    """The Markdown summary of the recorded runs (tests/mutation/latest.md, included in docs/contributing.md)."""
    areas = recorded["areas"]
    if not areas:
        return f"No run is recorded yet: `{COMMAND}` records one.\n"
    results = [r for area in sorted(areas) for r in areas[area]["results"]]
    total = score(results)
    lines = [
        f"**{total['percent']}%** of the non-equivalent mutants caught: {total['killed']} of {total['counted']} "
        f"({total['equivalent']} more marked equivalent, not counted).",
        "",
        "| area | mutants | killed | survived | equivalent | run on |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for area in sorted(areas):
        record, part = areas[area], score(areas[area]["results"])
        run_on = (f"`{record['commit'][:12]}`{'' if record['tree_clean'] else ' + uncommitted changes'}, "
                  f"{record['date_utc'][:10]}, torch {record['torch']}")
        lines.append(f"| {area} | {part['tried']} | {part['killed']} | {part['survived']} | {part['equivalent']} | {run_on} |")
    listed = {}
    for area, _ in load_mutants():
        listed[area] = listed.get(area, 0) + 1
    missing = [f"{area} ({count} mutants)" for area, count in sorted(listed.items()) if area not in areas]
    if missing:
        lines += ["", f"Not run yet, so not in the score: {', '.join(missing)} (`{COMMAND} --area <area>`)."]
    survivors = [r for r in results if r["outcome"] != "killed"]
    lines += ["", "Survivors:" if survivors else "No mutant survived.", ""]
    for r in survivors:
        fate = (f"equivalent: {r['equivalent']}" if r["equivalent"] else f"**not run**: {r['detail']}"
                if r["outcome"] == "not run" else "**not caught: a test is missing**")
        lines.append(f"- `{r['id']}` ({r['file']}, {r['outcome']}): {r['why']}. {fate}")
    return "\n".join(lines).rstrip() + "\n"


def provenance():
    """What the copy is taken from, read when it is taken: the commit, and whether the copied paths differ from it."""
    import torch

    # The run's own record is left out: an area run right after another starts while that one's record is uncommitted.
    own_record = [f":(exclude){path.relative_to(ROOT)}" for path in (RESULTS, SUMMARY)]
    return {"commit": git("rev-parse", "HEAD"), "tree_clean": git("status", "--porcelain", "--", *COPIED, *own_record) == "",
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__}


def record_areas(results, source, started, areas):
    """Replace the records of `areas` in results.json with this run's, and render latest.md again."""
    recorded = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {"areas": {}}
    common = {**source, "wall_seconds_of_the_whole_run": round(time.perf_counter() - started)}
    for area in areas:
        command = COMMAND if len(areas) > 1 else f"{COMMAND} --area {area}"
        recorded["areas"][area] = {"command": command, **common,
                                   "results": [r for r in results if r["area"] == area]}
    known = set(area_files())
    recorded["areas"] = {area: recorded["areas"][area] for area in sorted(recorded["areas"]) if area in known}
    RESULTS.write_text(json.dumps(recorded, indent=1) + "\n", encoding="utf-8")
    SUMMARY.write_text(render(recorded), encoding="utf-8")
    print(f"wrote {RESULTS.relative_to(ROOT)} and {SUMMARY.relative_to(ROOT)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--area", action="append", help="only this area (repeatable); its record is replaced")
    parser.add_argument("--mutant", action="append", help="only this mutant, `area/name` (repeatable); printed only")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, one tree copy each (default 1)")
    parser.add_argument("--render", action="store_true", help="rewrite latest.md from results.json and stop")
    args = parser.parse_args(argv)
    if args.render:
        SUMMARY.write_text(render(json.loads(RESULTS.read_text(encoding="utf-8"))), encoding="utf-8")
        return 0
    mutants = load_mutants(args.area)
    if args.mutant:
        mutants = [(area, m) for area, m in mutants if mutant_id(area, m) in args.mutant]
        unknown = set(args.mutant) - {mutant_id(area, m) for area, m in mutants}
        if unknown:
            raise SystemExit(f"no such mutant: {sorted(unknown)}")
    found = check_all(mutants)
    if found:
        raise SystemExit("fix these entries first:\n" + "\n".join(found))
    started = time.perf_counter()
    source = provenance()
    copies = [make_copy() for _ in range(max(1, args.jobs))]
    try:
        check_the_copy_is_imported(copies[0])
        print(f"{len(mutants)} mutants; baseline of {len({m.tests for _, m in mutants})} test selections", flush=True)
        failing = baseline(copies, sorted({m.tests for _, m in mutants}))
        free = list(copies)
        results = {mutant_id(area, m): not_run(area, m, failing[m.tests]) for area, m in mutants if m.tests in failing}

        def work(pair):
            copy = free.pop()
            try:
                return run_mutant(copy, *pair)
            finally:
                free.append(copy)

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(copies)) as pool:
            for result in pool.map(work, [(area, m) for area, m in mutants if m.tests not in failing]):
                results[result["id"]] = result
                print(f"  {result['outcome']:8} {result['id']}  {result['detail'][:120]}", flush=True)
    finally:
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)
    ordered = [results[mutant_id(area, m)] for area, m in mutants]
    total = score(ordered)
    print(f"score: {total['percent']}% ({total['killed']} of {total['counted']} non-equivalent mutants killed, "
          f"{total['equivalent']} equivalent, {total['errors']} errors, {total['not_run']} not run: their tests fail "
          "unmutated)")
    if not args.mutant:
        record_areas(ordered, source, started, sorted({area for area, _ in mutants}))
    return 1 if total["errors"] or total["not_run"] else 0


if __name__ == "__main__":
    sys.exit(main())
