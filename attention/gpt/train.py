"""Train the tiny GPT on the Python language reference, on the CPU, deterministically from a seed.

    python -m attention.gpt.train --steps 50                 # a short run, written to gpt-runs/
    python -m attention.gpt.train --steps 50 --out /tmp/gpt  # the same, to another folder

The model (`attention.gpt.model.GPT`, attention class `--attention`, default `sdpa_causal`) reads
the bytes of `pydoc_data.topics` (`attention.gpt.data`) in random windows of `--context-length`
bytes and learns to predict each next byte, with AdamW, a linear warm-up and a cosine decay of the
learning rate. A progress bar shows the steps, the loss (nats per byte, averaged over the last
`--log-every` steps) and the time left; every `--eval-every` steps the loss on a fixed sample of the
validation bytes is printed too. Batches and initial weights come from `--seed`, so two runs with
the same arguments and thread count compute the same numbers. If the loss stops being a finite
number (a learning rate too large), training stops with an error and writes nothing.

At the end it writes to the folder `--out` (default `gpt-runs/` in the current directory, made if
missing; never the package's own folder unless asked):

* `<name>.pt`: the checkpoint (`attention.gpt.checkpoint.save_checkpoint`: sizes, attention class,
  canonical state dict);
* `<name>.json`: what produced it and how it went (`attention.gpt.checkpoint.RECORD`): the git commit,
  the command, the seed, the steps, the wall time, the final train and validation loss (on all
  validation bytes), torch and Python versions, the CPU, its thread count, the load average before
  and after (other work on the machine slows a run), the SHA-256 of the text, and the training log
  (every step's loss, every evaluation).

Every option is checked before training starts, the output files included: an existing `<name>.pt`
or `<name>.json` is refused unless `--force` is given, so a run never replaces another silently.

The shipped checkpoint was trained with the defaults and `--threads 1` on a 2-core machine shared with
other work (one thread, because two OpenMP threads sharing two busy cores wait on each other); its
JSON says on what, how long and under what load (the load averages before and after the run). To make
it again, from the repository root, replacing the shipped files on purpose:

    python -m attention.gpt.train --threads 1 --out attention/gpt/checkpoints --force
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from attention import files
from attention.machine import cpu_flags, cpu_name, git_state, load_average
from attention.gpt.checkpoint import ARGUMENTS, COMMAND, RECORD_FIELDS, record_problems, save_checkpoint
from attention.gpt.data import VOCAB_SIZE, encode, evaluate, random_batch, split, text_sha256, training_text
from attention.gpt.model import GPT, GPTConfig
from attention.registry import IMPLEMENTATIONS

DEFAULT_OUT = Path("gpt-runs")  # in the current directory: a run never writes inside the installed package by default


def checked(convert, name):
    """An argparse `type`: `convert` the text, then check it with the record's rule for `name` (`ARGUMENTS`), so an
    option takes exactly the values a record may hold; a usage error naming the option otherwise."""
    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if convert is int else 'a number'}, got {text!r}") from None
        problems = ARGUMENTS[name](value, name)
        if problems:
            raise argparse.ArgumentTypeError("; ".join(problems))
        return value
    return parse


def recorded_out(out):
    """`--out` as the record holds it: relative to the current directory, with / (no machine's absolute path)."""
    return Path(os.path.relpath(Path(out).absolute())).as_posix()


def command_line(argv):
    """The command as the record holds it: `python -m attention.gpt.train` and the arguments, quoted for a shell."""
    return shlex.join(["python", "-m", "attention.gpt.train", *argv])


def parse_args(argv=None):
    """The options, each checked before any work: ranges (the record's rules), a model the sizes can build, a
    window the text can fill, and output files that may be written (`attention.files.check_new_file`)."""
    parser = argparse.ArgumentParser(prog="python -m attention.gpt.train", description=__doc__.split("\n\n")[0],
                                     epilog="The shipped checkpoint is made again (replaced on purpose) by: "
                                            "python -m attention.gpt.train --threads 1 --out attention/gpt/checkpoints "
                                            "--force, from the repository root.")
    parser.add_argument("--steps", type=checked(int, "steps"), default=1500, help="optimizer steps (default 1500)")
    parser.add_argument("--batch-size", type=checked(int, "batch_size"), default=16, help="windows per step (default 16)")
    parser.add_argument("--context-length", type=checked(int, "context_length"), default=128,
                        help="bytes per window, fewer than the validation text holds (default 128)")
    parser.add_argument("--d-model", type=checked(int, "d_model"), default=128, help="width of the model (default 128)")
    parser.add_argument("--num-layers", type=checked(int, "num_layers"), default=4, help="transformer blocks (default 4)")
    parser.add_argument("--num-heads", type=checked(int, "num_heads"), default=4,
                        help="attention heads, a divisor of --d-model (default 4)")
    parser.add_argument("--attention", default="sdpa_causal", help="the attention class's registry name (default sdpa_causal)")
    parser.add_argument("--lr", type=checked(float, "lr"), default=3e-3, help="peak learning rate (default 3e-3)")
    parser.add_argument("--warmup", type=checked(int, "warmup"), default=50, help="steps of linear warm-up (default 50)")
    parser.add_argument("--eval-every", type=checked(int, "eval_every"), default=100,
                        help="steps between validation losses (default 100)")
    parser.add_argument("--eval-windows", type=checked(int, "eval_windows"), default=64,
                        help="validation windows per evaluation (default 64)")
    parser.add_argument("--log-every", type=checked(int, "log_every"), default=10, help="steps between loss printouts (default 10)")
    parser.add_argument("--threads", type=checked(int, "threads"), default=None,
                        help="CPU threads for torch (default: torch's own choice, one per core); on a machine busy with "
                             "other work, 1 avoids threads waiting on each other")
    parser.add_argument("--seed", type=checked(int, "seed"), default=0, help="seed of the weights and the batches (default 0)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"folder for the outputs, made if missing (default {DEFAULT_OUT}/ in the current directory)")
    parser.add_argument("--name", default="tiny_gpt",
                        help="file name of the outputs, without extension and folder (default tiny_gpt)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing <name>.pt and <name>.json in --out (default: refuse them)")
    args = parser.parse_args(argv)
    if args.attention not in IMPLEMENTATIONS:
        parser.error(f"--attention must be one of {', '.join(sorted(IMPLEMENTATIONS))}, got {args.attention!r}")
    if problems := ARGUMENTS["name"](args.name, "--name"):
        parser.error("; ".join(problems))
    if problems := ARGUMENTS["out"](recorded_out(args.out), "--out (as recorded, relative to this folder)"):
        parser.error("; ".join(problems))
    if problems := COMMAND(command_line(sys.argv[1:] if argv is None else argv), "the command line (recorded)"):
        parser.error("; ".join(problems))
    _, validation_data = split(encode(training_text()))
    if args.context_length >= len(validation_data):  # evaluation needs a window of the validation text (and its next byte)
        parser.error(f"--context-length must be below {len(validation_data):,}, the validation text's length in "
                     f"bytes, got {args.context_length}")
    if args.d_model % args.num_heads:
        parser.error(f"--num-heads must divide --d-model, got --d-model {args.d_model} and --num-heads {args.num_heads}")
    try:  # what else the attention class asks of the sizes (RoPE: an even head_dim), without allocating the model
        with torch.device("meta"):
            GPT(model_config(args), IMPLEMENTATIONS[args.attention])
    except (ValueError, TypeError) as error:
        parser.error(f"--attention {args.attention} with --d-model {args.d_model}, --num-heads {args.num_heads}, "
                     f"--num-layers {args.num_layers}, --context-length {args.context_length}: {error}")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out must be a folder (made if missing), got the file {args.out}")
    try:
        if args.out.is_dir():
            for suffix in (".pt", ".json"):
                files.check_new_file(args.out / f"{args.name}{suffix}", force=args.force)
        else:
            files.check_new_file(args.out)  # the folder to make: its parent exists, nothing is there yet
    except (ValueError, FileExistsError) as error:
        parser.error(f"--out {args.out} --name {args.name}: {error}")
    return args


def model_config(args):
    """The `GPTConfig` of the options."""
    return GPTConfig(vocab_size=VOCAB_SIZE, context_length=args.context_length, d_model=args.d_model,
                     num_layers=args.num_layers, num_heads=args.num_heads)


class ProgressBar:
    """A one-line progress bar on stderr: `[#####.....] 120/600 loss 2.134  41 s, 2.7 min left`.

    On a terminal the line is redrawn in place; elsewhere (a log file, CI) each update is a new line,
    so every printed loss stays readable. (tqdm does this too; one class avoids a dependency.)
    """

    def __init__(self, total, width=30, stream=None):
        self.total, self.width, self.stream = total, width, sys.stderr if stream is None else stream
        self.start = time.perf_counter()
        self.in_place = self.stream.isatty()

    def update(self, done, text=""):
        elapsed = time.perf_counter() - self.start
        filled = round(self.width * done / self.total)
        left = elapsed / done * (self.total - done) if done else float("nan")
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} {text}  "
                f"{elapsed:.0f} s, {left / 60:.1f} min left")
        self.stream.write(("\r" + line) if self.in_place else line + "\n")
        self.stream.flush()

    def note(self, text):
        """A line of its own (an evaluation), above the bar."""
        self.stream.write(("\r\033[K" if self.in_place else "") + text + "\n")
        self.stream.flush()

    def close(self):
        if self.in_place:
            self.stream.write("\n")


def learning_rate(step, steps, peak, warmup):
    """Linear warm-up to `peak` over `warmup` steps, then a cosine decay to `peak / 10` at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def stop_unless_finite(loss, what, step, args):
    """`loss`, if it is a finite number; else `FloatingPointError`: the run diverged, nothing is worth saving."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"the {what} became {loss} at step {step} (--lr {args.lr}): training stopped, "
                                 f"nothing written")
    return loss


def train(args, command):
    """Train as `args` say; return `(model, record)`, the record being what `<name>.json` holds (`command`: the command line).

    Raises:
        ValueError: before training, where the machine's description (CPU name, platform, versions) is not what
            a record may hold (`attention.gpt.checkpoint.RECORD`).
        FloatingPointError: the training loss became NaN or infinite (the model is not worth saving).
    """
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_before, code = load_average(), git_state()  # the code that trains: its state now, not after the run
    machine = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
               "cpu": cpu_name(), "cpu_flags": cpu_flags()}
    if problems := [problem for name, value in machine.items() for problem in RECORD_FIELDS[name](value, name)]:
        raise ValueError("this machine's description cannot be recorded, nothing trained: " + "; ".join(problems))
    started = time.perf_counter()
    text = training_text()
    train_data, validation_data = split(encode(text))
    config = model_config(args)
    torch.manual_seed(args.seed)
    model = GPT(config, IMPLEMENTATIONS[args.attention])
    batches = torch.Generator().manual_seed(args.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]  # matrices decay; biases and norms do not
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    step_losses, evaluations = [], []
    bar = ProgressBar(args.steps)
    model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
        inputs, targets = random_batch(train_data, args.batch_size, args.context_length, batches)  # (B, T) each
        logits = model(inputs)  # (B, T, vocab)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        stop_unless_finite(loss.item(), "training loss", step + 1, args)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step_losses.append(round(loss.item(), 5))
        done = step + 1
        if done % args.eval_every == 0 or done == args.steps:
            validation_loss = stop_unless_finite(evaluate(model, validation_data, count=args.eval_windows),
                                                 "validation loss", done, args)
            evaluations.append({"step": done, "validation_loss": round(validation_loss, 5),
                                "elapsed_s": round(time.perf_counter() - started, 1)})
            bar.note(f"step {done}: train loss {sum(step_losses[-args.log_every:]) / len(step_losses[-args.log_every:]):.4f}, "
                     f"validation loss {validation_loss:.4f} (nats per byte, {args.eval_windows} windows)")
        if done % args.log_every == 0 or done == args.steps:
            recent = step_losses[-args.log_every:]
            bar.update(done, f"loss {sum(recent) / len(recent):.4f}")
    bar.close()
    training_s = time.perf_counter() - started
    final_train = stop_unless_finite(evaluate(model, train_data, count=(len(validation_data) - 1) // args.context_length),
                                     "final train loss", args.steps, args)
    final_validation = stop_unless_finite(evaluate(model, validation_data), "final validation loss", args.steps, args)
    wall_s = time.perf_counter() - started
    record = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "arguments": {**vars(args), "out": recorded_out(args.out)},
        "git": code, "seed": args.seed, "steps": args.steps, "attention": args.attention,
        "config": config.to_dict(), "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_seen": args.steps * args.batch_size * args.context_length,
        "training_s": round(training_s, 1), "wall_s": round(wall_s, 1),
        "final_train_loss": round(final_train, 5), "final_validation_loss": round(final_validation, 5),
        "loss_unit": "nats per byte (cross-entropy); train loss over as many train windows as the validation split has",
        "text": {"source": "pydoc_data.topics", "bytes": len(train_data) + len(validation_data),
                 "train_bytes": len(train_data), "validation_bytes": len(validation_data), "sha256": text_sha256(text)},
        **machine, "torch_num_threads": torch.get_num_threads(),
        "load_average_before": load_before, "load_average_after": load_average(),
        "log": {"step_train_loss": step_losses, "evaluations": evaluations, "eval_windows": args.eval_windows},
    }
    return model, record


def main(argv=None):
    args = parse_args(argv)
    command = command_line(sys.argv[1:] if argv is None else argv)
    try:
        model, record = train(args, command)
    except FloatingPointError as error:
        raise SystemExit(f"python -m attention.gpt.train: error: {error}") from None
    problems = record_problems(record)
    if problems:  # a bug here, not in the options (checked before training): say so rather than write a bad record
        raise ValueError("the run's record breaks its own rules, nothing written: " + "; ".join(problems))
    checkpoint, record_path = args.out / f"{args.name}.pt", args.out / f"{args.name}.json"
    args.out.mkdir(exist_ok=True)
    save_checkpoint(model, args.attention, checkpoint, force=args.force)
    files.write_bytes(record_path, json.dumps(record, indent=1) + "\n", force=args.force)
    print(f"trained {args.steps} steps in {record['training_s']:.0f} s ({record['wall_s']:.0f} s with the final "
          f"evaluation): train loss {record['final_train_loss']:.4f}, validation loss "
          f"{record['final_validation_loss']:.4f} nats per byte; wrote {checkpoint} and {record_path}")
    return record


if __name__ == "__main__":
    main()
