"""Saving and loading a trained `GPT`: its sizes, the attention class it was trained with, and its
canonical state dict, so the weights load into any causal class that fits them; and the training
run's record beside it.

`load_gpt()` loads the checkpoint shipped with the package (`CHECKPOINT`, trained by
`python -m attention.gpt.train`; its provenance and training log are `PROVENANCE`).

A checkpoint or a record may come from anyone (a pull request that "retrains the model", a download),
so both are read through `attention.files` (regular files only, a byte limit) and checked field by
field before anything is built: the checkpoint's structure, sizes and weights (`read_checkpoint`), the
record's every field (`RECORD`, the benchmark results' rules: strings of a fixed character class,
numbers finite and bounded) and its agreement with the checkpoint (`read_provenance`).
"""

import io
import pickle
import re
from pathlib import Path

import torch

from attention import files
from attention.machine import RESULT_FLAGS
from attention.schema import (BOOLEAN, DATE, LOAD, NAME, PROSE, SECONDS, VERSION, escaped, in_range, integer, list_of,
                              nullable, one_of, record, text)
from attention.gpt.model import GPT, GPTConfig
from attention.registry import IMPLEMENTATIONS

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
CHECKPOINT = CHECKPOINT_DIR / "tiny_gpt.pt"
PROVENANCE = CHECKPOINT_DIR / "tiny_gpt.json"
FORMAT = "attention.gpt checkpoint, version 1"
MAX_CHECKPOINT_BYTES = 64 * 2**20  # the shipped one is 3.3 MiB
MAX_RECORD_BYTES = 16 * 2**20  # a record of MAX_STEPS steps, evaluated at every step, is about 9 MiB
MAX_STEPS = 100_000  # bounds the training log a record holds

# --- What a checkpoint's config and a record's fields may hold (rules of attention.bench.results) ---

# Bounds well past any model this CPU-trained GPT will be, tight enough that a file cannot ask for absurd sizes.
CONFIG = {
    "vocab_size": integer(1, 2**20), "context_length": integer(1, 2**16), "d_model": integer(1, 2**14),
    "num_layers": integer(1, 256), "num_heads": integer(1, 256), "num_kv_heads": nullable(integer(1, 256)),
    "mlp_ratio": integer(1, 64), "dropout": in_range(0.0, 0.99),
}
ATTENTION = one_of(*sorted(IMPLEMENTATIONS))
FILE_NAME = text(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", "a plain file name of letters, digits and ._- "
                 "(no folder, not starting with a dot)", 100)
# `--out` as recorded: relative to the folder the run started in (no machine's absolute path in a record).
RELATIVE_PATH = text(r"(?!/)[A-Za-z0-9._/-]+", "a relative path of letters, digits and ._/-", 500)
ARGUMENTS = {
    "steps": integer(1, MAX_STEPS), "batch_size": integer(1, 4096), "context_length": CONFIG["context_length"],
    "d_model": CONFIG["d_model"], "num_layers": CONFIG["num_layers"], "num_heads": CONFIG["num_heads"],
    "attention": ATTENTION, "lr": in_range(1e-8, 10.0), "warmup": integer(0, MAX_STEPS),
    "eval_every": integer(1, MAX_STEPS), "eval_windows": integer(1, 2**16), "log_every": integer(1, MAX_STEPS),
    "threads": nullable(integer(1, 4096)), "seed": integer(-2**63, 2**64 - 1), "out": RELATIVE_PATH, "name": FILE_NAME,
    "force": BOOLEAN,
}
SHA256 = text(r"[0-9a-f]{64}", "a sha256 in hexadecimal", 64)
LOSS = in_range(0.0, 1e6)  # nats per byte: finite and non-negative
# The command line as `train` records it (shlex.join): no quote but ', no backtick, bracket, `<`, `>` or `&`.
COMMAND = text(r"[A-Za-z0-9 ._/=,:+@%'-]+", "a command line of letters, digits, spaces and ._/=,:+@%'-", 2000)
RECORD_FIELDS = {
    "date_utc": DATE,
    "command": COMMAND,
    "arguments": record(ARGUMENTS, optional=("force",)),  # runs before --force existed do not record it
    "git": record({"commit": nullable(text(r"[0-9a-f]{40}|[0-9a-f]{64}", "a hexadecimal git commit", 64)),
                   "dirty": nullable(BOOLEAN)}),
    "seed": ARGUMENTS["seed"], "steps": ARGUMENTS["steps"], "attention": ATTENTION, "config": record(CONFIG),
    "parameters": integer(1, 2**40), "tokens_seen": integer(1, 2**62), "training_s": SECONDS, "wall_s": SECONDS,
    "final_train_loss": LOSS, "final_validation_loss": LOSS, "loss_unit": PROSE,
    "text": record({"source": text(r"[A-Za-z0-9_.]+", "a module name", 100), "bytes": integer(1, 2**40),
                    "train_bytes": integer(1, 2**40), "validation_bytes": integer(1, 2**40), "sha256": SHA256}),
    "torch": VERSION, "python": VERSION,
    "platform": text(r"[A-Za-z0-9._+-]+", "a platform of letters, digits and ._+-", 200),
    "cpu": NAME, "cpu_flags": nullable(list_of(one_of(*RESULT_FLAGS), 16)), "torch_num_threads": integer(1, 1 << 16),
    "load_average_before": LOAD, "load_average_after": LOAD,
    "log": record({"step_train_loss": list_of(LOSS, MAX_STEPS),
                   "evaluations": list_of(record({"step": ARGUMENTS["steps"], "validation_loss": LOSS,
                                                  "elapsed_s": SECONDS}), MAX_STEPS),
                   "eval_windows": ARGUMENTS["eval_windows"]}),
}
RECORD = record(RECORD_FIELDS)


def record_problems(value):
    """Every problem of a training run's record (`[]`: valid): `RECORD`'s rules, and a log of one loss per step."""
    problems = RECORD(value, "")
    if not problems:
        problems += [f"{name}: {value[name]!r} differs from arguments.{name} {value['arguments'][name]!r}"
                     for name in ("steps", "seed", "attention") if value[name] != value["arguments"][name]]
        if len(value["log"]["step_train_loss"]) != value["steps"]:
            problems.append(f"log.step_train_loss: {len(value['log']['step_train_loss'])} losses for "
                            f"steps={value['steps']}")
    return problems


# --- Checkpoints ---

def save_checkpoint(model, attention_name, path, force=False):
    """Write `model`'s sizes, `attention_name` (its class's registry name) and canonical state dict to `path`
    (`attention.files.write_bytes`: never over an existing file unless `force`)."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "config": model.config.to_dict(), "attention": attention_name,
                "state": model.canonical_state_dict()}, buffer)
    files.write_bytes(path, buffer.getvalue(), force=force)


def read_checkpoint(path=CHECKPOINT):
    """The checkpoint's dict (`format`, `config`, `attention`, `state`), read without running pickled code.

    Read through `attention.files.read_bytes` (a regular file of at most `MAX_CHECKPOINT_BYTES`), then checked
    before anything is built from it: exactly those four keys, `config` within `CONFIG`'s bounds (and a valid
    `GPTConfig`), `attention` a registry name, `state` a mapping of names to floating-point tensors holding
    finite numbers, no more of them than the file stores (a tensor can claim many elements over one stored one).

    Raises:
        ValueError: naming the file and the problem, for each of these and for a file that is empty or not a
            torch checkpoint (including one that would run code when unpickled).
        FileNotFoundError: no file at `path`.
    """
    data = files.read_bytes(path, MAX_CHECKPOINT_BYTES)
    if not data:
        raise ValueError(f"{path}: an empty file, not an {FORMAT!r} file")
    try:
        checkpoint = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:
        raise ValueError(f"{path}: not a checkpoint that loads without running code: "
                         f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}") from error
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise ValueError(f"{path} is not an {FORMAT!r} file (its format: "
                         f"{checkpoint.get('format') if isinstance(checkpoint, dict) else type(checkpoint).__name__!r})")
    problems = record({"format": one_of(FORMAT), "config": record(CONFIG), "attention": ATTENTION,
                       "state": lambda value, where: [] if isinstance(value, dict) else
                       [f"{where}: expected a mapping of names to tensors, got {type(value).__name__}"]})(checkpoint, "")
    if not problems:
        try:
            GPTConfig(**checkpoint["config"])
        except ValueError as error:
            problems.append(f"config: {error}")
    problems = problems or state_problems(checkpoint["state"], len(data))
    if problems:
        raise ValueError(f"{path}: not a valid {FORMAT!r} file: " + "; ".join(problems[:10]))
    return checkpoint


def state_problems(state, file_bytes):
    """The problems of a checkpoint's `state`: names, floating-point tensors, no more bytes than the file, finite."""
    problems = []
    for name, tensor in state.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.]{1,200}", name):
            problems.append(f"state: the key {name!r:.60} is not a parameter name")
        elif not isinstance(tensor, torch.Tensor):
            problems.append(f"state.{name}: expected a tensor, got {type(tensor).__name__}")
        elif not tensor.is_floating_point():
            problems.append(f"state.{name}: expected floating-point weights, got dtype {tensor.dtype}")
        elif tensor.device.type != "cpu" or tensor.layout != torch.strided:
            problems.append(f"state.{name}: expected a dense tensor on the CPU, got {tensor.layout} on {tensor.device}")
    if problems:
        return problems
    claimed = sum(tensor.numel() * tensor.element_size() for tensor in state.values())
    if claimed > file_bytes:  # before touching the elements: a stride-0 tensor can claim terabytes
        return [f"state: its tensors claim {claimed:,} bytes, more than the file's {file_bytes:,}"]
    return [f"state.{name}: holds NaN or infinite values" for name, tensor in state.items()
            if not torch.isfinite(tensor).all()]


def load_gpt(path=CHECKPOINT, attention=None, **attention_sizes):
    """The `GPT` of a checkpoint in eval mode, its attention layers of class `IMPLEMENTATIONS[attention]`.

    The checkpoint is checked (`read_checkpoint`), and its weights' shapes compared with those the config
    gives (computed on the meta device, where nothing is allocated) before the model is built.

    Args:
        path: a file written by `save_checkpoint` (default: the shipped `CHECKPOINT`).
        attention: a registry name (`attention.IMPLEMENTATIONS`); default, the class it was trained with.
        attention_sizes: `GPTConfig` fields to override, e.g. `num_kv_heads` (then the weights must fit them).

    Raises:
        KeyError: an unknown `attention` name (listing the valid ones).
        ValueError: a malformed checkpoint (`read_checkpoint`), a class whose position encoding differs from
            the trained class's (the weights would run a different model), or weights whose shapes do not fit
            the class (each key named, with its expected and actual shape).
    """
    checkpoint = read_checkpoint(path)
    trained_name = checkpoint["attention"]
    name = trained_name if attention is None else attention
    attention_class, trained_class = IMPLEMENTATIONS[name], IMPLEMENTATIONS[trained_name]
    if attention_class.position_encoding != trained_class.position_encoding:
        raise ValueError(f"attention={name!r} ({attention_class.__name__}) applies position_encoding="
                         f"{attention_class.position_encoding!r}, but the checkpoint was trained with {trained_name!r} "
                         f"(position_encoding={trained_class.position_encoding!r}): its weights do not fit that model")
    config = GPTConfig(**{**checkpoint["config"], **attention_sizes, "dropout": 0.0})  # inference: no dropout
    state = checkpoint["state"]
    blocks = {key.split(".")[1] for key in state if key.startswith("blocks.")}
    if blocks != {str(index) for index in range(config.num_layers)}:  # before building num_layers blocks, even on meta
        raise ValueError(f"{path}: num_layers={config.num_layers}, but the state holds the weights of {len(blocks)} "
                         f"blocks, numbered {sorted(blocks, key=lambda block: (len(block), block))[:8]}")
    try:
        with torch.device("meta"):  # the shapes the config gives, without allocating them
            skeleton = GPT(config, attention_class)
        skeleton.check_canonical_state(state)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    model = GPT(config, attention_class)
    model.load_canonical_state_dict(state)
    return model.eval()


# --- The training run's record ---

def read_provenance(path=PROVENANCE, checkpoint=None):
    """The training run's record beside a checkpoint: provenance, final losses and the training log.

    Read through `attention.files.read_json` (at most `MAX_RECORD_BYTES`), every field checked (`RECORD`,
    `record_problems`), and its `config` and `attention` compared with those of the checkpoint it describes
    (`checkpoint`, default the `.pt` file beside it: `tiny_gpt.json` describes `tiny_gpt.pt`).

    Raises:
        ValueError: naming the file and every problem: a field unknown, missing, of the wrong form (a string
            outside its character class, a number out of range or not finite), a log that is not one loss per
            step, or a config or attention class that differs from the checkpoint's (both named).
    """
    path = Path(path)
    value = files.read_json(path, MAX_RECORD_BYTES)
    problems = record_problems(value)
    if problems:
        raise ValueError(f"{path}: not a valid training record: " + "; ".join(problems[:10])
                         + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))
    checkpoint = path.with_suffix(".pt") if checkpoint is None else Path(checkpoint)
    weights = read_checkpoint(checkpoint)
    for field in ("config", "attention"):
        if value[field] != weights[field]:
            raise ValueError(f"{path}: its {field} {value[field]!r} differs from the {field} {weights[field]!r} of "
                             f"the checkpoint {checkpoint}: the record does not describe these weights")
    return value


def record_rows(record):
    """The rows `(what, recorded)` of the table "A tiny GPT, end to end" shows of a training run's record, in
    Markdown, every string from the record escaped first (`attention.bench.results.escaped`): a record that got
    past `read_provenance` still cannot put a tag, link or code span of its own into the page."""
    record = escaped(record)
    commit, dirty = record["git"]["commit"], record["git"]["dirty"]
    return [
        ("command", f"`{record['command']}`"),
        ("code", ("an unknown commit" if commit is None else f"commit `{commit[:10]}`")
         + (" (uncommitted changes)" if dirty else "")),
        ("seed, steps, batch", f"{record['seed']}, {record['steps']}, {record['arguments']['batch_size']} windows of "
                               f"{record['config']['context_length']} bytes ({record['tokens_seen']:,} bytes seen)"),
        ("text", f"{record['text']['bytes']:,} bytes: {record['text']['train_bytes']:,} to train, "
                 f"{record['text']['validation_bytes']:,} held out (Python {record['python']})"),
        ("time", f"{record['training_s'] / 60:.1f} min training, {record['wall_s'] / 60:.1f} min with the final evaluation"),
        ("machine", f"{record['cpu']}, {record['torch_num_threads']} thread{'' if record['torch_num_threads'] == 1 else 's'}, "
                    f"torch {record['torch']}"),
        ("load average (1, 5, 15 min)", f"before {record['load_average_before']}, after {record['load_average_after']}"),
        ("final loss (nats per byte)",
         f"train {record['final_train_loss']:.4f}, validation {record['final_validation_loss']:.4f}"),
    ]
