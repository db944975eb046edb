"""The decode kernel and the decode sweep of the benchmark (`attention/bench/sweeps/decode.py`).

The sweep runs here at toy sizes (8 heads of 16, contexts of 64 and 128): every row must be checked correct
against its float64 reference and pass the validator, which recomputes the derived numbers; tampering with
one must be caught. A model added in a test (a contract-only cache) shows how a family adds its layers.
"""

import copy
import types

import pytest
import torch
from bench_tables import BEFORE, TINY_DECODE, quick_yardsticks, structure
from helpers import tolerance
from matplotlib.figure import Figure

from attention import report
from attention.bench import core, metrics, profiles
from attention.bench.__main__ import build_parser, config_from_args, main
from attention.schema import config_problems
from attention.bench.sweeps import decode, decode_layers
from attention.causal.gqa import GroupedQueryAttention
from attention.decoding import AUTO_MATMUL_MAX_TOKENS, DECODE_KERNELS, grouped_decode_attention, per_head_matmul
from attention.reference import reference_kernel


def run_decode(**config):
    return core.run(profiles.plan("decode", TINY_DECODE | config), "cpu", progress=False)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("queries", [1, 5])
def test_grouped_decode_attention_matches_the_reference(num_heads, num_kv_heads, queries):
    B, S, D = 2, 37, 16
    q = torch.randn(B, num_heads, queries, D)
    k, v = torch.randn(B, num_kv_heads, S, D), torch.randn(B, num_kv_heads, S, D)
    query_pos = torch.arange(S - queries, S)
    mask = query_pos[:, None] >= torch.arange(S)[None, :]  # (T, S) lower-right causal
    for m in (None, mask):
        out = grouped_decode_attention(q, k, v, m)
        assert out.shape == (B, num_heads, queries, D)
        torch.testing.assert_close(out.double(), reference_kernel(q, k, v, m)[0], **tolerance("cpu", torch.float32))


def test_grouped_decode_attention_gives_zeros_for_a_query_with_no_key():
    q, k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1] = False
    out = grouped_decode_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all()
    torch.testing.assert_close(out.double(), reference_kernel(q, k, v, mask)[0], **tolerance("cpu", torch.float32))


@pytest.mark.parametrize("num_kv_heads", [8, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_a_bfloat16_step_over_a_cache_slice_matches_the_reference_and_copies_nothing(num_kv_heads):
    """bfloat16 on the CPU, over a cache filled to half its capacity (keys and values a slice whose heads lie
    `capacity` rows apart, as a `KVCache` returns them): the step matches the float64 reference of the same bfloat16
    values, and allocates less than the keys hold: a 2-D matmul per head takes each head's block as it lies (the
    batched bfloat16 matmul copied the whole slice, 1.1 to 1.8 times the keys' bytes here, and ran several times
    slower)."""
    B, H, S, D, capacity = 2, 8, 2048, 64, 4097
    buffers = torch.randn(2, B, num_kv_heads, capacity, D).to(torch.bfloat16)  # (2, B, H_kv, capacity, D): k, v
    k, v = buffers[0, :, :, :S], buffers[1, :, :, :S]  # (B, H_kv, S, D) each, heads `capacity` rows apart
    q = torch.randn(B, H, 1, D).to(torch.bfloat16)
    out = grouped_decode_attention(q, k, v)
    expected = reference_kernel(q.double(), k.double(), v.double())[0]  # (B, H, 1, D)
    torch.testing.assert_close(out.double(), expected, **tolerance("cpu", torch.bfloat16))
    peak = metrics.profile_call(lambda: grouped_decode_attention(q, k, v), torch.device("cpu"))["cpu_tensor_peak_bytes"]
    assert peak is not None and peak < k.nbytes, f"a step allocated {peak:,} bytes, the keys hold {k.nbytes:,}"
    # How: each sequence's and K/V head's block in a 2-D matmul, never a batched matmul over the slice (which on some
    # builds copies nothing the profiler sees, yet runs a slow kernel).
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiled:
        grouped_decode_attention(q, k, v)
    over_cache = [event.name for event in profiled.events() if event.name in ("aten::mm", "aten::bmm", "aten::baddbmm")
                  and any(S in shape for shape in event.input_shapes if shape)]
    assert over_cache == ["aten::mm"] * (2 * B * num_kv_heads), over_cache  # scores and weighted values, per block


def test_per_head_matmul_in_bfloat16_is_the_batched_product_and_keeps_its_gradients():
    a = torch.randn(2, 3, 5, 16, dtype=torch.float64).to(torch.bfloat16).requires_grad_(True)
    b = torch.randn(2, 3, 40, 7, dtype=torch.float64).to(torch.bfloat16)[:, :, :16].requires_grad_(True)  # a slice
    grad_out = torch.randn(2, 3, 5, 7).to(torch.bfloat16)
    out = per_head_matmul(a, b)
    out.backward(grad_out)
    a64, b64 = (t.detach().double().requires_grad_(True) for t in (a, b))
    expected = a64 @ b64
    expected.backward(grad_out.double())
    for got, want in ((out, expected), (a.grad, a64.grad), (b.grad, b64.grad)):
        torch.testing.assert_close(got.double(), want, **tolerance("cpu", torch.bfloat16))


@pytest.mark.parametrize("decode_kernel", ["sdpa", "matmul", "auto"])
def test_every_decode_kernel_continues_the_full_forward(decode_kernel):
    module = GroupedQueryAttention(32, 32, 64, 0.0, 8, num_kv_heads=2, decode_kernel=decode_kernel).eval()
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        full = module(x)
        cache = module.new_cache(2, 20)
        steps = [module(x[:, :6], cache=cache)] + [module(x[:, t:t + 1], cache=cache) for t in range(6, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **tolerance("cpu", torch.float32))


def test_decode_kernel_is_checked():
    with pytest.raises(ValueError, match="decode_kernel must be one of .* got decode_kernel='flash'"):
        GroupedQueryAttention(32, 32, 64, 0.0, 8, decode_kernel="flash")


def test_with_tuning_off_the_auto_kernel_runs_the_grouped_matmuls_on_cpu(monkeypatch):
    """`ATTENTION_TUNING=off`: `"auto"` takes the fixed rule (the grouped matmuls on CPU for a few new tokens), no
    timing (tests/test_tuning.py: the measured choice)."""
    import attention.causal.gqa as gqa

    monkeypatch.setenv("ATTENTION_TUNING", "off")

    calls = []
    original = gqa.grouped_decode_attention
    monkeypatch.setattr(gqa, "grouped_decode_attention", lambda *args: calls.append(1) or original(*args))
    module = GroupedQueryAttention(32, 32, 64, 0.0, 8, num_kv_heads=2).eval()
    with torch.no_grad():
        module(torch.randn(1, 3, 32), cache=module.new_cache(1, 8))
        assert calls == [1]
        module(torch.randn(1, 3, 32))  # no cache: SDPA
        module(torch.randn(1, AUTO_MATMUL_MAX_TOKENS + 1, 32), cache=module.new_cache(1, 64))  # a prefill: SDPA
        assert calls == [1]
        module(torch.randn(1, AUTO_MATMUL_MAX_TOKENS, 32), cache=module.new_cache(1, 64))
        assert calls == [1, 1]


def test_a_cache_is_any_object_keeping_the_contract():
    """`check_cache` asks for the `DecodingCache` contract (length, nbytes, update, rewind), not a class name."""
    module = GroupedQueryAttention(32, 32, 64, 0.0, 8, num_kv_heads=2).eval()
    with torch.no_grad(), pytest.raises(TypeError, match="cache must come from new_cache.*rewind"):
        module(torch.randn(1, 1, 32), cache=object())
    with torch.no_grad():
        module(torch.randn(1, 1, 32), cache=ContractOnly(module.new_cache(1, 8)))


@pytest.fixture(scope="module")
def decode_result():
    return run_decode(models=("MHA", "GQA", "MQA"))  # the model families' layers: tests/test_decode_models.py


def test_decode_rows_are_complete_correct_and_valid(decode_result):
    rows = decode_result["decode"]["rows"]
    assert len(rows) == 3 * 3 * 2 * 2  # models x kernels (sdpa, matmul, auto) x batches x contexts
    assert {row["model"]: row["num_kv_heads"] for row in rows} == {"MHA": 8, "GQA": 1, "MQA": 1}
    assert all(list(row) == list(decode.Row.__annotations__) for row in rows)
    assert all(row["status"] == "ok" and row["correct"] is True for row in rows), [r["reason"] for r in rows]
    assert decode_result["complete"] is True and report.validate_result(decode_result) == []
    assert set(decode_result) == {"schema_version", "complete", "profile", "device_type", "dtype", "provenance",
                                  "decode"}  # no placeholder config, rows or rankings of another sweep
    assert all(row["sdpa_backends"] not in (None, ["n/a"]) for row in rows if row["kernel"] == "sdpa")
    assert all(row["sdpa_backends"] == ["n/a"] for row in rows if row["kernel"] == "matmul")
    assert decode_layers.KERNELS == (*(kernel for kernel in DECODE_KERNELS if kernel != "auto"), "auto")


def test_the_auto_rows_name_what_the_timing_chose_and_ran_it(decode_result):
    """An `auto` row names the attention its timing chose (the profiler's backends agree: SDPA's op, or none for the
    matmuls) and, at batch 1, the single-row projections; a forced kernel's row names nothing; a wrong `chose` is
    refused by the validator."""
    rows = decode_result["decode"]["rows"]
    for row in rows:
        if row["kernel"] != "auto":
            assert row["chose"] is None
            continue
        attention, *projections = row["chose"].split()
        assert attention in ("sdpa", "matmul") and (row["sdpa_backends"] == ["n/a"]) == (attention == "matmul")
        assert set(projections) <= {"linear", "row_split"} and bool(projections) == (row["batch"] == 1)
    for kernel, chose in (("sdpa", "sdpa"), ("auto", None)):
        tampered = copy.deepcopy(decode_result)
        row = next(row for row in tampered["decode"]["rows"] if row["kernel"] == kernel)
        row["chose"] = chose
        assert any("what `auto` chose, named on its rows only" in problem for problem in report.validate_result(tampered))


def test_decode_bytes_and_flops_follow_from_the_shapes(decode_result):
    for row in decode_result["decode"]["rows"]:
        assert row["cache_bytes_per_token"] == 2 * row["num_kv_heads"] * row["head_dim"] * 4  # keys and values, fp32
        d_model, kv = row["num_heads"] * row["head_dim"], row["num_kv_heads"] * row["head_dim"]
        parameters = d_model * d_model * 2 + d_model + 2 * kv * d_model  # query, out (+ bias), key, value
        assert row["weight_bytes"] == parameters * 4 and row["positions_read"] == row["context"] + 1
        assert row["cache_bytes_read"] == row["batch"] * (row["context"] + 1) * row["cache_bytes_per_token"]
        assert row["flops"] == 2 * row["batch"] * parameters + 4 * row["batch"] * 8 * (row["context"] + 1) * 16


def test_the_decode_profile_makes_the_tables_it_made_before(decode_result):
    before = BEFORE["decode"]
    forced = copy.deepcopy(decode_result)  # the tables of the forced kernels, as before; `auto` rows came later
    forced["decode"]["rows"] = [row for row in forced["decode"]["rows"] if row["kernel"] != "auto"]
    assert structure(report.decode.decode_table(forced, 1)) == before["decode_table_1"]
    assert structure(report.decode.decode_table(forced, 2)) == before["decode_table_2"]
    assert {line.split(" | ")[1] for line in structure(report.decode.decode_table(decode_result, 1))[0]["rows"]} == {
        "`auto`", "`matmul`", "`sdpa`"}
    # Issue 45 made the summary fit a column: a row per model (K/V heads and cache per token in its label), a column per
    # batch size and context, where it had a row per batch and model.
    summary = report.decode.decode_summary_table(decode_result).splitlines()
    (batches, models), contexts = ({row.split(" | ")[i] for row in before["decode_summary_table"][0]["rows"]}
                                   for i in (0, 1)), before["decode_summary_table"][0]["header"][4:]
    assert sorted(line.split(" | ")[0].lstrip("| ").split(" (")[0] for line in summary[2:]) == sorted(models)
    assert summary[0].count("| B=") == len(batches) * len(contexts)


@pytest.mark.parametrize("field", ["tokens_per_s", "gbps", "share_of_paired_bandwidth", "share_of_peak_bandwidth",
                                   "bytes_read", "tflops",
                                   "share_of_matmul_peak", "flops", "cache_bytes_read"])
def test_the_validator_recomputes_each_derived_number(decode_result, field):
    tampered = copy.deepcopy(decode_result)
    tampered["decode"]["rows"][3][field] = int(tampered["decode"]["rows"][3][field] * 1.5)
    assert any(f"decode.rows[3]" in p and field in p for p in report.validate_result(tampered))


def test_decode_tables_and_figures_show_every_measurement(decode_result):
    assert report.decode.decode_table(decode_result, 2).count(" · ") == 3 * 3 * 2  # tokens/s · share, per model, kernel, context
    summary = report.decode.decode_summary_table(decode_result)
    assert summary.count(" · ") == 2 * 3 * 2 and "KiB" in summary
    for metric in ("tokens_per_s", "share_of_peak_bandwidth", "share_of_paired_bandwidth"):
        fig = report.decode.plot_decode(decode_result, metric)
        assert isinstance(fig, Figure) and sum(len(ax.lines) for ax in fig.axes) == 3 * 3 * 2
    assert "Bandwidth ceiling of this run" in report.decode.tables(decode_result)


def test_the_summary_shows_a_cache_of_less_than_a_kibibyte_per_token(decode_result):
    """bfloat16 MQA caches 512 bytes per token and MLA 1,152: shown as 0.5 and 1.125 KiB, not rounded to 0 and 1."""
    sized = copy.deepcopy(decode_result)
    rows = sized["decode"]["rows"]
    models = list(dict.fromkeys(row["model"] for row in rows))
    for row in rows:
        row["cache_bytes_per_token"] = {models[0]: 512, models[1]: 1152}.get(row["model"], row["cache_bytes_per_token"])
    labels = [line.split("|")[1].strip() for line in report.decode.decode_summary_table(sized).splitlines()[2:]]
    assert ", 0.5 KiB per token)" in labels[0] and ", 1.125 KiB per token)" in labels[1]


def test_the_bandwidth_ceiling_is_the_best_read_or_copy_past_the_last_level_cache(decode_result):
    """The peak is the best sample of the run (a read or a copy, at sizes past the cache); each row's share of it is
    recomputed by the validator, and a peak that is not the samples' best is refused. A run recorded before the peak
    was measured (no `peak_gbps`, no row share) still validates and shows the share against the paired read."""
    section = decode_result["decode"]
    bandwidth = section["bandwidth"]
    assert bandwidth["peak_gbps"] == max(max(s["read_gbps"], s["copy_gbps"]) for s in bandwidth["samples"])
    assert section["ceiling_bytes"] == [2**22, 2**23]
    assert all(row["share_of_peak_bandwidth"] == pytest.approx(row["gbps"] / bandwidth["peak_gbps"])
               and row["share_of_peak_bandwidth"] <= 1 for row in section["rows"])
    assert report.decode.shown_share(decode_result) == "share_of_peak_bandwidth"
    tampered = copy.deepcopy(decode_result)
    tampered["decode"]["bandwidth"]["peak_gbps"] *= 1.5
    assert any("peak_gbps" in problem for problem in report.validate_result(tampered))
    older = copy.deepcopy(decode_result)
    del older["decode"]["bandwidth"]["peak_gbps"], older["decode"]["bandwidth"]["last_level_cache_bytes"]
    del older["decode"]["ceiling_bytes"]
    for row in older["decode"]["rows"]:
        del row["share_of_peak_bandwidth"]
    assert report.validate_result(older) == [] and report.decode.shown_share(older) == "share_of_paired_bandwidth"
    assert "Read bandwidth" in report.decode.tables(older) and "ceiling" not in report.decode.tables(older)
    for cache, sizes in ((None, (2**27, 2**28, 2**29)), (32 * 2**20, (2**27, 2**28, 2**29)),
                         (105 * 2**20, (2**29, 2**30, 2**31))):
        assert metrics.ceiling_sizes(cache) == sizes and sizes[0] >= 4 * (cache or 0)


def test_a_cache_past_the_memory_budget_is_skipped_with_the_reason():
    rows = run_decode(memory_budget_bytes=10_000, models=("MQA",), batches=(2,))["decode"]["rows"]
    assert rows and all(row["status"] == "skipped" and "exceeds the memory budget" in row["reason"] for row in rows)


# A CPU whose last-level cache sysfs reports at 480 MiB (a VM's): the ceiling's reads were 2, 4 and 8 GiB, past the
# config's rule, and the decode profile could not start. Tests that resolve the decode config fake it, so they test
# the same sizes on every host.
LARGE_CACHE = 480 * 2**20


@pytest.mark.parametrize("cache", [8 * 2**20, 32 * 2**20, LARGE_CACHE, 4 * 2**30])
@pytest.mark.parametrize("available", [2**30, 64 * 2**30], ids=["1GiB", "64GiB"])
def test_the_ceilings_reads_fit_the_rule_and_the_memory_whatever_the_cache(monkeypatch, cache, available):
    """On a host of `available` memory whose last-level cache reads `cache`: the decode profile resolves, its config
    keeps every rule, and each read of the ceiling is at most 2 GiB and a quarter of the memory budget (three tensors of
    that size live at once), past four times the cache where those allow it."""
    monkeypatch.setattr(metrics, "last_level_cache_bytes", lambda device: cache)
    monkeypatch.setattr(core, "meminfo_bytes", lambda key: available)
    plan = config_from_args(build_parser().parse_args(["--profile", "decode", "--device", "cpu"]))
    config = plan.sweeps[0][1].resolve(torch.device("cpu"))
    largest = min(2**31, config.memory_budget_bytes // 4)
    assert config.memory_budget_bytes == available * 3 // 4 and config_problems(config) == []
    assert config.ceiling_bytes and all(0 < size <= largest for size in config.ceiling_bytes)
    assert list(config.ceiling_bytes) == sorted(set(config.ceiling_bytes))  # distinct, ascending
    assert config.ceiling_bytes[0] >= min(4 * cache, largest)


def test_decode_config_names_bad_values(monkeypatch):
    monkeypatch.setattr(metrics, "last_level_cache_bytes", lambda device: LARGE_CACHE)
    resolve = lambda **fields: decode.Config(**fields).resolve("cpu")  # noqa: E731
    with pytest.raises(ValueError, match=r"models\[1\]: 'Mamba' is not one of MHA, GQA, MQA, Llama-3"):
        resolve(models=("GQA", "Mamba"))
    with pytest.raises(ValueError, match="models: 'MLA' runs none of the kernels \\['sdpa'\\] \\(it runs absorbed, naive\\)"):
        resolve(models=("GQA", "MLA"), kernels=("sdpa",))
    with pytest.raises(ValueError, match="kernels: 'flash' is run by none of the models"):
        resolve(kernels=("flash",))
    with pytest.raises(ValueError, match=r"contexts\[0\]: 0 is outside"):
        resolve(contexts=(0,))
    with pytest.raises(ValueError, match="num_heads must be divisible by 8 for 8:1 GQA"):
        resolve(num_heads=12)


def test_the_command_line_runs_the_decode_profile(tmp_path, capsys):
    out = tmp_path / "cpu-decode.json"
    with quick_yardsticks():  # every model: the family layers and MLA too (at 8 heads of 128)
        assert main(["--profile", "decode", "--device", "cpu", "--heads", "8", "--seq-lens", "64", "--batch", "1",
                     "--min-run-time", "0.02", "--repeats", "2", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tok/s" in printed and "Bandwidth ceiling of this run" in printed
    assert report.check_file(out)["problems"] == [] and main(["--validate", str(out)]) == 0


class ContractOnly:
    """A KV cache seen only through the `DecodingCache` contract: anything else it is asked for fails, so a sweep
    that wrote `cache.length` or read `cache.keys` would fail here."""

    def __init__(self, cache):
        object.__setattr__(self, "_cache", cache)

    length = property(lambda self: self._cache.length)
    nbytes = property(lambda self: self._cache.nbytes)

    def update(self, *new):
        return self._cache.update(*new)

    def rewind(self, length):
        self._cache.rewind(length)

    def __setattr__(self, name, value):
        raise AttributeError(f"the benchmark set cache.{name}")


def test_a_model_is_one_record_and_the_sweep_uses_only_the_cache_contract(monkeypatch):
    """A toy kind of layer: one `Layer` record in `LAYERS` gives it rows beside MHA/GQA/MQA, checked against its
    own float64 reference, through a cache that keeps only the contract."""
    grouped = decode_layers.grouped(2)
    checks = []

    def build(config, kernel):
        module, hidden = grouped.build(config, kernel)
        module.new_cache = lambda batch, capacity, make=module.new_cache: ContractOnly(make(batch, capacity))
        return module, hidden

    def reference(config, module, x0, cached, context):
        checks.append(context)
        return grouped.reference(config, module, x0, cached, context)

    monkeypatch.setitem(decode.LAYERS, "toy", decode_layers.Layer(("matmul",), build, grouped.entries, reference,
                                                           positions_read=lambda context: context + 1))
    with quick_yardsticks():
        result = run_decode(models=("toy", "MQA"), batches=(1,), kernels=("matmul",))
    rows = result["decode"]["rows"]
    assert [(r["model"], r["context"]) for r in rows] == [("toy", 64), ("toy", 128), ("MQA", 64), ("MQA", 128)]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows) and checks == [64, 128]
    assert report.validate_result(result) == []
    wrong = decode_layers.Layer(("matmul",), build, grouped.entries, lambda *args: grouped.reference(*args) + 1)
    monkeypatch.setitem(decode.LAYERS, "toy", wrong)
    with quick_yardsticks():
        rows = run_decode(models=("toy",), batches=(1,), contexts=(64,), kernels=("matmul",))["decode"]["rows"]
    assert rows[0]["correct"] is False and rows[0]["reason"] == "output differs from the float64 reference"


def test_auto_rows_are_timed_in_turn_with_the_forced_kernels_and_validated(decode_result):
    """Every `auto` row holds its median beside the fastest forced kernel's, timed in turn; forced rows hold none;
    the validator recomputes the ratio and refuses a kernel the model does not force."""
    rows = decode_result["decode"]["rows"]
    for row in rows:
        if row["kernel"] != "auto":
            assert all(row[name] is None for name in decode.IN_TURN)
            continue
        assert row["fastest_forced"] in ("sdpa", "matmul") and row["auto_ms_in_turn"] > 0
        assert row["auto_over_fastest"] == pytest.approx(row["auto_ms_in_turn"] / row["fastest_forced_ms_in_turn"])
    for change, message in [({"auto_over_fastest": 7.0}, "auto_over_fastest 7.0 does not match"),
                            ({"fastest_forced": "auto"}, "fastest_forced 'auto' is not one of the model's forced"),
                            ({"fastest_forced": None}, "set on `auto` rows only, and all of them there")]:
        broken = copy.deepcopy(decode_result)
        next(row for row in broken["decode"]["rows"] if row["kernel"] == "auto").update(change)
        assert any(message in problem for problem in report.validate_result(broken)), change
    broken = copy.deepcopy(decode_result)
    broken["decode"]["rows"][0]["auto_over_fastest"] = 1.0  # a forced row
    assert any("set on `auto` rows only" in problem for problem in report.validate_result(broken))


def test_against_forced_times_each_kernel_in_turn_and_restores_auto(monkeypatch):
    """The rounds alternate `auto` and each forced kernel through `module.decode_kernel`; the medians are per kernel;
    the module is left on `auto`, even when a call raises."""
    module, order = types.SimpleNamespace(decode_kernel="auto"), []
    ms = {"auto": 2.0, "sdpa": 3.0, "matmul": 1.9}
    monkeypatch.setattr(decode, "timed_call", lambda call: call() or ms[module.decode_kernel] / 1e3)
    config = types.SimpleNamespace(min_repeats=1, min_run_time=0.0)
    fields = decode.against_forced(lambda: order.append(module.decode_kernel), module, ["sdpa", "matmul"], config)
    assert fields == dict(auto_ms_in_turn=pytest.approx(2.0), fastest_forced="matmul",
                          fastest_forced_ms_in_turn=pytest.approx(1.9), auto_over_fastest=pytest.approx(2.0 / 1.9))
    names = ["auto", "sdpa", "matmul"]  # the untimed round, then each round starting one kernel later
    assert order == names + [name for turn in range(decode.IN_TURN_ROUNDS) for name in names[turn % 3:] + names[:turn % 3]]
    assert module.decode_kernel == "auto"

    def fails():
        if module.decode_kernel == "matmul":
            raise RuntimeError("out of memory")
    with pytest.raises(RuntimeError, match="out of memory"):
        decode.against_forced(fails, module, ["sdpa", "matmul"], config)
    assert module.decode_kernel == "auto"


def test_a_ratio_past_the_goal_is_timed_in_turn_again_and_every_earlier_ratio_kept(monkeypatch):
    """`in_turn` times again while the ratio is past the goal, at most `IN_TURN_ATTEMPTS` in all, and keeps the
    earlier ratios; one within the goal is timed once; the validator refuses an earlier ratio within the goal."""
    ratios = iter([1.6, 1.02, 1.9, 1.8, 1.7])
    def against(step, module, forced, config):
        ratio = next(ratios)
        return dict(auto_ms_in_turn=ratio, fastest_forced="matmul", fastest_forced_ms_in_turn=1.0, auto_over_fastest=ratio)
    monkeypatch.setattr(decode, "against_forced", against)
    fields = decode.in_turn(None, None, ["matmul"], None)
    assert fields["auto_over_fastest"] == 1.02 and fields["in_turn_earlier"] == [1.6]
    fields = decode.in_turn(None, None, ["matmul"], None)  # a wrong choice stays past the goal: kept as it is
    assert fields["auto_over_fastest"] == 1.7 and fields["in_turn_earlier"] == [1.9, 1.8]
    assert decode.IN_TURN_ATTEMPTS == 3
    ratios = iter([1.01])
    assert decode.in_turn(None, None, ["matmul"], None)["in_turn_earlier"] == []


def test_the_validator_and_the_sentence_read_the_earlier_ratios(decode_result):
    timed = copy.deepcopy(decode_result)
    for row in report.decode.decode_rows(timed, kernel="auto"):
        row.update(auto_ms_in_turn=1.0, fastest_forced="matmul", fastest_forced_ms_in_turn=1.0, auto_over_fastest=1.0,
                   in_turn_earlier=[])
    assert not report.validate_result(timed)
    assert "timed in turn again" not in report.decode.auto_sentence(timed)
    first = report.decode.decode_rows(timed, kernel="auto")[0]
    first["in_turn_earlier"] = [1.64]
    assert not report.validate_result(timed)
    assert ("1 shape came out past 1.05x at first and was timed in turn again (first ratios 1.64x; 1 within 1.05x "
            "the next time)." in report.decode.auto_sentence(timed))
    first["in_turn_earlier"] = [1.01]
    assert any("in_turn_earlier [1.01]: on `auto` rows only, each earlier ratio past the goal 1.05" in problem
               for problem in report.validate_result(timed))
    first["in_turn_earlier"] = [1.2, 1.3, 1.4]
    assert any("in_turn_earlier[" not in problem and "3 items, at most 2" in problem
               for problem in report.validate_result(timed))


def test_auto_is_set_beside_the_fastest_forced_kernel_at_every_shape(decode_result):
    """The sentence counts the shapes where the default ran within 5% of the fastest forced kernel timed in turn with
    it, and names the largest ratio and what `auto` chose there; the choices read `chose` per model, batch, context."""
    contexts = decode_result["decode"]["contexts"]
    timed = copy.deepcopy(decode_result)
    for row in report.decode.decode_rows(timed, kernel="auto"):
        row.update(auto_ms_in_turn=1.0, fastest_forced="matmul", fastest_forced_ms_in_turn=1.0, auto_over_fastest=1.0)
    assert "`auto` ran within 5% of the fastest at 12 of 12 shapes;" in report.decode.auto_sentence(timed)
    gqa = next(row for row in report.decode.decode_rows(timed, kernel="auto", model="GQA", batch=2,
                                                         context=contexts[1]))
    gqa.update(chose="sdpa", auto_ms_in_turn=1.5, auto_over_fastest=1.5)
    sentence = report.decode.auto_sentence(timed)
    assert "`auto` ran within 5% of the fastest at 11 of 12 shapes;" in sentence
    assert (f"the largest ratio: 1.50x `matmul`'s time (GQA, batch 2, {contexts[1]:,} positions; `auto` chose `sdpa`, "
            "not `matmul`)" in sentence)
    gqa["chose"] = "matmul row_split"
    assert "`auto` chose `matmul`, the fastest kernel's attention)" in report.decode.auto_sentence(timed)
    assert "at 4 of 4 shapes" in report.decode.auto_sentence(timed, models=("MHA",))
    chose = copy.deepcopy(decode_result)
    for row in report.decode.decode_rows(chose, kernel="auto"):
        row["chose"] = ("matmul" if row["model"] == "MQA" or row["batch"] == 2 and row["context"] == contexts[1]
                        else "sdpa") + (" row_split" if row["batch"] == 1 else "")
    words = report.decode.choice_words(chose)
    assert words.startswith(f"MHA `sdpa` at batch 1 (every context), batch 2 ({contexts[0]:,}); `matmul` at batch 2 "
                            f"({contexts[1]:,}); GQA ")
    assert "; MQA `matmul` everywhere." in words
    assert words.endswith("One token's projections: `row_split`.")


def test_the_kv_cache_page_names_each_machines_choice_or_says_none_is_recorded(decode_result):
    stale = copy.deepcopy(decode_result)
    stale["provenance"]["source_files"] = dict.fromkeys(stale["provenance"]["source_files"], "0" * 64)
    section = report.decode.choice_section([("docs/results/decode/a.json", decode_result),
                                            ("docs/results/decode/b.json", stale)])
    first, second = section.splitlines()
    assert first.startswith(f"- **{report.format.title_suffix(decode_result)}** (`a.json`): MHA `")
    assert "within 5% of the fastest at" in first and "(`b.json`, stale)" in second
    forced = copy.deepcopy(decode_result)
    forced["decode"]["rows"] = [row for row in forced["decode"]["rows"] if row["kernel"] != "auto"]
    assert report.decode.choice_section([("a.json", forced)]).startswith("No recorded run times `auto` yet")
    assert report.decode.auto_sentence(forced) == "" and report.decode.choice_words(forced) == ""


def test_contexts_read_as_every_context_a_range_or_a_list():
    measured = [1024, 2048, 4096, 8192]
    assert report.decode.contexts_words(measured, measured) == "every context"
    assert report.decode.contexts_words([2048, 4096, 8192], measured) == "2,048 to 8,192"
    assert report.decode.contexts_words([1024, 4096], measured) == "1,024, 4,096"
    assert report.decode.contexts_words([1024, 2048], measured) == "1,024, 2,048"
