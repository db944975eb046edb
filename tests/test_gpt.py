"""The tiny GPT (attention/gpt): the shipped checkpoint, every class swapped in, cached generation, training.

* The shipped checkpoint loads and gives the validation loss its training record states.
* Every causal class that fits the checkpoint (no position encoding of its own, as many K/V heads)
  gives logits within its dtype's tolerance (tests/helpers.py) of the float64 reference model: the
  same GPT with `attention.reference.ReferenceCausalSelfAttention` in every block, run in float64.
  The classes that do not fit are refused with an error that says why.
* Random GQA, MQA, RoPE and ALiBi configurations match their float64 reference models too.
* Generation with KV caches gives the same tokens as recomputing the whole sequence.
* A checkpoint of the wrong shape is refused with an error naming each mismatched key.
* A short run of the training script lowers the loss, and the same seed gives the same run.
"""

import json
import math

import pytest
import torch
from helpers import tolerance

from attention import IMPLEMENTATIONS
from attention.gpt import data
from attention.gpt.checkpoint import CHECKPOINT, PROVENANCE, load_gpt, read_provenance, save_checkpoint
from attention.gpt.model import GPT, GPTConfig, pick_token
from attention.gpt.train import main as train_main
from attention.reference import reference_attention_class

RECORD = read_provenance()
TRAINED_CLASS = IMPLEMENTATIONS[RECORD["attention"]]
# The classes the trained weights fit: no position encoding of their own (the model learned its positions)
# and one K/V head per query head (MultiQueryAttention has one K/V head in all).
FITTING = sorted(name for name, cls in IMPLEMENTATIONS.items()
                 if cls.position_encoding == TRAINED_CLASS.position_encoding and name != "mqa")
NOT_FITTING = sorted(set(IMPLEMENTATIONS) - set(FITTING))


def reference_model(model):
    """The float64 reference of `model`: the same GPT and weights with the float64 reference attention."""
    reference = GPT(model.config, reference_attention_class(model.position_encoding)).double().eval()
    reference.load_canonical_state_dict(model.canonical_state_dict())
    return reference


def validation_windows(count):
    _, validation = data.split(data.encode(data.training_text()))
    return data.windows(validation, RECORD["config"]["context_length"], count)[0]  # (count, T)


def test_the_checkpoint_and_its_record_are_shipped():
    assert CHECKPOINT.is_file() and PROVENANCE.is_file()
    assert CHECKPOINT.stat().st_size < 8 * 2**20, "the checkpoint should stay a few MB"
    for field in ("git", "seed", "steps", "wall_s", "final_train_loss", "final_validation_loss", "torch", "cpu",
                  "load_average_before", "load_average_after", "log"):
        assert field in RECORD, f"{PROVENANCE.name} lacks {field!r}"
    assert RECORD["git"]["commit"] and RECORD["git"]["dirty"] is False, "the checkpoint must come from committed code"
    assert len(RECORD["log"]["step_train_loss"]) == RECORD["steps"]


def test_checkpoint_gives_the_recorded_validation_loss():
    text = data.training_text()
    if data.text_sha256(text) != RECORD["text"]["sha256"]:
        pytest.skip(f"this Python's pydoc_data text differs from the one the checkpoint was trained on "
                    f"(Python {RECORD['python']}): the recorded loss is for that text")
    _, validation = data.split(data.encode(text))
    loss = data.evaluate(load_gpt(), validation)
    assert loss == pytest.approx(RECORD["final_validation_loss"], abs=2e-4)
    assert loss < math.log(data.VOCAB_SIZE) - 2, "the checkpoint should be far better than a uniform guess"


@pytest.mark.parametrize("name", FITTING)
def test_every_fitting_class_gives_the_reference_logits(name):
    model = load_gpt(attention=name)
    idx = validation_windows(2)  # (2, T): two windows of real text
    with torch.no_grad():
        logits = model(idx)
        expected = reference_model(model)(idx)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits.double(), expected, **tolerance("cpu", torch.float32))


@pytest.mark.parametrize("name", NOT_FITTING)
def test_a_class_that_does_not_fit_the_checkpoint_is_refused_with_the_reason(name):
    reason = "position_encoding" if IMPLEMENTATIONS[name].position_encoding != TRAINED_CLASS.position_encoding \
        else r"blocks\.0\.attn\.key\.weight: expected"
    with pytest.raises(ValueError, match=reason):
        load_gpt(attention=name)


@pytest.mark.parametrize("name, num_kv_heads", [("gqa", 2), ("mqa", None), ("rope", None), ("alibi", None),
                                                ("sdpa_causal", None)])
def test_gqa_rope_and_alibi_configurations_match_their_reference(name, num_kv_heads):
    config = GPTConfig(context_length=32, d_model=32, num_layers=2, num_heads=4, num_kv_heads=num_kv_heads)
    torch.manual_seed(0)
    model = GPT(config, IMPLEMENTATIONS[name]).eval()
    with torch.no_grad():  # weights far from GPT-2's small init, so attention is far from uniform and positions matter
        for param in model.parameters():
            param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]))
    assert (model.position_embedding is None) == (IMPLEMENTATIONS[name].position_encoding is not None)
    kv_heads = getattr(model.blocks[0].attn, "num_kv_heads", config.num_heads)  # MultiQueryAttention: 1
    reference_config = GPTConfig(**{**config.to_dict(), "num_kv_heads": kv_heads})
    reference = GPT(reference_config, reference_attention_class(model.position_encoding)).double().eval()
    reference.load_canonical_state_dict(model.canonical_state_dict())
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(idx).double(), reference(idx), **tolerance("cpu", torch.float32))


def test_cached_generation_equals_uncached_generation_token_for_token():
    model = load_gpt(attention="gqa")
    assert model.supports_cache
    prompt = data.encode("The \"with\" statement is used to")[None]  # (1, T)
    cached = model.generate(prompt, 64, use_cache=True)
    uncached = model.generate(prompt, 64, use_cache=False)
    assert torch.equal(cached, uncached)
    sampled = [model.generate(prompt, 64, temperature=1.0, generator=torch.Generator().manual_seed(3), use_cache=use)
               for use in (True, False)]
    assert torch.equal(*sampled)


@pytest.mark.parametrize("name, num_kv_heads", [("gqa", 2), ("mqa", None)])
def test_cached_forward_continues_the_full_forward(name, num_kv_heads):
    config = GPTConfig(context_length=48, d_model=32, num_layers=2, num_heads=4, num_kv_heads=num_kv_heads)
    torch.manual_seed(0)
    model = GPT(config, IMPLEMENTATIONS[name]).eval()
    idx = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        caches = model.new_caches(batch_size=2)
        pieces = [model(idx[:, :9], caches)] + [model(idx[:, t:t + 1], caches) for t in range(9, 33)] + [model(idx[:, 33:], caches)]
    assert [cache.length for cache in caches] == [40, 40]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, **tolerance("cpu", torch.float32))
    torch.testing.assert_close(model.generate(idx[:, :5], 30, use_cache=True), model.generate(idx[:, :5], 30, use_cache=False),
                               rtol=0, atol=0)


def test_generation_appends_the_most_likely_next_token_of_the_whole_sequence():
    """Greedy generation, with or without caches, appends the argmax of the logits at the last position, the whole
    sequence so far fed in; the config's K/V heads reach a grouped-query attention class."""
    config = GPTConfig(context_length=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1)
    torch.manual_seed(0)
    model = GPT(config, IMPLEMENTATIONS["gqa"]).eval()
    assert model.blocks[0].attn.num_kv_heads == 1
    with torch.no_grad():  # weights far from GPT-2's small init, so each position's logits differ clearly
        for param in model.parameters():
            param.normal_(0.0, 1.0 / math.sqrt(param.shape[-1]))
        idx = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(1))
        expected = idx
        for _ in range(4):
            expected = torch.cat([expected, model(expected)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    for use_cache in (False, True):
        assert torch.equal(model.generate(idx, 4, use_cache=use_cache), expected)


def test_sampling_divides_by_the_temperature_and_keeps_the_top_k(monkeypatch):
    logits = torch.tensor([[0.0, 1.0, 2.0, 2.0, -1.0]])
    drawn_from = []
    monkeypatch.setattr(torch, "multinomial", lambda probs, n, generator=None: drawn_from.append(probs) or probs[:, :1].long())
    pick_token(logits, temperature=0.5)
    torch.testing.assert_close(drawn_from[-1], torch.softmax(logits * 2, dim=-1))
    pick_token(logits, temperature=0.5, top_k=2)  # the two largest are tied: both kept, the rest never drawn
    torch.testing.assert_close(drawn_from[-1], torch.tensor([[0.0, 0.0, 0.5, 0.5, 0.0]]))
    pick_token(logits, temperature=2.0, top_k=3)
    kept = torch.tensor([[float("-inf"), 1.0, 2.0, 2.0, float("-inf")]])
    torch.testing.assert_close(drawn_from[-1], torch.softmax(kept / 2, dim=-1))


def test_a_class_without_a_cache_says_so():
    model = load_gpt()
    assert not model.supports_cache
    with pytest.raises(ValueError, match=f"{TRAINED_CLASS.__name__} has no KV cache"):
        model.generate(data.encode("x")[None], 3, use_cache=True)
    with pytest.raises(ValueError, match="has no KV cache"):
        model.new_caches(1)


def test_a_checkpoint_of_the_wrong_shape_names_each_mismatch(tmp_path):
    small = GPT(GPTConfig(context_length=64, d_model=64, num_layers=4, num_heads=4), IMPLEMENTATIONS["sdpa_causal"])
    model = load_gpt()
    with pytest.raises(ValueError, match=r"position_embedding\.weight: expected \(128, 128\), got \(64, 64\)") as error:
        model.load_canonical_state_dict(small.canonical_state_dict())
    assert "blocks.3.attn.query.weight: expected (128, 128), got (64, 64)" in str(error.value)
    shallow = GPT(GPTConfig(num_layers=2), IMPLEMENTATIONS["sdpa_causal"])
    with pytest.raises(ValueError, match=r"missing keys \['blocks\.2\.attn\.key\.weight'"):
        model.load_canonical_state_dict(shallow.canonical_state_dict())
    # A checkpoint file whose stated sizes do not match its weights.
    path = tmp_path / "edited.pt"
    save_checkpoint(small, "sdpa_causal", path)
    edited = torch.load(path, weights_only=True)
    edited["config"]["d_model"] = 128
    torch.save(edited, path)
    with pytest.raises(ValueError, match=r"token_embedding\.weight: expected \(256, 128\), got \(256, 64\)"):
        load_gpt(path)
    torch.save({"weights": {}}, path)
    with pytest.raises(ValueError, match="is not an 'attention.gpt checkpoint"):
        load_gpt(path)


def test_unknown_attention_name_lists_the_valid_ones():
    with pytest.raises(KeyError, match="valid names: .*sdpa_causal"):
        load_gpt(attention="nope")


TINY_RUN = ["--steps", "40", "--d-model", "32", "--num-layers", "1", "--num-heads", "2", "--batch-size", "8",
            "--context-length", "32", "--eval-every", "20", "--eval-windows", "8", "--log-every", "10", "--lr", "1e-2",
            "--warmup", "5"]


def test_a_short_training_run_lowers_the_loss(tmp_path, capsys):
    record = train_main([*TINY_RUN, "--out", str(tmp_path)])
    losses = record["log"]["step_train_loss"]
    assert len(losses) == 40
    first, last = losses[0], sum(losses[-5:]) / 5
    assert first > math.log(256) - 0.3, "an untrained model predicts about uniformly"
    assert last < first - 1.0, f"the loss should fall: first step {first:.3f}, mean of the last five {last:.3f}"
    evaluations = record["log"]["evaluations"]
    assert [entry["step"] for entry in evaluations] == [20, 40]
    assert record["final_validation_loss"] < first - 1.0
    saved = json.loads((tmp_path / "tiny_gpt.json").read_text())
    assert saved["final_validation_loss"] == record["final_validation_loss"]
    assert saved["command"].startswith("python -m attention.gpt.train --steps 40")
    _, validation = data.split(data.encode(data.training_text()))
    assert data.evaluate(load_gpt(tmp_path / "tiny_gpt.pt"), validation) == pytest.approx(record["final_validation_loss"], abs=1e-4)
    printed = capsys.readouterr().err
    assert "40/40" in printed and "validation loss" in printed  # the progress bar and the losses, as it goes


def test_training_is_deterministic_from_the_seed(tmp_path):
    runs = [train_main([*TINY_RUN[:1], "3", *TINY_RUN[2:], "--out", str(tmp_path / str(index))])
            for index in range(2)]
    assert runs[0]["log"]["step_train_loss"] == runs[1]["log"]["step_train_loss"]
    other_seed = train_main([*TINY_RUN[:1], "3", *TINY_RUN[2:], "--seed", "1", "--out", str(tmp_path / "other")])
    assert other_seed["log"]["step_train_loss"] != runs[0]["log"]["step_train_loss"]


def test_training_arguments_are_checked(capsys):
    with pytest.raises(SystemExit):
        train_main(["--steps", "0"])
    assert "--steps must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["--attention", "nope"])
    assert "--attention must be one of" in capsys.readouterr().err


def test_the_model_file_imports_only_torch_and_the_standard_library():
    import ast
    import sys

    from attention.gpt import model as model_module

    tree = ast.parse(open(model_module.__file__, encoding="utf-8").read())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert roots - {"torch"} <= set(sys.stdlib_module_names), f"model.py must stay copyable: it imports {sorted(roots)}"
