"""The measuring core's readings that do not time anything (`attention/bench/metrics.py`): FLOPs refused for a
mode they do not count, the comparison with the reference, the CPU's last-level cache read from a fake sysfs tree
(and a GPU's L2 from its properties), the read sizes past it, and None where torch's internals do not say."""

from types import SimpleNamespace

import pytest
import torch

from attention.bench import metrics


def test_flops_are_refused_for_a_mode_they_do_not_count():
    shape = dict(batch=1, seq_len=4, d_in=8, d_out=8, num_heads=2)
    with pytest.raises(ValueError, match=r"mode must be 'forward' or 'forward_backward', got mode='backward'"):
        metrics.attention_flops(shape, "backward")


def test_an_output_of_the_wrong_shape_or_not_finite_is_wrong_without_an_error_size():
    reference = torch.ones(2, 3, dtype=torch.float64)
    tolerance = {"atol": 1e-5, "rtol": 1e-5}
    assert metrics.compare_to_reference(torch.ones(3, 2), reference, tolerance) == (False, None)
    assert metrics.compare_to_reference(torch.full((2, 3), float("inf")), reference, tolerance) == (False, None)
    assert metrics.compare_to_reference(torch.ones(2, 3) * 1.5, reference, tolerance) == (False, 0.5)
    empty = torch.ones(0, 3, dtype=torch.float64)
    assert metrics.compare_to_reference(empty.float(), empty, tolerance) == (True, 0.0)  # nothing to be wrong


@pytest.fixture
def fake_sysfs(tmp_path, monkeypatch):
    """A /sys tree of its own: `metrics` reads its paths under `tmp_path`; returns cpu0's cache folder."""
    cache = tmp_path / "sys" / "devices" / "system" / "cpu" / "cpu0" / "cache"
    cache.mkdir(parents=True)
    real_path = metrics.Path
    monkeypatch.setattr(metrics, "Path", lambda path: real_path(tmp_path / str(path).lstrip("/")))
    return cache


def _cache_level(folder, size):
    folder.mkdir()
    (folder / "size").write_text(size + "\n")


def test_the_last_level_cache_is_the_largest_cache_sysfs_lists(fake_sysfs):
    assert metrics.last_level_cache_bytes("cpu") is None  # no caches listed: unknown, not zero
    for index, size in enumerate(["48K", "32K", "2048K", "105M"]):  # L1d, L1i, L2, L3 of a large Xeon
        _cache_level(fake_sysfs / f"index{index}", size)
    assert metrics.last_level_cache_bytes("cpu") == 105 * 2**20
    assert metrics.ceiling_sizes(105 * 2**20) == (2**29, 2**30, 2**31)  # the first power of two >= 420 MiB


def test_a_cache_size_that_cannot_be_read_or_parsed_is_skipped(fake_sysfs):
    _cache_level(fake_sysfs / "index0", "32K")
    _cache_level(fake_sysfs / "index1", "1.5M")  # not a whole number of units
    _cache_level(fake_sysfs / "index2", "")
    _cache_level(fake_sysfs / "index3", "8 M")
    (fake_sysfs / "index4").mkdir()  # no size file: unreadable
    (fake_sysfs / "index5" / "size").mkdir(parents=True)  # a folder where the size should be: unreadable
    assert metrics.last_level_cache_bytes("cpu") == 32 * 2**10
    assert metrics.ceiling_sizes(None) == (2**27, 2**28, 2**29)  # unknown cache: the smallest sizes


@pytest.mark.parametrize("l2_cache_size, expected", [(50 * 2**20, 50 * 2**20), (0, None), (None, None)])
def test_a_gpus_last_level_cache_is_its_l2_from_the_device_properties(l2_cache_size, expected, monkeypatch):
    properties = SimpleNamespace(name="NVIDIA H100 80GB HBM3")  # an older torch reports no L2_cache_size at all
    if l2_cache_size is not None:
        properties.L2_cache_size = l2_cache_size
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: properties)
    assert metrics.last_level_cache_bytes("cuda:0") == expected


def test_torchs_internal_counters_missing_give_none_not_an_error(monkeypatch):
    import torch._dynamo.utils

    monkeypatch.setattr(torch._dynamo.utils, "counters", {})  # a torch without the graph counter
    assert metrics.unique_graphs() is None
    assert metrics._allocation_peak(SimpleNamespace(), torch.autograd.DeviceType.CPU) is None  # no kineto results
    assert metrics.device_peak_memory(lambda: torch.ones(2**20), "cpu") is None  # CPU: the profiler measures it


# The measuring core's failure path (`attention/bench/core.py`): what a failed or unchecked row says.

def test_a_failed_row_says_out_of_memory_or_the_errors_first_line():
    from attention.bench import core

    row = {"status": "ok"}
    core.failed(row, torch.OutOfMemoryError("CUDA error: out of memory\nTried to allocate 2.00 GiB"))
    assert row == {"status": "failed", "reason": "out of memory"}
    core.failed(row, RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: Out of memory"))
    assert row["reason"] == "out of memory"  # the CPU allocator's words, not its type
    core.failed(row, ValueError("seq_len=9 exceeds context_length=8\nsecond line"))
    assert row == {"status": "failed", "reason": "ValueError: seq_len=9 exceeds context_length=8"}


def test_an_output_whose_reference_failed_is_not_checked_and_says_why():
    from attention.bench import core

    assert core.compared(torch.ones(2), RuntimeError("reference: too large"), {"atol": 0, "rtol": 0}) == dict(
        correct=None, max_abs_error=None, reason="not checked: RuntimeError: reference: too large")


def test_auto_picks_cuda_then_mps_then_the_cpu(monkeypatch):
    from attention.bench import core

    for cuda, mps, expected in ((True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        assert core.resolve_device("auto") == torch.device(expected)
