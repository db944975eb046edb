"""Where a result came from: machine, software versions, code version and command line.

A result is only worth keeping if a reader can tell what produced it. `collect_provenance` records
the device, the PyTorch/CUDA/cuDNN versions, the git commit (and whether the tree had uncommitted
changes), the exact command line, and a sha256 of every `*.py` file of the `attention` package that
can change a measurement (all of them but the presentation-only modules in `PRESENTATION_ONLY`).
`source_hash` recomputes that hash for the code as it is now, so the docs can say when a recorded
run predates the code that would measure it today (see `attention.bench.render.is_stale`); a new
chart or a reworded table does not make a run stale.
"""

import datetime
import hashlib
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch

# Bump when a field changes meaning or disappears; adding fields keeps the version.
SCHEMA_VERSION = 1

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../attention
REPO_DIR = PACKAGE_DIR.parent

# Modules that only draw or format results and never run while measuring: left out of the hash.
PRESENTATION_ONLY = ("bench/render.py", "plotting.py")


def source_files(package_dir=PACKAGE_DIR):
    """sha256 of each `*.py` file under the package that can change a measurement, keyed by its path
    relative to the repository root (`PRESENTATION_ONLY` modules are left out).

    Args:
        package_dir: the package directory; defaults to the installed `attention/`.

    Returns:
        `{"attention/causal/flex.py": "<sha256 hex>", ...}`, sorted by path.
    """
    package_dir = Path(package_dir)
    root = package_dir.parent
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts
                   and p.relative_to(package_dir).as_posix() not in PRESENTATION_ONLY)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def source_hash(package_dir=PACKAGE_DIR):
    """One sha256 over the package sources: each sorted relative path and its file hash, in order.

    Two trees give the same hash exactly when they hold the same `*.py` files with the same bytes.

    Args:
        package_dir: the package directory; defaults to the installed `attention/`.

    Returns:
        The hex digest.
    """
    digest = hashlib.sha256()
    for path, file_hash in source_files(package_dir).items():
        digest.update(f"{path}\0{file_hash}\n".encode())
    return digest.hexdigest()


def git_state(repo_dir=REPO_DIR):
    """`{"commit": sha or None, "dirty": bool or None}`; None where git or the repository is missing."""
    def git(*args):
        return subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        status = git("status", "--porcelain", "--", "attention")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def cpu_name():
    """The CPU model from /proc/cpuinfo (Linux), sysctl (macOS) or `platform`, else "unknown CPU"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown CPU"


def total_memory_bytes():
    """Physical memory of the machine in bytes (Linux /proc/meminfo), else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_info(device):
    """Name and size of the device the benchmark runs on, plus the CPU it runs from."""
    device = torch.device(device)
    info = {
        "type": device.type,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "host_memory_bytes": total_memory_bytes(),
    }
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
    """Everything needed to say what produced a result, except the results themselves.

    Args:
        device: the `torch.device` (or string) the benchmark runs on.
        argv: the command line; defaults to `sys.argv` as `python -m attention.bench ...` would give it.

    Returns:
        A JSON-ready dict (see docs/benchmark-schema.md, `provenance`).
    """
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(os.path.join("attention", "bench", "__main__.py")):
        argv = ["python", "-m", "attention.bench", *argv[1:]]
    cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(argv),
        "argv": argv,
        "git": git_state(),
        "source_hash": source_hash(),
        "source_files": source_files(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn_version,
        "device": device_info(device),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "load_average_start": load_average(),
    }
