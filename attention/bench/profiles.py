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
    # One H100 or H200: the attention kernels alone on prompts (T 512 to 16k, 16k tokens per batch, head dim 64 and 128,
    # causal or not, forward and backward), then decoding over 1k to 128k cached positions at batch 1 to 64.
    "gpu": {"kernels": dict(seq_lens=(512, 2048, 8192, 16384)),
            "decode": dict(models=("GQA", "MHA", "MQA", "MLA"), contexts=(1024, 16384, 131072), batches=(1, 8, 64),
                           min_run_time=0.2, min_repeats=3, warmup_time=0.05)},
}
DTYPES = {"gpu": "bfloat16"}  # a profile's dtype where --dtype is not given (else float32)
# `--dry-run`: every case of a profile at tiny sizes (these, over its preset) on the CPU (the Triton kernel through its
# interpreter), recorded as profile "<name>_dry_run", so a profile meant for a GPU runs in the tests and cannot rot.
DRY_RUN = {"gpu": {"kernels": dict(seq_lens=(130,), tokens=260, width=64, head_dims=(32,), check_len=131, matmul_size=128,
                                   tiled_max_len=130,
                                   min_run_time=0.01, min_repeats=2, warmup_time=0.0),
                   "decode": dict(num_heads=8, head_dim=16, contexts=(64,), batches=(1, 2), min_run_time=0.01,
                                  min_repeats=2, warmup_time=0.0, bandwidth_bytes=2**20, ceiling_bytes=(2**20,),
                                  matmul_size=128)}}
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


def plan(profile, options, dry_run=False):
    """The `Plan` of `profile`, `options` ({option or field: value}, None: not given) over its preset (its `DRY_RUN`
    sizes with `dry_run`); configs not yet resolved (`Config.resolve(device)` checks them)."""
    from attention.bench import SWEEPS

    if profile not in profiles():
        raise ValueError(f"profile must be one of {', '.join(profiles())}, got profile={profile!r}")
    if dry_run and profile not in DRY_RUN:
        raise ValueError(f"--dry-run: profile {profile!r} has no dry run; the profiles with one: {', '.join(DRY_RUN)}")
    name = "custom" if profile == "default" and any(options.get(key) is not None for key in SIZE_OPTIONS) else profile
    name, planned = name + "_dry_run" if dry_run else name, []
    for sweep_name, preset in profiles()[profile].items():
        sweep = SWEEPS[sweep_name]
        fields = {field.name: field for field in dataclasses.fields(sweep.Config)}
        chosen = preset | (DRY_RUN[profile][sweep_name] if dry_run else {})
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
