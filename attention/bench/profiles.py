"""The profiles: plain presets naming the sweeps a run measures and the sizes they change from the defaults.
`--profile NAME` runs one; a sweep no preset runs alone is a profile of its name. A command-line option sets the
field of its name (or the one `Config.OPTIONS` maps it to) in every sweep of the profile that has it."""

import dataclasses
from typing import NamedTuple

from attention.bench.sweeps import sequence

LONG_SEQ_LENS = tuple(2**i for i in range(7, 15))  # 128 .. 16384
LONG_TIMING = dict(min_run_time=0.5, min_repeats=3, warmup_time=0.1)
PRESETS = {
    "default": {"sequence": {}},  # GPT-2 small: B=8, T=1024, then T = 128 .. 4096 (CPU) at batch 1
    # What the docs build runs on 2 CPU cores: batch 1, T = 256, 512, 1024 (the last the headline), short timing.
    "quick": {"sequence": dict(batch=1, seq_len=1024, sweep_batch=1, seq_lens=(256, 512, 1024), min_run_time=0.1,
                               min_repeats=3, warmup_time=0.05)},
    # Memory against T to 16k for the naive, tiled and fused classes, then block sparsity at the same lengths.
    "long": {"sequence": dict(batch=1, seq_len=LONG_SEQ_LENS[0], sweep_batch=1, seq_lens=LONG_SEQ_LENS,
                              implementations=("split_heads", "tiled", "sdpa_causal"), **LONG_TIMING),
             "block_sparse": dict(seq_lens=LONG_SEQ_LENS, **LONG_TIMING)},
    # MHA, GQA (8:1), MQA, 8 layers of model families and MLA (absorbed, naive), 32 heads of 128, batch 1 and 8, 1k .. 32k
    "decode": {"decode": {}},
}
# Options that change what the default profile measures: its run is then recorded as profile "custom".
SIZE_OPTIONS = ("batch", "seq_len", "seq_lens", "sweep_batch", "d_model", "d_in", "num_heads", "min_run_time",
                "min_repeats")


class Plan(NamedTuple):
    profile: str  # the name recorded in the results file
    sweeps: list  # [(sweep module, its Config)], in the order they run


def profiles():
    """Every profile: the presets, and each sweep that no preset runs alone, under its own name."""
    from attention.bench import SWEEPS

    alone = {name for preset in PRESETS.values() for name in preset if len(preset) == 1}
    return PRESETS | {name: {name: {}} for name in SWEEPS if name not in alone}


def plan(profile, options):
    """The `Plan` of `profile`, `options` ({option or field: value}, None: not given) over its preset; configs not yet
    resolved (`Config.resolve(device)` checks them)."""
    from attention.bench import SWEEPS

    if profile not in profiles():
        raise ValueError(f"profile must be one of {', '.join(profiles())}, got profile={profile!r}")
    name = "custom" if profile == "default" and any(options.get(key) is not None for key in SIZE_OPTIONS) else profile
    planned = []
    for sweep_name, preset in profiles()[profile].items():
        sweep = SWEEPS[sweep_name]
        fields, chosen = {field.name: field for field in dataclasses.fields(sweep.Config)}, dict(preset)
        for option, value in options.items():
            field = getattr(sweep.Config, "OPTIONS", {}).get(option, option)
            if value is not None and field in fields:
                scalar = isinstance(fields[field].default, tuple) and not isinstance(value, (tuple, list))
                chosen[field] = (value,) if scalar else value
        planned.append((sweep, sweep.Config(**chosen | ({"profile": name} if "profile" in fields else {}))))
    return Plan(name, planned)


def quick_config(**overrides):
    """The quick profile's sequence config, with `overrides` (its field names)."""
    return sequence.Config(**PRESETS["quick"]["sequence"] | {"profile": "quick"} | overrides)
