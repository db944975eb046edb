"""The tiny GPT's training and generation read in detail (attention/gpt): what a falling loss cannot tell.

* Training batches pair each input byte with the next byte of the same text: targets are the inputs shifted by
  one, from the same offsets, over every offset the text allows (`data.random_batch`, `data.windows`), and the
  training loop scores the logits of those inputs against those targets.
* The optimizer decays the weight matrices (linear layers, embeddings) and nothing else: no bias, no norm.
* Sampling draws from the distribution computed by hand from fixed logits: divided by the temperature, cut to the
  `top_k` most likely tokens, through `GPT.generate` itself.
"""

import functools
import math

import pytest
import torch
from torch import nn

from attention import IMPLEMENTATIONS
from attention.gpt import data
from attention.gpt import train as train_module
from attention.gpt.model import GPT, GPTConfig


def test_a_training_batch_pairs_each_input_with_the_next_token_of_the_same_window():
    """Over a text whose token is its own offset, every target is its input's offset plus one, each row a run of
    consecutive offsets, and every start the text allows is drawn (the last one reaches the text's last token)."""
    context_length, text = 8, torch.arange(12)  # starts 0..3
    inputs, targets = data.random_batch(text, 400, context_length, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (400, context_length)
    assert torch.equal(targets, inputs + 1)
    assert torch.equal(inputs, inputs[:, :1] + torch.arange(context_length))
    assert sorted(set(inputs[:, 0].tolist())) == [0, 1, 2, 3]
    assert targets.max().item() == len(text) - 1


def test_evaluation_windows_pair_each_input_with_the_next_token_and_tile_the_text():
    context_length, text = 4, torch.arange(3 * 4 + 1)
    inputs, targets = data.windows(text, context_length)
    assert inputs.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert torch.equal(targets, inputs + 1)
    inputs, targets = data.windows(torch.arange(10 * 4 + 1), context_length, count=3)  # spread: first, middle, last
    assert inputs[:, 0].tolist() == [0, 16, 36] and torch.equal(targets, inputs + 1)


class StopTraining(Exception):
    pass


@functools.cache
def first_training_step(attention):
    """Run `attention.gpt.train.train` up to its first optimizer step (stopped there, nothing updated) and return
    what it did: the model, the optimizer's parameter groups, the batch it drew and what the loss was given."""
    seen = {}
    build_model, draw_batch, cross_entropy = train_module.GPT, train_module.random_batch, torch.nn.functional.cross_entropy

    def spy_model(*args, **kwargs):
        seen["model"] = build_model(*args, **kwargs)
        return seen["model"]

    def spy_batch(*args, **kwargs):
        seen["batch"] = draw_batch(*args, **kwargs)
        return seen["batch"]

    def spy_loss(logits, targets, *args, **kwargs):
        seen.setdefault("loss_inputs", (logits.detach().clone(), targets.clone()))
        return cross_entropy(logits, targets, *args, **kwargs)

    class SpyAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            seen["param_groups"] = self.param_groups
            raise StopTraining

    args = train_module.parse_args(["--steps", "1", "--d-model", "16", "--num-layers", "2", "--num-heads", "2",
                                    "--batch-size", "4", "--context-length", "16", "--attention", attention])
    with pytest.MonkeyPatch.context() as monkeypatch, pytest.raises(StopTraining):
        monkeypatch.setattr(train_module, "GPT", spy_model)
        monkeypatch.setattr(train_module, "random_batch", spy_batch)
        monkeypatch.setattr(torch.nn.functional, "cross_entropy", spy_loss)
        monkeypatch.setattr(torch.optim, "AdamW", SpyAdamW)
        train_module.train(args, "test")
    return seen


def test_the_training_loop_scores_the_logits_of_each_input_against_the_next_byte():
    seen = first_training_step("sdpa_causal")
    inputs, targets = seen["batch"]
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # real text: the windows overlap by all but one byte
    logits, scored_targets = seen["loss_inputs"]
    assert torch.equal(scored_targets, targets.flatten())
    with torch.no_grad():  # no dropout by default: the logits are the model's of these inputs
        torch.testing.assert_close(logits, seen["model"](inputs).flatten(0, 1), rtol=0, atol=0)


@pytest.mark.parametrize("attention", ["sdpa_causal", "rope"])
def test_the_optimizer_decays_the_weight_matrices_and_no_bias_or_norm(attention):
    """Every parameter in exactly one group: the weights of linear layers and embeddings (the tied head once)
    decayed by 0.1; the biases and the layer norms' weights and biases not at all."""
    seen = first_training_step(attention)
    model, groups = seen["model"], seen["param_groups"]
    decay_of = {}
    for group in groups:
        for param in group["params"]:
            assert id(param) not in decay_of, "a parameter in two groups"
            decay_of[id(param)] = group["weight_decay"]
    expected, names = {}, {}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}"
            decays = isinstance(module, (nn.Linear, nn.Embedding)) and param_name == "weight"
            assert isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)), f"{name}: a parameter of a new kind"
            expected.setdefault(id(param), 0.1 if decays else 0.0)
            names.setdefault(id(param), name)
    assert set(decay_of) == set(expected), "every parameter of the model, once, and nothing else"
    wrong = {names[key]: decay_of[key] for key in expected if decay_of[key] != expected[key]}
    assert not wrong, f"wrong weight decay: {wrong}"
    assert any(isinstance(m, nn.LayerNorm) for m in model.modules()) and any(".bias" in n for n in names.values())


# Sampling, through GPT.generate, from logits fixed by hand.

VOCAB = 256
FIXED = {10: 2.0, 20: 1.0, 30: 0.5, 40: 0.0, 50: -0.5}  # every other token: -30 (never drawn at these temperatures)


def hand_probabilities(temperature, top_k):
    """The distribution over `FIXED`'s tokens, computed with math.exp: softmax(logit / temperature) over the
    `top_k` largest logits (all where None); the other 251 tokens' share at -30 is below 1e-4 here."""
    kept = sorted(FIXED, key=FIXED.get, reverse=True)[:top_k]
    weights = {token: math.exp(FIXED[token] / temperature) for token in kept}
    total = sum(weights.values()) + (0 if top_k else (VOCAB - len(FIXED)) * math.exp(-30 / temperature))
    return {token: weights.get(token, 0.0) / total for token in FIXED}


def sampled_frequencies(temperature, top_k, draws=20000):
    """The share of each token in `draws` single-token generations (one per row) of a GPT whose logits are fixed."""
    model = GPT(GPTConfig(context_length=4, d_model=8, num_layers=1, num_heads=1), IMPLEMENTATIONS["sdpa_causal"]).eval()
    logits = torch.full((VOCAB,), -30.0)
    for token, value in FIXED.items():
        logits[token] = value
    model.forward = lambda idx, caches=None: logits.expand(idx.shape[0], idx.shape[1], VOCAB)
    prompts = torch.zeros(draws, 1, dtype=torch.long)
    tokens = model.generate(prompts, 1, temperature=temperature, top_k=top_k, use_cache=False,
                            generator=torch.Generator().manual_seed(0))[:, -1]
    return torch.bincount(tokens, minlength=VOCAB).double() / draws


@pytest.mark.parametrize("temperature,top_k", [(0.5, 3), (2.0, None), (1.0, 2)])
def test_sampling_draws_from_the_hand_computed_distribution(temperature, top_k):
    """Over 20,000 draws each token's share is within 5 standard errors of its hand-computed probability, and a
    token outside the top k is never drawn."""
    frequencies = sampled_frequencies(temperature, top_k)
    expected = hand_probabilities(temperature, top_k)
    for token, probability in expected.items():
        error = 5 * math.sqrt(max(probability * (1 - probability), 1e-4) / 20000)
        assert abs(frequencies[token].item() - probability) < error, (token, frequencies[token].item(), probability)
        if probability == 0.0:
            assert frequencies[token].item() == 0.0, f"token {token} outside the top {top_k} was drawn"
    assert frequencies.sum().item() == pytest.approx(1.0)
