"""Plausible bugs in the benchmark's numbers (attention/bench/): FLOP counts, bytes, rates and shares.

A wrong count here is a wrong published number on every row (issue 35's fifth survivor: the FLOPs of
grouped-query attention counted at the K/V width of multi-head attention). The fast checks are the FLOP
convention tests, the validator (which recomputes each row's work and rates from its shape and time) on a
small run, and the decode sweep's bytes and FLOPs test.
"""

from mutant import Mutant

METRICS = "attention/bench/metrics.py"
CORE = "attention/bench/core.py"
SEQUENCE = "attention/bench/sweeps/sequence.py"
DECODE = "attention/bench/sweeps/decode.py"
DECODE_LAYERS = "attention/bench/sweeps/decode_layers.py"  # the layers the decode sweep steps
PREFILL = "attention/bench/sweeps/prefill.py"
PREFILL_REPORT = "attention/report/prefill.py"  # what the page reads from a prefill run
FLOPS = "tests/test_bench.py -k flop"  # the convention, the GQA width (on the small run) and the validator's check
VALIDATOR = "tests/test_bench.py -k 'fresh_run or rows_carry'"  # a small run, validated: rates and shares recomputed
DECODE_TESTS = "tests/test_decode.py -k 'bytes_and_flops or complete_correct'"
MODEL_DECODE_TESTS = "tests/test_decode_models.py -k 'positions or past_gemma'"  # the model families' windows and chunks
PREFILL_TESTS = "tests/test_prefill.py -k 'correct_valid_rows or recomputes or tables_summary or faster or names_ties'"
YARDSTICKS = "tests/test_bench.py -k work_units"
# core.matmul_rates is what the sweeps record and the validator expects (one definition): a hand-computed row checks it.
RATES = "tests/test_bench.py -k rate_and_share_from_its_own_numbers"

MUTANTS = [
    Mutant("gqa_flops_at_the_mha_kv_width", METRICS,
           "d_kv = d_out if num_kv_heads is None else num_kv_heads * (d_out // num_heads)", "d_kv = d_out",
           "the K/V projections counted at d_out whatever the K/V heads: GQA/MQA TFLOP/s inflated (issue 35)", FLOPS),
    Mutant("gqa_flops_kv_width_of_one_head", METRICS,
           "d_kv = d_out if num_kv_heads is None else num_kv_heads * (d_out // num_heads)",
           "d_kv = d_out if num_kv_heads is None else d_out // num_heads",
           "the K/V width of one head (MQA's) used for every grouped-query row", FLOPS),
    Mutant("causal_core_not_halved", METRICS,
           "core = 4 * batch * num_heads * seq_len * seq_len * (d_out // num_heads) // 2",
           "core = 4 * batch * num_heads * seq_len * seq_len * (d_out // num_heads)",
           "the causal mask's halving of the useful score work forgotten", FLOPS),
    Mutant("core_counts_one_matmul", METRICS,
           "core = 4 * batch * num_heads * seq_len * seq_len * (d_out // num_heads) // 2",
           "core = 2 * batch * num_heads * seq_len * seq_len * (d_out // num_heads) // 2",
           "Q K^T counted, P V forgotten", FLOPS),
    Mutant("output_projection_not_counted", METRICS,
           "projections = 2 * batch * seq_len * d_in * (d_out + 2 * d_kv) + 2 * batch * seq_len * d_out * d_out",
           "projections = 2 * batch * seq_len * d_in * (d_out + 2 * d_kv)",
           "the output projection left out of the projections' FLOPs", FLOPS),
    Mutant("backward_replaces_the_forward", METRICS,
           "projections = projections * (1 + BACKWARD_FACTOR_PROJECTIONS)",
           "projections = projections * BACKWARD_FACTOR_PROJECTIONS",
           "forward_backward counts the backward alone, not forward plus backward", FLOPS),
    Mutant("attention_backward_factor_two", METRICS,
           "BACKWARD_FACTOR_ATTENTION = 2.5", "BACKWARD_FACTOR_ATTENTION = 2.0",
           "the attention core's backward counted like a matmul's (2x), not FlashAttention's 2.5x", FLOPS),
    Mutant("matmul_yardstick_flops_halved", METRICS,
           "return (lambda: torch.mm(a, b)), 2 * size**3", "return (lambda: torch.mm(a, b)), size**3",
           "a multiply-add counted as one FLOP in the matmul yardstick: every share of it doubled", YARDSTICKS),
    Mutant("bandwidth_yardstick_counts_elements", METRICS,
           "return (lambda: data.sum()), data.nbytes", "return (lambda: data.sum()), elements",
           "elements for bytes in the read yardstick: GB/s off by the element size", YARDSTICKS),
    Mutant("copy_rate_counts_the_read_only", METRICS,
           "2 * source.nbytes)):", "source.nbytes)):",
           "a copy's bytes counted once, its write forgotten: copy GB/s halved", YARDSTICKS),
    Mutant("tolerance_without_its_relative_part", METRICS,
           "allowed = tolerance[\"atol\"] + tolerance[\"rtol\"] * reference.abs()", "allowed = tolerance[\"atol\"]",
           "the relative tolerance dropped: large correct outputs flagged wrong", YARDSTICKS),
    Mutant("yardstick_rate_in_milliseconds", CORE,
           "return self.work / (ms * 1e-3) / self.scale", "return self.work / ms / self.scale",
           "milliseconds taken for seconds: every paired yardstick rate 1000x too low", YARDSTICKS),
    Mutant("row_tflops_in_milliseconds", CORE,
           "tflops = row[\"flops\"] / (row[\"ms_median\"] * 1e-3) / 1e12",
           "tflops = row[\"flops\"] / row[\"ms_median\"] / 1e12",
           "a row's TFLOP/s from milliseconds as if seconds", RATES),
    Mutant("row_share_inverted", CORE,
           "\"share_of_paired_matmul\": tflops / (row[\"matmul_tflops_paired\"] or math.nan)",
           "\"share_of_paired_matmul\": (row[\"matmul_tflops_paired\"] or math.nan) / tflops",
           "the share of the paired matmul computed upside down", RATES),
    Mutant("decode_attention_flops_per_kv_head", DECODE_LAYERS,
           "4 * row[\"batch\"] * row[\"num_heads\"] * row[\"positions_read\"] * row[\"head_dim\"]",
           "4 * row[\"batch\"] * row[\"num_kv_heads\"] * row[\"positions_read\"] * row[\"head_dim\"]",
           "a decode step's score work counted per K/V head instead of per query head", DECODE_TESTS),
    Mutant("decode_bytes_without_the_weights", DECODE,
           "row[\"bytes_read\"] = row[\"cache_bytes_read\"] + row[\"weight_bytes\"]",
           "row[\"bytes_read\"] = row[\"cache_bytes_read\"]",
           "a decode step's bytes: the weights it reads once per step forgotten", DECODE_TESTS),
    Mutant("decode_cache_read_at_the_full_context", DECODE,
           "cache_bytes_read=batch * row[\"positions_read\"] * per_token", "cache_bytes_read=batch * context * per_token",
           "the cache read counted at the context, without the new token (or a window's shorter read)", DECODE_TESTS),
    Mutant("decode_chunked_layer_read_whole", DECODE_LAYERS,
           "window = layer.sliding_window or getattr(layer, \"attention_chunk_size\", None)",
           "window = layer.sliding_window",
           "a chunked layer (Llama 4) counted as reading every cached position, not its ring of one chunk",
           MODEL_DECODE_TESTS),
    Mutant("decode_naive_mla_budget_at_the_element_size", DECODE_LAYERS,
           "return max(5 * module.kv_b_proj.weight.element_size(), 24)",
           "return 5 * module.kv_b_proj.weight.element_size()",
           "the naive MLA step's memory counted at the cache's element size: in bfloat16 half of what it allocates, "
           "and the operating system kills the run", "tests/test_decode_models.py -k memory_budget"),
    Mutant("prefill_flops_of_one_sequence", PREFILL,
           "return row[\"batch\"] * latent_attention_flops(", "return latent_attention_flops(",
           "a prefill row's FLOPs counted for one sequence whatever the batch", PREFILL_TESTS),
    Mutant("prefill_flops_of_the_other_path", PREFILL,
           "row[\"tokens\"], row[\"path\"])", "row[\"tokens\"], \"naive\")",
           "both paths' FLOPs counted as the naive path's (the absorbed path's rate understated)", PREFILL_TESTS),
    Mutant("prefill_faster_path_by_the_medians", PREFILL_REPORT,
           "\"naive\" if naive[\"ms_q3\"] < absorbed[\"ms_q1\"]", "\"naive\" if naive[\"ms_median\"] < absorbed[\"ms_median\"]",
           "the page's 'naive faster' read from the medians alone, a tie within noise called a win", PREFILL_TESTS),
    Mutant("prefill_naive_faster_from_any_length", PREFILL_REPORT,
           "all(faster_path(pairs[u]) == \"naive\" for u in both[i:])", "faster_path(pairs[t]) == \"naive\"",
           "'naive faster from T on' claimed past a longer length where it is not faster", PREFILL_TESTS),
]
