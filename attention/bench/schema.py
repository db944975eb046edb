"""The results file's row type: one `Row` per measurement, each field with its meaning.

The harness builds every row with `new_row`; the renderer reads rows by these names; the docs build
writes the field table of docs/benchmark-schema.md from `ROW_FIELDS`. That page also describes the
rest of the file and the conventions behind the numbers (FLOPs, timing, correctness, memory).
"""

import typing
from typing import Annotated, TypedDict

# Bump when a field changes meaning or disappears; adding fields keeps the version.
# Version 1 files also hold `conventions` (prose now on the schema page), `matmul_peak.note` and the rows'
# `peak_rss_growth_bytes`; nothing reads them, so they still render.
SCHEMA_VERSION = 2

# A CPU row whose process got less than this share of its threads' time was measured while other work
# competed for the cores: its time overstates the implementation's cost.
CONTENDED_BELOW = 0.8


class Row(TypedDict):
    """One implementation (compiled or not) in one mode at one shape. `null` (None): not measured."""

    implementation: Annotated[str, "Registry name."]
    compiled: Annotated[bool, "`true` for the `torch.compile`d version (`--compile`); FlexAttention classes, which "
                              "compile inside themselves, are `false` (see `compile_s`)."]
    label: Annotated[str, "`implementation`, plus ` (compiled)` for compiled rows: the name in rankings and tables."]
    mode: Annotated[str, '`"forward"` (under `torch.no_grad()`) or `"forward_backward"` (see [Timing](#timing)).']
    batch: Annotated[int, "B, the batch size."]
    seq_len: Annotated[int, "T, the sequence length."]
    d_in: Annotated[int, "Input features: the config's `d_in`, by default `d_model`."]
    d_out: Annotated[int, "Output features: the config's `d_model`."]
    num_heads: Annotated[int, "H, the number of heads."]
    head_dim: Annotated[int, "D = `d_out / num_heads`."]
    num_kv_heads: Annotated[int | None, "Key/value heads of the module as built (`num_heads` for multi-head classes, "
                                        "fewer for grouped-query and multi-query ones); `null`: not built."]
    position_encoding: Annotated[str | None, 'The class\'s `position_encoding` (`null`, `"alibi"`, `"rope"`).']
    status: Annotated[str, '`"ok"`; `"skipped"` (the constructor or the weight loader refused this configuration, '
                           'e.g. `nn.MultiheadAttention` with `d_in != d_out`); `"failed"` (a call raised).']
    reason: Annotated[str | None, 'Why the row was skipped, failed (`"out of memory"`), is not correct or unchecked.']
    correct: Annotated[bool | None, "Matched the reference ([Correctness](#correctness)); `null`: not checked."]
    max_abs_error: Annotated[float | None, "Largest `|out - ref|` over the checked elements."]
    tolerance: Annotated[dict, "`{atol, rtol}` of the run's dtype."]
    checked_tokens: Annotated[int, "The check covers positions `0 .. checked_tokens - 1`."]
    checked_batch_index: Annotated[int, "The batch element checked: 0."]
    first_call_s: Annotated[float | None, "The first call alone (s), compilation and allocation included."]
    compiled_graphs: Annotated[int | None, "TorchDynamo graphs compiled by the first call; `null`: not counted."]
    compile_s: Annotated[float | None, "`first_call_s` when `compiled_graphs > 0`, else `null`."]
    ms_median: Annotated[float | None, "Median per-call time over the timing blocks (ms)."]
    ms_q1: Annotated[float | None, "First quartile of the blocks' per-call times (ms)."]
    ms_q3: Annotated[float | None, "Third quartile of the blocks' per-call times (ms)."]
    ms_iqr: Annotated[float | None, "Interquartile range, `ms_q3 - ms_q1` (ms)."]
    ms_min: Annotated[float | None, "Fastest block's per-call time (ms)."]
    ms_max: Annotated[float | None, "Slowest block's per-call time (ms)."]
    repeats: Annotated[int | None, "Number of timing blocks."]
    calls_per_repeat: Annotated[int | None, "Back-to-back calls per block."]
    cpu_utilization: Annotated[float | None, "CPU only: CPU time the process got while timing / (wall time × "
                                             f"`torch_num_threads`); below {CONTENDED_BELOW}, other processes "
                                             "competed for the cores and the time overstates the cost."]
    flops_attention: Annotated[int, "Useful FLOPs of the attention core ([FLOPs](#flops))."]
    flops_projections: Annotated[int, "Useful FLOPs of the query, key, value and output projections."]
    flops_total: Annotated[int, "`flops_attention + flops_projections`: the same for every implementation."]
    tflops: Annotated[float | None, "`flops_total / ms_median`, in TFLOP/s."]
    share_of_matmul_peak: Annotated[float | None, "`tflops / matmul_peak.tflops`, against the run-level matmul rate "
                                                  "(it can exceed 1)."]
    matmul_tflops_paired: Annotated[float | None, "The matmul rate timed in blocks interleaved with this row's timing "
                                                  "blocks (median over those blocks), in TFLOP/s."]
    share_of_paired_matmul: Annotated[float | None, "`tflops / matmul_tflops_paired`: the row's rate against the "
                                                    "matmul's under the same machine conditions (it can exceed 1)."]
    peak_memory_bytes: Annotated[int | None, "Peak tensor memory of one call ([Memory](#memory))."]
    sdpa_backends: Annotated[list | None, 'SDPA backends the profiler saw run (`"flash (cpu)"`, `"math"`, `"flash"`, '
                                          '`"efficient"`, `"cudnn"`, ...); `["n/a"]` where none ran.']
    sdpa_ops: Annotated[list | None, "Their dispatcher ops (`aten::_scaled_dot_product_flash_attention`, ...)."]
    sdpa_kernels: Annotated[list | None, "On CUDA, the GPU kernel names that matched an SDPA backend."]


# {field: its description}, in the order of `Row`.
ROW_FIELDS = {name: hint.__metadata__[0] for name, hint in typing.get_type_hints(Row, include_extras=True).items()}


def new_row(**values):
    """A `Row` with `values` and every other field None; `TypeError` naming any field `Row` lacks."""
    unknown = sorted(set(values) - set(ROW_FIELDS))
    if unknown:
        raise TypeError(f"unknown row field(s) {unknown}; Row has {', '.join(ROW_FIELDS)}")
    return Row(**dict.fromkeys(ROW_FIELDS) | values)
