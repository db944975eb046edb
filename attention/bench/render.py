"""What the pages read from results files, in one place: `from attention.bench import render`.

Names only: each is defined once, in the module it is imported from here. Results files are read with
`load_result`, which escapes every string in them for Markdown and HTML.
"""

from attention.bench.compare import (dtype_comparison, dtype_comparison_table, dtype_pairs, dtype_verdict,  # noqa: F401
                                     share_stability, share_stability_table)
from attention.bench.format import (MODE_TITLES, collapsed, device_label, devices_line, mebibytes, number, percent,  # noqa: F401
                                    provenance_summary, run_line, table)
from attention.bench.profiles import profile_summary, quick_profile_summary  # noqa: F401
from attention.bench.provenance import changed_sources, is_stale  # noqa: F401
from attention.bench.results import (RESULTS_DIR, check_file, check_report, find_results, load_result,  # noqa: F401
                                     validate as validate_result)
from attention.bench.sweeps.block_sparse import (block_sparse_rows, block_sparse_table, crossover_table,  # noqa: F401
                                                 crossovers, plot_block_sparse)
from attention.bench.sweeps.decode import (decode_best, decode_rows, decode_summary_table, decode_table,  # noqa: F401
                                           bandwidth_note, plot_decode, share_words, shown_share)
from attention.bench.sweeps.sequence import (fastest, fastest_cell, fastest_table, markdown_tables, memory_slope_table,  # noqa: F401
                                             memory_slopes, plot_bars, plot_memory_vs_seq_len,
                                             plot_time_vs_seq_len, results_table, shape_rows, slower_by, sweep_rows,
                                             sweep_table, tied)
