"""`python -m attention.bench`: benchmark every registered implementation, print tables, save JSON.

Examples:

    python -m attention.bench --quick --out docs/results/cpu-quick.json
    python -m attention.bench --profile long --out docs/results/long/cpu-long-float32.json
    python -m attention.bench --profile decode --out docs/results/decode/cpu-decode-float32.json
    python -m attention.bench --device cuda --dtype bfloat16 --mode both --compile --out results.json
    python -m attention.bench --impl sdpa_causal flex --batch 4 --seq-len 2048 --seq-lens none
    python -m attention.bench --validate docs/results/*.json
"""

import argparse
import dataclasses
import sys

from attention.bench.harness import (DEVICES, DTYPES, MODE_CHOICES, BenchConfig, quick_config, run_benchmark,
                                     select_implementations)
from attention.registry import IMPLEMENTATIONS


def seq_lens_argument(text):
    """"128,256,512" or "128 256" -> (128, 256, 512); "none" -> () (no sweep)."""
    if text.strip().lower() in ("none", ""):
        return ()
    try:
        values = tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seq-lens must be integers separated by commas, or 'none', got {text!r}")
    if any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"--seq-lens must be positive, got {text!r}")
    return values


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser():
    quick = quick_config()
    parser = argparse.ArgumentParser(
        prog="python -m attention.bench",
        description="Benchmark the registered causal self-attention implementations: each is checked against "
                    "the float64 reference, then timed. Defaults: GPT-2 small (B=8, T=1024, d_model=768, 12 heads) "
                    "plus a sequence-length sweep.",
    )
    parser.add_argument("--device", choices=DEVICES, default="auto", help="default: auto (CUDA, else MPS, else CPU)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32",
                        help="tf32 = float32 tensors with TensorFloat-32 matmuls (CUDA only)")
    parser.add_argument("--mode", choices=list(MODE_CHOICES), default="both",
                        help="forward, backward (= forward+backward) or both (default)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd versions, as separate rows")
    parser.add_argument("--quick", action="store_true",
                        help=f"the docs profile: batch {quick.sweep_batch}, T={','.join(map(str, quick.seq_lens))}, "
                             "short timing; explicit size options override it")
    parser.add_argument("--profile", choices=("default", "quick", "long", "decode"), default="default",
                        help="default: GPT-2 small plus the sweep; quick: the same as --quick; long: memory against "
                             "T = 128..16384 for split_heads, tiled and sdpa_causal, then FlexAttention BlockMasks "
                             "against dense SDPA masks (causal, sliding window, BigBird, documents) at the same "
                             "lengths; decode: one new token per step over a KV cache of 1k..32k positions, batch 1 "
                             "and 8, MHA, GQA (8:1) and MQA with 32 heads of 128, in tokens/s and share of the "
                             "measured read bandwidth (--batch, --seq-lens and --heads set its batch, contexts "
                             "and query heads); explicit size options override a profile's")
    parser.add_argument("--batch", type=positive_int, help="headline batch size (default 8)")
    parser.add_argument("--seq-len", type=positive_int, help="headline sequence length (default 1024)")
    parser.add_argument("--seq-lens", type=seq_lens_argument,
                        help="sweep lengths, e.g. 128,256,512 or 'none' (default 128..4096 on CPU, ..16384 on CUDA)")
    parser.add_argument("--sweep-batch", type=positive_int,
                        help="batch size of the sweep (default 1 on CPU/MPS, --batch on CUDA)")
    parser.add_argument("--d-model", type=positive_int, help="model width: d_in = d_out = d_model (default 768)")
    parser.add_argument("--d-in", type=positive_int, help="input features, if not d_model")
    parser.add_argument("--heads", type=positive_int, dest="num_heads", metavar="HEADS",
                        help="number of heads (default 12)")
    parser.add_argument("--impl", nargs="+", dest="implementations", metavar="NAME",
                        help="implementations to run (default: all registered)")
    parser.add_argument("--min-run-time", type=float, help="seconds of timing per row at least (default 1.0)")
    parser.add_argument("--repeats", type=positive_int, dest="min_repeats", metavar="REPEATS",
                        help="timing blocks per row at least (default 5)")
    parser.add_argument("--matmul-size", type=positive_int, help="side of the peak matmul (default 2048 CPU, 4096 GPU)")
    parser.add_argument("--seed", type=int, help="seed of the weights and inputs (default 0)")
    parser.add_argument("--out", metavar="FILE",
                        help="write the JSON result here (rewritten after each implementation while running)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--validate", nargs="+", metavar="FILE",
                        help="check results files instead of running: schema, provenance, every row consistent; "
                             "exit status 1 if any is not valid (a run recorded with older sources is valid, "
                             "and said to be)")
    return parser


def validate(paths):
    """Print `render.check_report` for each file; 0 if all are valid, else 1."""
    from attention.bench.render import check_file, check_report

    verdicts = [check_file(path) for path in paths]
    for path, checked in zip(paths, verdicts):
        print(check_report(path, checked))
    return 1 if any(checked["problems"] for checked in verdicts) else 0


def config_from_args(args):
    """The `BenchConfig` the parsed arguments ask for (each option's `dest` is a `BenchConfig` field)."""
    fields = {field.name for field in dataclasses.fields(BenchConfig)}
    overrides = {key: value for key, value in vars(args).items() if key in fields and value is not None}
    overrides["modes"] = MODE_CHOICES[args.mode]
    overrides.pop("profile", None)  # --profile picks the settings below; the config records the profile's name
    if args.quick or args.profile == "quick":
        return quick_config(**overrides)
    if args.profile == "long":
        from attention.bench.long import long_config
        return long_config(**overrides)
    custom = any(key in overrides for key in ("batch", "seq_len", "seq_lens", "sweep_batch", "d_model", "d_in",
                                               "num_heads", "min_run_time", "min_repeats"))
    return BenchConfig(profile="custom" if custom else "default", **overrides)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.validate:
        return validate(args.validate)
    if args.profile == "decode":
        return decode_main(parser, args, argv)
    try:
        config = config_from_args(args).resolve()
        select_implementations(IMPLEMENTATIONS, config.implementations)
    except ValueError as error:
        parser.error(str(error))
    # With --out the run writes its file after each implementation and once complete.
    run = run_benchmark
    if config.profile == "long":
        from attention.bench.long import run_long as run
    result = run(config, progress=not args.quiet, checkpoint=args.out,
                 argv=None if argv is None else ["python", "-m", "attention.bench", *argv])
    from attention.bench.render import block_sparse_table, markdown_tables, provenance_summary

    print(provenance_summary(result))
    print()
    print(markdown_tables(result, include_sweep=config.profile == "long"))
    if result.get("block_sparse"):
        print()
        print(block_sparse_table(result))
    if args.out:
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


def decode_main(parser, args, argv):
    """`--profile decode`: run `attention.bench.decode`, print its tables, save JSON."""
    from attention.bench.decode import DecodeConfig, run_decode
    from attention.bench.render import decode_summary_table, decode_table, provenance_summary

    overrides = {key: value for key, value in (("device", args.device), ("dtype", args.dtype), ("seed", args.seed),
                                               ("num_heads", args.num_heads), ("min_run_time", args.min_run_time),
                                               ("min_repeats", args.min_repeats)) if value is not None}
    if args.batch is not None:
        overrides["batches"] = (args.batch,)
    if args.seq_lens:
        overrides["contexts"] = args.seq_lens
    try:
        config = DecodeConfig(**overrides).resolve()
    except ValueError as error:
        parser.error(str(error))
    result = run_decode(config, progress=not args.quiet, checkpoint=args.out,
                        argv=None if argv is None else ["python", "-m", "attention.bench", *argv])
    print(provenance_summary(result))
    for batch in config.batches:
        print(f"\nBatch {batch}: tokens per second (one layer) and share of the measured read bandwidth\n")
        print(decode_table(result, batch))
    print()
    print(decode_summary_table(result))
    if args.out:
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
