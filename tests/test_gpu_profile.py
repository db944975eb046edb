"""The GPU profile (`--profile gpu`: the kernels sweep, then decoding): refused without CUDA, and its dry run, every
case at tiny sizes on the CPU, which must measure, check and validate, so the profile cannot rot between GPU runs."""

import copy
import dataclasses
import importlib.util
import json
import types

import pytest
import torch

from attention import report
from attention.bench import profiles
from attention.bench.__main__ import main
from attention.bench.sweeps import kernels

HAS_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "dry.json"
    assert main(["--profile", "gpu", "--dry-run", "--device", "cpu", "--quiet", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_the_gpu_profile_without_cuda_is_refused_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    with pytest.raises(SystemExit):
        main(["--profile", "gpu", "--device", "cpu", "--out", str(out)])
    assert "--profile gpu measures a CUDA GPU" in capsys.readouterr().err and not out.exists()
    with pytest.raises(ValueError, match="profile 'decode' has no dry run; the profiles with one: gpu"):
        profiles.plan("decode", {}, dry_run=True)


def test_the_dry_run_measures_every_case_and_validates(dry_run, capsys):
    assert dry_run["profile"] == "gpu_dry_run" and dry_run["dtype"] == "bfloat16" and dry_run["complete"] is True
    assert report.validate_result(dry_run) == []
    rows, config = dry_run["kernels"]["rows"], profiles.DRY_RUN["gpu"]["kernels"]
    assert {(row["kernel"], row["mode"], row["causal"]) for row in rows} == {
        (kernel, mode, causal) for kernel in kernels.KERNELS for mode in kernels.MODES for causal in (True, False)}
    assert all(row["seq_len"] in config["seq_lens"] and row["head_dim"] in config["head_dims"] for row in rows)
    skipped = {(row["kernel"], row["mode"]) for row in rows if row["status"] == "skipped"}
    # The CPU has neither cuDNN's nor the memory-efficient backend, and FlexAttention has no backward there.
    assert {("sdpa_cudnn", "forward"), ("sdpa_efficient", "forward"), ("flex", "forward_backward")} <= skipped
    assert all(row["reason"] for row in rows if row["status"] == "skipped")
    ran = {(row["kernel"], row["mode"]) for row in rows if row["status"] == "ok"}
    assert all(row["correct"] is True for row in rows if row["status"] == "ok")
    expected = {("sdpa_flash", "forward"), ("sdpa_math", "forward_backward"), ("flex", "forward"),
                ("tiled", "forward_backward")} | ({("triton", "forward"), ("triton", "forward_backward")} if HAS_TRITON else set())
    assert expected <= ran
    decode = dry_run["decode"]["rows"]
    assert {row["model"] for row in decode} == {"GQA", "MHA", "MQA", "MLA"}
    assert all(row["status"] == "ok" and row["correct"] is True for row in decode)



def test_the_dry_runs_file_passes_the_command_lines_validator(dry_run, tmp_path, capsys):
    path = tmp_path / "dry.json"
    path.write_text(json.dumps(dry_run))
    assert main(["--validate", str(path)]) == 0 and "profile 'gpu_dry_run'" in capsys.readouterr().out


def test_the_kernels_validator_recomputes_each_row(dry_run):
    broken = copy.deepcopy(dry_run)
    row = next(row for row in broken["kernels"]["rows"] if row["status"] == "ok")
    row.update(flops=row["flops"] + 1, batch=row["batch"] + 1)
    problems = report.validate_result(broken)
    assert any("flops" in problem for problem in problems) and any("batch" in problem for problem in problems)


def test_the_kernels_tables_name_each_case_and_the_fastest(dry_run):
    text = report.kernels.tables(dry_run)
    assert text.startswith(f"Fastest at T {profiles.DRY_RUN['gpu']['kernels']['seq_lens'][-1]:,}: head size 32, causal")
    assert "**Head size 32, not causal, forward and backward**" in text and "| `sdpa_cudnn` | skipped |" in text
    assert report.kernels.tables({"kernels": {"rows": []}}) == ""


def test_rows_too_large_for_this_machine_are_skipped_with_the_reason():
    """The tiled loop past `tiled_max_len`, the Triton interpreter past a few thousand elements and inputs past the
    memory budget are skipped before anything runs, each with a reason a reader can act on."""
    config = kernels.Config(tiled_max_len=512, memory_budget_bytes=2**40).resolve("cpu")
    envelope = types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, result={"dtype": "float32"})

    def row(kernel, T, config=config):
        return kernels.kernel_row(config, (kernel, "forward", True, 64, T), envelope, None)

    assert row("tiled", 1024)["reason"].startswith("past tiled_max_len 512: the tiled loop's")
    assert row("triton", 512)["reason"].startswith("Triton's interpreter (no GPU) runs the kernel far too slowly")
    small = dataclasses.replace(config, memory_budget_bytes=2**20)
    skipped = row("sdpa_flash", 512, small)
    assert skipped["status"] == "skipped" and "exceeds the memory budget 1.0 MiB" in skipped["reason"]
    with pytest.raises(ValueError, match="head_dims: 48 does not divide width 2048; seq_lens: 32768 is longer than "
                                         "tokens 16384"):
        kernels.Config(head_dims=(48,), seq_lens=(32768,)).resolve("cpu")
