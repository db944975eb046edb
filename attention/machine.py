"""The machine a measurement or a training run ran on, as its records say it: the CPU model and the flags that
change results, cores, memory, the load from other processes, the git commit of the checkout.

Read from Linux's /proc (elsewhere from `sysctl` or `platform`, or None where unknown), never from the network.
"""

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

REPO_DIR = Path(__file__).resolve().parents[1]


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
