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
* Files others could have made are checked before use: a checkpoint's structure, sizes and weights before
  anything is built from it, the record's every field and its agreement with the weights; the page escapes
  what it shows of the record.
* Bad input is refused before any work, naming the argument or option: `generate`'s arguments, the
  training script's options and output files (it never writes into the package, or over a file, unasked).
"""

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from helpers import tolerance

from attention import IMPLEMENTATIONS
from attention.gpt import checkpoint as checkpoint_module
from attention.gpt import data
from attention.gpt import train as train_module
from attention.gpt.checkpoint import CHECKPOINT, PROVENANCE, load_gpt, read_checkpoint, read_provenance, save_checkpoint
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
    assert "argument --steps: steps: 0 is outside [1, 100000]" in capsys.readouterr().err
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


# --- generate: every argument checked before any work, each error naming it ---

def small_model():
    torch.manual_seed(0)
    return GPT(GPTConfig(context_length=16, d_model=16, num_layers=1, num_heads=2), IMPLEMENTATIONS["sdpa_causal"]).eval()


PROMPT = torch.tensor([[65, 66, 67]])  # (1, 3)


@pytest.mark.parametrize("idx, error, pattern", [
    ([[65, 66]], TypeError, "idx=list"),
    (torch.tensor([65, 66]), ValueError, r"idx\.shape=\(2,\)"),
    (torch.tensor([[65, 66]], dtype=torch.int32), TypeError, r"idx\.dtype=torch\.int32"),
    (torch.zeros(1, 0, dtype=torch.long), ValueError, r"at least one token \(T >= 1\), got idx\.shape=\(1, 0\)"),
    (torch.tensor([[65, 256]]), ValueError, r"\[0, vocab_size=256\), got ids from 65 to 256"),
    (torch.tensor([[-1, 65]]), ValueError, r"\[0, vocab_size=256\), got ids from -1 to 65"),
])
def test_generate_refuses_a_bad_prompt_first(idx, error, pattern):
    with pytest.raises(error, match=pattern):
        small_model().generate(idx, -1, temperature=-1.0)  # the prompt is checked before the other arguments


@pytest.mark.parametrize("arguments, error, pattern", [
    (dict(max_new_tokens=-1), ValueError, "max_new_tokens=-1"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens=True"),
    (dict(max_new_tokens=None), TypeError, "max_new_tokens=None"),
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens=2.5"),
    (dict(temperature=-1.0), ValueError, "temperature=-1.0"),
    (dict(temperature=-1e-9), ValueError, "temperature=-1e-09"),
    (dict(temperature=float("inf")), ValueError, "temperature=inf"),
    (dict(temperature=float("nan")), ValueError, "temperature=nan"),
    (dict(temperature="1"), TypeError, "temperature='1'"),
    (dict(temperature=None), TypeError, "temperature=None"),
    (dict(temperature=1.0, top_k=0), ValueError, "top_k=0"),
    (dict(temperature=1.0, top_k=-3), ValueError, "top_k=-3"),
    (dict(temperature=1.0, top_k=2.5), TypeError, "top_k=2.5"),
    (dict(temperature=1.0, top_k=True), TypeError, "top_k=True"),
    (dict(use_cache="yes"), TypeError, "use_cache='yes'"),
])
def test_generate_refuses_bad_sampling_arguments_naming_them(arguments, error, pattern):
    arguments = {"max_new_tokens": 3, **arguments}
    with pytest.raises(error, match=pattern):
        small_model().generate(PROMPT, **arguments)


@pytest.mark.parametrize("temperature", [1e-45, 1e-300, 5e-324])
def test_a_temperature_too_small_to_divide_by_picks_the_most_likely_token(temperature):
    """Dividing by it overflows (inf - inf, NaN probabilities, a RuntimeError before): the limit, greedy, instead."""
    model = small_model()
    with torch.no_grad():  # logits far apart, so greedy is one token per step
        for param in model.parameters():
            param.normal_(0.0, 1.0)
    greedy = model.generate(PROMPT, 8)
    assert torch.equal(model.generate(PROMPT, 8, temperature=temperature, generator=torch.Generator().manual_seed(0)),
                       greedy)
    logits = torch.tensor([[0.0, 3.0, -2.0], [1e30, -1e30, 0.0]])
    assert pick_token(logits, temperature, top_k=2).tolist() == [[1], [0]]


# --- Loading a checkpoint: its structure checked, its shapes compared before anything is allocated ---

def saved(tmp_path, value, name="edited.pt"):
    path = tmp_path / name
    torch.save(value, path)
    return path


@pytest.fixture(scope="module")
def shipped():
    return read_checkpoint()


@pytest.mark.parametrize("edit, pattern", [
    (lambda ck: {"format": ck["format"]}, r"config: missing; attention: missing; state: missing"),
    (lambda ck: dict(ck, config=list(ck["config"].values())), r"config: expected an object, got \["),
    (lambda ck: dict(ck, config=dict(ck["config"], d_model="128")), r"config\.d_model: expected an integer, got '128'"),
    (lambda ck: dict(ck, config=dict(ck["config"], vocab_size=1e12)), r"config\.vocab_size: expected an integer"),
    (lambda ck: dict(ck, config=dict(ck["config"], context_length=2**24)), r"config\.context_length: 16777216 is outside"),
    (lambda ck: dict(ck, config=dict(ck["config"], evil_field=1)), r"config\.'evil_field': unknown field"),
    (lambda ck: dict(ck, config=dict(ck["config"], num_heads=3)), r"config: GPTConfig\.d_model must be divisible"),
    (lambda ck: dict(ck, attention=7), r"attention: 7 is not one of"),
    (lambda ck: dict(ck, state=[1, 2]), r"state: expected a mapping of names to tensors, got list"),
    (lambda ck: dict(ck, state={name: 1 for name in ck["state"]}), r"state\.token_embedding\.weight: expected a tensor, got int"),
    (lambda ck: dict(ck, state={**ck["state"], "blocks.0.ln_1.weight": ck["state"]["blocks.0.ln_1.weight"].long()}),
     r"state\.blocks\.0\.ln_1\.weight: expected floating-point weights, got dtype torch\.int64"),
    (lambda ck: dict(ck, state={**ck["state"], "blocks.1.mlp.fc.bias": torch.full((512,), float("nan"))}),
     r"state\.blocks\.1\.mlp\.fc\.bias: holds NaN or infinite values"),
    (lambda ck: dict(ck, state={**ck["state"], "ln_f.bias": torch.tensor([0.0, float("inf")]).repeat(64)}),
     r"state\.ln_f\.bias: holds NaN or infinite values"),
    # One stored number read as 2**28 (a stride-0 view): refused by its claimed size, before its elements are read.
    (lambda ck: dict(ck, state={**ck["state"], "ln_f.bias": torch.zeros(1).expand(2**28)}),
     r"state: its tensors claim [\d,]+ bytes, more than the file's"),
])
def test_a_malformed_checkpoint_is_refused_naming_the_file_and_the_problem(tmp_path, shipped, edit, pattern):
    path = saved(tmp_path, edit(copy.copy(shipped)))
    for read in (read_checkpoint, load_gpt):
        with pytest.raises(ValueError, match=pattern) as error:
            read(path)
        assert str(error.value).startswith(str(path))


def test_an_empty_or_foreign_checkpoint_file_is_refused_naming_it(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.pt: an empty file"):
        load_gpt(empty)
    text = tmp_path / "text.pt"
    text.write_text('{"format": "attention.gpt checkpoint, version 1"}')
    with pytest.raises(ValueError, match=r"text\.pt: not a checkpoint that loads without running code"):
        load_gpt(text)


class RunsCodeWhenUnpickled:
    marker = None

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path, shipped):
    hostile = RunsCodeWhenUnpickled()
    hostile.marker = tmp_path / "pwned.marker"
    path = saved(tmp_path, dict(shipped, state={**shipped["state"], "ln_f.bias": hostile}))
    with pytest.raises(ValueError, match=r"edited\.pt: not a checkpoint that loads without running code: UnpicklingError"):
        load_gpt(path)
    assert not hostile.marker.exists()


def test_a_checkpoint_is_read_as_a_regular_file_of_bounded_size(tmp_path, monkeypatch):
    link = tmp_path / "link.pt"
    link.symlink_to(CHECKPOINT)
    with pytest.raises(ValueError, match=r"link\.pt: a symbolic link"):
        load_gpt(link)
    monkeypatch.setattr(checkpoint_module, "MAX_CHECKPOINT_BYTES", 2**20)
    with pytest.raises(ValueError, match=r"tiny_gpt\.pt: longer than 1 MiB"):
        load_gpt()


@pytest.mark.parametrize("sizes", [
    dict(vocab_size=2**20, d_model=2**14),  # 2**34 embedding numbers (64 GiB) in the config, a few KB of weights
    dict(num_layers=256),  # 256 blocks asked for, one stored
])
def test_a_small_checkpoint_asking_for_a_huge_model_is_refused_before_allocating_it(tmp_path, monkeypatch, sizes):
    tiny = GPT(GPTConfig(context_length=8, d_model=8, num_layers=1, num_heads=2), IMPLEMENTATIONS["sdpa_causal"])
    path = tmp_path / "hostile.pt"
    save_checkpoint(tiny, "sdpa_causal", path)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["config"].update(sizes)
    path.unlink()
    path = saved(tmp_path, checkpoint, "hostile.pt")
    assert path.stat().st_size < 64 * 2**10
    built = []

    def build_without_memory(config, attention_class):  # a model built outside the meta device allocates its weights
        device = torch.empty(0).device.type
        built.append(device)
        if device != "meta":
            raise AssertionError(f"a model of {config} built on {device} before its weights were checked")
        return GPT(config, attention_class)

    monkeypatch.setattr(checkpoint_module, "GPT", build_without_memory)
    with pytest.raises(ValueError, match=r"hostile\.pt: .*(expected \(1048576, 16384\), got \(256, 8\)|num_layers=256, "
                                         r"but the state holds the weights of 1 blocks)"):
        load_gpt(path)
    assert set(built) <= {"meta"}


# --- The record beside the checkpoint: a strict schema, compared with the weights, escaped on the page ---

HOSTILE_CPU = "AMD EPYC <script>alert(2)</script>"
HOSTILE_COMMAND = "python -m attention.gpt.train --threads 1`<img src=x onerror=alert(1)>`"


def written_record(tmp_path, edit):
    """The shipped record, edited, written beside a copy of the shipped checkpoint (the weights it describes)."""
    value = json.loads(PROVENANCE.read_text(encoding="utf-8"))
    edit(value)
    (tmp_path / "tiny_gpt.pt").write_bytes(CHECKPOINT.read_bytes())
    path = tmp_path / "tiny_gpt.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def test_a_hostile_record_is_refused_naming_its_fields(tmp_path):
    path = written_record(tmp_path, lambda value: value.update(cpu=HOSTILE_CPU, command=HOSTILE_COMMAND))
    with pytest.raises(ValueError, match=r"tiny_gpt\.json: not a valid training record: ") as error:
        read_provenance(path)
    assert "command: 'python -m attention.gpt.train --threads 1`<img" in str(error.value)
    assert "cpu: 'AMD EPYC <script>alert(2)</script>' is not a name" in str(error.value)


@pytest.mark.parametrize("edit, pattern", [
    (lambda value: value.update(extra="x"), r"'extra': unknown field"),
    (lambda value: value.pop("torch"), r"torch: missing"),
    (lambda value: value.update(final_validation_loss=float("nan")), r"final_validation_loss: nan is not a finite number"),
    (lambda value: value["arguments"].update(lr=float("inf")), r"arguments\.lr: inf is not a finite number"),
    (lambda value: value["text"].update(sha256="<b>"), r"text\.sha256: '<b>' is not a sha256"),
    (lambda value: value["log"].update(step_train_loss=[1.0] * 100_001), r"log\.step_train_loss: 100001 items, at most 100000"),
    (lambda value: value["log"]["step_train_loss"].pop(), r"log\.step_train_loss: 1499 losses for steps=1500"),
    (lambda value: value["git"].update(commit="main"), r"git\.commit: 'main' is not a hexadecimal git commit"),
    (lambda value: value["arguments"].update(out="/home/someone/attention/gpt/checkpoints"), r"arguments\.out: "),
])
def test_every_field_of_the_record_is_checked(tmp_path, edit, pattern):
    with pytest.raises(ValueError, match=pattern):
        read_provenance(written_record(tmp_path, edit))


@pytest.mark.parametrize("edit, pattern", [
    (lambda value: value["config"].update(d_model=64),
     r"its config \{.*'d_model': 64.*\} differs from the config \{.*'d_model': 128.*\} of the checkpoint .*tiny_gpt\.pt"),
    (lambda value: value.update(attention="einsum") or value["arguments"].update(attention="einsum"),
     r"its attention 'einsum' differs from the attention 'sdpa_causal' of the checkpoint .*tiny_gpt\.pt"),
])
def test_a_record_that_does_not_describe_the_weights_is_refused_naming_both(tmp_path, edit, pattern):
    with pytest.raises(ValueError, match=pattern):
        read_provenance(written_record(tmp_path, edit))


def test_the_page_escapes_every_string_it_shows_from_the_record():
    from attention.gpt.checkpoint import record_rows

    hostile = copy.deepcopy(RECORD)
    hostile.update(cpu=HOSTILE_CPU, command=HOSTILE_COMMAND, python="3.11<i>")
    hostile["git"]["commit"] = "<svg onload=x>" + "0" * 40
    shown = dict(record_rows(hostile))
    page = "\n".join(shown.values())
    assert "<" not in page and ">" not in page
    assert shown["command"] == ("`python -m attention.gpt.train --threads 1&#96;&lt;img src=x onerror=alert(1)&gt;&#96;`")
    assert shown["machine"].startswith("AMD EPYC &lt;script&gt;alert(2)&lt;/script&gt;, ")
    assert dict(record_rows(RECORD))["command"] == f"`{RECORD['command']}`"  # a valid record is shown as it is


@pytest.mark.parametrize("threads, words", [(1, "1 thread, torch"), (2, "2 threads, torch")])
def test_the_page_counts_the_training_threads_in_words(threads, words):
    """The page said "AMD EPYC, 1 threads": the word follows the count."""
    from attention.gpt.checkpoint import record_rows

    record = copy.deepcopy(RECORD)
    record["torch_num_threads"] = threads
    assert f"{RECORD['cpu']}, {words} " in dict(record_rows(record))["machine"]


def test_the_shipped_record_holds_no_absolute_path():
    def strings(value):
        if isinstance(value, dict):
            return [item for element in value.values() for item in strings(element)]
        return [item for element in value for item in strings(element)] if isinstance(value, list) else [value]

    assert RECORD["arguments"]["out"] == "attention/gpt/checkpoints"
    assert not [text for text in strings(RECORD) if isinstance(text, str) and ("/home" in text or text.startswith("/"))]


# --- The training script: outputs and options checked before training; never into the package unasked ---

def never_train(*args, **kwargs):
    raise AssertionError("trained although the options should have been refused")


def test_training_writes_to_a_new_folder_in_the_current_directory_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default_out = train_module.parse_args([]).out
    assert not default_out.is_absolute() and default_out == Path("gpt-runs")  # never inside the installed package
    shipped_bytes = CHECKPOINT.read_bytes()
    record = train_main([*TINY_RUN[:1], "3", *TINY_RUN[2:]])
    assert (tmp_path / "gpt-runs" / "tiny_gpt.pt").is_file() and (tmp_path / "gpt-runs" / "tiny_gpt.json").is_file()
    assert CHECKPOINT.read_bytes() == shipped_bytes
    assert record["arguments"]["out"] == "gpt-runs"  # relative to where the run started: no machine path
    assert read_provenance(tmp_path / "gpt-runs" / "tiny_gpt.json") == record


@pytest.mark.parametrize("existing", ["tiny_gpt.pt", "tiny_gpt.json"])
def test_an_existing_output_is_refused_before_training_unless_forced(tmp_path, monkeypatch, capsys, existing):
    (tmp_path / existing).write_text("precious")
    monkeypatch.setattr(train_module, "train", never_train)
    with pytest.raises(SystemExit):
        train_main([*TINY_RUN, "--out", str(tmp_path)])
    assert f"{existing}: exists already; pass --force" in capsys.readouterr().err
    assert (tmp_path / existing).read_text() == "precious"
    monkeypatch.undo()
    train_main([*TINY_RUN[:1], "2", *TINY_RUN[2:], "--out", str(tmp_path), "--force"])
    assert (tmp_path / existing).read_bytes() != b"precious"
    assert read_provenance(tmp_path / "tiny_gpt.json")["arguments"]["force"] is True


@pytest.mark.parametrize("options, message", [
    (["--out", "{file}"], "--out must be a folder (made if missing), got the file"),
    (["--out", "{tmp}/missing/deeper"], "its folder {tmp}/missing does not exist"),
    (["--name", "sub/dir/x"], "--name: 'sub/dir/x' is not a plain file name"),
    (["--name", "../escaped"], "--name: '../escaped' is not a plain file name"),
    (["--name", "/tmp/absolute"], "--name: '/tmp/absolute' is not a plain file name"),
    (["--name", ".."], "--name: '..' is not a plain file name"),
    (["--num-heads", "3"], "--num-heads must divide --d-model, got --d-model 128 and --num-heads 3"),
    (["--d-model", "0"], "argument --d-model: d_model: 0 is outside"),
    (["--num-layers", "-1"], "argument --num-layers: num_layers: -1 is outside"),
    (["--lr", "inf"], "argument --lr: lr: inf is not a finite number"),
    (["--lr", "nan"], "argument --lr: lr: nan is not a finite number"),
    (["--lr", "0"], "argument --lr: lr: 0.0 is outside"),
    (["--warmup", "-5"], "argument --warmup: warmup: -5 is outside"),
    (["--context-length", "500000"], "argument --context-length: context_length: 500000 is outside"),
    (["--context-length", "{validation}"], "--context-length must be below {validation:,}, the validation text's length"),
    (["--attention", "rope", "--d-model", "36"], "--attention rope with --d-model 36, --num-heads 4"),
])
def test_bad_training_options_are_usage_errors_before_training(tmp_path, monkeypatch, capsys, options, message):
    (tmp_path / "afile").write_text("notes")
    monkeypatch.setattr(train_module, "train", never_train)
    monkeypatch.chdir(tmp_path)
    _, validation = data.split(data.encode(data.training_text()))
    values = dict(file=tmp_path / "afile", tmp=tmp_path, validation=len(validation))  # the shortest window too long
    with pytest.raises(SystemExit) as exit_:
        train_main([option.format(**values) for option in options])
    assert exit_.value.code == 2
    assert message.format(**values) in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile"]


def test_training_stops_and_writes_nothing_when_the_loss_is_not_finite(tmp_path, monkeypatch):
    calls, cross_entropy = [], torch.nn.functional.cross_entropy

    def diverging(*args, **kwargs):  # the third step's loss is NaN, as a learning rate too large makes it
        calls.append(1)
        loss = cross_entropy(*args, **kwargs)
        return loss * float("nan") if len(calls) == 3 else loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", diverging)
    with pytest.raises(SystemExit, match="the training loss became nan at step 3 .*nothing written"):
        train_main([*TINY_RUN, "--out", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()
