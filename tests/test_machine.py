"""The machine a record names (`attention/machine.py`), read from a fake /proc tree, a fake git and a fake platform:
what a run on another host would record, and None (never a crash) where the host does not say."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention import machine

CPUINFO = ("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
           "flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile amx_bf16\n\n"
           "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
MEMINFO = "MemTotal:       16384000 kB\nMemFree:         1000000 kB\nMemAvailable:    8192000 kB\n"


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    """/proc/cpuinfo and /proc/meminfo of another host, read where `machine` reads /proc."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cpuinfo").write_text(CPUINFO)
    (root / "proc" / "meminfo").write_text(MEMINFO)
    read = machine._proc_field
    monkeypatch.setattr(machine, "_proc_field", lambda path, key: read(root / Path(path).relative_to("/"), key))
    return root


def test_the_cpu_and_its_memory_are_read_from_proc(fake_proc):
    assert machine.cpu_name() == "Intel(R) Xeon(R) Platinum 8480+"
    assert machine.cpu_flags() == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
    assert machine.cpu_features_label(machine.cpu_flags()) == "AMX"
    assert machine.meminfo_bytes("MemTotal") == 16384000 * 1024
    assert machine.meminfo_bytes("MemAvailable") == 8192000 * 1024
    info = machine.device_info("cpu")
    assert info["type"] == "cpu" and info["name"] == info["cpu"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["host_memory_bytes"] == 16384000 * 1024 and info["cpu_count"] == os.cpu_count()
    assert info["torch_num_threads"] == torch.get_num_threads()


def test_a_memory_field_that_is_missing_or_not_a_number_is_none_not_a_crash(fake_proc):
    assert machine.meminfo_bytes("SwapTotal") is None  # absent
    (fake_proc / "proc" / "meminfo").write_text("MemTotal:    lots kB\nMemFree:\n")
    assert machine.meminfo_bytes("MemTotal") is None  # not a number
    assert machine.meminfo_bytes("MemFree") is None  # empty
    (fake_proc / "proc" / "meminfo").unlink()
    assert machine.meminfo_bytes("MemTotal") is None  # no /proc: no memory budget rather than no run


def test_without_proc_the_cpu_is_named_by_sysctl_on_macos_else_by_platform(fake_proc, monkeypatch):
    (fake_proc / "proc" / "cpuinfo").unlink()
    asked = []
    monkeypatch.setattr(machine, "_output", lambda *command, timeout=10: asked.append(command) or "Apple M3 Max")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert machine.cpu_name() == "Apple M3 Max"
    assert asked == [("sysctl", "-n", "machdep.cpu.brand_string")]
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(platform, "processor", lambda: "Intel64 Family 6 Model 85")
    assert machine.cpu_name() == "Intel64 Family 6 Model 85"
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "")
    assert machine.cpu_name() == "unknown CPU"
    assert machine.cpu_flags() is None and machine.cpu_features_label(machine.cpu_flags()) == "flags unknown"


def test_a_command_that_fails_or_does_not_exist_gives_none():
    assert machine._output(sys.executable, "-c", "print(' out ')") == "out"
    assert machine._output(sys.executable, "-c", "import sys; print('partial'); sys.exit(3)") is None
    assert machine._output("a-command-that-does-not-exist-here") is None
    assert machine._output(sys.executable, "-c", "import time; time.sleep(30)", timeout=0.5) is None


@pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0, reason="needs git")
def test_the_git_state_names_the_commit_and_whether_the_package_was_changed(tmp_path):
    repo = tmp_path / "checkout"
    (repo / "attention").mkdir(parents=True)
    (repo / "attention" / "a.py").write_text("x = 1\n")
    (repo / "notes.txt").write_text("mine")

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("add", "attention")
    git("commit", "-q", "-m", "first")
    state = machine.git_state(repo)
    assert state == {"commit": git("rev-parse", "HEAD"), "dirty": False}  # notes.txt is not the package
    (repo / "attention" / "a.py").write_text("x = 2\n")
    assert machine.git_state(repo) == {"commit": state["commit"], "dirty": True}
    assert machine.git_state(tmp_path / "not-a-checkout") == {"commit": None, "dirty": None}


def test_the_load_average_is_rounded_or_none_where_the_system_has_none(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (1.23456, 0.5, 2.0))
    assert machine.load_average() == [1.23, 0.5, 2.0]

    def unavailable():
        raise OSError("load average unobtainable")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert machine.load_average() is None
    monkeypatch.delattr(os, "getloadavg")  # Windows has none
    assert machine.load_average() is None


def test_a_gpu_is_recorded_by_its_name_memory_and_compute_capability(fake_proc, monkeypatch):
    """What a CUDA run records, from the device's properties (faked here: the fields torch reports)."""
    from types import SimpleNamespace

    h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85_000_000_000, major=9, minor=0,
                           multi_processor_count=132)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: asked.append(device) or h100)
    info = machine.device_info("cuda:1")
    assert asked == [torch.device("cuda", 1)]
    assert {key: info[key] for key in ("type", "name", "memory_bytes", "compute_capability", "multiprocessors")} == {
        "type": "cuda", "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85_000_000_000, "compute_capability": "9.0",
        "multiprocessors": 132}
    assert info["cpu"] == "Intel(R) Xeon(R) Platinum 8480+"  # the host it runs from


def test_apples_gpu_is_named_with_the_chip_it_shares_memory_with(fake_proc, monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    info = machine.device_info("mps")
    assert info["type"] == "mps" and info["name"] == "Apple MPS (arm64, Intel(R) Xeon(R) Platinum 8480+)"
    assert "memory_bytes" not in info  # unified memory: the host's, recorded as host_memory_bytes
