"""The fastest of several correct ways to run a step, measured on the machine that runs it, once per shape class.

Where a step has several correct implementations (SDPA or the grouped matmuls over a cache, a plain or a row-split
projection), which is faster depends on the CPU, its BLAS and the shapes: the rule tuned on an AMD EPYC (the grouped
matmuls and the row split for every decoding step on a CPU) made a multi-head step over 16k positions 1.7x slower than
plain SDPA on an Intel Xeon with AMX. So `"auto"` does not guess: on the first call of a
shape class it times each candidate a few calls on the call's own inputs and keeps the winner for the process, as
cuDNN's benchmark mode and Triton's autotuner do. Every candidate computes the same function, so the choice changes
the speed, not the result beyond rounding.

`ATTENTION_TUNING=off` turns the timing off for reproducible runs: each step then takes the fixed rule its caller
names (the choice measured on the machine the project was tuned on). Imports only torch.
"""

import os
import statistics
import time

import torch

TUNING_ENV = "ATTENTION_TUNING"
TUNING_MODES = ("measure", "off")
TIMED_CALLS = 5  # per candidate at least, after one untimed call; interleaved, so a drift of the machine hits every candidate
# Short calls are timed more often: rounds go on until they have taken TIMING_SECONDS in all (at most MAX_ROUNDS). Five
# calls each of a 4 ms projection once chose the plain product for a batch-1 step that the row split ran 1.16x faster.
TIMING_SECONDS = 0.1
MAX_ROUNDS = 50

_chosen = {}  # shape class -> the candidate's name, for this process


def tuning_mode():
    """`os.environ[TUNING_ENV]`, `"measure"` when unset; `ValueError` naming it and the valid values otherwise."""
    mode = os.environ.get(TUNING_ENV, "measure")
    if mode not in TUNING_MODES:
        raise ValueError(f"{TUNING_ENV} must be one of {TUNING_MODES}, got {TUNING_ENV}={mode!r}")
    return mode


def fastest(shape_class, candidates, rule):
    """The name of the fastest of `candidates` (`{name: call}`, each call a zero-argument function computing the
    same result), timed on the first use of `shape_class` (a hashable key) and remembered for the process.

    `rule`: the name taken without timing, when tuning is off (`TUNING_ENV`) or while `torch.compile` traces. A
    candidate that fails while timed (out of memory, a kernel the device lacks) is left out; if every one fails,
    `rule` is taken, and the caller's own call raises the error.
    """
    if tuning_mode() == "off" or torch.compiler.is_compiling():
        return rule
    if shape_class not in _chosen:
        _chosen[shape_class] = time_candidates(candidates) or rule
    return _chosen[shape_class]


def time_candidates(candidates):
    """The name of the candidate with the smallest median of its timed calls, or None if every one failed: at least
    `TIMED_CALLS` rounds of one call each, and more until the rounds have taken `TIMING_SECONDS` (`MAX_ROUNDS` at most)."""
    samples, spent = {}, 0.0
    with torch.no_grad():  # timing only: no graph kept, whatever the caller records
        for name, call in candidates.items():
            try:
                timed_call(call)  # the first call pays for allocations and a kernel's one-time set-up
                samples[name] = []
            except (RuntimeError, MemoryError):  # this candidate cannot run here: the others still can
                continue
        names, round_ = list(samples), 0
        while names and (round_ < TIMED_CALLS or spent < TIMING_SECONDS and round_ < MAX_ROUNDS):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:  # each round starts one later
                samples[name].append(timed_call(candidates[name]))
                spent += samples[name][-1]
            round_ += 1
    return min(samples, key=lambda name: statistics.median(samples[name]), default=None)


def timed_call(call):
    """Seconds one `call()` takes, its device's queued work included."""
    start = time.perf_counter()
    result = call()
    if result.device.type == "cuda":  # pragma: no cover (cuda: a GPU runs the call after it returns)
        torch.cuda.synchronize(result.device)
    return time.perf_counter() - start


def chosen():
    """`{shape class: name}` of every choice made so far in this process (what a benchmark records)."""
    return dict(_chosen)


def forget_choices():
    """Forget every choice, so the next call of each shape class times its candidates again."""
    _chosen.clear()
