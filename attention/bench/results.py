"""A results file: its schema (every field's form and bounds), reading, validation, escaping and migration.

One JSON object: the envelope (`ENVELOPE`, written by `core.Envelope`) and a section per sweep that ran
(`attention.bench.SWEEPS`): the sequence sweep's at the top level, where the pages have always read it, the
others under their names. Files come from anyone ("Add your device") and their strings reach the pages, so
every field has a rule (strings a form and a length, numbers finite and bounded, names from fixed sets),
unknown fields are refused, and each problem names its field. docs/benchmark-schema.md describes the file.
"""

import copy
import math
import re
import typing
from pathlib import Path

from attention import files
from attention.schema import (BOOLEAN, DATE, IDENTIFIER, LOAD, NAME, PROSE, SECONDS, VERSION, config_problems,  # noqa: F401
                              escaped, field_rules, in_range, integer, list_of, mapping, nullable, one_of, record,
                              rule_of, shown, text)
from attention.bench.metrics import SDPA_KERNEL_PATTERNS, SDPA_OPS
from attention.bench.provenance import REPO_DIR, dependencies, source_files
from attention.machine import RESULT_FLAGS
from attention.reference import TOLERANCES

# Bump when a field changes name or meaning, and teach `migrate` to rewrite the files of the version before.
SCHEMA_VERSION = 3
RESULTS_DIR = REPO_DIR / "docs" / "results"
MAX_FILE_BYTES, MAX_ROWS = 16 * 2**20, 5000
# Objects and lists inside one another, at most (a recorded file nests 6 deep): the validator, `escaped` and the
# messages that quote a value walk a file recursively, and a deeper file would exhaust Python's stack there.
MAX_DEPTH = 32
DEVICE_TYPES = ("cpu", "cuda", "mps")
FILE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}\.json")  # the pages show it: a name, nothing else
# What a recorded error message may hold: no Markdown link, HTML or code span can be written with these.
REASON_CHARS = r"A-Za-z0-9 .,:;'=!?%#()/+*_-"


def fields_table(row_type):
    """Markdown table of a row type's fields and their meanings, for docs/benchmark-schema.md."""
    hints = typing.get_type_hints(row_type, include_extras=True)
    return "\n".join(["| Field | Meaning |", "|---|---|"] + [f"| `{name}` | {hint.__metadata__[1]} |"
                                                             for name, hint in hints.items()])


def new_row(row_type, **values):
    """A row of `row_type` with `values` and every other field None; `TypeError` naming a field it lacks."""
    fields = typing.get_type_hints(row_type)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise TypeError(f"unknown row field(s) {unknown}; {row_type.__name__} has {', '.join(fields)}")
    return dict.fromkeys(fields) | values


def mismatches(where, row, expected):
    """Problems where a row's number differs from its definition (`expected`: {field: value}; integers exactly)."""
    return [f"{where}: {key} {row.get(key)} does not match its definition ({value:.6g})" for key, value in expected.items()
            if row.get(key) is None or (row[key] != value if isinstance(value, int) else
                                        not math.isclose(row[key], value, rel_tol=1e-3))]


def disordered(where, row):
    """The problem of an `ok` row whose times are not positive and ordered, or `[]`."""
    times = [row[key] for key in ("ms_min", "ms_q1", "ms_median", "ms_q3", "ms_max")]
    return [] if None not in times and times == sorted(times) and times[0] > 0 else [
        f"{where}: times are not positive and ordered min <= q1 <= median <= q3 <= max: {times}"]


REASON = text(f"[{REASON_CHARS}]+", "a sentence of letters, digits and punctuation (no brackets)", 300)
COUNT, BYTES, MS = integer(0, 2**31), integer(0, 2**60), in_range(0, 1e9)
POSITIVE = integer(1, 2**31)
RATE, SHARE = in_range(0, 1e9), in_range(0, 1e4)
DTYPE = one_of(*dict.fromkeys(dtype for _, dtype in TOLERANCES))  # the dtypes with a tolerance
TOLERANCE = record({"atol": in_range(0, 1), "rtol": in_range(0, 1)})
SDPA_BACKENDS = list_of(one_of("n/a", *dict.fromkeys(SDPA_OPS.values()), *(label for label, _ in SDPA_KERNEL_PATTERNS)), 8)
SDPA_OP_NAMES = list_of(one_of(*SDPA_OPS), 16)
# CUDA kernel names are C++ signatures (templates, namespaces): no quotes, `=`, `/` or brackets, so no HTML attribute,
# closing tag or Markdown link.
KERNEL_NAME = text(r"[A-Za-z0-9_:<>(),*&. -]+", "a GPU kernel name", 1000)

DEVICE = record({
    "type": one_of(*DEVICE_TYPES), "name": NAME, "cpu": NAME, "cpu_flags": nullable(list_of(one_of(*RESULT_FLAGS), 16)),
    "cpu_count": integer(1, 1 << 16), "torch_num_threads": integer(1, 1 << 16), "host_memory_bytes": nullable(BYTES),
    "memory_bytes": BYTES, "compute_capability": text(r"\d{1,2}\.\d{1,2}", "a compute capability such as 8.0", 8),
    "multiprocessors": integer(1, 1 << 16)}, optional=("memory_bytes", "compute_capability", "multiprocessors"))
SOURCE_FILES = mapping(text(r"attention/[A-Za-z0-9_/]+\.py", "a path attention/....py", 200),
                       text(r"[0-9a-f]{64}", "a sha256 in hexadecimal", 64), 2000)
COMMAND = text(r"[A-Za-z0-9 ._/=,:+@%'-]+", "a command line of letters, digits, spaces and ._/=,:+@%'-", 2000)
GIT = record({"commit": nullable(text(r"[0-9a-f]{40}|[0-9a-f]{64}", "a hexadecimal git commit", 64)),
              "dirty": nullable(BOOLEAN)})
# `--refresh`: the rows measured again (by section and index) and what they were measured with; the rest of a row's
# provenance is the file's.
REFRESH = record({"date_utc": DATE, "command": COMMAND, "git": GIT, "source_files": SOURCE_FILES, "duration_s": SECONDS,
                  "rows": mapping(IDENTIFIER, list_of(integer(0, MAX_ROWS), MAX_ROWS), 10)})
PROVENANCE = record({
    "date_utc": DATE, "command": COMMAND,
    "argv": list_of(text(r"[A-Za-z0-9 ._/=,:+@%-]*", "an argument of letters, digits, spaces and ._/=,:+@%-", 500), 200),
    "git": GIT,
    "source_hash": text(r"[0-9a-f]{64}", "a sha256 in hexadecimal", 64),
    "source_files": SOURCE_FILES,
    "python": VERSION, "platform": text(r"[A-Za-z0-9._+-]+", "a platform of letters, digits and ._+-", 200),
    "torch": VERSION, "cuda": nullable(VERSION), "cudnn": nullable(integer(0, 10**8)), "device": DEVICE,
    "float32_matmul_precision": one_of("highest", "high", "medium"), "load_average_start": LOAD,
    "load_average_end": LOAD, "duration_s": SECONDS, "refreshes": list_of(REFRESH, 100)},
    optional=("load_average_end", "duration_s", "refreshes"))
ENVELOPE = {"schema_version": one_of(SCHEMA_VERSION), "complete": BOOLEAN, "profile": IDENTIFIER,
            "device_type": one_of(*DEVICE_TYPES), "dtype": DTYPE, "provenance": PROVENANCE}


def section(result, sweep_name):
    """A sweep's section of a results file, or None: the top level for the sequence sweep, else `result[name]`."""
    from attention.bench import SWEEPS  # the sweeps import this module; read their registry when needed

    if sweep_name == "sequence":
        return {key: value for key, value in result.items() if key not in ENVELOPE and key not in SWEEPS} or None
    return result.get(sweep_name)


def all_rows(result):
    """The rows of every sweep of a results file, in the order of `SWEEPS`."""
    from attention.bench import SWEEPS

    return [row for name in SWEEPS for row in (section(result, name) or {}).get("rows", [])]


def measured_by(name, row):
    """The modules that measured `row` (of sweep `name`): the sweep's, and those it names as the row's subjects
    (`subjects(row)`: the class it measured). Its numbers depend on their files and what they import."""
    from attention.bench import SWEEPS

    sweep = SWEEPS[name]
    return (sweep.__name__, *getattr(sweep, "subjects", lambda row: [])(row))


def stale_rows(result, current=None):
    """`{sweep name: {row index: [files changed since the row was measured]}}`, only rows with a change: the files
    `measured_by` it whose hash now (`current`, default `source_files()`) differs from the one recorded for it (the
    last `provenance.refreshes` entry that measured it again, else the file's `provenance.source_files`)."""
    from attention.bench import SWEEPS

    current, stale, files = current or source_files(), {}, {}
    for name in SWEEPS:
        refreshes = result["provenance"].get("refreshes", [])
        for index, row in enumerate((section(result, name) or {}).get("rows", [])):
            recorded = next((refresh["source_files"] for refresh in reversed(refreshes)
                             if index in refresh["rows"].get(name, [])), result["provenance"]["source_files"])
            modules = measured_by(name, row)
            files[modules] = files.get(modules) or dependencies(modules)
            changed = [path for path in files[modules] if recorded.get(path) != current.get(path)]
            if changed:
                stale.setdefault(name, {})[index] = changed
    return stale


def is_stale(result):
    """True when a row of `result` was measured by code that has changed since (`stale_rows`)."""
    return bool(stale_rows(result))


def changed_sources(result):
    """The files changed since the stale rows of `result` were measured, sorted (`[]`: the run is current)."""
    return sorted({path for rows in stale_rows(result).values() for changed in rows.values() for path in changed})


def validate(result):
    """Every problem that makes `result` unfit to publish (`[]`: valid): the envelope's rules, a finished run of
    one device type, and each sweep's section (`Sweep.validate`). A run of older sources is valid (and stale)."""
    from attention.bench import SWEEPS

    if not isinstance(result, dict):
        return [f"expected a JSON object, got {shown(result)}"]
    envelope = {key: value for key, value in result.items() if key in ENVELOPE}
    problems = record(ENVELOPE)(envelope, "")
    if not problems:
        if result["complete"] is not True:
            problems.append("complete: false: the run did not finish (a checkpoint written while it ran)")
        if result["provenance"]["device"]["type"] != result["device_type"]:
            problems.append(f"device_type: {result['device_type']!r} differs from provenance.device.type")
    sections = {name: section(result, name) for name in SWEEPS}
    if not any(value is not None for value in sections.values()):
        problems.append("no section of any sweep: " + ", ".join(SWEEPS))
    problems += [p for name, found in sections.items() if found is not None for p in SWEEPS[name].validate(found, result)]
    for number_, refresh in enumerate([] if problems else result["provenance"].get("refreshes", [])):
        problems += [f"provenance.refreshes[{number_}].rows.{name}: {index} is not a row of that section" for name, indices
                     in refresh["rows"].items() for index in indices if index >= len((sections.get(name) or {}).get("rows", []))]
    return problems


def read(path):
    """The JSON object in the regular file `path` (`attention.files.read_json`: at most `MAX_FILE_BYTES`, unique keys;
    NaN and infinities read as floats, for the validator to name); `ValueError` naming the file for anything else,
    and for nesting deeper than `MAX_DEPTH`."""
    result = files.read_json(path, MAX_FILE_BYTES)
    if nesting_depth(result) > MAX_DEPTH:
        raise ValueError(f"{path}: objects and lists nested more than {MAX_DEPTH} deep")
    return result


def nesting_depth(value):
    """How many objects and lists deep `value` goes (0 for a string or a number), counted without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_result(path):
    """A results file of the current `SCHEMA_VERSION`, its strings `escaped` for the pages that show them;
    `ValueError` for another version (`migrate` it)."""
    result = read(path)
    if (version := isinstance(result, dict) and result.get("schema_version")) != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version!r}, this code reads {SCHEMA_VERSION}; "
                         "python -m attention.bench --migrate FILE rewrites an older file")
    return escaped(result)


def find_results(directory=RESULTS_DIR, device_type=None):
    """Results files directly in `directory` (default `docs/results/`), newest run first, as `Path`s; with
    `device_type` ("cpu", "cuda", "mps"), only those whose `device_type` field says so."""
    found = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            result = load_result(path)
        except (ValueError, OSError):
            continue
        if device_type in (None, result["device_type"]):
            found.append((result["provenance"]["date_utc"], path))
    return [path for _, path in sorted(found, reverse=True)]


def check_file(path):
    """Everything `python -m attention.bench --validate FILE` says about a file: `{"result", "problems",
    "changed"}`: the result if valid (as read: `escaped` it before a page shows it), what makes it unfit to
    publish, and the package files changed since it was recorded."""
    problems = [] if FILE_NAME.fullmatch(Path(path).name) else [
        f"file name: {shown(Path(path).name)} is not lower-case letters, digits and ._- ending in .json"]
    try:
        result = read(path)
    except (OSError, ValueError) as error:  # the report names the file already: the reason alone
        return {"result": None, "problems": problems + [f"cannot be read: {str(error).removeprefix(f'{path}: ')}"],
                "changed": []}
    version = result.get("schema_version") if isinstance(result, dict) else None
    if isinstance(version, int) and version in MIGRATIONS:  # a list or an object there is not a key: the rules name it
        problems.append(f"schema_version: {version}, an older layout: python -m attention.bench --migrate FILE "
                        f"rewrites it as version {SCHEMA_VERSION}")
    problems += [] if isinstance(version, int) and version in MIGRATIONS else validate(result)
    return {"result": None if problems else result, "problems": problems,
            "changed": [] if problems else changed_sources(result)}


# --- Migration: an older file rewritten mechanically (fields renamed, moved or added as null; no number edited) ---

def _from_version_2(result):
    """Version 2 -> 3: the envelope gains `profile` and `provenance.device.cpu_flags` (null: not recorded then);
    the work and rate fields are named alike in every sweep (`flops`, `tflops`, `share_of_matmul_peak`,
    `matmul_peak`); a decode run loses the placeholders the sequence validator needed (`rows`, `rankings`,
    `matmul_peak`, and `config`'s `modes`, `batch`, `seq_len`, `sweep_batch`, `seq_lens`) and keeps its config
    in `decode`; `block_sparse` records the seed and timing it ran with (the run's `config`'s); every row has
    every field of its sweep's row type (`null` where that run did not measure it; `ms_iqr` is `ms_q3 - ms_q1`)."""
    from attention.bench import SWEEPS

    config, _ = result.pop("config"), result.pop("schema_version")
    result["provenance"]["device"].setdefault("cpu_flags", None)
    migrated = {"schema_version": 3, "complete": result.pop("complete"), "profile": config["profile"],
                **{key: result.pop(key) for key in ("device_type", "dtype", "provenance")}}
    renames = {"flops_total": "flops", "flops_useful": "flops", "tflops_useful": "tflops",
               "share_of_matmul": "share_of_matmul_peak", "matmul": "matmul_peak"}
    if "decode" in result:
        for key in ("rows", "rankings", "matmul_peak"):
            del result[key]
        placeholders = ("modes", "batch", "seq_len", "sweep_batch", "seq_lens", "device", "dtype", "profile", "d_model")
        header = {key: list(value) if key == "models" else value for key, value in config.items()
                  if key not in placeholders}
        migrated["decode"] = header | {renames.get(key, key): value for key, value in result.pop("decode").items()}
    else:
        migrated["config"] = config
    if "block_sparse" in result:
        result["block_sparse"].update({key: config[key] for key in ("seed", "min_run_time", "min_repeats",
                                                                   "warmup_time", "matmul_size")})
    migrated.update(result)
    for name, sweep in SWEEPS.items():
        found = section(migrated, name) or {}
        for index, row in enumerate(found.get("rows", [])):
            row = {renames.get(key, key): value for key, value in row.items()}
            if row.get("ms_iqr") is None and row.get("ms_q3") is not None:
                row["ms_iqr"] = row["ms_q3"] - row["ms_q1"]
            if name == "decode":  # the cache bytes of version 2 counted every cached position and the step's own
                row["positions_read"] = row["context"] + 1
            found["rows"][index] = new_row(sweep.Row, **row)
    return migrated


MIGRATIONS = {2: _from_version_2}


def migrate(result):
    """`result` rewritten as the current `SCHEMA_VERSION`, one version at a time (a copy; numbers untouched);
    `ValueError` for a value that is not an object of a known version."""
    if not isinstance(result, dict):
        raise ValueError(f"expected a JSON object, got {shown(result)}")
    result = copy.deepcopy(result)
    while result.get("schema_version") != SCHEMA_VERSION:
        version = result.get("schema_version")
        if not isinstance(version, int) or version not in MIGRATIONS:
            raise ValueError(f"schema_version {version!r}: no migration to {SCHEMA_VERSION} (known: {list(MIGRATIONS)})")
        result = MIGRATIONS[version](result)
    return result
