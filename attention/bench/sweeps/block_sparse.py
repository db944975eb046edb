"""The block-sparse sweep: where skipping blocks pays, FlexAttention with a `BlockMask` against SDPA with a dense mask.

For each mask pattern (`PATTERNS`: causal, a sliding window, BigBird with random blocks, packed documents)
and each length, two kernels on the same `(B, H, T, D)` queries, keys and values, forward: FlexAttention
with the pattern's `BlockMask`, which skips the `(128 x 128)` blocks with no attended pair, and SDPA with
the same mask as a dense boolean `(T, T)` tensor, which computes every block. Each row is checked against
the float64 reference on `CHECKED_QUERIES` query rows spread over the sequence, then measured by
`core.measure` (timing paired with a matmul). Its FLOPs count the attended pairs only, the work any kernel
needs for the mask, so the dense kernel's rate in those units shows what the mask wastes.
"""

import dataclasses
import math
import time
from typing import Annotated

import torch
import torch.nn.functional as F

from attention.bench import core
from attention.bench.results import BYTES, MAX_ROWS, POSITIVE, disordered, mismatches, new_row
from attention.schema import PROSE, SECONDS, field_rules, in_range, integer, list_of, mapping, one_of, record, rule_of
from attention.masks import and_masks, bigbird, block_mask, causal, dense_mask, document, sliding_window
from attention.reference import reference_kernel, tolerance

NAME = "block_sparse"
KEY = ("pattern", "kernel", "seq_len")  # what tells a row apart in its section
KERNELS = {"flex_block_mask": "FlexAttention + BlockMask", "sdpa_dense_mask": "SDPA + dense mask"}
CHECKED_QUERIES = 64
BLOCK = 128  # FlexAttention's default block side on every device here


def document_ids(seq_len, seed=0, shortest=256, longest=2048):
    """`(seq_len,)` document ids of packed documents whose lengths are drawn uniformly in [shortest, longest]."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (seq_len // shortest + 1,), generator=generator)
    return torch.repeat_interleave(torch.arange(len(lengths)), lengths)[:seq_len].contiguous()  # (seq_len,)


# name -> (description, mask_mod for a length and device). One mask definition serves both kernels.
PATTERNS = {
    "causal": ("causal (decoder)", lambda seq_len, device: causal),
    "sliding_window": ("causal sliding window of 1024 keys (Mistral-style)", lambda seq_len, device: sliding_window(1024)),
    "bigbird": ("BigBird, bidirectional: a window of ±64 keys, 64 global tokens, and 3 random key blocks of 128 "
                "tokens per query block of 128, aligned with FlexAttention's blocks (as many as there are, when fewer)",
                lambda seq_len, device: bigbird(64, 64, min(3, math.ceil(seq_len / BLOCK)), max_len=seq_len, seed=0,
                                                device=device, block_size=BLOCK)),
    "document": ("causal within packed documents of 256 to 2048 tokens",
                 lambda seq_len, device: and_masks(causal, document(document_ids(seq_len).to(device)))),
}


@dataclasses.dataclass
class Config:
    """What to measure: `patterns` (names of `PATTERNS`) at `seq_lens`, batch `batch`, `num_heads` heads of
    `d_model // num_heads`; timing per row; the paired matmul's side (default 2048 on CPU, 4096 elsewhere)."""

    OPTIONS = {"sweep_batch": "batch"}  # the command line's --sweep-batch sets this sweep's batch

    patterns: Annotated[tuple, list_of(one_of(*PATTERNS), 16)] = tuple(PATTERNS)
    seq_lens: Annotated[tuple, list_of(POSITIVE, 64)] = tuple(2**i for i in range(7, 15))
    batch: Annotated[int, POSITIVE] = 1
    d_model: Annotated[int, POSITIVE] = 768
    num_heads: Annotated[int, POSITIVE] = 12
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 1.0
    min_repeats: Annotated[int, POSITIVE] = 5
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.25
    matmul_size: Annotated[int | None, POSITIVE] = None

    def resolve(self, device):
        return core.checked(dataclasses.replace(self, patterns=tuple(self.patterns), seq_lens=tuple(self.seq_lens),
                                                matmul_size=self.matmul_size or (2048 if torch.device(device).type == "cpu"
                                                                                 else 4096)))


class Row(core.Measured, core.PairedMatmul):
    """One kernel on one pattern at one length, forward."""

    pattern: Annotated[str, one_of(*PATTERNS), "Key of `block_sparse.patterns`, which describes the mask in words."]
    kernel: Annotated[str, one_of(*KERNELS), '`"flex_block_mask"` (compiled FlexAttention with the pattern\'s '
                      '`BlockMask`) or `"sdpa_dense_mask"` (SDPA with the mask as a dense boolean `(T, T)` tensor).']
    seq_len: Annotated[int, POSITIVE, "T, queries and keys."]
    batch: Annotated[int, POSITIVE, "B."]
    num_heads: Annotated[int, POSITIVE, "H."]
    head_dim: Annotated[int, POSITIVE, "D."]
    mode: Annotated[str, one_of("forward"), '`"forward"`, under `torch.no_grad()`.']
    mask_density: Annotated[float, in_range(0, 1), "Share of the T² (query, key) pairs the mask attends."]
    block_share: Annotated[float, in_range(0, 1), "Share of the `(128 x 128)` blocks the kernel computes: those holding "
                           "an attended pair for FlexAttention, all of them (1) for SDPA."]
    mask_bytes: Annotated[int, BYTES, "Bytes of the mask the kernel reads: the `BlockMask`'s index tensors, or the "
                          "dense boolean mask."]
    block_mask_s: Annotated[float | None, SECONDS, "Seconds to build the `BlockMask` (FlexAttention rows)."]
    checked_queries: Annotated[int, POSITIVE, "Query rows (spread over the sequence) compared with the float64 "
                               "reference, all heads, batch element 0."]
    flops: Annotated[int, integer(), "`4·B·H·D` × attended pairs: the work the mask asks for, the same for both kernels."]
    flops_dense: Annotated[int, integer(), "`4·B·H·D·T²`: the work of every pair."]


def run(config, envelope):
    config = config.resolve(envelope.device)
    device, dtype = envelope.device, envelope.dtype
    header = {"patterns": {name: PATTERNS[name][0] for name in config.patterns}, "kernels": list(KERNELS),
              "batch": config.batch, "num_heads": config.num_heads, "head_dim": config.d_model // config.num_heads,
              "seq_lens": list(config.seq_lens), "block_size": BLOCK, "checked_queries": CHECKED_QUERIES,
              "mode": "forward", **{key: getattr(config, key) for key in ("seed", "min_run_time", "min_repeats",
                                                                           "warmup_time", "matmul_size")}, "rows": []}
    section = envelope.open(NAME, header, len(config.patterns) * len(config.seq_lens) * len(KERNELS))
    yardstick = core.matmul_yardstick(device, dtype, config.matmul_size)
    for pattern in config.patterns:
        for seq_len in config.seq_lens:
            for row in pattern_rows(config, pattern, seq_len, envelope, yardstick):
                envelope.add(section["rows"], row, f"block sparse {pattern} {row['kernel']} T={seq_len}")
            core.release(device)


def pattern_rows(config, pattern, seq_len, envelope, yardstick):
    """The two rows (FlexAttention with the BlockMask, SDPA with the dense mask) of one pattern and length."""
    from attention.causal.flex import compiled_flex_attention

    B, H, D, device = config.batch, config.num_heads, config.d_model // config.num_heads, envelope.device
    generator = torch.Generator().manual_seed(config.seed + 3)
    q, k, v = (torch.randn(B, H, seq_len, D, generator=generator).to(device, envelope.dtype) for _ in range(3))
    mask_mod = PATTERNS[pattern][1](seq_len, device)
    dense = dense_mask(mask_mod, seq_len, seq_len, device=device)  # (T, T), True = attend
    attended = int(dense.sum())
    checked = torch.linspace(0, seq_len - 1, min(CHECKED_QUERIES, seq_len)).round().long().unique()
    q64, k64, v64 = (t[:1].to("cpu", torch.float64) for t in (q, k, v))  # (1, H, T, D): batch element 0
    expected = reference_kernel(q64[:, :, checked], k64, v64, mask=dense[checked].cpu())[0][0]  # (H, checked, D)
    started = time.perf_counter()
    blocks = block_mask(mask_mod, seq_len, seq_len, device)
    built_s = time.perf_counter() - started
    computed = sum(int(n.sum()) for n in (blocks.kv_num_blocks, blocks.full_kv_num_blocks) if n is not None)
    calls = {"flex_block_mask": (lambda: compiled_flex_attention(q, k, v, block_mask=blocks), computed
                                 / math.ceil(seq_len / BLOCK) ** 2, sum(t.nbytes for t in blocks.as_tuple()
                                                                        if isinstance(t, torch.Tensor)), built_s),
             "sdpa_dense_mask": (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense), 1.0, dense.nbytes,
                                 None)}
    for kernel, (kernel_call, block_share, mask_bytes, mask_s) in calls.items():
        row = new_row(Row, pattern=pattern, kernel=kernel, seq_len=seq_len, batch=B, num_heads=H, head_dim=D,
                      mode="forward", mask_density=attended / seq_len**2, block_share=block_share, mask_bytes=mask_bytes,
                      block_mask_s=mask_s, checked_queries=len(checked), flops=4 * B * H * D * attended,
                      flops_dense=4 * B * H * D * seq_len**2, status="ok",
                      tolerance=tolerance(envelope.device, envelope.result["dtype"]))

        def call(kernel_call=kernel_call):
            with torch.no_grad():
                return kernel_call()
        try:
            row.update(core.measure(call, lambda out: core.compared(out[0][:, checked], expected, row["tolerance"]),
                                    device, config, yardstick))
            row.update(core.matmul_rates(row))
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            core.failed(row, error)
        yield row


SECTION = record({name: rule for name, rule in field_rules(Config).items() if name != "d_model"} | {
    "patterns": mapping(one_of(*PATTERNS), PROSE, 16), "kernels": list_of(one_of(*KERNELS), 4), "head_dim": POSITIVE,
    "block_size": POSITIVE, "checked_queries": POSITIVE, "mode": one_of("forward"),
    "rows": list_of(rule_of(Row), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each measured row's rates and shares recomputed from its own numbers."""
    problems = SECTION(section, NAME)
    for index, row in enumerate([] if problems else section["rows"]):
        where = f"block_sparse.rows[{index}] ({row['pattern']}, {row['kernel']}, T={row['seq_len']})"
        pairs = row["mask_density"] * row["seq_len"] ** 2
        expected = {"flops": 4 * row["batch"] * row["num_heads"] * row["head_dim"] * pairs,
                    "flops_dense": 4 * row["batch"] * row["num_heads"] * row["head_dim"] * row["seq_len"] ** 2}
        if not 0 < row["mask_density"] <= row["block_share"] <= 1:
            problems.append(f"{where}: expected 0 < mask_density <= block_share <= 1, got {row['mask_density']} and "
                            f"{row['block_share']}")
        if row["status"] == "ok":
            if disordered(where, row):
                problems += disordered(where, row)
                continue
            expected |= core.matmul_rates(row)
        problems += mismatches(where, row, expected)
    return problems
