"""Where a result came from: `collect_provenance` records the device (and the CPU flags that change results),
the PyTorch/CUDA/cuDNN versions, the git commit, the command line, and a sha256 of each `*.py` file of `attention`
but `attention/report/`, which only shows results. `dependencies` says which of those files a row's numbers depend
on (the modules that measured it and everything they import), so that a recorded row goes stale only when one of
them changes (`attention.bench.results.stale_rows`).
"""

import ast
import datetime
import hashlib
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../attention
REPO_DIR = PACKAGE_DIR.parent
SHOWING = "attention/report/"  # tables, charts and page text: never hashed, never a dependency
# Files that never change a measured number: the results file's schema and validator, this file, the presets, the
# command line, the file handling. Not followed: what they import counts only where a measuring file imports it.
BOOKKEEPING = ("attention/bench/results.py", "attention/bench/provenance.py", "attention/bench/profiles.py",
               "attention/bench/__main__.py", "attention/files.py")
# Catalogues of names (registries, a package's face): a module that imports one depends on the catalogue's own lines,
# not on every module it lists (a row depends on its own class, named by its sweep's `subjects`).
INDEXES = ("attention/__init__.py", "attention/registry.py", "attention/models/__init__.py", "attention/bench/__init__.py")


def source_files(package_dir=PACKAGE_DIR):
    """`{"attention/causal/flex.py": "<sha256 hex>", ...}`, sorted: each `*.py` file under `package_dir` but those under
    `attention/report/`, by its path relative to the repository root."""
    package_dir = Path(package_dir)
    root = package_dir.parent
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    hashes = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    return {path: digest for path, digest in hashes.items() if not path.startswith(SHOWING)}


def source_hash(package_dir=PACKAGE_DIR):
    """One sha256 (hex) over `source_files(package_dir)`: each sorted relative path and its file hash."""
    return files_hash(source_files(package_dir))


def files_hash(files):
    """One sha256 (hex) over `{path: sha256}`: each sorted path and its hash."""
    digest = hashlib.sha256()
    for path, file_hash in sorted(files.items()):
        digest.update(f"{path}\0{file_hash}\n".encode())
    return digest.hexdigest()


_IMPORTS = {}  # (root, path, sha256 of its bytes) -> the package's files it imports


def _module_file(name, root):
    """The file of the dotted module `name` under `root` (`x/y.py` or `x/y/__init__.py`), or None."""
    base = root / name.replace(".", "/")
    return next((found for found in (base.with_suffix(".py"), base / "__init__.py") if found.is_file()), None)


def imported_files(path, root):
    """The files of the `attention` package that the module at `root / path` imports (anywhere in it), as paths
    relative to `root`: `from attention.bench import core` names `attention/bench/core.py`, `from attention.models
    import MODELS` names `attention/models/__init__.py`."""
    source = (root / path).read_bytes()
    key = (root, path, hashlib.sha256(source).hexdigest())
    if key not in _IMPORTS:
        files = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                files += [_module_file(alias.name, root) for alias in node.names if alias.name.startswith("attention")]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("attention"):
                files += [_module_file(f"{node.module}.{alias.name}", root) or _module_file(node.module, root)
                          for alias in node.names]
        _IMPORTS[key] = {found.relative_to(root).as_posix() for found in files if found is not None}
    return _IMPORTS[key]


def dependencies(modules, package_dir=PACKAGE_DIR):
    """The files a measurement by `modules` (dotted names, e.g. a sweep's module and the class it measured) depends on:
    those modules and everything they import from the package, transitively, but not through `INDEXES` (their own
    lines count) or `BOOKKEEPING` files, and never `attention/report/`. Sorted relative paths."""
    root = Path(package_dir).parent
    todo, seen = [name.replace(".", "/") + ".py" for name in modules], set()
    while todo:
        path = todo.pop()
        if path in seen or path.startswith(SHOWING) or not (root / path).is_file():
            continue
        seen.add(path)
        if path not in INDEXES and path not in BOOKKEEPING:
            todo += imported_files(path, root)
    return sorted(seen - set(BOOKKEEPING))


def _output(*command, timeout=10):
    """The stripped standard output of `command`, or None where it fails or does not exist."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _proc_field(path, key):
    """What follows `key:` on the first line of a /proc file that starts with `key` (Linux), else None."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), None)


def git_state(repo_dir=REPO_DIR):
    """`{"commit": sha or None, "dirty": bool or None}`; None where git or the repository is missing."""
    commit = _output("git", "-C", str(repo_dir), "rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    status = _output("git", "-C", str(repo_dir), "status", "--porcelain", "--", "attention")
    return {"commit": commit, "dirty": bool(status)}


def cpu_name():
    """The CPU model from /proc/cpuinfo (Linux), sysctl (macOS) or `platform`, else "unknown CPU"."""
    return (_proc_field("/proc/cpuinfo", "model name")
            or (sys.platform == "darwin" and _output("sysctl", "-n", "machdep.cpu.brand_string", timeout=5))
            or platform.processor() or platform.machine() or "unknown CPU")


# CPU flags that change what a benchmark measures: vector width (AVX2, AVX-512), fused multiply-add, and the
# bfloat16 and float16 instructions (AVX-512 BF16/FP16, AMX tiles), without which low-precision matmuls are
# emulated and can run slower than float32. Linux names, as in /proc/cpuinfo.
RESULT_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "amx_int8")


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The `RESULT_FLAGS` this CPU has, in that order (Linux, from /proc/cpuinfo); None where unknown."""
    flags = _proc_field(cpuinfo, "flags")
    if flags is None:
        return None
    present = set(flags.split())
    return [flag for flag in RESULT_FLAGS if flag in present]


def cpu_features_label(flags):
    """A short label of what sets the CPU's matmul speed: "AMX", "AVX-512 BF16", "AVX-512", "AVX2", "no AVX2",
    or "flags unknown" for `flags` None (a run recorded before the flags were)."""
    if flags is None:
        return "flags unknown"
    for flag, label in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2")):
        if flag in flags:
            return label
    return "no AVX2"


def meminfo_bytes(key):
    """A /proc/meminfo field in bytes (Linux: `MemAvailable`, memory available to new processes; `MemTotal`,
    physical memory), else None (not Linux, or an unreadable /proc: no budget rather than no run)."""
    try:
        return int(_proc_field("/proc/meminfo", key).split()[0]) * 1024
    except (AttributeError, ValueError, IndexError):
        return None


def device_info(device):
    """Name and size of the device the benchmark runs on, plus the CPU it runs from."""
    device = torch.device(device)
    info = {"type": device.type, "cpu": cpu_name(), "cpu_flags": cpu_flags(), "cpu_count": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(), "host_memory_bytes": meminfo_bytes("MemTotal")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, memory_bytes=props.total_memory,
                    compute_capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
    elif device.type == "mps":
        info.update(name=f"Apple MPS ({platform.machine()}, {cpu_name()})")
    else:
        info.update(name=info["cpu"])
    return info


def load_average():
    """The 1, 5 and 15 minute load averages (other work on the machine skews timings), or None."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def collect_provenance(device, argv=None):
    """Everything needed to say what produced a result on `device`, except the results themselves.

    `argv` is the command line, default `sys.argv` as `python -m attention.bench ...`. Returns a
    JSON-ready dict (docs/benchmark-schema.md, `provenance`).
    """
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(os.path.join("attention", "bench", "__main__.py")):
        argv = ["python", "-m", "attention.bench", *argv[1:]]
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(argv), "argv": argv, "git": git_state(),
        "source_hash": source_hash(), "source_files": source_files(),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": device_info(device), "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "load_average_start": load_average(),
    }
