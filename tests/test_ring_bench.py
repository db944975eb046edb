"""The ring sweep of the benchmark (`attention/bench/sweeps/ring.py`): one small run on 2 processes, reused.

The run launches 2 local processes (gloo) on a short sequence: both rows (forward, forward + backward) must be
checked correct against the float64 reference, count exactly the bytes the ring should send, and pass the
validator; tampering with the bytes, an unknown field or a hostile string must be refused, naming the field.
"""

import copy

import pytest
import torch
from matplotlib.figure import Figure

from attention import report
from attention.bench import SWEEPS, core, profiles, results
from attention.bench.sweeps import ring
from attention.distributed import check
from attention.reference import reference_kernel

TINY_RING = dict(world_sizes=(2,), batch=1, num_heads=4, num_kv_heads=2, seq_len=48, head_dim=8, repeats=2,
                 matmul_size=64, min_run_time=0.01)


@pytest.fixture(scope="module")
def ring_result():
    return core.run(profiles.plan("ring", TINY_RING), "cpu", progress=False)


def test_a_small_ring_run_gives_valid_correct_rows(ring_result):
    rows = ring_result["ring"]["rows"]
    assert [(row["world_size"], row["mode"]) for row in rows] == [(2, "forward"), (2, "forward_backward")]
    assert all(list(row) == list(ring.Row.__annotations__) for row in rows)
    assert all(row["status"] == "ok" and row["correct"] is True for row in rows), [row["reason"] for row in rows]
    assert ring_result["complete"] is True and results.validate(ring_result) == []
    assert set(ring_result) == {"schema_version", "complete", "profile", "device_type", "dtype", "provenance", "ring"}
    block = 2 * 1 * 2 * (48 // 2) * 8 * 4  # keys and values of 2 K/V heads, 24 positions, float32
    forward, both = rows
    assert forward["kv_block_bytes"] == block and forward["rank_sent_bytes"] == [[block], [block]]
    assert both["rank_sent_bytes"] == [[block, block, block, block]] * 2  # K/V, then K/V and dK/dV, then dK/dV home
    assert all(row["sent_as_expected"] is True and len(row["rank_peak_memory_bytes"]) == 2 for row in rows)
    assert all(row["peak_memory_bytes"] > 0 and row["ms_median"] > 0 and row["tflops"] > 0 for row in rows)


@pytest.mark.parametrize("field, change, named", [
    ("expected_sent_bytes", lambda row: row["expected_sent_bytes"].append(4), "expected_sent_bytes"),
    ("kv_block_bytes", lambda row: row.update(kv_block_bytes=row["kv_block_bytes"] // 2), "kv_block_bytes"),
    ("rank_sent_bytes", lambda row: row["rank_sent_bytes"][1].__setitem__(0, 8), "sent_as_expected"),
    ("rank_sent_bytes", lambda row: row["rank_sent_bytes"].pop(), "rank_sent_bytes"),
    ("peak_memory_bytes", lambda row: row.update(peak_memory_bytes=row["peak_memory_bytes"] + 1), "peak_memory_bytes"),
    ("tflops", lambda row: row.update(tflops=row["tflops"] * 2), "tflops"),
    ("local_len", lambda row: row.update(local_len=row["local_len"] + 2), "local_len"),
    ("world_size", lambda row: row.update(world_size=4), "(P=4, forward): world_size 4 is not one of world_sizes"),
])
def test_the_validator_refuses_wrong_bytes_and_derived_numbers(ring_result, field, change, named):
    tampered = copy.deepcopy(ring_result)
    change(tampered["ring"]["rows"][0])
    assert any(p.startswith("ring.rows[0]") and named in p for p in results.validate(tampered)), field


def test_bytes_that_differ_from_the_ring_are_kept_and_shown_when_said_so(ring_result):
    measured = copy.deepcopy(ring_result)
    measured["ring"]["rows"][0]["rank_sent_bytes"][1] = [8]
    measured["ring"]["rows"][0]["sent_as_expected"] = False
    assert results.validate(measured) == []  # a measurement, not a broken file: the table says NO
    assert report.ring.ring_table(measured).rstrip().endswith("| NO |")


def test_the_validator_refuses_unknown_fields_and_hostile_strings(ring_result):
    for where, holder, key, value in [
        ("ring.rows[1].'extra': unknown field", lambda r: r["ring"]["rows"][1], "extra", 1),
        ("ring.'note': unknown field", lambda r: r["ring"], "note", "x"),
        ("ring.layout:", lambda r: r["ring"], "layout", "<script>alert(1)</script>"),
        ("ring.rows[0].reason:", lambda r: r["ring"]["rows"][0], "reason", '<img src=x onerror="alert(1)">'),
        ("ring.rows[0].mode:", lambda r: r["ring"]["rows"][0], "mode", "[click](javascript:alert(1))"),
        ("ring.rows[0].rank_sent_bytes[0][0]:", lambda r: r["ring"]["rows"][0], "rank_sent_bytes", [[-1], [1]]),
    ]:
        tampered = copy.deepcopy(ring_result)
        holder(tampered)[key] = value
        assert any(p.startswith(where) for p in results.validate(tampered)), (where, results.validate(tampered)[:3])


def test_tables_chart_and_page_show_the_run(ring_result):
    text = report.ring.tables(ring_result)
    assert "| 2 | 24 |" in text and text.count("yes") == 1 and "WRONG" not in text
    assert "at P = 2, 1 forward step of 3 KiB (one key/value block) per process, exactly the computed bytes" in text
    (figure, alt), = report.ring.charts(ring_result).values()
    assert isinstance(figure, Figure) and sum(len(ax.lines) for ax in figure.axes) == 4 and alt
    page = report.ring.page(results.escaped(ring_result), {"ring": "![chart](ring.png)"})
    assert "![chart](ring.png)" in page and "T = 48" in page


def test_ring_config_names_bad_values():
    with pytest.raises(ValueError, match="the ring sweep runs local CPU processes over gloo, got device='cuda'"):
        ring.Config().resolve("cuda")
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads, got num_heads=6, num_kv_heads=4"):
        ring.Config(num_heads=6, num_kv_heads=4).resolve("cpu")
    with pytest.raises(ValueError, match=r"world_sizes\[0\]: 0 is outside"):
        ring.Config(world_sizes=(0, 2)).resolve("cpu")
    with pytest.raises(ValueError, match="layout: 'striped' is not one of contiguous, zigzag"):
        ring.Config(layout="striped").resolve("cpu")
    assert profiles.plan("ring", {"min_repeats": 3, "seq_len": 512}).sweeps[0][1].repeats == 3


@pytest.mark.parametrize("causal", [True, False])
def test_the_reference_one_query_head_at_a_time_is_the_whole_reference(causal):
    case = dict(batch=2, num_heads=6, num_kv_heads=2, seq_len=13, head_dim=4, causal=causal, dtype="float32", seed=5)
    q, k, v, grad_out = (t.double().requires_grad_(True) for t in check.case_inputs(case))
    out, _ = reference_kernel(q, k, v, mask=torch.ones(13, 13, dtype=torch.bool).tril() if causal else None)
    out.backward(grad_out)
    expected = dict(zip(check.RESULTS, (out.detach(), q.grad, k.grad, v.grad)))
    for name, tensor in check.reference_results(case).items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-12, atol=1e-12)
