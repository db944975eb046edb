"""The delta rules' forms are one function: every form against the recurrent one (the definition) in float64, outputs,
final states and the gradients of every input, at lengths no chunk divides, gates near 0 and near 1, a sequence in
two segments, batch invariance; KDA with equal channel gates is the gated delta rule; bad input is an error."""

import math

import pytest
import torch

from attention.linear import (delta_rule, gated_delta_rule, gated_delta_step, gated_linear_attention, gated_linear_step,
                              kimi_delta_rule, kimi_delta_step, retention, retnet_log_decays, ssd, ssd_step)

RULES = {"gated_delta": (gated_delta_rule, gated_delta_step, False), "kimi_delta": (kimi_delta_rule, kimi_delta_step, True)}
EXACT = 1e-12  # float64: each form against the recurrent one, relative to the largest value compared


def draw(rule, B=2, H=3, T=37, Dk=8, Dv=6, decay=(0.5, 1.0), seed=0):
    """Inputs as the layers give them: q and k L2-normalised, beta in (0, 1), decays drawn in `decay` (a range of
    `exp(g)`), per head and position or per key channel, and a random initial state; float64."""
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, T, Dk, generator=generator, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=generator, dtype=torch.float64)
    low, high = decay
    shape = (B, H, T, Dk) if RULES[rule][2] else (B, H, T)
    g = (low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)).log()
    beta = torch.rand(B, H, T, generator=generator, dtype=torch.float64)
    state = torch.randn(B, H, Dk, Dv, generator=generator, dtype=torch.float64)
    return q, k, v, g, beta, state


def largest_error(got, want):
    return ((got - want).abs().max() / max(1.0, want.abs().max().item())).item() if got.numel() else 0.0


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("T, chunk_size", [(1, 16), (37, 16), (64, 16), (130, 64), (5, 64)])
def test_every_form_equals_the_recurrent_one_outputs_and_state(rule, T, chunk_size):
    function = RULES[rule][0]
    q, k, v, g, beta, state = draw(rule, T=T)
    want, want_state = function(q, k, v, g, beta, form="recurrent", initial_state=state)
    for form in ("chunked", "quadratic"):
        out, final = function(q, k, v, g, beta, form=form, initial_state=state, chunk_size=chunk_size)
        assert largest_error(out, want) <= EXACT and largest_error(final, want_state) <= EXACT, form


@pytest.mark.parametrize("rule", RULES)
def test_every_form_has_the_recurrent_forms_gradients(rule):
    """The gradients of q, k, v, g, beta and the initial state, through the output and the final state."""
    function = RULES[rule][0]
    inputs = draw(rule, T=21)
    weights = torch.Generator().manual_seed(1)
    out_weight, state_weight = (torch.randn(shape, generator=weights, dtype=torch.float64)
                                for shape in ((2, 3, 21, 6), (2, 3, 8, 6)))
    grads = {}
    for form in ("recurrent", "chunked", "quadratic"):
        leaves = [tensor.clone().requires_grad_() for tensor in inputs]
        out, final = function(*leaves[:5], form=form, initial_state=leaves[5], chunk_size=8)
        ((out * out_weight).sum() + (final * state_weight).sum()).backward()
        grads[form] = [leaf.grad for leaf in leaves]
    for form in ("chunked", "quadratic"):
        for name, got, want in zip(("q", "k", "v", "g", "beta", "initial_state"), grads[form], grads["recurrent"]):
            assert largest_error(got, want) <= 1e-11, (form, name)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("decay", [(1e-12, 1e-6), (1 - 1e-9, 1.0), (0.0, 1.0)], ids=["near 0", "near 1", "0 to 1"])
def test_gates_near_0_and_near_1_stay_exact_and_finite(rule, decay):
    """Decays near 0 make a chunk's cumulative log-decay reach thousands below 0: nothing overflows, nothing is NaN."""
    function = RULES[rule][0]
    q, k, v, g, beta, state = draw(rule, T=150, decay=decay)
    want, want_state = function(q, k, v, g, beta, form="recurrent", initial_state=state)
    out, final = function(q, k, v, g, beta, form="chunked", initial_state=state, chunk_size=64)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    assert largest_error(out, want) <= EXACT and largest_error(final, want_state) <= EXACT


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("form", ["recurrent", "chunked", "quadratic"])
def test_two_segments_with_the_state_carried_equal_the_whole(rule, form):
    function = RULES[rule][0]
    q, k, v, g, beta, state = draw(rule, T=50)
    whole, whole_state = function(q, k, v, g, beta, form=form, initial_state=state, chunk_size=16)
    first, middle = function(*(t[:, :, :23] for t in (q, k, v, g, beta)), form=form, initial_state=state, chunk_size=16)
    second, last = function(*(t[:, :, 23:] for t in (q, k, v, g, beta)), form=form, initial_state=middle, chunk_size=16)
    assert largest_error(torch.cat([first, second], dim=2), whole) <= EXACT and largest_error(last, whole_state) <= EXACT


@pytest.mark.parametrize("rule", RULES)
def test_a_sequence_gives_the_same_answer_alone_or_in_a_batch(rule):
    function = RULES[rule][0]
    q, k, v, g, beta, state = draw(rule, B=3, T=40)
    batch, batch_state = function(q, k, v, g, beta, form="chunked", initial_state=state, chunk_size=16)
    alone, alone_state = function(*(t[1:2] for t in (q, k, v, g, beta)), form="chunked", initial_state=state[1:2],
                                  chunk_size=16)
    assert largest_error(alone, batch[1:2]) <= EXACT and largest_error(alone_state, batch_state[1:2]) <= EXACT


@pytest.mark.parametrize("rule", RULES)
def test_decoding_after_a_chunked_prefill_continues_the_sequence(rule):
    """A prompt through the chunked form, then one step per token from its final state: the whole sequence's outputs."""
    function, step, _ = RULES[rule]
    q, k, v, g, beta, state = draw(rule, T=45)
    whole, _ = function(q, k, v, g, beta, form="recurrent", initial_state=state)
    prompt, state = function(*(t[:, :, :40] for t in (q, k, v, g, beta)), form="chunked", initial_state=state,
                             chunk_size=16)
    outs = [prompt]
    for t in range(40, 45):
        out, state = step(q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t], state, 8 ** -0.5)
        outs.append(out[:, :, None])
    assert largest_error(torch.cat(outs, dim=2), whole) <= EXACT


def test_kda_with_every_channel_gated_alike_is_the_gated_delta_rule():
    q, k, v, g, beta, state = draw("gated_delta", T=33)
    for form in ("recurrent", "chunked"):
        want, want_state = gated_delta_rule(q, k, v, g, beta, form=form, initial_state=state, chunk_size=16)
        out, final = kimi_delta_rule(q, k, v, g[..., None].expand(*q.shape), beta, form=form, initial_state=state,
                                     chunk_size=16)
        assert largest_error(out, want) <= EXACT and largest_error(final, want_state) <= EXACT


def test_without_a_decay_or_a_correction_the_state_is_a_sum_of_outer_products():
    """With g = 0 and beta = 1 on orthonormal keys, each key's value is stored and read back exactly: the delta rule
    as an associative memory (a second write under one key replaces the first)."""
    keys = torch.eye(4, dtype=torch.float64)[None, None]  # (1, 1, 4, 4): four orthonormal keys
    values = torch.arange(16, dtype=torch.float64).view(1, 1, 4, 4)
    zeros, ones = torch.zeros(1, 1, 4, dtype=torch.float64), torch.ones(1, 1, 4, dtype=torch.float64)
    _, state = gated_delta_rule(keys, keys, values, zeros, ones, form="chunked", chunk_size=2)
    torch.testing.assert_close(state[0, 0], values[0, 0], rtol=0, atol=1e-15)  # S = sum_t k_t v_tᵀ = V here
    again = torch.cat([keys, keys[:, :, :1]], dim=2), torch.cat([values, -values[:, :, :1]], dim=2)
    _, state = gated_delta_rule(again[0], again[0], again[1], torch.zeros(1, 1, 5, dtype=torch.float64),
                                torch.ones(1, 1, 5, dtype=torch.float64), form="recurrent")
    torch.testing.assert_close(state[0, 0, 0], -values[0, 0, 0], rtol=0, atol=1e-15)  # overwritten, not summed
    assert math.isclose(state[0, 0, 1:].sub(values[0, 0, 1:]).abs().max().item(), 0.0, abs_tol=1e-15)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("change, error, match", [
    (dict(form="parallel"), ValueError, r"form must be one of \('recurrent', 'chunked', 'quadratic'\), got form='parallel'"),
    (dict(chunk_size=0), ValueError, "chunk_size must be a positive int, got chunk_size=0"),
    (dict(g=0.5), ValueError, "g is a log-decay and must be <= 0 .* a largest g of 0.5"),
    (dict(beta=1.5), ValueError, r"beta must lie in \[0, 1\], got values from .* to 1.5"),
    (dict(v_length=5), ValueError, r"q and k must be \(B, H, T, Dk\) and v \(B, H, T, Dv\), got q \(1, 2, 6, 4\)"),
    (dict(state_shape=(1, 2, 3, 3)), ValueError, r"initial_state must be \(B, H, Dk, Dv\) = \(1, 2, 4, 3\), got \(1, 2, 3, 3\)"),
    (dict(dtype=torch.float32), ValueError, "q, k, v, g, beta must share one floating dtype"),
    (dict(q=[1.0]), TypeError, "q must be a torch.Tensor, got list"),
])
def test_bad_input_is_an_error_naming_the_argument(rule, change, error, match):
    function, _, per_channel = RULES[rule]
    q, k, v = torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, change.get("v_length", 6), 3)
    g = torch.full((1, 2, 6, 4) if per_channel else (1, 2, 6), change.get("g", -0.1))
    beta = torch.full((1, 2, 6), change.get("beta", 0.5))
    if "dtype" in change:
        v = v.to(torch.float64)
    state = torch.zeros(change["state_shape"]) if "state_shape" in change else None
    with pytest.raises(error, match=match):
        function(change.get("q", q), k, v, g, beta, form=change.get("form", "chunked"), initial_state=state,
                 chunk_size=change.get("chunk_size", 4))


@pytest.mark.parametrize("rule", RULES)
def test_gates_of_the_wrong_shape_name_the_shape_expected(rule):
    function, _, per_channel = RULES[rule]
    q = torch.zeros(1, 2, 6, 4)
    wrong = torch.zeros(1, 2, 6) if per_channel else torch.zeros(1, 2, 6, 4)
    with pytest.raises(ValueError, match=r"g must be \(B, H, T(, Dk)?\) = "):
        function(q, q, q[..., :3], wrong, torch.zeros(1, 2, 6), form="chunked")
    with pytest.raises(ValueError, match=r"beta must be \(B, H, T\) = \(1, 2, 6\), got beta \(1, 2, 6, 1\)"):
        function(q, q, q[..., :3], torch.zeros(q.shape if per_channel else q.shape[:3]), torch.zeros(1, 2, 6, 1),
                 form="chunked")


def recurrence(q, k, v, decay, beta=None, state=None, scale=None):
    """The definition, written here and not imported: per position, decay the state's rows by `decay[:, :, t]`
    `(B, H, Dk)`, write `k_t v_tᵀ` (or with `beta`, the delta rule's correction), read `Sᵀ (scale q_t)`."""
    B, H, T, Dk = q.shape
    state = torch.zeros(B, H, Dk, v.shape[-1], dtype=q.dtype) if state is None else state
    scale, outs = Dk ** -0.5 if scale is None else scale, []
    for t in range(T):
        state = decay[:, :, t, :, None] * state
        write = v[:, :, t] if beta is None else beta[:, :, t, None] * (v[:, :, t] - (k[:, :, t, :, None] * state).sum(-2))
        state = state + k[:, :, t, :, None] * write[:, :, None, :]
        outs.append((scale * q[:, :, t, :, None] * state).sum(-2))
    return torch.stack(outs, dim=2), state


def ladder(name, q, k, v, g, beta, state, form):
    """`(package's (out, state), the definition's (out, state))` of one rung, from per-channel gates `g`."""
    B, H, T, Dk = q.shape
    rule = {"retention": lambda: (retention(q, k, v, g[0, :, 0, 0], form=form, initial_state=state, chunk_size=16),
                                  g[0, :, 0, 0][None, :, None, None].expand(B, H, T, Dk)),
            "ssd": lambda: (ssd(q, k, v, g[..., 0], form=form, initial_state=state, chunk_size=16),
                            g[..., :1].expand(B, H, T, Dk)),
            "gla": lambda: (gated_linear_attention(q, k, v, g, form=form, initial_state=state, chunk_size=16), g),
            "delta": lambda: (delta_rule(q, k, v, beta, form=form, initial_state=state, chunk_size=16), g * 0),
            "gated_delta": lambda: (gated_delta_rule(q, k, v, g[..., 0], beta, form=form, initial_state=state,
                                                     chunk_size=16), g[..., :1].expand(B, H, T, Dk)),
            "kimi_delta": lambda: (kimi_delta_rule(q, k, v, g, beta, form=form, initial_state=state, chunk_size=16), g)}
    got, used = rule[name]()
    return got, recurrence(q, k, v, used.exp(), beta if "delta" in name else None, state)


@pytest.mark.parametrize("name", ["retention", "ssd", "gla", "delta", "gated_delta", "kimi_delta"])
@pytest.mark.parametrize("form", ["recurrent", "chunked", "quadratic"])
def test_each_rung_of_the_ladder_is_its_definition_in_every_form(name, form):
    q, k, v, g, beta, state = draw("kimi_delta", T=35)
    if name == "retention":  # one decay per head, the same at every batch element, position and channel
        g = g[:1, :, :1, :1].expand_as(g)
    (out, final), (want, want_state) = ladder(name, q, k, v, g, beta, state, form)
    assert largest_error(out, want) <= EXACT and largest_error(final, want_state) <= EXACT


def test_retnets_decays_and_the_rungs_own_steps():
    torch.testing.assert_close(retnet_log_decays(3).exp(), torch.tensor([1 - 2**-5, 1 - 2**-6, 1 - 2**-7], dtype=torch.float64))
    q, k, v, g, beta, state = draw("kimi_delta", T=2)
    for step, gate, function in [(ssd_step, g[..., 0], lambda: ssd(q, k, v, g[..., 0], form="recurrent", initial_state=state)),
                                 (gated_linear_step, g, lambda: gated_linear_attention(q, k, v, g, form="recurrent",
                                                                                      initial_state=state))]:
        out, after = step(q[:, :, 0], k[:, :, 0], v[:, :, 0], gate[:, :, 0], state, 8 ** -0.5)
        out2, after2 = step(q[:, :, 1], k[:, :, 1], v[:, :, 1], gate[:, :, 1], after, 8 ** -0.5)
        whole, whole_state = function()
        assert largest_error(torch.stack([out, out2], dim=2), whole) <= EXACT
        assert largest_error(after2, whole_state) <= EXACT
    with pytest.raises(ValueError, match=r"log_decay must be a \(H,\) = \(3,\) tensor, got \(2,\)"):
        retention(q, k, v, torch.zeros(2, dtype=torch.float64), form="chunked")
    with pytest.raises(TypeError, match="beta must be a torch.Tensor, got float"):
        delta_rule(q, k, v, 0.5, form="chunked")
