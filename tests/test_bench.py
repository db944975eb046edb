"""The benchmark harness: schema, provenance, correctness gate, errors, CLI and renderer, at tiny sizes.

No assertion here depends on a measured time: machines differ and shared machines are noisy.
FlexAttention is left out (its first compile takes many seconds on CPU); `torch.compile` rows use
the "eager" backend, which exercises the same plumbing without code generation.
"""

import copy
import datetime
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attention.bench import metrics, render
from attention.bench.__main__ import build_parser, config_from_args, main
from attention.bench.harness import BenchConfig, quick_config, rank_rows, run_benchmark
from attention.bench.provenance import source_files, source_hash
from attention.bench.schema import ROW_FIELDS, SCHEMA_VERSION
from attention.causal.sdpa_causal import SDPACausalAttention
from attention.causal.split_heads import SplitHeadsAttention
from attention.causal.torch_mha import TorchMultiheadAttention

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(device="cpu", batch=2, seq_len=16, sweep_batch=1, seq_lens=(8, 16), d_model=32, num_heads=2,
            min_run_time=0.01, min_repeats=2, warmup_time=0.0, matmul_size=64)
TINY_CLI = ["--device", "cpu", "--batch", "1", "--seq-len", "16", "--seq-lens", "none", "--d-model", "32",
            "--heads", "2", "--mode", "forward", "--min-run-time", "0.01", "--repeats", "2", "--matmul-size", "64",
            "--quiet"]


class WrongSoftmaxAttention(SplitHeadsAttention):
    """A planted bug: the softmax normalises over the queries (dim=-2) instead of the keys."""

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.query(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = self.key(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = self.value(x).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, H, T, T)
        scores = scores.masked_fill(~self.causal_mask[:T, :T], float("-inf"))
        attn_weights = torch.softmax(scores, dim=-2)  # wrong axis
        context = (attn_weights @ v).transpose(1, 2).reshape(B, T, self.d_out)  # (B, T, H*D)
        return self.out(context)  # (B, T, d_out)


@pytest.fixture(scope="module")
def result():
    """One tiny run with a correct pair of implementations and a planted wrong one."""
    implementations = {"split_heads": SplitHeadsAttention, "sdpa_causal": SDPACausalAttention,
                       "wrong_softmax": WrongSoftmaxAttention}
    return run_benchmark(BenchConfig(**TINY), implementations=implementations, progress=False,
                         argv=["pytest", "tests/test_bench.py"])


def test_result_has_schema_and_provenance(result):
    assert result["schema_version"] == SCHEMA_VERSION
    assert result["complete"] is True
    assert result["device_type"] == "cpu" and result["dtype"] == "float32"
    provenance = result["provenance"]
    datetime.datetime.fromisoformat(provenance["date_utc"])
    assert provenance["torch"] == torch.__version__
    assert len(provenance["source_hash"]) == 64 and int(provenance["source_hash"], 16) >= 0  # sha256 hex
    assert "attention/bench/harness.py" in provenance["source_files"]
    assert provenance["command"] == "pytest tests/test_bench.py"
    assert set(provenance["git"]) == {"commit", "dirty"}
    assert provenance["device"]["name"] and provenance["device"]["cpu_count"] >= 1
    assert provenance["device"]["torch_num_threads"] == torch.get_num_threads()
    assert {"cuda", "cudnn", "python", "platform", "source_files", "duration_s"} <= set(provenance)
    assert result["matmul_peak"]["tflops"] > 0
    json.dumps(result, allow_nan=False)  # plain JSON, no NaN or infinity


def test_every_row_is_complete(result):
    shapes = [(2, 16), (1, 8), (1, 16)]
    assert len(result["rows"]) == len(shapes) * 3 * 2  # shapes x implementations x modes
    for row in result["rows"]:
        assert list(row) == list(ROW_FIELDS)  # exactly the fields of schema.Row, in its order
        assert row["status"] == "ok", row
        assert row["ms_q1"] <= row["ms_median"] <= row["ms_q3"]
        assert row["repeats"] >= 2 and row["first_call_s"] > 0
        assert row["tflops"] > 0 and row["share_of_matmul_peak"] > 0
        assert row["peak_memory_bytes"] > 0
        assert row["cpu_utilization"] > 0  # CPU rows say how much of the cores the run got
        expected = metrics.attention_flops(row["batch"], row["seq_len"], 32, 32, 2, row["mode"])
        assert row["flops_total"] == expected["total"]
        if row["implementation"] == "sdpa_causal":
            assert set(row["sdpa_backends"]) <= {"flash (cpu)", "math"} and row["sdpa_ops"]
        else:
            assert row["sdpa_backends"] == ["n/a"] and row["sdpa_ops"] == []


def test_planted_wrong_implementation_is_flagged_and_unranked(result):
    for row in result["rows"]:
        if row["implementation"] == "wrong_softmax":
            assert row["correct"] is False
            assert row["max_abs_error"] > row["tolerance"]["atol"]
        else:
            assert row["correct"] is True
    for ranking in result["rankings"]:
        assert "wrong_softmax" not in ranking["order"]
        assert ranking["excluded"]["wrong_softmax"].startswith("incorrect")
        assert set(ranking["order"]) == {"split_heads", "sdpa_causal"}
        assert ranking["fastest"] == ranking["order"][0]
    table = render.results_table(result, "forward")
    wrong_line = next(line for line in table.splitlines() if "wrong_softmax" in line)
    assert wrong_line.startswith("|  |") and "**no**" in wrong_line


def test_constructor_refusal_is_recorded_as_skipped():
    config = BenchConfig(**{**TINY, "d_in": 16, "seq_lens": (), "modes": ("forward",)})
    run = run_benchmark(config, implementations={"torch_mha": TorchMultiheadAttention,
                                                 "split_heads": SplitHeadsAttention}, progress=False)
    by_name = {row["implementation"]: row for row in run["rows"]}
    assert by_name["torch_mha"]["status"] == "skipped"
    assert "d_in" in by_name["torch_mha"]["reason"] and by_name["torch_mha"]["ms_median"] is None
    assert by_name["split_heads"]["status"] == "ok" and by_name["split_heads"]["correct"] is True
    assert run["rankings"][0]["order"] == ["split_heads"]


def test_compiled_rows_report_compile_time_apart():
    config = BenchConfig(**{**TINY, "seq_lens": (), "modes": ("forward",), "compile": True, "compile_backend": "eager"})
    run = run_benchmark(config, implementations={"split_heads": SplitHeadsAttention}, progress=False)
    eager, compiled = run["rows"]
    assert (eager["compiled"], compiled["compiled"]) == (False, True)
    assert compiled["label"] == "split_heads (compiled)" and compiled["correct"] is True
    assert compiled["compiled_graphs"] >= 1 and compiled["compile_s"] == compiled["first_call_s"]
    assert eager["compile_s"] is None


@pytest.mark.parametrize("field, value", [("device", "tpu"), ("dtype", "float8"), ("modes", ("sideways",))])
def test_unknown_settings_raise_clear_errors(field, value):
    with pytest.raises(ValueError, match=str(value[0] if isinstance(value, tuple) else value)):
        BenchConfig(**{field: value}).resolve()


@pytest.mark.parametrize("flag, value", [("--device", "tpu"), ("--dtype", "float8"), ("--mode", "sideways")])
def test_cli_rejects_unknown_choices(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([flag, value])
    assert exit_info.value.code == 2
    assert f"invalid choice: '{value}'" in capsys.readouterr().err


def test_cli_rejects_unknown_implementation(capsys):
    with pytest.raises(SystemExit):
        main([*TINY_CLI, "--impl", "no_such_thing"])
    assert "no_such_thing" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
def test_cuda_unavailable_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="cuda"):
        BenchConfig(device="cuda").resolve()
    with pytest.raises(SystemExit):
        main(["--device", "cuda"])
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the error raised where MPS is missing")
def test_mps_unavailable_is_a_clear_error():
    with pytest.raises(ValueError, match="mps"):
        BenchConfig(device="mps").resolve()


def test_tf32_off_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="tf32"):
        BenchConfig(device="cpu", dtype="tf32").resolve()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
def test_cuda_run_names_the_sdpa_kernel_that_ran():
    config = BenchConfig(**{**TINY, "device": "cuda", "dtype": "bfloat16", "d_model": 128, "seq_lens": ()})
    run = run_benchmark(config, implementations={"sdpa_causal": SDPACausalAttention,
                                                 "split_heads": SplitHeadsAttention}, progress=False)
    for row in run["rows"]:
        assert row["status"] == "ok" and row["correct"] is True
        assert row["peak_memory_bytes"] > 0
        if row["implementation"] == "sdpa_causal":
            assert set(row["sdpa_backends"]) <= {"flash", "efficient", "cudnn", "math"}
        else:
            assert row["sdpa_backends"] == ["n/a"]


def test_sdpa_backend_detection_reports_what_ran():
    q = k = v = torch.randn(1, 2, 8, 4)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def math_only():
        with sdpa_kernel(SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    assert metrics.profile_call(math_only, "cpu")["backends"] == ["math"]
    assert metrics.profile_call(lambda: q @ k.transpose(-2, -1), "cpu")["backends"] == ["n/a"]


def allocate_in_steps():
    """Live tensor memory peaks at 4 x 16 MiB: `out`, `nxt`, `extra` and the next `out`."""
    size = 4 * 2**20  # float32 elements: 16 MiB
    out = torch.ones(size)
    for _ in range(4):
        nxt = out * 2  # 16 MiB more while `out` is alive
        extra = nxt + 1  # and a third
        out = extra - nxt  # frees the old `out` once reassigned
        del nxt, extra
    return float(out[-1])


def test_cpu_tensor_peak_memory_is_exact():
    peak = metrics.profile_call(allocate_in_steps, "cpu")["cpu_tensor_peak_bytes"]
    assert peak == 4 * 16 * 2**20  # out, nxt, extra and the new out are alive together


def test_flop_convention_for_gpt2_small():
    forward = metrics.attention_flops(8, 1024, 768, 768, 12, "forward")
    assert forward["projections"] == 2 * 8 * 1024 * 768 * 768 * 4
    assert forward["attention"] == 4 * 8 * 12 * 1024 * 1024 * 64 // 2
    both = metrics.attention_flops(8, 1024, 768, 768, 12, "forward_backward")
    assert both["projections"] == 3 * forward["projections"]
    assert both["attention"] == 3.5 * forward["attention"]


def test_rankings_leave_out_failed_and_unchecked_rows():
    rows = [dict(mode="forward", batch=1, seq_len=8, label=name, status=status, correct=correct, ms_median=ms,
                 reason=None, max_abs_error=None)
            for name, status, correct, ms in [("a", "ok", True, 2.0), ("b", "ok", True, 1.0),
                                              ("c", "failed", None, None), ("d", "ok", None, 0.5)]]
    (ranking,) = rank_rows(rows)
    assert ranking["order"] == ["b", "a"] and ranking["fastest"] == "b"
    assert set(ranking["excluded"]) == {"c", "d"}


def test_quick_profile_settings():
    config = quick_config(device="cpu").resolve()
    assert config.profile == "quick" and config.d_model == 768 and config.num_heads == 12
    assert config.shapes()[0] == (1, 1024) and len(config.shapes()) == len(config.seq_lens)
    from_cli = config_from_args(build_parser().parse_args(["--quick", "--device", "cpu", "--mode", "forward"]))
    assert from_cli == quick_config(device="cpu", modes=("forward",))


def test_default_profile_is_gpt2_small_with_a_sweep():
    config = config_from_args(build_parser().parse_args(["--device", "cpu"])).resolve()
    assert (config.batch, config.seq_len, config.d_model, config.num_heads) == (8, 1024, 768, 12)
    assert config.seq_lens == (128, 256, 512, 1024, 2048, 4096) and config.sweep_batch == 1
    assert config.modes == ("forward", "forward_backward") and config.profile == "default"


def test_staleness(result):
    # Other work may edit attention/ while the tests run: compare with the sources as they are now.
    edited = json.loads(json.dumps(result))
    edited["provenance"]["source_hash"] = source_hash()
    edited["provenance"]["source_files"] = source_files()
    assert not render.is_stale(edited)
    assert render.changed_sources(edited) == []
    assert "Current" in render.provenance_summary(edited)
    edited["provenance"]["source_hash"] = "0" * 64
    edited["provenance"]["source_files"]["attention/causal/flex.py"] = "0" * 64
    assert render.is_stale(edited)
    assert render.changed_sources(edited) == ["attention/causal/flex.py"]
    assert "Stale" in render.provenance_summary(edited)


def test_renderer_tables_and_charts(result, tmp_path):
    tables = render.markdown_tables(result, include_sweep=True)
    assert tables.count("| # | implementation |") == 2  # one headline table per mode
    assert "T=8" in tables and "split_heads" in tables
    summary = render.provenance_summary(result)
    assert "torch " + torch.__version__ in summary and result["provenance"]["command"] in summary
    assert "MiB" in render.sweep_table(result, "forward", "peak_memory_bytes")
    with pytest.raises(ValueError, match="metric"):
        render.sweep_table(result, "forward", "median")

    path = tmp_path / "cpu-tiny.json"
    path.write_text(json.dumps(result))
    assert render.find_results(tmp_path, device_type="cpu") == [path]
    assert render.find_results(tmp_path, device_type="cuda") == []
    assert render.load_result(path)["rows"] == result["rows"]

    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for figure in (render.plot_bars(result), render.plot_time_vs_seq_len(result, "forward"),
                   render.plot_memory_vs_seq_len(result, "forward_backward")):
        assert isinstance(figure, matplotlib.figure.Figure)
        assert all(ax.get_title() or figure._suptitle for ax in figure.axes)
        plt.close(figure)

    share = render.plot_share(result)
    assert len(share.axes) == len(result["config"]["modes"])
    for ax in share.axes:  # one bar per correct row of the headline shape, each as long as its share
        mode = {"forward": "forward", "forward + backward": "forward_backward"}[ax.get_title().split(",")[0]]
        rows = [r for r in render.shape_rows(result, mode) if r["correct"] is True]
        widths = sorted(patch.get_width() for patch in ax.patches)
        assert widths == pytest.approx(sorted(100 * r["share_of_paired_matmul"] for r in rows))
    plt.close(share)


def test_presentation_modules_do_not_make_a_run_stale(tmp_path):
    import shutil

    from attention.bench import provenance

    package = tmp_path / "attention"
    shutil.copytree(provenance.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_hash(package)
    assert "attention/bench/render.py" not in source_files(package)
    (package / "bench" / "render.py").write_text("# a new chart\n")
    (package / "plotting.py").write_text("# a new figure\n")
    (package / "display.py").write_text("# a new way to show it\n")
    assert source_hash(package) == before
    (package / "bench" / "metrics.py").write_text("# changes what is measured\n")
    assert source_hash(package) != before


def test_cli_end_to_end(tmp_path):
    out = tmp_path / "cpu-cli.json"
    completed = subprocess.run([sys.executable, "-m", "attention.bench", *TINY_CLI, "--impl", "split_heads",
                                "sdpa_causal", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert "| # | implementation |" in completed.stdout
    recorded = render.load_result(out)
    assert recorded["complete"] is True
    assert recorded["provenance"]["command"].startswith("python -m attention.bench --device cpu")
    assert [row["implementation"] for row in recorded["rows"]] == ["split_heads", "sdpa_causal"]


def test_recorded_results_are_readable():
    for path in render.find_results():
        recorded = render.load_result(path)
        assert recorded["complete"] is True
        assert path.name.startswith(recorded["device_type"] + "-")
        assert render.markdown_tables(recorded)


def test_version_1_files_still_render(result, tmp_path):
    """Files written before schema version 2 hold `conventions` and rows with `peak_rss_growth_bytes`."""
    old = json.loads(json.dumps(result))
    old["schema_version"], old["conventions"] = 1, {"flops": "...", "memory": "...", "rss_memory": "..."}
    for row in old["rows"]:
        row["peak_rss_growth_bytes"] = 123
    path = tmp_path / "cpu-old.json"
    path.write_text(json.dumps(old))
    loaded = render.load_result(path)
    assert loaded["rows"] == result["rows"]  # read as rows of the current schema
    assert render.markdown_tables(loaded, include_sweep=True) == render.markdown_tables(result, include_sweep=True)


def test_schema_page_lists_exactly_the_row_fields():
    """The docs build writes the row table of docs/benchmark-schema.md from `schema.Row`."""
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("benchmarks_hook", ROOT / "docs" / "_hooks" / "benchmarks.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = SimpleNamespace(file=SimpleNamespace(src_uri="benchmark-schema.md"))
    markdown = hook.on_page_markdown((ROOT / "docs" / "benchmark-schema.md").read_text(), page, None, None)
    rows_section = markdown.split("## `rows[]`", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", rows_section, flags=re.MULTILINE) == list(ROW_FIELDS)
    assert all(description for description in ROW_FIELDS.values())


# ----------------------------------------------------------------------------------------------
# Results files from anyone: the validator, and a tab per file on the Benchmarks page
# ----------------------------------------------------------------------------------------------


def as_device(result, device_type, name, dtype=None):
    """A copy of `result` as if recorded on another device (for page tests only, never published)."""
    other = copy.deepcopy(result)
    other["device_type"] = other["config"]["device"] = device_type
    other["provenance"]["device"] = {"type": device_type, "name": name, "cpu": "test host CPU", "cpu_count": 8}
    if dtype:
        other["dtype"] = other["config"]["dtype"] = dtype
    return other


def valid_rows(result):
    return [r for r in result["rows"] if r["status"] == "ok"]


def test_recorded_and_fresh_results_are_valid(result):
    assert render.validate_result(result) == []
    for path in render.find_results():
        assert render.validate_result(render.load_result(path)) == [], path.name


@pytest.mark.parametrize("breakage,message", [
    (lambda r: r["provenance"].pop("torch"), "provenance lacks 'torch'"),
    (lambda r: r["provenance"]["device"].pop("name"), "provenance.device lacks 'name'"),
    (lambda r: r.pop("rankings"), "missing top-level field(s): rankings"),
    (lambda r: r.update(device_type="cuda"), "device_type 'cuda' differs from provenance.device.type 'cpu'"),
    (lambda r: valid_rows(r)[0].update(tflops=valid_rows(r)[0]["tflops"] * 2), "does not match flops_total / ms_median"),
    (lambda r: valid_rows(r)[0].update(ms_q1=valid_rows(r)[0]["ms_max"] * 2), "times are not ordered"),
    (lambda r: valid_rows(r)[0].update(share_of_matmul_peak=5.0), "is not tflops / matmul_peak.tflops"),
    (lambda r: valid_rows(r)[0].update(share_of_paired_matmul=5.0), "is not tflops / matmul_tflops_paired"),
    (lambda r: valid_rows(r)[0].pop("peak_memory_bytes"), "missing field(s) peak_memory_bytes"),
    (lambda r: valid_rows(r)[0].update(status="great"), "unknown status 'great'"),
    (lambda r: r["rankings"][0]["order"].reverse(), "is not the correct rows by median time"),
])
def test_validator_names_what_is_wrong(result, breakage, message):
    broken = copy.deepcopy(result)
    breakage(broken)
    problems = render.validate_result(broken)
    assert any(message in problem for problem in problems), problems


def test_results_from_older_sources_are_valid_and_marked_stale(result):
    old = copy.deepcopy(result)
    old["provenance"]["source_hash"] = "f" * 64
    assert render.validate_result(old) == [] and render.is_stale(old)


def bench_page_hook(tmp_path, monkeypatch, results):
    """The real benchmarks hook run under `mkdocs serve` for a project in tmp_path whose docs/results/
    holds `results` ({file name: result}); returns the hook and its config after on_pre_build."""
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    hook = config.hooks["docs/_hooks/benchmarks.py"]
    (tmp_path / "docs" / "results").mkdir(parents=True)
    for name, data in results.items():
        (tmp_path / "docs" / "results" / name).write_text(json.dumps(data))
    config.config_file_path = str(tmp_path / "mkdocs.yml")
    monkeypatch.setattr("attention.bench.source_hash", lambda: "0123456789abcdef" * 4)
    monkeypatch.delenv(hook.ENV_VAR, raising=False)
    monkeypatch.setitem(hook.state, "command", "serve")
    hook.on_pre_build(config)
    monkeypatch.setitem(hook.state, "charts", {path.stem: hook.chart_set(path.stem, data)
                                               for path, data in hook.state["recorded"]})
    return hook


def tab_bodies(markdown):
    """{tab title: its text} for the top-level `=== "title"` tabs of a Markdown page."""
    parts = re.split(r'^=== "([^"]+)"\n', markdown, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_benchmarks_page_makes_a_tab_for_every_results_file(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    files = {"cpu-test-float32.json": result,
             "cuda-testgpu-bfloat16.json": as_device(result, "cuda", "NVIDIA Test GPU", "bfloat16"),
             "cuda-testgpu-float32.json": as_device(result, "cuda", "NVIDIA Test GPU"),
             "mps-testchip-float32.json": as_device(result, "mps", "Apple Test Chip")}
    hook = bench_page_hook(tmp_path, monkeypatch, files)
    tabs = tab_bodies(hook.benchmark_tabs())
    assert list(tabs) == ["CPU, this build", "CPU, recorded", "NVIDIA CUDA", "Apple MPS"]
    cuda, mps = tabs["NVIDIA CUDA"], tabs["Apple MPS"]
    # Two CUDA files: a nested tab each, with its device, its provenance and its tables.
    nested = re.findall(r'^    === "([^"]+)"', cuda, flags=re.MULTILINE)
    assert nested == ["float32, default profile (cuda-testgpu-float32.json)",  # float32 first, then other dtypes
                      "bfloat16, default profile (cuda-testgpu-bfloat16.json)"]
    for body, device in ((cuda, "NVIDIA Test GPU"), (mps, "Apple Test Chip")):
        assert device in body and "| # | implementation | ms (median) |" in body
        assert "`split_heads`" in body and "What this run was measured on" in body
    assert "No Apple MPS run has been recorded yet" not in mps
    summary = hook.fastest_section()
    assert "NVIDIA Test GPU" in summary and "Apple Test Chip" in summary and "3 devices" in summary


def test_an_invalid_results_file_fails_the_build_with_the_validators_message(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    broken = copy.deepcopy(result)
    del broken["provenance"]["source_hash"]
    with pytest.raises(PluginError, match=r"cuda-broken\.json: NOT valid, 1 problem\(s\):\n  - provenance lacks 'source_hash'"):
        bench_page_hook(tmp_path, monkeypatch, {"cuda-broken.json": as_device(broken, "cuda", "NVIDIA Test GPU")})


def test_an_unreadable_results_file_fails_the_build(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    partial = {key: value for key, value in result.items() if key != "rankings"}
    with pytest.raises(PluginError, match=r"(?s)cpu-partial\.json: NOT valid.*cannot be read: missing top-level field\(s\): rankings"):
        bench_page_hook(tmp_path, monkeypatch, {"cpu-partial.json": partial})


def test_paired_yardstick_alternates_with_the_rows_blocks():
    calls = []
    timing = metrics.time_callable(lambda: calls.append("row"), "cpu", min_run_time=0.0, min_repeats=3,
                                   warmup_time=0.0, paired=lambda: calls.append("matmul"))
    runs = [name for index, name in enumerate(calls) if index == 0 or calls[index - 1] != name]
    # One warm-up call of the row, then matmul, row, matmul, row, matmul, row, matmul.
    assert runs == ["row"] + ["matmul", "row"] * 3 + ["matmul"]
    assert timing["repeats"] == 3 and timing["paired_repeats"] == 4 and timing["paired_ms_median"] > 0


def test_paired_yardstick_cancels_a_drifting_machine():
    """A machine that slows down threefold while one row is timed: the row and the yardstick beside it
    slow down alike, so their ratio stays what it is on a steady machine (here 2), and a yardstick timed
    only before the row would be off by the drift."""
    start = __import__("time").perf_counter()

    def work(seconds):
        def call():
            slowdown = 1 + 4 * (__import__("time").perf_counter() - start)  # 1x at the start, 3x after 0.5 s
            __import__("time").sleep(seconds * slowdown)
        return call

    before = metrics.time_callable(work(0.004), "cpu", min_run_time=0.05, min_repeats=3, warmup_time=0.0)
    timing = metrics.time_callable(work(0.002), "cpu", min_run_time=0.5, min_repeats=5, warmup_time=0.0,
                                   paired=work(0.004))
    assert timing["paired_ms_median"] / timing["ms_median"] == pytest.approx(2, rel=0.15)
    assert before["ms_median"] / timing["ms_median"] < 1.6  # unpaired: the drift shows


def test_rows_carry_the_paired_yardstick(result):
    measured = [row for row in result["rows"] if row["status"] == "ok"]
    for row in measured:
        assert row["matmul_tflops_paired"] > 0
        assert row["share_of_paired_matmul"] == pytest.approx(row["tflops"] / row["matmul_tflops_paired"])
    paired = result["matmul_peak"]["paired"]
    assert paired["rows"] == len(measured)
    assert paired["lowest_tflops"] <= paired["median_tflops"] <= paired["highest_tflops"]
    table = render.markdown_tables(result)
    assert "timed in blocks interleaved with the row's own" in table
    assert "**Paired matmul rate**" in render.provenance_summary(result)


def test_bfloat16_runs_on_cpu_against_its_own_yardstick_and_tolerance():
    config = BenchConfig(**{**TINY, "dtype": "bfloat16", "seq_lens": (), "modes": ("forward", "forward_backward")})
    run = run_benchmark(config, implementations={"split_heads": SplitHeadsAttention, "sdpa_causal": SDPACausalAttention},
                        progress=False)
    assert run["dtype"] == "bfloat16" and run["matmul_peak"]["dtype"] == "bfloat16"
    assert render.validate_result(run) == []
    for row in run["rows"]:
        assert row["status"] == "ok" and row["correct"] is True, row
        assert row["tolerance"] == metrics.TOLERANCES["bfloat16"]
        assert 0 < row["max_abs_error"] <= row["tolerance"]["atol"] + row["tolerance"]["rtol"]


def test_validate_cli_says_what_is_wrong(result, tmp_path, capsys):
    good, stale, broken, garbled = (tmp_path / name for name in ("good.json", "stale.json", "broken.json", "bad.json"))
    good.write_text(json.dumps(result))
    old = copy.deepcopy(result)
    old["provenance"]["source_files"]["attention/causal/split_heads.py"] = "0" * 64
    old["provenance"]["source_hash"] = "f" * 64
    stale.write_text(json.dumps(old))
    wrong = copy.deepcopy(result)
    valid_rows(wrong)[0]["ms_q1"] = valid_rows(wrong)[0]["ms_max"] * 2
    broken.write_text(json.dumps(wrong))
    garbled.write_text("{not json")

    assert main(["--validate", str(good), str(stale)]) == 0
    out = capsys.readouterr().out
    assert f"{good}: valid: cpu (" in out and "recorded with the current attention/ sources" in out
    assert f"{stale}: valid" in out and "recorded with older sources" in out and "attention/causal/split_heads.py" in out
    assert main(["--validate", str(good), str(broken), str(garbled)]) == 1
    out = capsys.readouterr().out
    assert f"{broken}: NOT valid, 1 problem(s):" in out and "times are not ordered" in out
    assert f"{garbled}: NOT valid" in out and "cannot be read" in out


def slowed(result, label, factor):
    """A copy of `result` where every row of `label` took `factor` times as long, kept consistent (TFLOP/s,
    shares and rankings recomputed), so it stays a valid results file."""
    changed = copy.deepcopy(result)
    for row in changed["rows"]:
        if row["label"] == label and row["status"] == "ok":
            for key in ("ms_median", "ms_q1", "ms_q3", "ms_iqr", "ms_min", "ms_max"):
                row[key] *= factor
            row["tflops"] /= factor
            row["share_of_matmul_peak"] /= factor
            row["share_of_paired_matmul"] /= factor
    changed["rankings"] = rank_rows(changed["rows"])
    return changed


def test_fastest_leaves_out_rows_with_fewer_kv_heads(result):
    """A grouped-query row is another model: however fast, it is not ranked against multi-head classes."""
    grouped = copy.deepcopy(result)
    extra = []
    for row in grouped["rows"]:
        if row["implementation"] == "sdpa_causal":
            faster = dict(row, implementation="gqa", label="gqa", num_kv_heads=row["num_heads"] // 2)
            for key in ("ms_median", "ms_q1", "ms_q3", "ms_min", "ms_max"):
                faster[key] = row[key] / 10
            extra.append(faster)
    grouped["rows"] += extra
    assert extra and all(render.fewer_kv_heads(row) for row in extra)
    assert [entry["fastest"]["label"] for entry in render.fastest(grouped)] == \
        [entry["fastest"]["label"] for entry in render.fastest(result)]
    assert "`gqa`" not in render.fastest_table(grouped)


def test_share_stability_compares_two_runs(result):
    assert all(row["paired"][0] == row["paired"][1] for entry in render.share_stability(result, result)
               for row in entry["rows"])
    slower = slowed(result, "split_heads", 2.0)
    for entry in render.share_stability(result, slower):
        ranking = next(r for r in result["rankings"] if (r["mode"], r["batch"], r["seq_len"]) ==
                       (entry["mode"], result["config"]["batch"], result["config"]["seq_len"]))
        assert entry["fastest"] == ranking["fastest"]
        row = next(row for row in entry["rows"] if row["label"] == "split_heads")
        assert row["paired"][1] == pytest.approx(row["paired"][0] / 2)
    table = render.share_stability_table(result, slower)
    assert "| forward | `split_heads`" in table and "(fastest)" in table


def test_bfloat16_section_compares_a_devices_two_dtypes(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    name = result["provenance"]["device"]["name"]
    bf16 = slowed(as_device(result, "cpu", name, "bfloat16"), "split_heads", 2.0)
    hook = bench_page_hook(tmp_path, monkeypatch, {"cpu-test-float32.json": result, "cpu-test-bfloat16.json": bf16})
    section = hook.dtype_section()
    assert f"**{name}**" in section and "| `split_heads` |" in section and "0.50×" in section
    assert "slower: `split_heads` (0.50×)" in section
    assert "examples/benchmark.py#bfloat16-on-this-cpu" in section
    alone = bench_page_hook(tmp_path / "alone", monkeypatch, {"cpu-test-float32.json": result})
    assert alone.dtype_section() == "No device has recorded runs in both float32 and bfloat16 yet."


def test_add_your_device_page_is_filled_from_the_hook(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    hook = bench_page_hook(tmp_path, monkeypatch, {"cpu-test-float32.json": result})
    page = SimpleNamespace(file=SimpleNamespace(src_uri="add-your-device.md"))
    markdown = hook.on_page_markdown((ROOT / "docs" / "add-your-device.md").read_text(), page, None, None)
    assert "<!--" not in markdown
    for device, command in hook.RECORD_COMMANDS.items():
        assert f'=== "{hook.RECORD_TITLES[device]}"' in markdown
        assert command.replace(" --out ", " \\\n        --out ") in markdown  # inside the tab, on two lines
    assert "docs/results/cpu-test-float32.json: valid: cpu (" in markdown
    duration = result["provenance"]["duration_s"] / 60
    assert (f"The default-profile runs recorded for this site took: {result['provenance']['device']['name']}, "
            f"{result['dtype']}: {duration:.0f} minutes.") in markdown


def test_cpu_flags_and_their_label(tmp_path):
    from attention.bench.provenance import cpu_features_label, cpu_flags

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
                       "flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 amx_int8\n")
    flags = cpu_flags(cpuinfo)
    assert flags == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    assert cpu_features_label(flags) == "AMX"
    assert cpu_features_label(["avx2", "fma", "avx512f"]) == "AVX-512"
    assert cpu_features_label(["avx2", "fma"]) == "AVX2"
    assert cpu_features_label([]) == "no AVX2"
    assert cpu_features_label(None) == "flags unknown"
    assert cpu_flags(tmp_path / "missing") is None
