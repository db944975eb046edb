"""The benchmark's core and its sequence sweep: schema, provenance, correctness gate, errors, CLI, tables, pages.

No assertion here depends on a measured time: machines differ and shared machines are noisy. FlexAttention
is left out (its first compile takes many seconds on CPU); `torch.compile` rows use the "eager" backend,
which exercises the same plumbing without code generation.
"""

import ast
import copy
import datetime
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from bench_tables import BEFORE, TINY, structure

from attention.bench import SWEEPS, core, metrics, profiles, run_benchmark
from attention import report
from attention.bench.__main__ import build_parser, config_from_args, main
from attention.bench.provenance import source_files, source_hash
from attention.bench.results import SCHEMA_VERSION, fields_table
from attention.bench.sweeps import Sweep, sequence
from attention.bench.sweeps.sequence import Config, rank_rows
from attention.causal.sdpa_causal import SDPACausalAttention
from attention.causal.split_heads import SplitHeadsAttention
from attention.causal.torch_mha import TorchMultiheadAttention
from attention.reference import tolerance
from attention.registry import IMPLEMENTATIONS

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(device="cpu", batch=2, seq_len=16, sweep_batch=1, seq_lens=(8, 16), d_model=32, num_heads=2,
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
    """One small run of two registered classes, as published (valid)."""
    return run_benchmark(Config(**SMALL, implementations=("split_heads", "sdpa_causal")), progress=False,
                         argv=["pytest", "tests/test_bench.py"])


@pytest.fixture(scope="module")
def planted():
    """A small run with a correct class and a planted wrong one (not in the registry)."""
    return run_benchmark(Config(**SMALL | dict(seq_lens=())), progress=False,
                         implementations={"split_heads": SplitHeadsAttention, "wrong_softmax": WrongSoftmaxAttention})


def test_result_has_schema_and_provenance(result):
    assert result["schema_version"] == SCHEMA_VERSION == 3
    assert result["complete"] is True and result["profile"] == "default"
    assert result["device_type"] == "cpu" and result["dtype"] == "float32"
    provenance = result["provenance"]
    assert datetime.datetime.fromisoformat(provenance["date_utc"]).tzinfo is not None
    assert provenance["torch"] == torch.__version__
    assert provenance["source_hash"] == source_hash() and provenance["source_files"] == source_files()
    assert "attention/bench/core.py" in provenance["source_files"]
    assert provenance["command"] == "pytest tests/test_bench.py"
    assert provenance["device"]["cpu_count"] >= 1 and provenance["device"]["torch_num_threads"] == torch.get_num_threads()
    assert provenance["load_average_end"] is not None and provenance["duration_s"] > 0
    assert result["matmul_peak"]["tflops"] > 0
    json.dumps(result, allow_nan=False)  # plain JSON, no NaN or infinity


def test_every_row_is_complete_and_counts_the_work_by_hand(result):
    shapes = [(2, 16), (1, 8), (1, 16)]
    assert [(r["batch"], r["seq_len"]) for r in result["rows"][::4]] == shapes  # 2 classes x 2 modes per shape
    for row in result["rows"]:
        assert list(row) == list(sequence.Row.__annotations__)  # exactly the fields of Row, in its order
        assert row["status"] == "ok" and row["correct"] is True, row
        assert row["ms_min"] <= row["ms_q1"] <= row["ms_median"] <= row["ms_q3"] <= row["ms_max"]
        assert row["ms_iqr"] == pytest.approx(row["ms_q3"] - row["ms_q1"])
        assert row["repeats"] >= 2 and row["first_call_s"] > 0 and row["peak_memory_bytes"] > 0
        assert 0 < row["cpu_utilization"] and row["tflops"] > 0 and row["share_of_matmul_peak"] > 0
        B, T = row["batch"], row["seq_len"]  # d_in = d_out = 32, 2 heads of 16, MHA: written out by hand
        projections, core_flops = 2 * B * T * 32 * (32 + 2 * 32) + 2 * B * T * 32 * 32, 4 * B * 2 * T * T * 16 // 2
        if row["mode"] == "forward_backward":
            projections, core_flops = projections * 3, core_flops * 7 // 2
        assert (row["flops_projections"], row["flops_attention"]) == (projections, core_flops)
        assert row["flops"] == projections + core_flops
        if row["implementation"] == "sdpa_causal":
            assert set(row["sdpa_backends"]) <= {"flash (cpu)", "math"} and row["sdpa_ops"]
        else:
            assert row["sdpa_backends"] == ["n/a"] and row["sdpa_ops"] == []


def test_planted_wrong_implementation_is_flagged_and_unranked(planted):
    for row in planted["rows"]:
        wrong = row["implementation"] == "wrong_softmax"
        assert row["correct"] is (not wrong)
        if wrong:
            assert row["max_abs_error"] > row["tolerance"]["atol"]
            assert row["reason"] == "output differs from the float64 reference"
    for ranking in planted["rankings"]:
        assert ranking["order"] == ["split_heads"] and ranking["fastest"] == "split_heads"
        assert ranking["excluded"]["wrong_softmax"].startswith("incorrect")
    wrong_line = next(line for line in report.sequence.results_table(planted).splitlines() if "wrong_softmax" in line)
    assert wrong_line.startswith("|  |") and "**no**" in wrong_line
    # A class that is not registered is not publishable: the validator names it.
    assert any("rows[2].implementation: 'wrong_softmax' is not one of" in p for p in report.validate_result(planted))


def test_constructor_refusal_is_recorded_as_skipped():
    config = Config(**SMALL | dict(d_in=16, seq_lens=(), modes=("forward",)))
    run = run_benchmark(config, progress=False, implementations={"torch_mha": TorchMultiheadAttention,
                                                                 "split_heads": SplitHeadsAttention})
    by_name = {row["implementation"]: row for row in run["rows"]}
    assert by_name["torch_mha"]["status"] == "skipped" and by_name["torch_mha"]["ms_median"] is None
    assert by_name["torch_mha"]["reason"].startswith("constructor: ValueError") and "d_in" in by_name["torch_mha"]["reason"]
    assert by_name["split_heads"]["status"] == "ok" and by_name["split_heads"]["correct"] is True
    assert run["rankings"][0]["order"] == ["split_heads"] and report.validate_result(run) == []


def test_compiled_rows_report_compile_time_apart():
    config = Config(**SMALL | dict(seq_lens=(), modes=("forward",), compile=True, compile_backend="eager",
                                   implementations=("split_heads",)))
    eager, compiled = run_benchmark(config, progress=False)["rows"]
    assert (eager["compiled"], compiled["compiled"]) == (False, True)
    assert compiled["label"] == "split_heads (compiled)" and compiled["correct"] is True
    assert compiled["compiled_graphs"] >= 1 and compiled["compile_s"] == compiled["first_call_s"]
    assert eager["compile_s"] is None


@pytest.mark.parametrize("field, value, message", [
    ("device", "tpu", "device must be one of"), ("dtype", "float8", "dtype must be one of"),
    ("modes", ("sideways",), "modes must be a non-empty subset"), ("num_heads", 5, "divisible by num_heads"),
    ("implementations", ("nope",), "'nope' is not one of"), ("seq_lens", (0,), r"seq_lens\[0\]: 0 is outside")])
def test_unknown_settings_raise_clear_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value}).resolve("cpu" if field != "device" else None)


@pytest.mark.parametrize("flag, value", [("--device", "tpu"), ("--dtype", "float8"), ("--mode", "sideways"),
                                         ("--profile", "huge")])
def test_cli_rejects_unknown_choices(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([flag, value])
    assert exit_info.value.code == 2 and f"invalid choice: '{value}'" in capsys.readouterr().err


def test_cli_rejects_unknown_implementation(capsys):
    with pytest.raises(SystemExit):
        main([*TINY_CLI, "--impl", "no_such_thing"])
    assert "no_such_thing" in capsys.readouterr().err


def never_measured(monkeypatch):
    """Make measuring anything fail the test: every sweep's `run` raises."""
    def measured(*args, **kwargs):
        raise AssertionError("measured before --out was checked")
    for sweep in SWEEPS.values():
        monkeypatch.setattr(sweep, "run", measured)


@pytest.mark.parametrize("kind, message", [
    ("folder", r"--out: \S+: a folder; name a file to write"),
    ("missing parent", r"--out: \S+: its folder \S+ does not exist"),
    ("existing file", r"--out: \S+: exists already; pass --force to replace it, or choose another path"),
    ("symlink", r"--out: \S+: a symbolic link: name the file itself")])
def test_out_is_checked_before_anything_is_measured(tmp_path, monkeypatch, capsys, kind, message):
    """`--out DIR` measured a row, then failed (IsADirectoryError) and left DIR.tmp; `--out notes.txt` replaced the
    notes with the results: each is a usage error naming --out now, before any work, and leaves the folder as it was."""
    out = {"folder": tmp_path / "adir", "missing parent": tmp_path / "no" / "cpu.json",
           "existing file": tmp_path / "notes.txt", "symlink": tmp_path / "link.json"}[kind]
    (tmp_path / "adir").mkdir()
    (tmp_path / "notes.txt").write_text("precious")
    (tmp_path / "link.json").symlink_to(tmp_path / "notes.txt")
    never_measured(monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY_CLI, "--impl", "split_heads", "--out", str(out)])
    assert exit_info.value.code == 2 and re.search(message, capsys.readouterr().err)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["adir", "link.json", "notes.txt"]
    assert list((tmp_path / "adir").iterdir()) == [] and (tmp_path / "notes.txt").read_text() == "precious"


def test_force_replaces_an_existing_out_and_the_run_rewrites_its_own_file(tmp_path, capsys):
    out = tmp_path / "cpu-force.json"
    out.write_text("precious")
    assert main([*TINY_CLI, "--impl", "split_heads", "sdpa_causal", "--out", str(out), "--force"]) == 0
    recorded = report.load_result(out)  # rewritten after each of its two rows, then at the end
    assert recorded["complete"] is True and len(recorded["rows"]) == 2
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cpu-force.json"]  # no temporary file left


def test_an_envelope_never_writes_over_a_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """From Python as from the command line: an existing `out` is refused on entering, before anything is measured;
    a run that fails keeps its partial file (complete: false) and no temporary file."""
    out = tmp_path / "cpu-partial.json"
    out.write_text("precious")
    plan = profiles.plan("quick", {})
    never_measured(monkeypatch)
    with pytest.raises(FileExistsError, match="exists already"):
        core.run(plan, "cpu", out=out, progress=False)
    assert out.read_text() == "precious"
    monkeypatch.undo()

    def failing(config, envelope):
        envelope.add(envelope.open("sequence", {"rows": []}, 2)["rows"], {"status": "failed", "reason": "x"}, "one row")
        raise RuntimeError("the second row failed")
    monkeypatch.setattr(sequence, "run", failing)
    out.unlink()
    with pytest.raises(RuntimeError, match="the second row failed"):
        core.run(plan, "cpu", out=out, progress=False)
    assert json.loads(out.read_text())["complete"] is False
    assert sorted(path.name for path in tmp_path.iterdir()) == ["cpu-partial.json"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA is missing")
def test_cuda_unavailable_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="cuda"):
        Config(device="cuda").resolve()
    with pytest.raises(SystemExit):
        main(["--device", "cuda"])
    assert "torch.cuda.is_available() is False" in capsys.readouterr().err


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the error raised where MPS is missing")
def test_mps_unavailable_is_a_clear_error():
    with pytest.raises(ValueError, match="mps"):
        Config(device="mps").resolve()


def test_tf32_off_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="tf32"):
        Config(device="cpu", dtype="tf32").resolve()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA)")
def test_cuda_run_names_the_sdpa_kernel_that_ran():
    config = Config(**SMALL | dict(device="cuda", dtype="bfloat16", d_model=128, seq_lens=(),
                                   implementations=("sdpa_causal", "split_heads")))
    run = run_benchmark(config, progress=False)
    assert report.validate_result(run) == []
    for row in run["rows"]:
        assert row["status"] == "ok" and row["correct"] is True and row["peak_memory_bytes"] > 0
        expected = {"flash", "efficient", "cudnn", "math"} if row["implementation"] == "sdpa_causal" else {"n/a"}
        assert set(row["sdpa_backends"]) <= expected


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
    assert metrics.profile_call(allocate_in_steps, "cpu")["cpu_tensor_peak_bytes"] == 4 * 16 * 2**20


BUILT_AND_CALLED = []


class BuiltAndCalled(SplitHeadsAttention):
    """`split_heads` that records each construction and call in `BUILT_AND_CALLED`."""

    def __init__(self, *args, **kwargs):
        BUILT_AND_CALLED.append("built")
        super().__init__(*args, **kwargs)

    def forward(self, x):
        BUILT_AND_CALLED.append("called")
        return super().forward(x)


def test_the_first_shape_of_a_class_past_the_memory_budget_is_skipped_unbuilt():
    """The budget checked a shape only from the class's previous one, so a class's first shape went to the allocator
    (split_heads at T = 32768 asked for 51.5 GB against a 17.35 GB budget). Now a bound from the shape checks it: with
    a budget below split_heads' bound and above sdpa_causal's, split_heads is skipped without being built or called,
    sdpa_causal is measured."""
    config = Config(**SMALL | dict(seq_lens=(), modes=("forward",))).resolve("cpu")
    budget = sequence.first_peak_bound("sdpa_causal", "forward", config, config.batch, config.seq_len) + 1
    assert sequence.first_peak_bound("split_heads", "forward", config, config.batch, config.seq_len) > budget
    BUILT_AND_CALLED.clear()
    run = run_benchmark(Config(**SMALL | dict(seq_lens=(), modes=("forward",), memory_budget_bytes=budget)),
                        progress=False, implementations={"split_heads": BuiltAndCalled, "sdpa_causal": SDPACausalAttention})
    skipped, measured = run["rows"]
    assert BUILT_AND_CALLED == []
    assert skipped["status"] == "skipped" and skipped["ms_median"] is None and skipped["peak_memory_bytes"] is None
    assert skipped["reason"].startswith("predicted peak memory ") and "exceeds the memory budget" in skipped["reason"]
    assert "a bound from the shape" in skipped["reason"]
    assert measured["status"] == "ok" and measured["correct"] is True
    assert report.validate_result(run) == []


def test_the_first_shape_bound_holds_for_every_recorded_peak_and_spares_the_fused_classes(result):
    """The bound is above every peak recorded in docs/results/ and in a small run; at the review's shape (B=1,
    T=32768, GPT-2 small's heads) it stops the classes that hold the scores and lets the fused ones run."""
    recorded = [(path, row, found["config"]) for path in sorted((ROOT / "docs" / "results").rglob("*.json"))
                for found in [json.loads(path.read_text())] if "rows" in found for row in found["rows"]]
    recorded += [("the small run", row, result["config"]) for row in result["rows"]]
    assert len(recorded) > 1000
    for where, row, config in recorded:
        if row["peak_memory_bytes"]:
            shape = SimpleNamespace(num_heads=row["num_heads"], d_in=row["d_in"], d_model=row["d_out"])
            assert row["peak_memory_bytes"] < sequence.first_peak_bound(row["implementation"], row["mode"], shape,
                                                                        row["batch"], row["seq_len"]), (where, row["label"])
    gpt2 = SimpleNamespace(num_heads=12, d_in=768, d_model=768)
    review_budget = 17_350_250_496
    for name in ("split_heads", "stacked_heads", "alibi", "torch_mha_weights", "a class not listed"):
        assert sequence.first_peak_bound(name, "forward", gpt2, 1, 32768) > review_budget, name
    for name in ("sdpa_causal", "sdpa_mask", "torch_mha", "tiled", "rope", "gqa", "mqa", "flex"):
        assert sequence.first_peak_bound(name, "forward", gpt2, 1, 32768) < review_budget, name
    assert set(sequence.SCORE_BYTES) == set(IMPLEMENTATIONS)  # every registered class has its factors


def test_flop_convention_for_gpt2_small():
    gpt2 = dict(batch=8, seq_len=1024, d_in=768, d_out=768, num_heads=12)
    forward = metrics.attention_flops(gpt2, "forward")
    assert forward["projections"] == 2 * 8 * 1024 * 768 * 768 * 4
    assert forward["attention"] == 4 * 8 * 12 * 1024 * 1024 * 64 // 2
    both = metrics.attention_flops(gpt2, "forward_backward")
    assert both["projections"] == 3 * forward["projections"]
    assert both["attention"] == 3.5 * forward["attention"]


def test_flops_count_the_smaller_kv_width_of_grouped_query_attention(result):
    """GPT-2 small with 3 K/V heads of 64: key and value project to 192, not 768 (24.2 G, not 38.7 G, forward)."""
    grouped = metrics.attention_flops(dict(batch=8, seq_len=1024, d_in=768, d_out=768, num_heads=12, num_kv_heads=3),
                                      "forward")
    assert grouped["projections"] == 2 * 8 * 1024 * 768 * (768 + 2 * 192) + 2 * 8 * 1024 * 768 * 768 == 24_159_191_040
    assert grouped["attention"] == 4 * 8 * 12 * 1024 * 1024 * 64 // 2  # every query head still attends
    # A results file whose grouped-query row counts the K/V width of multi-head attention is refused.
    tampered = copy.deepcopy(result)
    row = next(row for row in tampered["rows"] if row["mode"] == "forward")
    row["num_kv_heads"] = 1
    problems = report.validate_result(tampered)
    assert any("flops_projections" in p and "does not match its definition" in p for p in problems), problems


def test_rankings_leave_out_failed_and_unchecked_rows():
    rows = [dict(mode="forward", batch=1, seq_len=8, label=name, status=status, correct=correct, ms_median=ms,
                 reason=None, max_abs_error=None)
            for name, status, correct, ms in [("a", "ok", True, 2.0), ("b", "ok", True, 1.0),
                                              ("c", "failed", None, None), ("d", "ok", None, 0.5)]]
    (ranking,) = rank_rows(rows)
    assert ranking["order"] == ["b", "a"] and ranking["fastest"] == "b" and set(ranking["excluded"]) == {"c", "d"}


def test_profiles_resolve_to_the_presets_they_resolved_to_before(monkeypatch):
    """The command line's presets, resolved on CPU, equal those the code before the rebuild resolved
    (tests/data/bench_tables_before.json), field for field (the memory budget is the machine's), on a host whose
    last-level cache reads 480 MiB too (the decode profile's bandwidth ceiling read past its rule there)."""
    monkeypatch.setattr(metrics, "last_level_cache_bytes", lambda device: 480 * 2**20)
    for name, before in BEFORE["presets"].items():
        plan = config_from_args(build_parser().parse_args(["--profile", name, "--device", "cpu"]))
        assert plan.profile == name
        sweep, config = plan.sweeps[0]
        resolved = {key: list(value) if isinstance(value, tuple) else value
                    for key, value in vars(config.resolve(torch.device("cpu"))).items()}
        shared = set(before) & set(resolved) - {"memory_budget_bytes", "profile"}
        grown = {"models", "kernels"} if name == "decode" else set()  # since: the model families' layers and MLA
        assert {key: resolved[key] for key in shared - grown} == {key: before[key] for key in shared - grown}, name
        assert all(resolved[key][:len(before[key])] == before[key] for key in grown), name
        assert shared >= set(before) - {"device", "dtype", "profile", "memory_budget_bytes"}, name
    long = config_from_args(build_parser().parse_args(["--profile", "long", "--device", "cpu"]))
    assert [sweep.NAME for sweep, _ in long.sweeps] == ["sequence", "block_sparse"]
    assert long.sweeps[1][1].seq_lens == tuple(BEFORE["presets"]["long"]["seq_lens"])
    assert config_from_args(build_parser().parse_args(["--quick", "--mode", "forward"])).sweeps[0][1] == \
        profiles.quick_config(modes=("forward",))
    assert config_from_args(build_parser().parse_args(["--batch", "2"])).profile == "custom"


def test_the_quick_profile_makes_the_tables_it_made_before():
    """A quick run at tiny sizes on the classes of the capture (FlexAttention's left out: its compile is slow) has
    the columns and the rows of the tables the code before the rebuild printed from the same inputs."""
    quick = run_benchmark(profiles.quick_config(**TINY, seq_len=16, seq_lens=(8, 16),
                                                implementations=BEFORE["implementations"]), progress=False)
    assert structure(report.sequence.markdown_tables(quick)) == BEFORE["quick"]["markdown_tables"]
    assert structure(report.sequence.markdown_tables(quick, include_sweep=True)) == BEFORE["quick"]["markdown_tables_sweep"]
    assert structure(report.sequence.fastest_table(quick)) == BEFORE["quick"]["fastest_table"]
    assert report.validate_result(quick) == []


def test_staleness(result):
    edited = copy.deepcopy(result)
    assert not report.is_stale(edited) and report.changed_sources(edited) == []
    assert "Current" in report.format.provenance_summary(edited)
    edited["provenance"]["source_hash"] = "0" * 64
    edited["provenance"]["source_files"]["attention/causal/flex.py"] = "0" * 64
    assert report.is_stale(edited) and report.changed_sources(edited) == ["attention/causal/flex.py"]
    assert "Stale" in report.format.provenance_summary(edited)


def test_renderer_tables_and_charts(result, tmp_path):
    tables = report.sequence.markdown_tables(result, include_sweep=True)
    assert tables.count("| # | implementation |") == 2 and "T=8" in tables and "`split_heads`" in tables
    summary = report.format.provenance_summary(result)
    assert "torch " + torch.__version__ in summary and result["provenance"]["command"] in summary
    assert "MiB" in report.sequence.sweep_table(result, "forward", "peak_memory_bytes")
    with pytest.raises(ValueError, match="metric"):
        report.sequence.sweep_table(result, "forward", "median")
    path = tmp_path / "cpu-tiny.json"
    path.write_text(json.dumps(result))
    assert report.find_results(tmp_path, device_type="cpu") == [path] and report.find_results(tmp_path, "cuda") == []
    assert report.load_result(path) == result  # nothing in it to escape
    matplotlib = pytest.importorskip("matplotlib")
    for figure in (report.sequence.plot_bars(result), report.sequence.plot_time_vs_seq_len(result, "forward"),
                   report.sequence.plot_memory_vs_seq_len(result, "forward_backward")):
        assert isinstance(figure, matplotlib.figure.Figure)
        assert all(ax.get_title() or figure._suptitle for ax in figure.axes)
    bars = report.sequence.plot_bars(result)
    for ax in bars.axes:  # one bar per measured row of the headline shape, each as long as its median
        mode = {"forward": "forward", "forward + backward": "forward_backward"}[ax.get_title().split(",")[0]]
        assert sorted(p.get_width() for p in ax.patches) == pytest.approx(
            sorted(r["ms_median"] for r in report.sequence.shape_rows(result, mode)))


def test_sweep_charts_name_four_kinds_of_kernel_and_grey_the_rest(result):
    """17 lines in 17 pastel colours were unreadable: the naive, SDPA, tiled and Flex classes are drawn in colour
    and named; every other class is grey, under one legend entry."""
    crowded = copy.deepcopy(result)
    crowded["rows"] += [dict(row, label=name, implementation=name) for name in ("einsum", "rope", "alibi")
                        for row in result["rows"] if row["implementation"] == "split_heads"]
    ax = report.sequence.plot_time_vs_seq_len(crowded).axes[0]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend[:2] == ["naive: (B, H, T, T) scores (split_heads)", "SDPA, fused (sdpa_causal)"]
    assert "other classes (see the tables)" in legend and len(legend) == 4  # + the O(T²) guide
    grey = [line for line in ax.get_lines() if line.get_color() == "0.72" and line.get_xdata().size]
    assert len(grey) == 3


def test_cli_end_to_end(tmp_path):
    out = tmp_path / "cpu-cli.json"
    completed = subprocess.run([sys.executable, "-m", "attention.bench", *TINY_CLI, "--impl", "split_heads",
                                "sdpa_causal", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert "| # | implementation |" in completed.stdout and "identified as **" in completed.stdout
    recorded = report.load_result(out)
    assert recorded["complete"] is True and recorded["profile"] == "custom"
    assert recorded["provenance"]["command"].startswith("python -m attention.bench --device cpu")
    assert [row["implementation"] for row in recorded["rows"]] == ["split_heads", "sdpa_causal"]
    assert main(["--validate", str(out)]) == 0


def test_help_gives_profiles_run_times_names_and_examples(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "profiles: default, quick, long, decode, gpu, block_sparse" in text
    assert all(name in text for name in IMPLEMENTATIONS) and "python -m attention.bench --validate" in text
    durations = report.recorded_durations()  # each recorded run's duration, read from its file
    assert f"run times of the runs recorded in docs/results/: {durations}" in text
    for path in report.find_results():
        recorded = report.load_result(path)
        assert f"{recorded['provenance']['duration_s'] / 60:.0f} min ({report.format.device_label(recorded['provenance']['device'])}" in durations


def test_recorded_results_are_valid_readable_and_named_after_their_device():
    paths = sorted((ROOT / "docs" / "results").rglob("*.json"))
    assert len(paths) >= 8
    for path in paths:
        checked = report.check_file(path)
        assert checked["problems"] == [], checked["problems"]
        assert path.name.startswith(checked["result"]["device_type"] + "-")
    for path in report.find_results():
        assert report.sequence.markdown_tables(report.load_result(path))


def test_the_schema_page_lists_every_sweeps_row_fields():
    """docs/benchmark-schema.md's field tables are written from each sweep's `Row`."""
    pytest.importorskip("mkdocs")
    hook = hook_module()
    page = SimpleNamespace(file=SimpleNamespace(src_uri="benchmark-schema.md"))
    markdown = hook.on_page_markdown((ROOT / "docs" / "benchmark-schema.md").read_text(), page, None, None)
    assert "<!--" not in markdown
    for sweep in SWEEPS.values():
        assert fields_table(sweep.Row) in markdown
        assert all(re.search(rf"^\| `{name}` \| \S", markdown, re.MULTILINE) for name in sweep.Row.__annotations__)


def hook_module():
    from mkdocs.config import load_config

    return load_config(str(ROOT / "mkdocs.yml")).hooks["docs/_hooks/benchmarks.py"]


# ----------------------------------------------------------------------------------------------
# The contract of the sweeps, and the rules the benchmark's code keeps
# ----------------------------------------------------------------------------------------------

BENCH = ROOT / "attention" / "bench"


def test_every_sweep_keeps_the_contract_and_imports_no_other():
    for name, sweep in SWEEPS.items():
        assert isinstance(sweep, Sweep) and sweep.NAME == name
        imported = {node.module for node in ast.walk(ast.parse(Path(sweep.__file__).read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module}
        # Another sweep, never; its own parts (the decode sweep's `decode_layers`), yes.
        others = {f"attention.bench.sweeps.{other}" for other in SWEEPS if other != name}
        assert not imported & others, name


def test_no_function_of_the_benchmark_takes_more_than_six_parameters():
    many = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}" for path in BENCH.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.FunctionDef, ast.Lambda))
            and len(node.args.posonlyargs + node.args.args + node.args.kwonlyargs) > 6]
    assert not many, many


def test_the_benchmark_computes_no_attention_of_its_own():
    """Every float64 check goes through `attention.reference`: no softmax, no exponent, no score matrix here."""
    for path in BENCH.rglob("*.py"):
        code = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)]
        assert not [node.attr for node in code if node.attr in ("softmax", "log_softmax", "masked_fill")], path


# ----------------------------------------------------------------------------------------------
# Ranking honestly, and the Benchmarks page
# ----------------------------------------------------------------------------------------------

def timed(label, ms, iqr, paired):
    return dict(label=label, ms_median=ms, ms_q1=ms - iqr / 2, ms_q3=ms + iqr / 2, matmul_tflops_paired=paired,
                mode="forward", batch=1, seq_len=256, compiled=False, status="ok", correct=True, num_heads=2,
                num_kv_heads=2)


def test_ties_compare_rows_at_one_machine_speed():
    """`a` timed while the machine ran at half speed (its paired matmul too) is as fast as `b`: tied, though
    their raw IQRs are far apart; and rows apart by more than their IQRs, raw and corrected alike, are not tied."""
    a, b = timed("a", 2.0, 0.1, paired=0.5), timed("b", 1.0, 0.1, paired=1.0)
    assert report.sequence.tied(a, b) and not (a["ms_q1"] <= b["ms_q3"])
    c = timed("c", 1.5, 0.1, paired=1.0)
    assert not report.sequence.tied(c, b) and report.sequence.slower_by(c, b) == "+50%"
    d = timed("d", 1.2, 0.1, paired=0.5)  # faster than b only once its slow machine is taken into account
    entry = report.sequence.fastest({"rows": [b, c, d]})[0]
    assert entry["fastest"]["label"] == "d" and [row["label"] for row in entry["tied"]] == ["b"]
    assert entry["next"]["label"] == "c" and report.sequence.leaders(entry) == "`d` ≈ `b` (within 67%)"


def test_a_class_is_named_fastest_only_outside_the_tie():
    """The leader must be ahead by the raw and the corrected medians, each time by more than both rows' IQR: a gap
    inside the spread, or an order only the drift correction makes, is "a ≈ b"."""
    x, y, z = timed("x", 100.0, 2.0, paired=1.0), timed("y", 103.0, 2.0, paired=1.0), timed("z", 101.5, 2.0, paired=1.0)
    assert not report.sequence.tied(x, y) and report.sequence.tied(x, z) and report.sequence.tied(z, x)
    clear, close = report.sequence.fastest({"rows": [y, x]})[0], report.sequence.fastest({"rows": [y, z, x]})[0]
    assert report.sequence.leaders(clear) == "`x`" and report.sequence.fastest_cell(clear) == "`x`: 100 ms; next `y` +3%"
    assert report.sequence.leaders(close) == "`x` ≈ `z` (within 2%)" and report.sequence.fastest_cell(close).startswith(
        "`x` ≈ `z` (within 2%): 100–102 ms; next `y`")
    # Apart by more than the spreads once corrected, but in the other order by the raw medians: a tie.
    slow_machine = timed("w", 101.0, 0.1, paired=0.9)
    assert report.sequence.tied(slow_machine, timed("v", 100.0, 0.1, paired=1.0))


def test_the_recorded_within_noise_order_is_not_called_fastest():
    """The AMD float32 run's forward at B = 8: `flex` leads only after the drift correction (304 ms against
    `sdpa_causal`'s 298 by the raw medians), so the page says they are tied instead of naming `flex`."""
    run = report.load_result(report.RESULTS_DIR / "cpu-amd-epyc-2c-float32.json")
    entry = next(e for e in report.sequence.fastest(run) if (e["mode"], e["batch"], e["seq_len"], e["compiled"]) ==
                 ("forward", 8, 1024, False))
    assert entry["fastest"]["label"] == "flex" and "sdpa_causal" in [row["label"] for row in entry["tied"]]
    assert report.sequence.leaders(entry).startswith("`flex` ≈ ") and "`sdpa_causal`" in report.sequence.leaders(entry)


def test_fastest_table_orders_shapes_by_batch_then_length(result):
    lines = report.sequence.fastest_table(result).splitlines()[2:]
    assert [tuple(int(cell) for cell in line.split("|")[1:3]) for line in lines] == [(1, 8), (1, 16), (2, 16)]


def as_device(result, device_type, name, dtype=None, flags=("avx2", "fma")):
    """A copy of `result` as if recorded on another device (for page tests only, never published)."""
    other = copy.deepcopy(result)
    other["device_type"] = other["config"]["device"] = device_type
    other["provenance"]["device"] = {"type": device_type, "name": name, "cpu": "Test Host CPU", "cpu_count": 8,
                                     "torch_num_threads": 8, "host_memory_bytes": None,
                                     "cpu_flags": None if flags is None else list(flags)}
    if dtype:
        other["dtype"] = other["config"]["dtype"] = other["matmul_peak"]["dtype"] = dtype
    return other


def valid_rows(result):
    return [r for r in result["rows"] if r["status"] == "ok"]


def test_a_fresh_run_is_valid_and_older_sources_are_valid_but_stale(result):
    assert report.validate_result(result) == []
    old = copy.deepcopy(result)
    old["provenance"]["source_files"]["attention/bench/core.py"] = "f" * 64  # measured by an older core
    assert report.validate_result(old) == [] and report.is_stale(old)


@pytest.mark.parametrize("breakage, message", [
    (lambda r: r["provenance"].pop("torch"), "provenance.torch: missing"),
    (lambda r: r["provenance"]["device"].pop("name"), "provenance.device.name: missing"),
    (lambda r: r.pop("rankings"), "rankings: missing"),
    (lambda r: r.update(device_type="cuda"), "device_type: 'cuda' differs from provenance.device.type"),
    (lambda r: valid_rows(r)[0].update(tflops=valid_rows(r)[0]["tflops"] * 2), "tflops"),
    (lambda r: valid_rows(r)[0].update(ms_q1=valid_rows(r)[0]["ms_max"] * 2), "times are not positive and ordered"),
    (lambda r: valid_rows(r)[0].update(flops_attention=valid_rows(r)[0]["flops_attention"] + 1), "flops_attention"),
    (lambda r: valid_rows(r)[0].update(share_of_matmul_peak=5.0), "share_of_matmul_peak 5.0 does not match"),
    (lambda r: valid_rows(r)[0].update(share_of_paired_matmul=5.0), "share_of_paired_matmul 5.0 does not match"),
    (lambda r: valid_rows(r)[0].update(flops=valid_rows(r)[0]["flops"] + 1), "flops"),
    (lambda r: valid_rows(r)[0].pop("peak_memory_bytes"), "rows[0].peak_memory_bytes: missing"),
    (lambda r: valid_rows(r)[0].update(status="great"), "rows[0].status: 'great' is not one of ok, skipped, failed"),
    (lambda r: r["rankings"][0]["order"].reverse(), "rankings: forward, B=2, T=16 differs"),
    (lambda r: r.update(complete=False), "complete: false: the run did not finish"),
    (lambda r: r["config"].update(dtype="bfloat16"), "config.dtype: 'bfloat16' differs from dtype"),
])
def test_validator_names_what_is_wrong(result, breakage, message):
    broken = copy.deepcopy(result)
    breakage(broken)
    problems = report.validate_result(broken)
    assert any(message in problem for problem in problems), problems


def test_validate_cli_says_what_is_wrong(result, tmp_path, capsys):
    good, stale, broken, garbled = (tmp_path / f"cpu-{name}.json" for name in ("good", "stale", "broken", "bad"))
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
    assert f"{broken}: NOT valid, 1 problem(s):" in out and "times are not positive and ordered" in out
    assert f"{garbled}: NOT valid" in out and "cannot be read" in out


def slowed(result, label, factor):
    """A copy of `result` where every row of `label` took `factor` times as long, kept consistent."""
    changed = copy.deepcopy(result)
    for row in valid_rows(changed):
        if row["label"] == label:
            for key in ("ms_median", "ms_q1", "ms_q3", "ms_iqr", "ms_min", "ms_max"):
                row[key] *= factor
            for key in ("tflops", "share_of_matmul_peak", "share_of_paired_matmul"):
                row[key] /= factor
    changed["rankings"] = rank_rows(changed["rows"])
    return changed


def test_fastest_leaves_out_rows_with_fewer_kv_heads(result):
    """A grouped-query row is another model: however fast, it is not ranked against multi-head classes."""
    grouped = copy.deepcopy(result)
    extra = [dict(row, implementation="gqa", label="gqa", num_kv_heads=1, **{key: row[key] / 10 for key in (
        "ms_median", "ms_q1", "ms_q3", "ms_min", "ms_max")}) for row in result["rows"] if row["label"] == "sdpa_causal"]
    grouped["rows"] += extra
    assert extra and all(report.sequence.fewer_kv_heads(row) for row in extra)
    assert [e["fastest"]["label"] for e in report.sequence.fastest(grouped)] == [e["fastest"]["label"] for e in report.sequence.fastest(result)]
    assert "`gqa`" not in report.sequence.fastest_table(grouped)


def test_share_stability_compares_two_runs(result):
    same = report.compare.share_stability_section(result, result, ["a", "b"], ["split_heads", "sdpa_causal"])
    assert "moved by at most 0 points" in same and all(line.endswith("| 0.0 |") for line in same.splitlines()
                                                       if line.startswith("| forward"))
    slower = report.compare.share_stability_section(result, slowed(result, "split_heads", 2.0), ["a", "b"], ["split_heads"])
    row = next(line for line in slower.splitlines() if line.startswith("| forward | `split_heads`"))
    run_1, run_2 = (int(cell.strip().rstrip("%")) for cell in row.split("|")[3:5])
    assert run_2 == pytest.approx(run_1 / 2, abs=1)


def bench_page_hook(tmp_path, monkeypatch, results):
    """The real benchmarks hook under `mkdocs serve` for a project in tmp_path whose docs/results/ holds `results`
    ({relative file name: result}); returns the hook after on_pre_build, with every run's charts drawn."""
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    hook = config.hooks["docs/_hooks/benchmarks.py"]
    for name, data in results.items():
        (tmp_path / "docs" / "results" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "docs" / "results" / name).write_text(json.dumps(data))
    config.config_file_path = str(tmp_path / "mkdocs.yml")
    monkeypatch.setattr("attention.bench.source_hash", lambda: "0123456789abcdef" * 4)
    monkeypatch.delenv(hook.ENV_VAR, raising=False)
    monkeypatch.setitem(hook.state, "command", "serve")
    monkeypatch.setitem(hook.state, "runs", {})
    hook.on_pre_build(config)
    monkeypatch.setitem(hook.state, "charts", {hook.slug(folder, path): hook.chart_set(hook.slug(folder, path), data)
                                               for folder, runs in hook.state["runs"].items() for path, data in runs})
    return hook


def tab_bodies(markdown):
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
    assert re.findall(r'^    === "([^"]+)"', tabs["NVIDIA CUDA"], flags=re.MULTILINE) == [
        "NVIDIA Test GPU, float32, default profile", "NVIDIA Test GPU, bfloat16, default profile"]
    # The only run of its device type is named like any other: a tab of its own (device, dtype, profile).
    assert re.findall(r'^    === "([^"]+)"', tabs["Apple MPS"], flags=re.MULTILINE) == [
        "Apple Test Chip, float32, default profile"]
    for body, device in ((tabs["NVIDIA CUDA"], "NVIDIA Test GPU"), (tabs["Apple MPS"], "Apple Test Chip")):
        assert device in body and "| # | implementation | ms (median) |" in body and "`split_heads`" in body
        assert "What this run was measured on" in body and "??? note" in body  # the sweep's tables collapsed
    summary = hook.fastest_section()
    assert "NVIDIA Test GPU" in summary and "Apple Test Chip" in summary and "3 devices" in summary
    assert "Tied: the run cannot tell the rows apart" in (ROOT / "docs" / "benchmarks.md").read_text()


def test_devices_are_told_apart_by_cpu_model_and_flags(result, tmp_path, monkeypatch):
    """Two runs on CPUs of one name, one with AMX and one recorded before the flags were, are two devices."""
    pytest.importorskip("mkdocs")
    amx = as_device(result, "cpu", "Intel(R) Xeon(R) Processor", flags=("avx2", "avx512f", "amx_tile", "amx_bf16"))
    unknown = as_device(result, "cpu", "Intel(R) Xeon(R) Processor", "bfloat16", flags=None)
    for run in (amx, unknown):
        run["provenance"]["device"]["cpu"] = "Intel(R) Xeon(R) Processor"
    hook = bench_page_hook(tmp_path, monkeypatch, {"cpu-a-float32.json": amx, "cpu-b-bfloat16.json": unknown})
    assert "2 devices" in hook.fastest_section()
    tabs = tab_bodies(hook.benchmark_tabs())["CPU, recorded"]
    assert re.findall(r'^    === "([^"]+)"', tabs, flags=re.MULTILINE) == [
        "Xeon, AMX, float32, default profile", "Xeon, flags unknown, bfloat16, default profile"]
    assert hook.dtype_section() == "No device has recorded runs in both float32 and bfloat16 yet."


def test_serve_without_a_quick_run_shows_the_newest_recorded_cpu_run(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    newer = copy.deepcopy(result)
    newer["provenance"]["date_utc"] = "2099-01-01T00:00:00+00:00"
    hook = bench_page_hook(tmp_path, monkeypatch, {"cpu-old.json": result, "cpu-new.json": newer})
    first = tab_bodies(hook.benchmark_tabs())["CPU, this build"]
    assert first.strip().startswith(hook.NOT_MEASURED + " Shown instead: the newest recorded CPU run.")
    assert "**`docs/results/cpu-new.json`**" in first and "| # | implementation |" in first


def test_an_invalid_results_file_fails_the_build_with_the_validators_message(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    broken = copy.deepcopy(result)
    del broken["provenance"]["source_hash"]
    with pytest.raises(PluginError, match=r"cuda-broken\.json: NOT valid, 1 problem\(s\):\n  - provenance\.source_hash: missing"):
        bench_page_hook(tmp_path, monkeypatch, {"cuda-broken.json": as_device(broken, "cuda", "NVIDIA Test GPU")})


def test_linked_results_fail_the_build_unread(result, tmp_path, monkeypatch):
    """A symlinked file (here to a JSON file of credentials: the build printed its key names) and a symlinked folder
    (the glob does not enter it, so its files were shown unchecked, or the build stopped on a KeyError) are listed as
    not valid, and nothing of what they point at is read."""
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "auths.json").write_text(json.dumps({"auths": {"registry": {"auth": "c2VjcmV0"}}}))
    (elsewhere / "cpu-elsewhere-long.json").write_text(json.dumps(result))
    results_dir = tmp_path / "docs" / "results"
    results_dir.mkdir(parents=True)
    (results_dir / "cpu-auths.json").symlink_to(elsewhere / "auths.json")
    (results_dir / "long").symlink_to(elsewhere)
    with pytest.raises(PluginError) as raised:
        bench_page_hook(tmp_path, monkeypatch, {"cpu-run.json": result})
    message = str(raised.value)
    assert "docs/results/cpu-auths.json: NOT valid, 1 problem(s):\n  - cannot be read: a symbolic link, not a regular " \
           "file: refused" in message and "auths'" not in message
    assert "docs/results/long: NOT valid: a symbolic link to a folder, not read: refused" in message
    assert "cpu-run.json" not in message


def test_an_older_results_file_fails_the_build_until_migrated(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    old = dict(result, schema_version=2)
    with pytest.raises(PluginError, match=r"(?s)cpu-old\.json: NOT valid.*--migrate FILE rewrites it"):
        bench_page_hook(tmp_path, monkeypatch, {"cpu-old.json": old})


def test_paired_yardstick_alternates_with_the_rows_blocks():
    calls = []
    timing = metrics.time_callable(lambda: calls.append("row"), "cpu", metrics.Timing(0.0, 3, 0.0),
                                   paired=lambda: calls.append("matmul"))
    runs = [name for index, name in enumerate(calls) if index == 0 or calls[index - 1] != name]
    assert runs == ["row"] + ["matmul", "row"] * 3 + ["matmul"]  # one warm-up call, then alternating blocks
    assert timing["repeats"] == 3 and timing["paired_repeats"] == 4 and timing["paired_ms_median"] > 0


def test_paired_yardstick_cancels_a_drifting_machine():
    """A machine that slows down threefold while one row is timed: the row and the yardstick beside it slow down
    alike, so their ratio stays what it is on a steady machine (2); a yardstick timed before would be off."""
    import time

    start = time.perf_counter()

    def work(seconds):
        return lambda: time.sleep(seconds * (1 + 4 * (time.perf_counter() - start)))  # 1x at first, 3x after 0.5 s

    before = metrics.time_callable(work(0.004), "cpu", metrics.Timing(0.05, 3, 0.0))
    timing = metrics.time_callable(work(0.002), "cpu", metrics.Timing(0.5, 5, 0.0), paired=work(0.004))
    assert timing["paired_ms_median"] / timing["ms_median"] == pytest.approx(2, rel=0.15)
    assert before["ms_median"] / timing["ms_median"] < 1.6  # unpaired: the drift shows


def test_a_rows_rate_and_share_from_its_own_numbers():
    """`core.matmul_rates`, which the sweeps record and the validator expects: 2e12 FLOPs in 1,000 ms is 2 TFLOP/s,
    half of a 4 TFLOP/s paired matmul (the validator cannot catch a wrong formula here: it uses the same one)."""
    from attention.bench import core

    rates = core.matmul_rates({"flops": 2e12, "ms_median": 1000.0, "matmul_tflops_paired": 4.0})
    assert rates == pytest.approx({"tflops": 2.0, "share_of_paired_matmul": 0.5})


def test_work_units_of_the_yardsticks_and_the_tolerance(monkeypatch):
    """What each yardstick counts is in the units its rate claims: the matmul's FLOPs are what PyTorch's FLOP counter
    counts for the call, the read's bytes are the bytes asked for in any dtype, a copy moves twice a read's bytes,
    and a rate is work per second (not per millisecond). The correctness check allows the relative tolerance too."""
    from torch.utils.flop_counter import FlopCounterMode

    call, flops = metrics.matmul_call("cpu", torch.float32, 24)
    with FlopCounterMode(display=False) as counter:
        call()
    assert flops == counter.get_total_flops()
    for dtype in (torch.float32, torch.bfloat16):
        assert metrics.bandwidth_call("cpu", dtype, nbytes=4096)[1] == 4096
    monkeypatch.setattr(metrics, "time_callable", lambda *args, **kwargs: {"ms_median": 2.0})
    rates = metrics.bandwidth_rate("cpu", torch.float32, sizes=(8192, 4096))  # the best over the sizes: the larger read
    assert rates["read_gbps"] == pytest.approx(8192 / 2e-3 / 1e9) and rates["copy_gbps"] == pytest.approx(2 * rates["read_gbps"])
    assert core.Yardstick(call, 3 * 10**12, "matmul_tflops_paired", 1e12).rate(1500.0) == pytest.approx(2.0)
    reference = torch.linspace(-1000.0, 1000.0, 11, dtype=torch.float64)
    float32 = tolerance("cpu", "float32")  # atol 2e-5, rtol 1e-4
    assert metrics.compare_to_reference(reference * (1 + 5e-5), reference, float32)[0] is True
    assert metrics.compare_to_reference(reference + 1e-3, reference, float32)[0] is False
    assert metrics.compare_to_reference(reference * float("nan"), reference, float32) == (False, None)


def test_rows_carry_the_paired_yardstick(result):
    measured = valid_rows(result)
    assert all(r["share_of_paired_matmul"] == pytest.approx(r["tflops"] / r["matmul_tflops_paired"]) for r in measured)
    paired = result["matmul_peak"]["paired"]
    assert paired["rows"] == len(measured) and paired["lowest_tflops"] <= paired["median_tflops"] <= paired["highest_tflops"]
    assert "timed in blocks interleaved with the row's own" in report.sequence.markdown_tables(result)


def test_bfloat16_runs_on_cpu_against_its_own_yardstick_and_tolerance():
    config = Config(**SMALL | dict(dtype="bfloat16", seq_lens=(), implementations=("split_heads", "sdpa_causal")))
    run = run_benchmark(config, progress=False)
    assert run["dtype"] == "bfloat16" and run["matmul_peak"]["dtype"] == "bfloat16"
    assert report.validate_result(run) == []
    for row in run["rows"]:
        assert row["status"] == "ok" and row["correct"] is True and row["tolerance"] == tolerance("cpu", torch.bfloat16)
        assert 0 < row["max_abs_error"] <= row["tolerance"]["atol"] + row["tolerance"]["rtol"]


def test_bfloat16_section_compares_a_devices_two_dtypes(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    bf16 = slowed(as_device(result, "cpu", "Test CPU", "bfloat16"), "split_heads", 2.0)
    hook = bench_page_hook(tmp_path, monkeypatch, {"cpu-test-float32.json": as_device(result, "cpu", "Test CPU"),
                                                   "cpu-test-bfloat16.json": bf16})
    section = hook.dtype_section()
    assert "**Test Host, AVX2**" in section and "| `split_heads` |" in section and "0.50×" in section
    assert "slower: `split_heads` (0.50×)" in section and "examples/benchmark.py#bfloat16-on-a-cpu" in section


def test_add_your_device_page_is_filled_from_the_hook(result, tmp_path, monkeypatch):
    pytest.importorskip("mkdocs")
    hook = bench_page_hook(tmp_path, monkeypatch, {"cpu-test-float32.json": result})
    page = SimpleNamespace(file=SimpleNamespace(src_uri="add-your-device.md"))
    markdown = hook.on_page_markdown((ROOT / "docs" / "add-your-device.md").read_text(), page, None, None)
    assert "<!--" not in markdown
    for device, (_, title, command) in hook.DEVICES.items():
        assert f'=== "{title}"' in markdown
        assert command.replace(" --out ", " \\\n        --out ") in markdown  # inside the tab, on two lines
    assert "docs/results/cpu-test-float32.json: valid: cpu (" in markdown
    assert f"The runs recorded for this site took: {report.recorded_durations()}." in markdown


def test_cpu_flags_and_their_label(tmp_path):
    from attention.machine import cpu_features_label, cpu_flags

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
                       "flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 amx_int8\n")
    flags = cpu_flags(cpuinfo)
    assert flags == ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    assert cpu_features_label(flags) == "AMX" and cpu_features_label(["avx2", "fma", "avx512f"]) == "AVX-512"
    assert cpu_features_label(["avx2", "fma"]) == "AVX2" and cpu_features_label([]) == "no AVX2"
    assert cpu_features_label(None) == "flags unknown" and cpu_flags(tmp_path / "missing") is None
    device = {"type": "cpu", "name": "x", "cpu": "AMD EPYC 7R13 Processor", "cpu_flags": ["avx2", "fma"]}
    assert report.format.device_label(device) == "EPYC 7R13, AVX2"
    assert report.format.device_label(device | {"cpu": "Intel(R) Xeon(R) Processor", "cpu_flags": flags}) == "Xeon, AMX"
    assert report.format.device_label({"type": "cuda", "name": "NVIDIA H100 80GB HBM3"}) == "NVIDIA H100 80GB HBM3"


# ----------------------------------------------------------------------------------------------
# The quick-run page's sections and the Benchmarks page's recorded runs (issue 45)
# ----------------------------------------------------------------------------------------------

def test_the_pieces_section_reads_the_times_it_is_given():
    amd_like = {"matmul": (8.0, 25.0), "projections": (30.0, 90.0), "sdpa": (40.0, 45.0), "scores": (20.0, 40.0),
                "mask": (16.0, 10.0), "softmax": (26.0, 20.0), "weights_v": (20.0, 50.0)}
    section = report.compare.bf16_pieces_section(amd_like, 1024, "AMD EPYC", ["avx2", "fma"])
    assert "| the projections: `(B·T, C) @ (C, 3C)` | 30.0 | 90.0 | 0.33× |" in section
    assert "at 0.32x the speed of its float32 one (0.0859 against 0.268 TFLOP/s)" in section  # 2·1024³ FLOPs
    assert "pays for slower projections" in section and "1.6× (faster) (the mask)" in section
    amx_like = {piece: (fp32, fp32 / 8 if piece in ("matmul", "projections") else fp32) for piece, (fp32, _) in
                amd_like.items()}
    section = report.compare.bf16_pieces_section(amx_like, 1024, "Intel Xeon", ["amx_bf16", "amx_tile"])
    assert "8.0x faster than its float32 one" in section and "gains from faster projections" in section


def test_the_stability_section_needs_one_source_and_shows_the_classes_asked_for(result):
    slower = slowed(result, "split_heads", 2.0)
    section = report.compare.share_stability_section(result, slower, ["a.json", "b.json"], ["sdpa_causal"])
    table_rows = [line for line in section.splitlines() if line.startswith("| ") and "implementation" not in line]
    assert [row.split(" | ")[1].split(" ")[0] for row in table_rows] == ["`sdpa_causal`"] * 2  # one per mode
    assert "over all 2 classes, a class's share moved by at most" in section and "- `a.json`:" in section
    other = copy.deepcopy(slower)
    other["provenance"]["source_hash"] = "f" * 64
    with pytest.raises(ValueError, match="same sources, got a.json and b.json"):
        report.compare.share_stability_section(result, other, ["a.json", "b.json"], ["sdpa_causal"])


def test_the_long_profile_leads_with_the_longest_length_every_class_measured():
    """Its headline, batch 1 at T = 128, is the least informative shape; the page and its bar chart show T = 8192,
    the longest length where every class has a number (split_heads is skipped at 16,384)."""
    run = report.load_result(report.RESULTS_DIR / "long" / "cpu-intel-xeon-2c-float32-long.json")
    assert (run["config"]["batch"], run["config"]["seq_len"]) == (1, 128)
    assert report.sequence.page_shape(run) == (1, 8192)
    section = report.sequence.page(run, {})
    assert "**forward, float32, B=1, T=8192," in section and "B=1, T=128," not in section
    assert [ax.get_title() for ax in report.sequence.plot_bars(run).axes] == ["forward, B=1, T=8192",
                                                                     "forward + backward, B=1, T=8192"]
    default = report.load_result(report.RESULTS_DIR / "cpu-amd-epyc-2c-float32.json")
    assert report.sequence.page_shape(default) == (8, 1024)  # a headline outside the sweep stays


def test_block_sparsity_puts_the_speed_up_second_and_sets_causal_beside_is_causal():
    run = report.load_result(report.RESULTS_DIR / "long" / "cpu-intel-xeon-2c-float32-long.json")
    assert report.block_sparse.crossover_table(run).splitlines()[0].startswith("| pattern | speed-up | at T |")
    assert report.block_sparse.block_sparse_table(run, "causal").splitlines()[2].startswith("| T | speed-up |")
    sdpa = next(r for r in report.sequence.sweep_rows(run, "forward") if r["label"] == "sdpa_causal" and r["seq_len"] == 16384)
    note = report.block_sparse.causal_note(run)
    assert f"`sdpa_causal` (`is_causal=True`" in note and f"takes {report.format.number(sdpa['ms_median'])} ms at T=16384" in note


def test_decode_charts_are_small_multiples_of_one_model_each():
    """24 lines in one panel, colours shared by pairs, could not be read: a panel per model, a colour per kernel
    (the same in every panel) and a line style per batch."""
    run = report.load_result(report.RESULTS_DIR / "decode" / "cpu-amd-epyc-2c-float32-decode.json")
    models = list(dict.fromkeys(row["model"] for row in run["decode"]["rows"]))
    figure = report.decode.plot_decode(run)
    panels = [ax for ax in figure.axes if ax.get_visible()]
    assert [ax.get_title().split(" (")[0] for ax in panels] == models
    colours = {}
    for ax, model in zip(panels, models):
        kernels = {row["kernel"] for row in report.decode.decode_rows(run, model=model)}
        batches = {row["batch"] for row in report.decode.decode_rows(run, model=model)}
        assert len(ax.get_lines()) == len(kernels) * len(batches), model
        for line in ax.get_lines():
            colours.setdefault(line.get_color(), set()).add(model)
    assert len(colours) == len({row["kernel"] for row in run["decode"]["rows"]})  # one colour per kernel
    assert "one attention layer" in figure.get_suptitle() and "one attention layer" in figure.get_supylabel()


def test_the_decode_summary_fits_a_column_the_cache_per_token_in_the_label():
    run = report.load_result(report.RESULTS_DIR / "decode" / "cpu-amd-epyc-2c-float32-decode.json")
    summary = report.decode.decode_summary_table(run, contexts=[16384, 32768])
    header, _, *lines = summary.splitlines()
    assert header == "| Model (K/V heads, cache) kernel | B=1, 16,384 | B=1, 32,768 | B=8, 16,384 | B=8, 32,768 |"
    gqa = report.decode.decode_best(run, "GQA", 1, 32768)
    winners = {report.decode.decode_best(run, "GQA", b, c)["kernel"] for b in (1, 8) for c in (16384, 32768)}
    figures = f"{gqa['tokens_per_s']:,.0f} · {gqa['share_of_peak_bandwidth']:.0%}"
    if len(winners) == 1:  # one kernel fastest in the whole row: named once, in the label
        assert lines[1].startswith(f"| GQA (4 K/V, 4 KiB per token) `{gqa['kernel']}` |")
        assert lines[1].split(" | ")[2] == figures
    else:  # each cell names its own
        assert lines[1].startswith("| GQA (4 K/V, 4 KiB per token) |")
        assert lines[1].split(" | ")[2] == f"{figures} `{gqa['kernel']}`"


def test_recorded_durations_under_a_minute_are_seconds():
    """A ring run took 23 s; "Add your device" said "ring: 0 min"."""
    durations = report.recorded_durations()
    ring = durations.split("ring: ", 1)[1].split(";")[0]
    assert "23 s (" in ring and not re.search(r"\b0 min", durations)


def test_each_recorded_run_of_a_profile_is_a_tab_and_the_site_size_is_not_on_the_benchmarks_page(result, tmp_path,
                                                                                                  monkeypatch):
    pytest.importorskip("mkdocs")
    hook = bench_page_hook(tmp_path, monkeypatch, {"long/cpu-a-long.json": result,
                                                   "long/cpu-b-long.json": as_device(result, "cpu", "Other CPU")})
    section = hook.runs_section("long")
    assert sorted(re.findall(r'^=== "([^"]+)"', section, flags=re.MULTILINE)) == sorted([
        f"{report.format.device_label(result['provenance']['device'])}, float32", "Test Host, AVX2, float32"])
    assert "site-size" not in (ROOT / "docs" / "benchmarks.md").read_text()
    assert "<!-- site-size -->" in (ROOT / "docs" / "contributing.md").read_text()


@pytest.mark.parametrize("argv, says", [
    (["--seq-lens", "128,abc"], "argument --seq-lens: expected positive integers separated by commas, or 'none', "
                                "got '128,abc'"),
    (["--seq-lens", "128,0"], "argument --seq-lens: expected positive integers separated by commas, or 'none', "
                              "got '128,0'"),
    (["--batch", "0"], "argument --batch: expected a positive integer, got '0'"),
    (["--heads", "-4"], "argument --heads: expected a positive integer, got '-4'"),
    (["--d-model", "7.5"], "argument --d-model: expected a positive integer, got '7.5'"),
])
def test_the_command_line_refuses_bad_sizes_naming_the_option(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_the_command_line_reads_sweep_lengths_with_commas_or_spaces_or_none():
    assert build_parser().parse_args(["--seq-lens", "128, 256,512"]).seq_lens == (128, 256, 512)
    assert build_parser().parse_args(["--seq-lens", "128 256"]).seq_lens == (128, 256)
    assert build_parser().parse_args(["--seq-lens", "None"]).seq_lens == ()
