"""`python -m attention.bench`: run a profile, print its tables, save its results file; or validate or migrate files.

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
import datetime
import shlex
import sys
import textwrap
import time
from pathlib import Path

import torch

from attention import files, report
from attention.bench import SWEEPS, core, profiles, results
from attention.bench.provenance import source_files
from attention.machine import device_info, git_state
from attention.registry import IMPLEMENTATIONS

MODE_CHOICES = {"forward": ("forward",), "backward": ("forward_backward",), "both": ("forward", "forward_backward")}


def lengths(text):
    """"128,256,512" or "128 256" -> (128, 256, 512); "none" -> () (no sweep)."""
    try:
        values = () if text.strip().lower() in ("none", "") else tuple(int(part) for part in text.replace(",", " ").split())
    except ValueError:
        values = (0,)
    if any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, or 'none', got {text!r}")
    return values


def positive_int(text):
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def build_parser():
    epilog = (f"profiles: {', '.join(profiles.profiles())} (the presets: attention/bench/profiles.py).\n"
              f"run times of the runs recorded in docs/results/: {report.recorded_durations()}. The quick profile is what "
              "the docs build runs; the page 'The quick run, explained' gives its duration.\n"
              f"--impl names: {', '.join(IMPLEMENTATIONS)}.\n" + textwrap.dedent(__doc__.split("Examples:", 1)[1]))
    parser = argparse.ArgumentParser(
        prog="python -m attention.bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
        description="Benchmark the registered attention implementations: every row is checked against the float64 "
                    "reference, then timed beside a yardstick (a matmul, or a large read for decoding), and the "
                    "run's provenance is saved with it. Default profile: GPT-2 small (B=8, T=1024, d_model=768, "
                    "12 heads) plus a sequence-length sweep.")
    parser.add_argument("--profile", choices=list(profiles.profiles()), default="default",
                        help="which sweeps and sizes (see below); explicit size options override a profile's")
    parser.add_argument("--quick", action="store_true", help="the docs build's profile: --profile quick")
    parser.add_argument("--device", choices=core.DEVICES, default="auto", help="default: auto (CUDA, else MPS, else CPU)")
    parser.add_argument("--dtype", choices=list(core.DTYPES), help="default float32 (--profile gpu: bfloat16); tf32 = "
                        "float32 tensors with TensorFloat-32 matmuls (CUDA only)")
    parser.add_argument("--mode", choices=list(MODE_CHOICES), help="forward, backward (= forward+backward) or both "
                                                                   "(the default)")
    parser.add_argument("--compile", action="store_true", default=None, help="also time torch.compile'd classes")
    sizes = [("--batch", positive_int, "headline batch (default 8); the decode profile's batch"),
             ("--seq-len", positive_int, "headline sequence length (default 1024)"),
             ("--seq-lens", lengths, "sweep lengths, e.g. 128,256,512 or 'none'; the decode profile's contexts"),
             ("--sweep-batch", positive_int, "batch of the length sweeps (default 1 on CPU/MPS, --batch on CUDA)"),
             ("--d-model", positive_int, "model width (default 768)"), ("--d-in", positive_int, "input features"),
             ("--min-run-time", float, "seconds of timing per row at least"),
             ("--matmul-size", positive_int, "side of the yardstick matmul (default 2048 CPU, 4096 GPU)"),
             ("--seed", int, "seed of the weights and inputs (default 0)")]
    for flag, kind, text in sizes:
        parser.add_argument(flag, type=kind, help=text)
    parser.add_argument("--heads", type=positive_int, dest="num_heads", help="query heads (default 12; decode 32)")
    parser.add_argument("--repeats", type=positive_int, dest="min_repeats", help="timing blocks per row at least")
    parser.add_argument("--impl", nargs="+", dest="implementations", metavar="NAME", help="classes to run (below)")
    parser.add_argument("--out", metavar="FILE", help="write the results file here (rewritten after every row); an "
                        "existing file is refused unless --force")
    parser.add_argument("--force", action="store_true", help="let --out replace an existing file")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--dry-run", action="store_true", help="every case of the profile at tiny sizes on the CPU "
                        "(--profile gpu: the Triton kernel through its interpreter), recorded as profile NAME_dry_run")
    parser.add_argument("--validate", nargs="+", metavar="FILE", help="check results files instead of running; exit "
                        "status 1 if any is not valid (a run recorded with older sources is valid, and said to be)")
    parser.add_argument("--migrate", nargs="+", metavar="FILE", help="rewrite results files of an older schema_version "
                        "as the current one (fields renamed or added as null, no number changed)")
    parser.add_argument("--stale", nargs="*", metavar="FILE", help="list the results files (default: every one under "
                        "docs/results/) with rows measured by code that has changed since, and those files; exit "
                        "status 1 if any")
    parser.add_argument("--refresh", metavar="FILE", help="measure again, on this machine, only the stale rows of a "
                        "results file, and rewrite it with the provenance of those rows (refused for a file recorded "
                        "on another machine)")
    return parser


def config_from_args(args):
    """The `profiles.Plan` the parsed arguments ask for, configs not yet checked against a device."""
    options = {key: value for key, value in vars(args).items() if value is not None}
    if args.mode:
        options["modes"] = MODE_CHOICES[args.mode]
    return profiles.plan("quick" if args.quick else args.profile, options, args.dry_run)


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.stale is not None:
        return stale(args.stale or sorted(results.RESULTS_DIR.rglob("*.json")))
    if args.refresh:
        return refresh(args.refresh, parser, argv, not args.quiet)
    if args.validate or args.migrate:
        for path in args.migrate or ():
            try:
                migrated = results.migrate(results.read(path))
            except (ValueError, KeyError, TypeError, AttributeError) as error:  # the validator below says why in full
                print(f"{path}: not migrated ({type(error).__name__}: {str(error).removeprefix(f'{path}: ')})")
                continue
            core.write_result(migrated, path, force=True)  # rewriting the file in place is what --migrate is for
            print(f"{path}: schema_version {results.SCHEMA_VERSION}")
        verdicts = {path: results.check_file(path) for path in args.validate or args.migrate}
        print("\n".join(report.check_report(path, checked) for path, checked in verdicts.items()))
        return 1 if any(checked["problems"] for checked in verdicts.values()) else 0
    if args.out:  # before any work: a measured run must not end in a path it cannot write, or over another file
        try:
            files.check_new_file(args.out, force=args.force)
        except (ValueError, FileExistsError) as error:
            parser.error(f"--out: {error}")
    try:
        plan = config_from_args(args)
        device = core.resolve_device(args.device)
        if args.profile == "gpu" and device.type != "cuda" and not args.dry_run:
            raise ValueError(f"--profile gpu measures a CUDA GPU, and this machine has none (device {device.type!r}, "
                             f"torch {torch.__version__}); --dry-run runs every case at tiny sizes here")
        plan = plan._replace(sweeps=[(sweep, config.resolve(device)) for sweep, config in plan.sweeps])
    except ValueError as error:
        parser.error(str(error))
    argv = None if argv is None else ["python", "-m", "attention.bench", *argv]
    dtype = args.dtype or profiles.DTYPES.get(args.profile, "float32")
    envelope = core.Envelope(plan.profile, args.device, dtype, argv, args.out)
    envelope.progress, envelope.force = not args.quiet, args.force
    result = envelope.run(plan)
    print(report.format.provenance_summary(result))
    for sweep, _ in plan.sweeps:
        print("\n" + report.PAGES[sweep.NAME].tables(result))
    if args.out:
        print(f"\nwrote {Path(args.out)}", file=sys.stderr)
    return 0


IDENTITY = ("type", "name", "cpu", "cpu_flags", "cpu_count", "torch_num_threads")  # a machine, as a run records it


def other_machine(result):
    """How this machine differs from the one that recorded `result` (`[]`: the same one, same torch)."""
    recorded, here = result["provenance"]["device"], device_info(result["device_type"])
    differ = [f"{key} {recorded.get(key)!r}, here {here.get(key)!r}" for key in IDENTITY if recorded.get(key) != here.get(key)]
    return differ + ([f"torch {result['provenance']['torch']}, here {torch.__version__}"]
                     if result["provenance"]["torch"] != torch.__version__ else [])


def refresh_rows(result, argv=None, progress=True):
    """Measure again, on this machine, the rows of `result` whose code has changed since (`results.stale_rows`), each
    sweep's section narrowed to them (`for_rows`); replace them in place and record what measured them in
    `provenance.refreshes`. Returns `{sweep: [row indices measured again]}`. `ValueError` naming both machines where
    this is not the machine (or the torch) that recorded the file."""
    if differ := other_machine(result):
        raise ValueError("recorded on another machine: " + "; ".join(differ) + ". Record a new file here instead")
    started, measured = time.perf_counter(), {}
    entry = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": shlex.join(
        argv or ["python", "-m", "attention.bench", *sys.argv[1:]]), "git": git_state(), "source_files": source_files()}
    for name, stale in results.stale_rows(result, entry["source_files"]).items():
        sweep, section = SWEEPS[name], results.section(result, name)
        fields = {field.name for field in dataclasses.fields(sweep.Config)}
        recorded = section["config"] if name == "sequence" else section
        config = sweep.Config(**{key: tuple(value) if isinstance(value, list) else value
                                 for key, value in recorded.items() if key in fields})
        rows = [section["rows"][index] for index in stale]
        fresh = core.Envelope(result["profile"], result["device_type"], result["dtype"], argv)
        fresh.progress = progress
        with fresh:
            sweep.run(getattr(sweep, "for_rows", lambda config, rows: config)(config, rows), fresh)
        again = {tuple(row[key] for key in sweep.KEY): row for row in results.section(fresh.result, name)["rows"]}
        for index, row in zip(stale, rows):
            if (key := tuple(row[field] for field in sweep.KEY)) in again:
                section["rows"][index] = again[key]
                measured.setdefault(name, []).append(index)
        getattr(sweep, "finish", lambda section: None)(section)
        if name == "sequence":
            result.update(section)
    entry.update(duration_s=round(time.perf_counter() - started, 1), rows=measured)
    result["provenance"].setdefault("refreshes", []).append(entry)
    return measured


def stale(paths):
    """Print each results file's stale rows (`results.stale_rows`); 1 if any file has some or cannot be read."""
    status = 0
    for path in paths:
        checked = results.check_file(path)
        if checked["problems"]:
            print(report.check_report(path, checked))
            status = 1
            continue
        found = results.stale_rows(checked["result"])
        counts = [f"{name} {len(rows)} of {len(results.section(checked['result'], name)['rows'])} rows"
                  for name, rows in found.items()]
        print(f"{path}: " + (f"stale: {', '.join(counts)}; changed since: {', '.join(checked['changed'])}" if found
                             else "current"))
        status |= bool(found)
    return status


def refresh(path, parser, argv, progress):
    """`--refresh FILE`: measure its stale rows again here and rewrite it."""
    checked = results.check_file(path)
    if checked["problems"]:
        parser.error(report.check_report(path, checked))
    result = checked["result"]
    try:
        measured = refresh_rows(result, None if argv is None else ["python", "-m", "attention.bench", *argv], progress)
    except ValueError as error:
        parser.error(f"--refresh {path}: {error}")
    if problems := results.validate(result):
        raise RuntimeError(f"the refreshed {path} is not valid: " + "; ".join(problems))
    core.write_result(result, path, force=True)  # rewriting the file is what --refresh is for
    print(f"{path}: measured again: " + (", ".join(f"{name} {len(rows)} rows" for name, rows in measured.items())
                                         or "nothing (no stale row)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
