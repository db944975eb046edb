"""The prefill sweep: a whole prompt through one multi-head latent attention layer, on each of its two paths.

MLA (DeepSeek-V2/V3, `attention/models/deepseek_v3.py`) attends either by expanding every latent to each head's
keys and values (`naive`) or over the latent itself, the up-projections folded into the query and the output
(`absorbed`). A decode step (the decode sweep) brings one token, and absorption saves expanding the whole cache
for it; a prefill brings `T` tokens at once: the naive path expands each latent once for all of them, while the
absorbed path's scores and weighted sums run over the latent (4.5 head sizes wide at DeepSeek-V3's widths)
instead of a head's keys (1.5) and values (1). For each prompt length and path, the sweep times one causal forward
of `tokens` tokens (`batch` sequences, no cache), checks batch element 0 against the float64 reference written
from the paper (`attention.reference.reference_latent_attention`), and counts its matmul FLOPs
(`attention.models.deepseek_v3.latent_attention_flops`) as TFLOP/s and as a share of a matmul timed beside it.
"""

import dataclasses
from typing import Annotated

import torch

from attention.bench import core
from attention.bench.results import BYTES, MAX_ROWS, POSITIVE, disordered, mismatches, new_row
from attention.schema import config_problems, field_rules, in_range, integer, list_of, one_of, record, rule_of
from attention.models.deepseek_v3 import PATHS, LATENT_NORM_EPS, DeepseekV3Attention, latent_attention_flops, latent_config
from attention.reference import randomised_parameters, reference_latent_attention, tolerance

NAME = "prefill"
KEY = ("path", "tokens")  # what tells a row apart in its section


@dataclasses.dataclass
class Config:
    """What to measure: MLA at `num_heads` heads of `head_dim` (DeepSeek-V3's other widths in head sizes,
    `attention.models.deepseek_v3.latent_config`), each of `paths` on prompts of each of `tokens` tokens, batch
    `batch`; timing per row; the paired matmul's side (default 2048 on CPU, 4096 elsewhere)."""

    OPTIONS = {"seq_lens": "tokens", "sweep_batch": "batch"}  # the command line's --seq-lens and --sweep-batch

    num_heads: Annotated[int, POSITIVE] = 32
    head_dim: Annotated[int, POSITIVE] = 128
    paths: Annotated[tuple, list_of(one_of(*PATHS), 2)] = PATHS
    tokens: Annotated[tuple, list_of(POSITIVE, 64)] = (128, 256, 512, 1024, 2048)
    batch: Annotated[int, POSITIVE] = 1
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 1.0
    min_repeats: Annotated[int, POSITIVE] = 3
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.25
    matmul_size: Annotated[int | None, POSITIVE] = None
    memory_budget_bytes: Annotated[int | None, BYTES] = None

    def resolve(self, device):
        """A copy with the lengths sorted and the device's defaults filled in; `ValueError` naming a bad value."""
        latent_config(self.num_heads, self.head_dim)  # `ValueError` for a head size MLA cannot split
        resolved = dataclasses.replace(
            self, paths=tuple(self.paths), tokens=tuple(sorted(self.tokens)),
            matmul_size=self.matmul_size or (2048 if torch.device(device).type == "cpu" else 4096),
            memory_budget_bytes=self.memory_budget_bytes or core.memory_budget(device))
        problems = config_problems(resolved) + [f"{name}: must not be empty" for name in ("paths", "tokens")
                                                 if not getattr(resolved, name)]
        if problems:
            raise ValueError("; ".join(problems))
        return resolved


class Row(core.Measured, core.PairedMatmul):
    """One path on one prompt length: a causal forward over the whole prompt, no cache."""

    path: Annotated[str, one_of(*PATHS), '`"absorbed"` (attention over the latent, the up-projections folded into the '
                    'query and the output) or `"naive"` (the latent expanded to keys and values, then SDPA).']
    tokens: Annotated[int, POSITIVE, "T: the prompt's tokens, every one a query over itself and those before it."]
    batch: Annotated[int, POSITIVE, "B."]
    num_heads: Annotated[int, POSITIVE, "H."]
    head_dim: Annotated[int, POSITIVE, "The head size the widths are counted in (`latent_config`)."]
    flops: Annotated[int, integer(), "`batch × latent_attention_flops(config, tokens, tokens, path)`: the path's "
                     "matmuls, the scores counted whole (T × T) as both paths compute them."]


def row_flops(row):
    return row["batch"] * latent_attention_flops(latent_config(row["num_heads"], row["head_dim"]), row["tokens"],
                                                 row["tokens"], row["path"])


def run(config, envelope):
    config = config.resolve(envelope.device)
    device, dtype = envelope.device, envelope.dtype
    header = {key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()}
    section = envelope.open(NAME, header | {"rows": []}, len(config.paths) * len(config.tokens))
    yardstick = core.matmul_yardstick(device, dtype, config.matmul_size)
    torch.manual_seed(config.seed)
    modules = {path: randomised_parameters(DeepseekV3Attention.from_config(
        latent_config(config.num_heads, config.head_dim), path=path), config.seed).to(device, dtype).eval()
        .requires_grad_(False) for path in config.paths}  # the same weights on both paths
    for tokens in config.tokens:
        for row in length_rows(config, modules, tokens, envelope, yardstick):
            envelope.add(section["rows"], row, f"prefill MLA {row['path']} T={tokens}")
        core.release(device)


def length_rows(config, modules, tokens, envelope, yardstick):
    """Both paths' rows at one prompt length, checked against one float64 reference."""
    H, D = config.num_heads, config.head_dim
    c = latent_config(H, D)
    x = torch.randn(config.batch, tokens, c["hidden_size"], generator=torch.Generator().manual_seed(config.seed + 1))
    x = x.to(envelope.device, envelope.dtype)
    # The reference's float64 scores and weights (H x T x T each), and a path's scores in the run's dtype per sequence.
    needed = 2 * H * tokens**2 * 8 + config.batch * H * tokens**2 * x.element_size() * 2
    skip = core.over_budget(needed, config.memory_budget_bytes, "the float64 reference's and the path's scores")
    expected = None
    for path, module in modules.items():
        row = new_row(Row, path=path, tokens=tokens, batch=config.batch, num_heads=H, head_dim=D, status="ok",
                      tolerance=tolerance(envelope.device, envelope.result["dtype"]))
        row["flops"] = row_flops(row)
        if skip:
            row.update(status="skipped", reason=skip)
            yield row
            continue
        if expected is None:  # from the weights as rounded to the run's dtype (both paths hold the same)
            state = {name: tensor.to("cpu") for name, tensor in module.state_dict().items()}
            expected = reference_latent_attention(x[:1].cpu(), state, H, c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                                  c["v_head_dim"], c["rope_theta"], c["rope_scaling"],
                                                  norm_eps=LATENT_NORM_EPS)[0][0]  # (T, hidden_size)

        def call(module=module):
            with torch.no_grad():
                return module(x)
        try:
            row.update(core.measure(call, lambda out: core.compared(out[0], expected, row["tolerance"]),
                                    envelope.device, config, yardstick))
            row.update(core.matmul_rates(row))
        except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
            core.failed(row, error)
        yield row


SECTION = record(field_rules(Config) | {"rows": list_of(rule_of(Row), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each row's FLOPs, rates and shares recomputed from its own numbers."""
    problems = SECTION(section, NAME) or ([] if section["rows"] else ["prefill.rows: none"])
    for index, row in enumerate([] if problems else section["rows"]):
        where = f"prefill.rows[{index}] ({row['path']}, T={row['tokens']})"
        expected = {"flops": row_flops(row)}
        if row["status"] == "ok":
            if disordered(where, row):
                problems += disordered(where, row)
                continue
            expected |= core.matmul_rates(row)
        problems += mismatches(where, row, expected)
    return problems
