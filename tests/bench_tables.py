"""The benchmark's tables as structure (headings, columns, the set of rows), to compare runs of different code.

`tests/data/bench_tables_before.json` holds the structure of the tables that the benchmark printed before
it was rebuilt as one core and one file per sweep (commit 2a33d11, captured from that commit's code at the
tiny sizes below, with `structure` as written here): the quick, long and decode profiles, and the presets
the command line resolved. The tests run today's code on the same inputs and compare.
"""

import contextlib
import json
import re
from pathlib import Path

import pytest

BEFORE = json.loads((Path(__file__).parent / "data" / "bench_tables_before.json").read_text())
# The columns that name a row rather than measure it: a row is the tuple of its cells there.
IDENTITY = {"implementation", "B", "T", "pattern", "Model (K/V heads)", "Kernel", "Batch", "Model", "K/V heads", "mode"}
TINY = dict(device="cpu", d_model=32, num_heads=2, min_run_time=0.01, min_repeats=2, warmup_time=0.0, matmul_size=64)
TINY_DECODE = dict(num_heads=8, head_dim=16, contexts=(64, 128), batches=(1, 2), min_run_time=0.02, min_repeats=2,
                   warmup_time=0.0, bandwidth_bytes=2**22, ceiling_bytes=(2**22, 2**23))


@contextlib.contextmanager
def quick_yardsticks():
    """The decode sweep's samples of the matmul rate and the bandwidth (after each model) shortened and small, for tests of
    what else a run does; tests/test_decode.py's `decode_result` samples them at the sweep's sizes."""
    from attention.bench import metrics

    matmul_rate, bandwidth_rate = metrics.matmul_rate, metrics.bandwidth_rate
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(metrics, "matmul_rate", lambda device, dtype, size, min_run_time: matmul_rate(
            device, dtype, 256, min_run_time=0.01, warmup_time=0.0))
        patch.setattr(metrics, "bandwidth_rate", lambda device, dtype, sizes: bandwidth_rate(
            device, dtype, sizes, min_run_time=0.01))
        patch.setattr(metrics, "ceiling_sizes", lambda last_level_cache: (2**22, 2**23))
        yield


def structure(markdown):
    """Every Markdown table in `markdown`: `{"heading", "header", "rows"}`, the heading the last `#### ` or `**`
    line above it, `rows` the sorted identity cells of each row."""
    tables, heading, lines, index = [], None, markdown.splitlines(), 0
    while index < len(lines):
        line = lines[index].strip()
        if line.startswith(("#### ", "**")):
            heading = line
        if line.startswith("|") and index + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[index + 1].strip()):
            header = [cell.strip() for cell in line.strip("|").split("|")]
            keep = [i for i, name in enumerate(header) if name in IDENTITY or name.startswith("implementation (")]
            rows, index = set(), index + 2
            while index < len(lines) and lines[index].strip().startswith("|"):
                cells = [cell.strip() for cell in lines[index].strip().strip("|").split("|")]
                rows.add(" | ".join(cells[i] for i in keep))
                index += 1
            tables.append({"heading": heading, "header": header, "rows": sorted(rows)})
            continue
        index += 1
    return tables
