"""What a results file shows: tables, charts, page sections and the sentences written from measured numbers. It only
reads results files (with `load_result`, which escapes their strings), so nothing here changes a measurement or stales
a recorded run. `PAGES` maps each sweep's name to its module: `tables(result)` (what the command line prints),
`charts(result)` (`{kind: (Figure, alt text)}`) and `page(result, images)` (its section of the Benchmarks page).
"""

import dataclasses

from attention.bench.profiles import quick_config
from attention.bench.results import (RESULTS_DIR, all_rows, changed_sources, check_file, find_results, is_stale,  # noqa: F401
                                     load_result, validate as validate_result)
from attention.report import (block_sparse, bounds, compare, decode, format, kernels, linear, prefill, ring,  # noqa: F401
                              sequence, sparse)
from attention.report.format import device_label

# sweep name (`attention.bench.SWEEPS`) -> the module that shows its results
PAGES = {"sequence": sequence, "block_sparse": block_sparse, "decode": decode, "ring": ring, "prefill": prefill,
         "bounds": bounds, "kernels": kernels, "linear": linear,
         "sparse": sparse}


def profile_summary(config=None):
    """A sequence run's sizes and timing in words, from its config (a file's `config`, or a `Config` as a dict; by
    default the quick profile's preset)."""
    config = config or dataclasses.asdict(quick_config())
    lengths = ", ".join(str(t) for t in config["seq_lens"] or ())
    shape = (f"batch {config['sweep_batch']}, `T` = {lengths}" if lengths
             else f"batch {config['batch']}, `T` = {config['seq_len']}")
    return (f"{shape}, d_model {config['d_model']}, {config['num_heads']} heads, timing of at least "
            f"{config['min_run_time']} s and {config['min_repeats']} repeats per row")


def recorded_durations():
    """How long each profile's runs recorded in docs/results/ took, in words."""
    runs = {}
    for folder in [RESULTS_DIR, *sorted(path for path in RESULTS_DIR.glob("*") if path.is_dir())]:
        for path in find_results(folder):
            result = load_result(path)
            seconds = result["provenance"]["duration_s"]
            runs.setdefault(result["profile"], []).append(
                (f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min")
                + f" ({device_label(result['provenance']['device'])}"
                f", {result['provenance']['device']['cpu_count']} cores, {result['dtype']})")
    return "; ".join(f"{name}: {', '.join(times)}" for name, times in runs.items()) or "none recorded in this checkout"


def check_report(path, checked):
    """`attention.bench.results.check_file`'s verdict on `path` in words, as the validator prints it."""
    result, problems, changed = checked["result"], checked["problems"], checked["changed"]
    if problems:
        return f"{path}: NOT valid, {len(problems)} problem(s):\n" + "\n".join(f"  - {problem}" for problem in problems)
    rows, device = all_rows(result), result["provenance"]["device"]
    return (f"{path}: valid: {device['type']} ({device['name']}), {result['dtype']}, profile {result['profile']!r}, "
            f"{len(rows)} rows ({sum(row['status'] == 'ok' for row in rows)} measured), recorded "
            f"{result['provenance']['date_utc']}\n" + (
                f"  recorded with older sources ({len(changed)} package file(s) changed since: {', '.join(changed[:6])}"
                f"{' ...' if len(changed) > 6 else ''}); the pages mark it as such" if changed
                else "  recorded with the current attention/ sources"))
