"""The long-context profile, `python -m attention.bench --profile long`: memory against T, and block sparsity.

One run, one results file, two measurements:

1. **Memory against length.** The naive class (`split_heads`, which writes the `(B, H, T, T)` scores),
   the tiled class (`tiled`, FlashAttention's algorithm in plain PyTorch) and the fused kernel
   (`sdpa_causal`), at batch 1 and T = 128 .. 16384, forward and forward + backward: ordinary benchmark
   rows (`run_benchmark`), each checked against the float64 reference and carrying its peak memory. A
   row whose predicted peak exceeds the memory budget is skipped with the prediction as its reason.
2. **Block sparsity** (`result["block_sparse"]`). For each mask pattern (`SPARSE_PATTERNS`: causal, a
   sliding window, BigBird with random blocks, packed documents) and each length, two kernels on the
   same `(B, H, T, D)` queries, keys and values, forward: FlexAttention with the pattern's `BlockMask`,
   which skips the `(128 x 128)` blocks with no attended pair, and SDPA with the same mask as a dense
   boolean `(T, T)` tensor, which computes every block. Each row is checked against a float64
   reference on `checked_queries` query rows spread over the sequence, then timed like the rows of
   the harness (blocks interleaved with the matmul yardstick), and its peak memory measured.

FLOPs of the block-sparse rows count the attended pairs only (`flops_useful`), the work any kernel
needs for that mask: the dense kernel's rate in those units shows what the mask wastes.
"""

import math
import sys
import time

import torch
import torch.nn.functional as F

from attention.bench import metrics
from attention.bench.harness import DTYPES, BenchConfig, run_benchmark, write_result
from attention.masks import and_masks, bigbird, causal, dense_mask, document, sliding_window

LONG_SEQ_LENS = tuple(2**i for i in range(7, 15))  # 128 .. 16384
LONG_IMPLEMENTATIONS = ("split_heads", "tiled", "sdpa_causal")
SPARSE_KERNELS = ("flex_block_mask", "sdpa_dense_mask")
CHECKED_QUERIES = 64
BLOCK = 128  # FlexAttention's default block side on every device here


def long_config(**overrides):
    """The long profile: GPT-2 small's widths at batch 1, T = 128 .. 16384, short timing per row."""
    settings = dict(batch=1, seq_len=LONG_SEQ_LENS[0], sweep_batch=1, seq_lens=LONG_SEQ_LENS,
                    implementations=LONG_IMPLEMENTATIONS, min_run_time=0.5, min_repeats=3, warmup_time=0.1,
                    profile="long")
    return BenchConfig(**settings | overrides)


def document_ids(seq_len, seed=0, shortest=256, longest=2048):
    """`(seq_len,)` document ids of packed documents whose lengths are drawn uniformly in [shortest, longest]."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (seq_len // shortest + 1,), generator=generator)
    ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (sum of lengths,) >= seq_len
    return ids[:seq_len].contiguous()


# name -> (description, mask_mod builder for a length and device). One mask definition serves both kernels.
SPARSE_PATTERNS = {
    "causal": ("causal (decoder)", lambda seq_len, device: causal),
    "sliding_window": ("causal sliding window of 1024 keys (Mistral-style)", lambda seq_len, device: sliding_window(1024)),
    "bigbird": ("BigBird, bidirectional: a window of ±64 keys, 64 global tokens, and 3 random key blocks of 128 "
                "tokens per query block of 128, aligned with FlexAttention's blocks (as many as there are, when "
                "fewer)",
                lambda seq_len, device: bigbird(64, 64, min(3, math.ceil(seq_len / BLOCK)), max_len=seq_len, seed=0,
                                                device=device, block_size=BLOCK)),
    "document": ("causal within packed documents of 256 to 2048 tokens",
                 lambda seq_len, device: and_masks(causal, document(document_ids(seq_len).to(device)))),
}


def run_long(config=None, progress=True, argv=None, checkpoint=None, patterns=None):
    """Run the long profile: the memory sweep, then the block-sparse sweep; return the result dict.

    Args:
        config: a `BenchConfig`, default `long_config()`; its `seq_lens` serve both sweeps, its
            `implementations` the memory sweep.
        patterns: names from `SPARSE_PATTERNS` (default all); `()` skips the block-sparse sweep.
        progress, argv, checkpoint: as for `run_benchmark`.
    """
    config = (config or long_config()).resolve()
    names = tuple(SPARSE_PATTERNS) if patterns is None else tuple(patterns)
    unknown = [name for name in names if name not in SPARSE_PATTERNS]
    if unknown:
        raise ValueError(f"unknown pattern(s) {unknown}; valid: {', '.join(SPARSE_PATTERNS)}")
    started = time.perf_counter()
    result = run_benchmark(config, progress=progress, argv=argv, checkpoint=checkpoint)
    result["complete"] = False
    result["block_sparse"] = {
        "patterns": {name: SPARSE_PATTERNS[name][0] for name in names}, "kernels": list(SPARSE_KERNELS),
        "batch": config.sweep_batch, "num_heads": config.num_heads, "head_dim": config.d_model // config.num_heads,
        "seq_lens": list(config.seq_lens), "block_size": BLOCK, "checked_queries": CHECKED_QUERIES,
        "mode": "forward", "rows": []}
    device, dtype = torch.device(config.device), DTYPES[config.dtype]
    yardstick = metrics.matmul_call(device, dtype, config.matmul_size)  # (call, flops), timed beside every row
    for name in names:
        for seq_len in config.seq_lens:
            result["block_sparse"]["rows"] += sparse_rows(config, name, seq_len, device, dtype, yardstick, progress)
            if checkpoint:
                write_result(result, checkpoint)
    result["complete"] = True
    result["provenance"]["duration_s"] = round(time.perf_counter() - started, 1)
    if checkpoint:
        write_result(result, checkpoint)
    return result


def sparse_rows(config, pattern, seq_len, device, dtype, yardstick, progress=False):
    """The two rows (FlexAttention with the BlockMask, SDPA with the dense mask) of one pattern and length."""
    from attention.causal.flex import compiled_flex_attention

    B, H, D = config.sweep_batch, config.num_heads, config.d_model // config.num_heads
    generator = torch.Generator().manual_seed(config.seed + 3)
    q, k, v = (torch.randn(B, H, seq_len, D, generator=generator).to(device=device, dtype=dtype) for _ in range(3))
    mask_mod = SPARSE_PATTERNS[pattern][1](seq_len, device)
    dense = dense_mask(mask_mod, seq_len, seq_len, device=device)  # (T, T), True = attend
    attended = int(dense.sum())
    rows_checked = torch.linspace(0, seq_len - 1, min(CHECKED_QUERIES, seq_len)).round().long().unique()
    expected = _reference_rows(q, k, v, dense, rows_checked)
    base = dict(pattern=pattern, seq_len=seq_len, batch=B, num_heads=H, head_dim=D, mode="forward",
                mask_density=attended / seq_len**2, flops_useful=4 * B * H * D * attended,
                flops_dense=4 * B * H * D * seq_len**2, checked_queries=len(rows_checked),
                tolerance=metrics.TOLERANCES[config.dtype])

    started = time.perf_counter()
    block_mask = _block_mask(mask_mod, seq_len, device)
    block_mask_s = time.perf_counter() - started
    computed_blocks = int(block_mask.kv_num_blocks.sum()) + int((block_mask.full_kv_num_blocks.sum()
                                                                if block_mask.full_kv_num_blocks is not None else 0))
    total_blocks = math.ceil(seq_len / BLOCK) ** 2
    block_mask_bytes = sum(t.nbytes for t in block_mask.as_tuple() if isinstance(t, torch.Tensor))
    calls = {
        "flex_block_mask": (lambda: compiled_flex_attention(q, k, v, block_mask=block_mask),
                            dict(block_share=computed_blocks / total_blocks, mask_bytes=block_mask_bytes,
                                 block_mask_s=block_mask_s)),
        "sdpa_dense_mask": (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense),
                            dict(block_share=1.0, mask_bytes=dense.nbytes, block_mask_s=None)),
    }
    rows = []
    for kernel, (fn, extra) in calls.items():
        row = base | extra | dict(kernel=kernel, status="ok", reason=None)
        try:
            _measure_sparse(config, row, fn, expected, rows_checked, device, yardstick)
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
            row.update(status="failed", reason="out of memory" if oom else f"{type(error).__name__}: {error}"[:300])
        rows.append(row)
        if progress:
            detail = (f"{row['ms_median']:9.2f} ms, {row['share_of_paired_matmul']:.0%} of matmul (useful FLOPs), "
                      f"{'correct' if row['correct'] else 'WRONG'}" if row["status"] == "ok" else row["reason"])
            print(f"block sparse {pattern:<15} {kernel:<16} T={seq_len:<6} blocks {row['block_share']:.0%} {detail}",
                  flush=True, file=sys.stderr)
    return rows


def _block_mask(mask_mod, seq_len, device):
    from attention.masks import block_mask
    return block_mask(mask_mod, seq_len, seq_len, device)


def _reference_rows(q, k, v, dense, rows):
    """float64 attention of batch element 0 at query `rows`: `(H, len(rows), D)`."""
    q64, k64, v64 = (t[0].to("cpu", torch.float64) for t in (q, k, v))  # (H, T, D)
    scores = q64[:, rows] @ k64.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (H, rows, T)
    scores = scores.masked_fill(~dense[rows].to("cpu"), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64  # (H, rows, D)


def _measure_sparse(config, row, fn, expected, rows_checked, device, yardstick):
    def call():
        with torch.no_grad():
            return fn()

    row["first_call_s"], out = metrics.time_first_call(call, device)
    row["correct"], row["max_abs_error"] = metrics.compare_to_reference(out[0][:, rows_checked], expected,
                                                                        row["tolerance"])
    del out
    warm_start = time.perf_counter()
    profiled = metrics.profile_call(call, device)
    row["sdpa_backends"] = profiled["backends"]
    if device.type == "cpu":
        row["peak_memory_bytes"], hint = profiled["cpu_tensor_peak_bytes"], None
    else:
        probe = time.perf_counter()
        row["peak_memory_bytes"] = metrics.device_peak_memory(call, device)
        hint = time.perf_counter() - probe  # the probe was one plain call
    matmul, matmul_flops = yardstick
    timing = metrics.time_callable(call, device, min_run_time=config.min_run_time, min_repeats=config.min_repeats,
                                   warmup_time=config.warmup_time, warm_s=time.perf_counter() - warm_start,
                                   per_call_hint=hint, paired=matmul)
    row.update({key: value for key, value in timing.items() if not key.startswith("paired_")})
    row["tflops_useful"] = row["flops_useful"] / (row["ms_median"] * 1e-3) / 1e12
    row["matmul_tflops_paired"] = matmul_flops / (timing["paired_ms_median"] * 1e-3) / 1e12
    row["share_of_paired_matmul"] = row["tflops_useful"] / row["matmul_tflops_paired"]
