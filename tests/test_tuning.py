"""`decode_kernel="auto"` chooses by measurement (`attention/decoding/tuning.py`): the candidates timed once per shape
class on the machine running it, the faster kept for the process, the same outputs whichever wins.

Which candidate is faster here is the machine's business, so these tests make one candidate slow on purpose (a
sleep in a wrapper) and check that the choice follows, that a forced kernel is never timed, and that the output of
`"auto"` is exactly the output of the kernel it chose.
"""

import math

import pytest
import torch

import attention.causal.gqa as gqa_file
import attention.decoding.kernels as kernels
import attention.decoding.tuning as tuning
from attention.causal.gqa import GroupedQueryAttention
from attention.decoding import TUNING_ENV, chosen, forget_choices
from attention.models import MODELS
from tests.test_models import config_of


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.delenv(TUNING_ENV, raising=False)
    forget_choices()
    yield
    forget_choices()


def slowed(monkeypatch, name):
    """Make `attention.decoding.kernels.<name>` slow as the tuning sees it: a timed call that reaches it takes a
    second on the tuning's clock (a real sleep would drown in the noise of a busy 2-core machine). Returns the list
    its calls append to."""
    calls, original = [], getattr(kernels, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernels, name, counted)
    if hasattr(gqa_file, name):  # GroupedQueryAttention calls it by its own name too
        monkeypatch.setattr(gqa_file, name, counted)
    return slow_clock(monkeypatch, calls)


def slow_clock(monkeypatch, calls):
    """The tuning's clock, faked: a timed call during which `calls` grew took a second, any other a millisecond."""
    def timed_call(call):
        before = len(calls)
        call()
        return 1.0 if len(calls) > before else 0.001

    monkeypatch.setattr(tuning, "timed_call", timed_call)
    return calls


def gqa(num_kv_heads=2, decode_kernel="auto", bias=True):
    torch.manual_seed(0)
    module = GroupedQueryAttention(32, 32, 64, 0.0, 8, qkv_bias=bias, num_kv_heads=num_kv_heads,
                                   decode_kernel=decode_kernel).eval()
    return module


def decode(module, x, prompt=5):
    """`x` `(B, T, C)` through `module` with a cache: a prompt of `prompt` tokens, then one token per call."""
    cache = module.new_cache(x.shape[0], x.shape[1])
    with torch.no_grad():
        steps = [module(x[:, :prompt], cache=cache)] + [module(x[:, t:t + 1], cache=cache)
                                                       for t in range(prompt, x.shape[1])]
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("slow,winner", [("grouped_decode_attention", "sdpa"), ("sdpa_over_cache", "matmul")])
def test_auto_takes_the_faster_kernel_and_outputs_exactly_what_that_kernel_outputs(monkeypatch, slow, winner):
    x = torch.randn(2, 12, 32)  # two sequences: no single-row projection, whose choice is tested apart
    forced = decode(gqa(decode_kernel=winner), x)  # before the slowdown: the winner's own output
    slowed(monkeypatch, slow)
    auto = decode(gqa(), x)
    attention_choices = {key: name for key, name in chosen().items() if key[0] == "attention"}
    assert attention_choices and set(attention_choices.values()) == {winner}
    assert torch.equal(auto, forced)


def test_each_shape_class_is_timed_once(monkeypatch):
    """Steps of one shape class reuse the choice; the cache's length counts by its power of two, so a cache that
    grows past one is timed again; another batch size is another class."""
    calls = slowed(monkeypatch, "grouped_decode_attention")
    module = gqa()
    x = torch.randn(1, 20, 32)
    cache = module.new_cache(1, 20)
    with torch.no_grad():
        module(x[:, :9], cache=cache)  # a prompt of 9: a class of its own (9 new tokens)
        timed_once = len(calls)
        assert timed_once == 1 + tuning.TIMED_CALLS  # one untimed call, then the timed ones; then SDPA won, no real call
        for t in range(9, 15):  # cache lengths 10..15: one power of two (8..15), one class
            module(x[:, t:t + 1], cache=cache)
        assert len(calls) == 2 * timed_once
        module(x[:, 15:17], cache=cache)  # two tokens: another class
        module(x[:, 17:18], cache=cache)  # 18 positions: the next power of two
        assert len(calls) == 4 * timed_once
        module2 = gqa()
        module2(torch.randn(2, 1, 32), cache=module2.new_cache(2, 4))  # batch 2
        assert len(calls) == 5 * timed_once


def test_a_forced_kernel_is_never_timed(monkeypatch):
    calls = slowed(monkeypatch, "sdpa_over_cache")
    decode(gqa(decode_kernel="matmul"), torch.randn(1, 10, 32))
    assert calls == [] and chosen() == {}


def test_with_tuning_off_auto_is_the_fixed_rule_and_times_nothing(monkeypatch):
    monkeypatch.setenv(TUNING_ENV, "off")
    calls = slowed(monkeypatch, "grouped_decode_attention")
    x = torch.randn(1, 10, 32)
    decode(gqa(), x)
    assert len(calls) == 6 and chosen() == {}  # the rule on CPU: the grouped matmuls at every one of 6 calls


def test_an_unknown_tuning_setting_is_refused_naming_the_valid_ones(monkeypatch):
    monkeypatch.setenv(TUNING_ENV, "fast")
    with pytest.raises(ValueError, match=r"ATTENTION_TUNING must be one of \('measure', 'off'\), got "
                                         r"ATTENTION_TUNING='fast'"):
        decode(gqa(), torch.randn(1, 8, 32))


def test_a_candidate_that_fails_while_timed_is_left_out(monkeypatch):
    """Out of memory on one candidate: the other is chosen and the result is that candidate's, unchanged."""
    x = torch.randn(1, 10, 32)
    forced = decode(gqa(decode_kernel="sdpa"), x)

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("out of memory (a test's)")

    monkeypatch.setattr(kernels, "grouped_decode_attention", out_of_memory)
    assert torch.equal(decode(gqa(), x), forced)
    assert {name for key, name in chosen().items() if key[0] == "attention"} == {"sdpa"}


def test_when_every_candidate_fails_the_rule_is_taken_and_its_error_raised():
    def fails():
        raise RuntimeError("no such kernel here")

    assert tuning.fastest(("test",), {"a": fails, "b": fails}, "b") == "b" and chosen() == {("test",): "b"}


def test_dropout_keeps_the_fixed_rule_because_timing_would_draw_random_numbers(monkeypatch):
    calls = slowed(monkeypatch, "grouped_decode_attention")
    module = GroupedQueryAttention(32, 32, 64, 0.5, 8, num_kv_heads=2).train()
    cache = module.new_cache(1, 4)
    torch.manual_seed(1)
    with torch.no_grad():  # a cache is for inference; dropout still applies in training mode
        module(torch.randn(1, 1, 32), cache=cache)
    assert len(calls) == 1 and not any(key[0] == "attention" for key in chosen())


class CountedLinear(torch.nn.Linear):
    def __init__(self, *args, calls):
        super().__init__(*args)
        self.calls = calls

    def forward(self, inputs):
        self.calls.append(1)
        return super().forward(inputs)


@pytest.mark.parametrize("slow,winner", [("row_split", "linear"), ("linear", "row_split")])
def test_a_single_rows_projection_takes_the_faster_and_the_same_output(monkeypatch, slow, winner):
    """One token of one sequence: each projection plain or split into a batch of matrix-vector products
    (`row_split_linear`), timed per weight shape; the step's output is the chosen projection's, to the bit."""
    calls = []
    layer = CountedLinear(32, 64, calls=calls)
    x = torch.randn(1, 1, 32)
    with torch.no_grad():
        expected = {"linear": layer(x), "row_split": kernels.row_split_linear(layer, x)}[winner]
        if slow == "row_split":
            slowed(monkeypatch, "row_split_linear")
        else:
            slow_clock(monkeypatch, calls)
        got = kernels.decode_linear(layer, x, "auto")
    assert chosen() == {("projection", torch.float32, 64, 32, False): winner}
    assert torch.equal(got, expected)


def test_more_than_one_row_or_a_forced_kernel_projects_without_timing():
    layer = torch.nn.Linear(32, 64)
    rows = torch.randn(2, 1, 32)
    one = torch.randn(1, 1, 32)
    with torch.no_grad():
        assert torch.equal(kernels.decode_linear(layer, rows, "auto"), layer(rows))
        assert torch.equal(kernels.decode_linear(layer, one, "sdpa"), layer(one))
        assert torch.equal(kernels.decode_linear(layer, one, "matmul"), kernels.row_split_linear(layer, one))
    assert chosen() == {}


@pytest.mark.parametrize("name", ["llama", "qwen3", "olmo2", "gemma3_text", "llama4_text"])
def test_the_model_families_auto_decode_equals_the_forced_winner(monkeypatch, name):
    """The model families attend over a cache through `cached_attention`: its `"auto"` is measured too."""
    config = config_of(name)
    torch.manual_seed(0)
    forced = MODELS[config["model_type"]].from_config(config, 0, decode_kernel="sdpa").eval()
    auto = MODELS[config["model_type"]].from_config(config, 0).eval()
    auto.load_state_dict(forced.state_dict())
    x = torch.randn(1, 6, config["hidden_size"])

    def steps(module):
        cache = module.new_cache(1, capacity=8)
        with torch.no_grad():
            return torch.cat([module(x[:, t:t + 1], cache=cache) for t in range(6)], dim=1)

    expected = steps(forced)
    slowed(monkeypatch, "grouped_decode_attention")
    assert torch.equal(steps(auto), expected)
    assert {name for key, name in chosen().items() if key[0] == "attention"} == {"sdpa"}


def test_short_calls_are_timed_more_often_up_to_a_limit(monkeypatch):
    """At least `TIMED_CALLS` rounds; calls that take little are timed until the rounds have taken `TIMING_SECONDS`, at
    most `MAX_ROUNDS` rounds (the noise of a few short calls chose the slower projection in a recorded run)."""
    for seconds, rounds in [(1.0, tuning.TIMED_CALLS), (0.004, math.ceil(tuning.TIMING_SECONDS / (0.004 + 0.0036))),
                            (1e-6, tuning.MAX_ROUNDS)]:
        calls = {"a": 0, "b": 0}

        def call(name, seconds=seconds):
            calls[name] += 1
            return seconds
        monkeypatch.setattr(tuning, "timed_call", lambda candidate: candidate())
        assert tuning.time_candidates({"a": lambda: call("a"), "b": lambda: call("b", seconds * 0.9)}) == "b"
        assert calls["a"] == calls["b"] and calls["a"] == 1 + rounds, (seconds, calls, rounds)
