"""A benchmark harness whose numbers can be trusted: checked, timed, measured and traced.

`python -m attention.bench` (see `attention/bench/__main__.py`) runs every registered implementation
on the same input and weights, compares each output with the float64 reference before timing it,
and writes a JSON result that records the machine, the software versions, the git commit, the
command line and a hash of the sources that ran. `attention.bench.render` turns a result into
Markdown tables and matplotlib charts. The file format is described in docs/benchmark-schema.md.

Modules:
    harness: `BenchConfig`, `quick_config`, `run_benchmark`, `write_result`.
    long: the long-context profile (`--profile long`): memory against T to 16k, block-sparse masks.
    schema: `Row`, the type of each result row, and `SCHEMA_VERSION`.
    metrics: FLOP count, tolerances, timing, matmul rate, peak memory, SDPA backend detection.
    provenance: `collect_provenance`, `source_hash`.
    render: tables, charts, provenance summary, `is_stale`.
"""

from attention.bench.harness import BenchConfig, quick_config, run_benchmark, write_result
from attention.bench.provenance import source_hash
from attention.bench.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "BenchConfig", "quick_config", "run_benchmark", "source_hash", "write_result"]
