"""The sparse sweep of the benchmark (`attention/bench/sweeps/sparse.py`): DeepSeek sparse attention against dense
latent attention.

A tiny run (2 query heads, an indexer of 16 heads, enough that no two positions tie at a score of 0, top-k 8, prompts
of 24 and 40 tokens, caches of 30 and 70 positions) must give every row checked correct against float64, with FLOPs and bytes from the row's sizes; the mask form past its
length is skipped with the reason; the validator refuses a wrong number, naming the field; the report says where each
kernel wins from the rows.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from attention import report
from attention.bench import core, profiles, results
from attention.bench.sweeps import sparse

TINY = dict(num_heads=2, index_n_heads=16, top_k=8, seq_lens=(40, 24), contexts=(70, 30), mask_max_len=30,
            check_len=20, check_top_k=5, min_run_time=0.01, min_repeats=2, warmup_time=0.0, matmul_size=64)


def run_sparse(**config):
    return core.run(profiles.plan("sparse", TINY | config), "cpu", progress=False)


@pytest.fixture(scope="module")
def result():
    return run_sparse()


def test_every_part_gives_checked_valid_rows_with_their_flops(result):
    rows = result["sparse"]["rows"]
    assert [(r["part"], r["kernel"], r["seq_len"]) for r in rows] == [
        (part, kernel, T) for part, lengths in (("prefill", (24, 40)), ("decode", (30, 70)))
        for T in lengths for kernel in sparse.KERNELS]
    skipped = {(r["part"], r["kernel"], r["seq_len"]): r["reason"] for r in rows if r["status"] == "skipped"}
    assert set(skipped) == {("prefill", "mask", 40)} and skipped["prefill", "mask", 40].startswith("past mask_max_len 30")
    assert all(r["correct"] is True for r in rows if r["status"] == "ok"), [r["reason"] for r in rows]
    assert results.validate(result) == []
    by = {(r["part"], r["kernel"], r["seq_len"]): r for r in rows}
    H, Hi, Dc, Dr, Di = 2, 16, 512, 64, 128
    absorb = 2 * H * Dc * (128 + 128)  # W^UK into each query, W^UV out of it
    # a prompt of 24 with top-k 8: queries 1..8 see 1..8 positions, the other 16 keep 8
    assert by["prefill", "gather", 24]["flops"] == (2 * H * (36 + 16 * 8) * (2 * Dc + Dr) + 24 * absorb
                                                    + 2 * Hi * (24 * 25 // 2) * (Di + 1))
    # MHA mode: keys of Dn + Dr, values padded to that width; the latent decompressed at every position
    assert by["prefill", "sdpa", 24]["flops"] == 2 * H * (24 * 25 // 2) * (128 + Dr + 128 + Dr) + 24 * absorb
    assert by["decode", "sdpa", 30]["flops"] == 2 * H * 31 * (2 * Dc + Dr) + absorb  # MQA mode: over the latent
    assert by["decode", "indexer", 70]["flops"] == 2 * Hi * 71 * (Di + 1)
    assert by["decode", "absorbed", 70]["memory_bytes"] == 71 * (Dc + Dr) * 4
    assert by["decode", "gather", 70]["memory_bytes"] == 71 * Di * 4 + 8 * (Dc + Dr) * 4  # all index keys, 8 latents


def test_each_kernel_is_checked_against_the_reference_on_tokens():
    """`checked` runs the row's kernel on a layer's own inputs of a few tokens and the float64 reference on the same
    tokens: in float64 they agree to rounding, for the prompt and for the last token alike; the gather and mask forms
    are the layer's own `attend`, the indexer the positions that path keeps."""
    config = sparse.Config(**TINY).resolve("cpu")
    x = torch.randn(1, 20, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    for kernel in sparse.KERNELS:
        module = sparse.build(config, 5, "cpu", torch.float64, "mask" if kernel == "mask" else "gather")
        assert module.sparse == ("mask" if kernel == "mask" else "gather") and module.index_topk == 5
        for decoding in (False, True):
            got, expected = sparse.checked(kernel, module, x, decoding)
            assert got.shape == expected.shape == ((1, 1, 20) if kernel == "indexer" and decoding else
                                                    (1, 20, 20) if kernel == "indexer" else
                                                    (1, 1, 256) if decoding else (1, 20, 256))
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_sdpa_in_head_groups_equals_the_reference(monkeypatch):
    """With group sizes that split the 7 query heads unevenly (3 groups of 2 heads, then 1), SDPA's kernel gives what
    the float64 reference gives, for the prompt (in MHA mode, the values padded) and for the last token (in MQA mode,
    over the latent)."""
    config = sparse.Config(**TINY | dict(num_heads=7)).resolve("cpu")
    module = sparse.build(config, 5, "cpu", torch.float64)
    x = torch.randn(1, 20, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    groups, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, *args, **kwargs: groups.append(q.shape[1]) or sdpa(q, *args, **kwargs))
    # 2 heads' queries: a 20-token prompt's at the keys' width 128 + 64; one token's at the latent's 512 + 64
    for decoding, elements in ((False, 2 * 20 * (128 + 64)), (True, 2 * (512 + 64))):
        monkeypatch.setattr(sparse, "SDPA_GROUP_ELEMENTS", elements)
        groups.clear()
        got, expected = sparse.checked("sdpa", module, x, decoding)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
        assert groups == [2, 2, 2, 1]


def test_a_row_over_the_memory_budget_is_skipped_with_its_estimate():
    """The estimate grows with the prompt as the absorbed queries and dense scores do; a row past the budget is
    skipped, naming the bytes, before anything is allocated."""
    def peak(kernel, T, H=128, Hi=64, part="prefill"):
        return sparse.row_peak_bytes(dict(part=part, kernel=kernel, batch=1, num_heads=H, index_n_heads=Hi,
                                          seq_len=T), 4)

    peaks = {kernel: [peak(kernel, T) for T in (1024, 32768)] for kernel in sparse.KERNELS}
    assert peak("absorbed", 32768, part="decode") < peaks["absorbed"][0]  # one query, not 32k
    assert all(short < long for short, long in peaks.values())
    assert peaks["absorbed"][1] > 2**40 > peaks["gather"][1] > peaks["sdpa"][1] > peaks["indexer"][1]
    rows = run_sparse(kernels=("absorbed", "gather"), parts=("prefill",), seq_lens=(24,),
                      memory_budget_bytes=peak("gather", 24, H=2, Hi=16) + 1)["sparse"]["rows"]
    assert [(row["kernel"], row["status"]) for row in rows] == [("absorbed", "skipped"), ("gather", "ok")]
    assert "exceeds the memory budget" in rows[0]["reason"]


@pytest.mark.parametrize("field", ["flops", "tflops", "share_of_paired_matmul", "tokens_per_s", "memory_bytes"])
def test_the_validator_recomputes_each_derived_number(result, field):
    tampered = copy.deepcopy(result)
    index = next(i for i, row in enumerate(tampered["sparse"]["rows"])
                 if row["status"] == "ok" and row[field] is not None)
    tampered["sparse"]["rows"][index][field] *= 1.5
    problems = results.validate(tampered)
    assert any(f"sparse.rows[{index}]" in problem and field in problem for problem in problems), problems


@pytest.mark.parametrize("change,message", [
    ({"memory_bytes": 100}, "memory_bytes 100: set on decode rows only"),
    ({"kernel": "<script>"}, "sparse.rows[3].kernel:"),
])
def test_the_validator_refuses_rows_that_do_not_fit_their_part(result, change, message):
    tampered = copy.deepcopy(result)
    tampered["sparse"]["rows"][3].update(change)  # prefill, absorbed, 24
    assert any(message in problem for problem in results.validate(tampered)), results.validate(tampered)


def test_a_bad_config_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="contexts: must not be empty"):
        sparse.Config(contexts=()).resolve("cpu")
    with pytest.raises(ValueError, match="check_top_k: must be below check_len 32"):
        sparse.Config(check_top_k=64).resolve("cpu")
    with pytest.raises(ValueError, match="kernels"):
        sparse.Config(kernels=("gather", "flash")).resolve("cpu")


def test_the_sentences_say_where_each_kernel_wins_from_the_rows(result):
    """The crossovers and the indexer's share are read from the rows: rewritten times move them."""
    timed = copy.deepcopy(result)
    rows = {(r["part"], r["kernel"], r["seq_len"]): r for r in timed["sparse"]["rows"]}
    for key, ms in [(("prefill", "gather", 24), 2.0), (("prefill", "sdpa", 24), 1.0), (("prefill", "indexer", 24), 0.5),
                    (("prefill", "gather", 40), 3.0), (("prefill", "sdpa", 40), 6.0), (("prefill", "indexer", 40), 1.5),
                    (("prefill", "mask", 24), 4.0), (("prefill", "absorbed", 24), 2.5),
                    (("decode", "gather", 30), 1.0), (("decode", "absorbed", 30), 2.0), (("decode", "sdpa", 30), 0.5),
                    (("decode", "gather", 70), 1.0), (("decode", "absorbed", 70), 4.0), (("decode", "sdpa", 70), 2.0)]:
        rows[key]["ms_median"] = ms
    summary = report.sparse.summary(timed)
    assert ("DSA's gather form is faster than dense attention through SDPA (MHA mode, the latent decompressed) from "
            "40 tokens on (of 24 to 40 tokens); "
            "at 40 it takes 3.00 ms against 6.00 ms (2.00x).") in summary
    assert "the indexer and its top-k take 50% of the gather form's time at 40 tokens (25% at 24)" in summary
    assert "The mask form skips nothing: at 24 tokens it takes 1.60x the time of dense attention" in summary
    assert ("DSA's gather form is faster than dense attention on the absorbed path at every length measured (of 30 to "
            "70 cached positions)") in summary
    assert "faster than dense attention through SDPA (MQA mode, over the latent) from 70 cached positions on" in summary
    rows["prefill", "gather", 40]["ms_median"] = 7.0
    assert "faster than dense attention through SDPA (MHA mode, the latent decompressed) at no length measured" in (
        report.sparse.summary(timed))
    assert report.sparse.summary({"sparse": {"rows": []}}) == ""
    page = report.sparse.page(result, {})
    assert "Every crossover, the indexer's share, every row" in page and "(charts)" not in page
    assert set(report.sparse.charts(result)) == {"prefill", "decode"}
    section = report.sparse.sparse_section("docs/results/sparse/x.json", result)
    assert "| T (prompt) | gather ms | indexer ms | mask ms | absorbed ms | sdpa ms |" in section
    assert "| 40 | " in section and "skipped" in section and "???" not in section
