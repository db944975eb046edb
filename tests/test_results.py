"""Results files from anyone: the validator knows every field and refuses, naming the field, whatever could reach
a page as markup or break it; a page built from a hostile file that slipped past the validator shows its strings
as text; older files migrate mechanically."""

import collections
import copy
import html.parser
import json
import math
import re
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
    assert results.check_file(big)["problems"] == ["cannot be read: 16.0 MiB, at most 16 MiB"]
    named = tmp_path / "cpu-<b>.json"
    named.write_text(json.dumps(FILES["sequence"]))
    assert results.check_file(named)["problems"][0].startswith("file name: 'cpu-<b>.json' is not")


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
