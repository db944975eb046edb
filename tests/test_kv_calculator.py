"""The KV-cache calculator's data (`attention.report.kv_calculator`): the terms read off `layer_cache_bytes` give
`kv_cache_bytes` for every published model at any context, batch and element type; the page's data block cannot be
closed by what it holds. tests/test_site.py checks the page's JavaScript against `kv_cache_bytes` in a browser."""

import json

import pytest
import torch

from attention.models.published import kv_cache_bytes, published_entries
from attention.report import kv_calculator


@pytest.fixture(scope="module")
def data():
    return kv_calculator.calculator_data()


def test_the_terms_give_kv_cache_bytes_for_every_model(data):
    assert [model["name"] for model in data["models"]] == list(published_entries())
    for model in data["models"]:
        for context in (1, 127, 128, 4096, 4097, 131072, 2**20 + 3):
            for dtype_name, itemsize in data["dtypes"].items():
                expected = kv_cache_bytes(model["name"], context, batch_size=3, dtype=kv_calculator.DTYPES[dtype_name])
                assert kv_calculator.terms_bytes(model["groups"], context, 3, itemsize) == expected, (model["name"], context)


def test_groups_name_each_kind_of_layer(data):
    groups = {model["name"]: model["groups"] for model in data["models"]}
    assert groups["DeepSeek-V3"] == [{"kind": "full_attention", "per_position": 576, "window": None, "per_entry": 0,
                                      "rate": None, "state": 0, "fixed": 0, "count": 61}]
    assert groups["DeepSeek-V3.2"][0]["per_position"] == 576 + 128 and groups["DeepSeek-V3.2"][0]["kind"] == "indexed_attention"
    qwen3_next = groups["Qwen3-Next 80B-A3B"]
    linear = next(group for group in qwen3_next if group["kind"] == "linear_attention")
    assert (linear["count"], linear["per_position"], linear["state"]) == (36, 0, 32 * 128 * 128)
    assert any(group["window"] == 128 for group in groups["gpt-oss-20b"])
    lines = {model["name"]: model["lines"] for model in data["models"]}
    assert lines["DeepSeek-V3"] == ["61 full_attention layers: 576 values per position"]
    assert "36 linear_attention layers: a state of 524,288 values (float32 at least); 24,576 values whatever the " \
           "context (the convolution's last inputs)" in lines["Qwen3-Next 80B-A3B"]
    # DeepSeek-V4-Flash: a window of 128 K=V vectors of 512 on every layer; CSA adds an entry of 512 + 128 (the
    # indexer's key) per 4 positions, HCA one of 512 per 128; Gemma 4 E2B's last 20 layers keep nothing
    v4 = {group["kind"]: group for group in groups["DeepSeek-V4-Flash"]}
    assert (v4["compressed_sparse_attention"]["per_entry"], v4["compressed_sparse_attention"]["rate"]) == (640, 4)
    assert (v4["heavily_compressed_attention"]["per_entry"], v4["heavily_compressed_attention"]["rate"]) == (512, 128)
    assert all((group["per_position"], group["window"]) == (512, 128) for group in v4.values())
    assert "16 sliding_attention (shared K/V) layers: no cache of their own (they read an earlier layer's)" in \
        lines["Gemma 4 E2B"]


def test_the_data_block_is_json_that_cannot_close_its_script(monkeypatch):
    monkeypatch.setattr(kv_calculator, "calculator_data", lambda: {"models": [{"name": "</script><b>x</b>"}]})
    block = kv_calculator.data_script()
    assert block.count("</script>") == 1 and block.endswith("</script>")
    inner = block[len('<script type="application/json" id="kv-calculator-data">'):-len("</script>")]
    assert json.loads(inner) == {"models": [{"name": "</script><b>x</b>"}]}


def test_the_table_lists_every_model_at_the_common_contexts():
    table = kv_calculator.contexts_table()
    assert table.count("\n") == len(published_entries()) + 1
    gib = kv_cache_bytes("Llama 3.1 8B", 131072, dtype=torch.bfloat16) / 2**30
    assert f"| [Llama 3.1 8B](https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json) | " in table
    assert f"{gib:.2f}" in table.splitlines()[2]
