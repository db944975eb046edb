"""Results files from anyone: the validator knows every field and refuses, naming the field, whatever could reach
a page as markup or break it; a page built from a hostile file that slipped past the validator shows its strings
as text; older files migrate mechanically."""

import collections
import copy
import html.parser
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import markdown
import pytest

from attention.bench import SWEEPS, results
from attention.bench.sweeps.sequence import rank_rows

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
RECORDED = {"sequence": "cpu-intel-xeon-2c-float32.json", "long": "long/cpu-intel-xeon-2c-float32-long.json",
            "decode": "decode/cpu-amd-epyc-2c-float32-decode.json", "ring": "ring/cpu-amd-epyc-2c-float32-ring.json",
            "prefill": "prefill/cpu-amd-epyc-2c-float32-prefill.json"}
HOSTILE = {"html": '<img src=x onerror="alert(document.domain)">', "script": "<script>alert(1)</script>",
           "link": "[click](javascript:alert(1))", "long": "A" * 5000, "control": "a\x00b\nc\x1b[31m"}


def trimmed(name, keep=3):
    """A recorded file cut to its first rows per section (rankings recomputed): still valid, quick to validate."""
    result = results.read(ROOT / "docs" / "results" / RECORDED[name])
    for sweep in SWEEPS:
        found = result if sweep == "sequence" else result.get(sweep)  # `results.section` gives a copy of the top
        if found and "rows" in found:  # the first rows, and the first that did not run (a reason to show)
            found["rows"] = found["rows"][:keep] + [row for row in found["rows"] if row["status"] != "ok"][:1]
    if "rankings" in result:
        result["rankings"] = rank_rows(result["rows"])
    assert results.validate(result) == [], name
    return result


FILES = {name: trimmed(name) for name in RECORDED}


def leaves(value, where=""):
    """`(where, kind, holder, key)` for every string and number of a result: `where` as the validator names it,
    `kind` "string", "number" or "key" (a key of a mapping whose keys are data, such as `source_files`)."""
    if isinstance(value, dict):
        for key, item in value.items():
            child = f"{where}.{key}" if where else key
            if where.endswith(("source_files", "excluded", "patterns")):
                yield f"{where} key", "key", value, key
            yield from leaves(item, child) if isinstance(item, (dict, list)) else _leaf(item, child, value, key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            child = f"{where}[{index}]"
            yield from leaves(item, child) if isinstance(item, (dict, list)) else _leaf(item, child, value, index)


def _leaf(item, where, holder, key):
    if isinstance(item, str):
        yield where, "string", holder, key
    elif isinstance(item, (int, float)) and not isinstance(item, bool):
        yield where, "number", holder, key


def field_of(where):
    """The field's own name: `rows[0].label` -> `label`, `provenance.argv[3]` -> `argv`."""
    return re.sub(r"\[\d+\]", "", where).split(".")[-1]


def cases(kind):
    """One case per field of `kind` in each recorded file: the first of a list's items, of a mapping's entries."""
    seen = {}
    for name, result in FILES.items():
        for where, found, holder, key in leaves(result):
            pattern = re.sub(r"\[\d+\]", "[]", re.sub(r"(source_files|excluded|patterns)\.[^.]+", r"\1.*", where))
            if found == kind:
                seen.setdefault((name, pattern), (name, where, key))
    return list(seen.values())


def reach(result, where):
    """The container and key of the field `where` names in `result` (as `leaves` found it)."""
    for found_where, _, holder, key in leaves(result):
        if found_where == where:
            return holder, key
    raise KeyError(where)


STRINGS, NUMBERS, KEYS = cases("string"), cases("number"), cases("key")


def test_every_kind_of_field_is_tried():
    fields = {field_of(where) for _, where, _ in STRINGS}
    assert {"name", "cpu", "torch", "platform", "command", "argv", "commit", "float32_matmul_precision", "label",
            "implementation", "sdpa_backends", "date_utc", "profile", "dtype", "model", "kernel", "pattern",
            "reason", "when", "python", "source_hash", "causal"} <= fields, fields
    assert len(STRINGS) > 60 and len(NUMBERS) > 100 and KEYS


@pytest.mark.parametrize("payload", list(HOSTILE))
@pytest.mark.parametrize("name, where, key", STRINGS, ids=[f"{n}:{w}" for n, w, _ in STRINGS])
def test_a_hostile_string_is_refused_naming_its_field(name, where, key, payload):
    hostile = copy.deepcopy(FILES[name])
    holder, key = reach(hostile, where)
    holder[key] = HOSTILE[payload]
    problems = results.validate(hostile)
    assert any(problem.startswith(where + ":") for problem in problems), (where, problems[:3])


@pytest.mark.parametrize("name, where, key", KEYS, ids=[f"{n}:{w}:{k}" for n, w, k in KEYS])
def test_a_hostile_key_is_refused_naming_its_mapping(name, where, key):
    hostile = copy.deepcopy(FILES[name])
    holder, _ = reach(hostile, where.removesuffix(" key") + f".{key}")
    holder[HOSTILE["html"]] = holder.pop(key)
    assert any(problem.startswith(where) for problem in results.validate(hostile))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300])
@pytest.mark.parametrize("name, where, key", NUMBERS[::3], ids=[f"{n}:{w}" for n, w, _ in NUMBERS[::3]])
def test_a_number_that_is_not_finite_or_out_of_bounds_is_refused(name, where, key, value):
    hostile = copy.deepcopy(FILES[name])
    holder, key = reach(hostile, where)
    holder[key] = value
    assert any(problem.startswith(where + ":") for problem in results.validate(hostile))


def test_unknown_fields_a_huge_rows_list_and_a_huge_file_are_refused(tmp_path):
    hostile = copy.deepcopy(FILES["sequence"])
    hostile["rows"][0]["onerror"] = "x"
    hostile["provenance"]["device"]["script"] = "x"
    hostile["notes"] = "x"
    problems = results.validate(hostile)
    for field in ("rows[0].'onerror'", "provenance.device.'script'", "'notes'"):
        assert f"{field}: unknown field" in problems, problems
    huge = copy.deepcopy(FILES["decode"])
    huge["decode"]["rows"] *= 2000
    assert len(huge["decode"]["rows"]) > results.MAX_ROWS
    assert f"decode.rows: {len(huge['decode']['rows'])} items, at most {results.MAX_ROWS}" in results.validate(huge)
    big = tmp_path / "cpu-big.json"
    big.write_text(" " * (results.MAX_FILE_BYTES + 1) + "{}")
    refusal = "cannot be read: longer than 16 MiB, the most this file may hold: refused"
    assert results.check_file(big)["problems"] == [refusal]
    named = tmp_path / "cpu-<b>.json"
    named.write_text(json.dumps(FILES["sequence"]))
    assert results.check_file(named)["problems"][0].startswith("file name: 'cpu-<b>.json' is not")


def limited_memory():  # the child's address space: a reader that never stops fails fast, not the machine
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs a FIFO and /dev/zero")
def test_a_file_that_is_not_regular_is_not_valid_and_never_read(tmp_path):
    """A symlink to /dev/zero was read until memory ran out, a FIFO blocked forever, a symlink to a JSON file had its
    key names printed ("'auths': unknown field"): each is now NOT valid with the reason, read from nowhere. The
    validator runs in a child process with a deadline and a memory limit, so a hang or a runaway read fails the test."""
    folder = tmp_path / "results"
    folder.mkdir()
    (tmp_path / "auths.json").write_text(json.dumps({"auths": {"registry": {"auth": "c2VjcmV0"}}}))
    (folder / "cpu-zero.json").symlink_to("/dev/zero")
    (folder / "cpu-secrets.json").symlink_to(tmp_path / "auths.json")
    os.mkfifo(folder / "cpu-fifo.json")
    reasons = {"cpu-zero.json": "a symbolic link", "cpu-secrets.json": "a symbolic link", "cpu-fifo.json": "a FIFO"}
    paths = [str(folder / name) for name in reasons]
    script = "import sys; from attention.bench.__main__ import main; sys.exit(main(['--validate', *sys.argv[1:]]))"
    done = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), preexec_fn=limited_memory, check=False)
    assert done.returncode == 1 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout == "".join(f"{folder / name}: NOT valid, 1 problem(s):\n  - cannot be read: {kind}, not a "
                                  "regular file: refused\n" for name, kind in reasons.items())
    assert "auths" not in done.stdout
    for name, kind in reasons.items():
        with pytest.raises(ValueError, match=re.escape(f"{folder / name}: {kind}, not a regular file")):
            results.read(folder / name)
    assert results.find_results(folder) == []


@pytest.mark.parametrize("text, reason", [
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply to read"),
    ('{"a":' * 50_000 + "1" + "}" * 50_000, "JSON nested too deeply to read"),
    # Under the parser's limit but past the validator's: quoting the value in a message recursed past the stack.
    ('{"schema_version": ' + "[" * 900 + "]" * 900 + "}", "objects and lists nested more than 32 deep"),
    ('{"schema_version": 3, "complete": true, "schema_version": 3}', "the key 'schema_version' appears twice in one object"),
])
def test_a_deep_or_ambiguous_file_is_not_valid_with_the_reason(tmp_path, capsys, text, reason):
    """Deep nesting printed a RecursionError traceback; a repeated key was read as its last value (a reviewer saw
    `"status": "<img onerror>"`, the pages `"ok"`)."""
    from attention.bench.__main__ import main

    path = tmp_path / "cpu-odd.json"
    path.write_text(text)
    assert main(["--validate", str(path)]) == 1
    assert capsys.readouterr().out == f"{path}: NOT valid, 1 problem(s):\n  - cannot be read: {reason}\n"
    assert main(["--migrate", str(path)]) == 1
    assert f"{path}: not migrated (ValueError: {reason})" in capsys.readouterr().out


def test_a_repeated_key_in_a_row_is_not_valid(tmp_path):
    text = json.dumps(FILES["sequence"], indent=1)
    path = tmp_path / "cpu-twice.json"
    path.write_text(text.replace('"status": "ok",', '"status": "<img src=x onerror=alert(1)>", "status": "ok",', 1))
    assert results.check_file(path)["problems"] == ["cannot be read: the key 'status' appears twice in one object"]


@pytest.mark.parametrize("version", [[], {}, "3", None])
def test_a_schema_version_of_another_type_is_named_not_a_traceback(tmp_path, version):
    path = tmp_path / "cpu-version.json"
    path.write_text(json.dumps(dict(FILES["sequence"], schema_version=version)))
    assert any(problem.startswith("schema_version: ") for problem in results.check_file(path)["problems"])
    with pytest.raises(ValueError, match="schema_version"):
        results.migrate(json.loads(path.read_text()))


def test_escaped_strings_are_text_in_markdown_and_html():
    assert results.escaped({'<a href="x">': ["[x](javascript:y) {: onclick=z } | `code` \\ \n"]}) == {
        "&lt;a href=&quot;x&quot;&gt;": ["&#91;x&#93;(javascript:y) &#123;: onclick=z &#125; &#124; &#96;code&#96; &#92;  "]}
    assert results.escaped({"Intel(R) Xeon(R) Processor": [1, 2.5, None, True]}) == {
        "Intel(R) Xeon(R) Processor": [1, 2.5, None, True]}  # valid names and numbers untouched


# Fields the pages use as keys or to choose what to draw (a hostile value there breaks a lookup, not the page's HTML).
STRUCTURAL = {"mode", "status", "kernel", "pattern", "model", "dtype", "device_type", "type", "modes", "patterns",
              "kernels", "models"}


class Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_a_hostile_file_past_the_validator_shows_as_text_on_the_pages(tmp_path, monkeypatch):
    """Every displayed string of three files made hostile, the validator bypassed: the hook's Markdown, through
    the site's own Markdown extensions, has no script, no event handler and no javascript: link."""
    pytest.importorskip("mkdocs")
    from mkdocs.config import load_config
    from test_bench import bench_page_hook

    payload = HOSTILE["script"] + HOSTILE["html"] + HOSTILE["link"] + '{: onclick="alert(4)" } | `x` \n=== "tab"'
    files = {}
    for name, path in RECORDED.items():
        hostile = copy.deepcopy(FILES[name])
        for where, kind, holder, key in list(leaves(hostile)):
            if kind == "string" and field_of(where) not in STRUCTURAL:
                holder[key] = payload
        files[path.replace("intel-xeon", "hostile")] = hostile
    monkeypatch.setattr(results, "validate", lambda result: [])  # a file the validator let through
    hook = bench_page_hook(tmp_path, monkeypatch, files)
    config = load_config(str(ROOT / "mkdocs.yml"))
    pages = {"benchmarks.md": (ROOT / "docs" / "benchmarks.md").read_text(), "index.md": "<!-- headline-charts -->\n"
             "<!-- short-answer -->", "add-your-device.md": (ROOT / "docs" / "add-your-device.md").read_text()}
    for source, text in pages.items():
        page = type("Page", (), {"file": type("File", (), {"src_uri": source})()})()
        converted = markdown.Markdown(extensions=config.markdown_extensions, extension_configs=config.mdx_configs)
        built = converted.convert(hook.on_page_markdown(text, page, config, None))
        parser = Tags()
        parser.feed(built)
        assert not [tag for tag, _ in parser.tags if tag in ("script", "iframe", "object", "embed", "style")], source
        assert all(attrs["src"].startswith("assets/benchmarks/") for tag, attrs in parser.tags if tag == "img"), source
        assert not [(tag, name) for tag, attrs in parser.tags for name in attrs if name.startswith("on")], source
        assert not [attrs for tag, attrs in parser.tags if any(str(value).strip().lower().startswith("javascript:")
                                                              for value in attrs.values())], source
        assert "<script" not in built and "&lt;script&gt;" in built, source


def numbers(value, counter):
    if isinstance(value, dict):
        for item in value.values():
            numbers(item, counter)
    elif isinstance(value, list):
        for item in value:
            numbers(item, counter)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        counter[value] += 1
    return counter


@pytest.mark.parametrize("sample", ["results-v2-long.json", "results-v2-decode.json"])
def test_a_version_2_file_migrates_mechanically_and_validates(sample, tmp_path):
    """Fields renamed, moved or added as null; every number of the old file is still in the new one (only the
    decode run's placeholders and its models' K/V head counts, derived, are dropped)."""
    old = json.loads((DATA / sample).read_text())
    path = tmp_path / f"cpu-{sample}"
    path.write_text(json.dumps(old))
    assert results.check_file(path)["problems"][0].startswith("schema_version: 2, an older layout")
    from attention.bench.__main__ import main

    assert main(["--migrate", str(path)]) == 0
    new = json.loads(path.read_text())
    assert results.validate(new) == [] and new["schema_version"] == 3 and results.migrate(new) == new
    assert new["profile"] == old["config"]["profile"] and new["provenance"]["device"]["cpu_flags"] is None
    lost = numbers(old, collections.Counter()) - numbers(new, collections.Counter())
    if "decode" in old:
        config = old["config"]
        placeholders = [2, config["batch"], config["seq_len"], *config["seq_lens"], *config["models"].values(),
                        config["d_model"]]
        assert lost <= collections.Counter(placeholders), lost
        assert "rows" not in new and new["decode"]["matmul_peak"] == old["decode"]["matmul"]
        assert [row["share_of_matmul_peak"] for row in new["decode"]["rows"]] == \
            [row["share_of_matmul"] for row in old["decode"]["rows"]]
    else:
        assert lost == collections.Counter([2]), lost  # the schema version
        assert [row["flops"] for row in new["rows"]] == [row["flops_total"] for row in old["rows"]]
        assert [row["tflops"] for row in new["block_sparse"]["rows"]] == \
            [row["tflops_useful"] for row in old["block_sparse"]["rows"]]
    with pytest.raises(ValueError, match="schema_version 1: no migration to 3"):
        results.migrate(dict(old, schema_version=1))


def test_the_deploy_workflow_validates_every_results_file_before_building():
    import yaml

    runs = [step.get("run", "") for step in yaml.safe_load((ROOT / ".github" / "workflows" / "docs.yml").read_text())
            ["jobs"]["build"]["steps"]]
    validate = next(index for index, run in enumerate(runs) if "python -m attention.bench --validate" in run)
    assert runs[validate].startswith("find docs/results -name '*.json'")
    assert validate < next(index for index, run in enumerate(runs) if "mkdocs build" in run)
