"""The sparse sweep: DeepSeek sparse attention (DSA) against dense latent attention, by prompt length and by cached
context, with the indexer's own cost apart.

The attention of one DeepSeek-V3.2 layer (`attention.models.deepseek_v32`), from its heads' queries and the cache on:
the projections are left out (they cost the same whichever way the layer attends). Kernels (`kernel`):

* `gather`: DSA's gather form, the layer's own: the indexer scores every visible position, keeps the `top_k` highest
  per query, and MLA attends over those only (absorbed, queries in blocks);
* `indexer`: the same indexer and top-k alone, in the same blocks: what the gather form pays to choose;
* `mask`: DSA as transformers runs it: the same choice, then dense attention with the rest masked out (to
  `mask_max_len`: its `(B, H, T, S)` scores);
* `absorbed`: dense MLA on the absorbed path, the DeepSeek-V3 layer's own (its `(B, H, T, S)` scores in memory);
* `sdpa`: dense MLA through SDPA's fused kernel, each part the way it costs least (as DeepSeek's own code runs them):
  a prompt in MHA mode, every head's keys and values decompressed from the latent (`kv_b_proj`), `Dn + Dr` wide keys
  and `Dv` values padded with zeros to the keys' width (SDPA's CPU kernel takes one width; values of another send it to
  the math path, which writes every score); a decode step in MQA mode, the absorbed query against the latent and
  rotary key, one K/V head read by every query head, the values the keys' first `kv_lora_rank` features (as FlashMLA
  lays them out). Either way the query heads go in groups (`SDPA_GROUP_ELEMENTS`), so that a long prompt fits in memory.

Two parts (`part`): `prefill`, a causal prompt of `T` tokens; `decode`, one new token after `T` cached positions.
Each row is first checked on a short sequence of tokens (`check_len`) against float64 (`attention.reference`: the
indexer's choice query by query, `reference_indexer_selection`, and the layer's output over the chosen or all
positions, `reference_latent_attention`), then timed on inputs of its own shape beside a dense matmul of side
`matmul_size`. FLOPs count the matmuls' multiply-adds times 2 (`row_flops`): per query and visible position, the
indexer `2 Hi (Di + 1)`, attention `2 H (2 Dc + Dr)` over every position (dense) or over the chosen ones (DSA), and the
absorption of `W^UK` and `W^UV` `2 H Dc (Dn + Dv)` per query; a prompt through `sdpa` instead `2 H (Dn + Dr + W)` per
visible pair (`W` the padded values' width) and the decompression `2 H Dc (Dn + Dv)` per position.
"""

import dataclasses
from typing import Annotated

import torch
import torch.nn.functional as F

from attention.bench import core
from attention.bench.results import BYTES, MAX_ROWS, POSITIVE, new_row
from attention.models.deepseek_v32 import DeepseekV32Attention, index_scores, query_blocks, top_k_positions
from attention.reference import reference_indexer_selection, reference_latent_attention, tolerance
from attention.schema import config_problems, field_rules, in_range, integer, list_of, nullable, one_of, record, rule_of

NAME = "sparse"
KEY = ("part", "kernel", "seq_len")  # what tells a row apart in its section
PARTS = ("prefill", "decode")
KERNELS = ("gather", "indexer", "mask", "absorbed", "sdpa")
DENSE = ("absorbed", "sdpa")
# DeepSeek-V3.2's attention widths (its config.json); the heads are the sweep's (`num_heads`, `index_n_heads`).
WIDTHS = dict(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, index_head_dim=128)
ROPE_THETA = 10000.0
SDPA_GROUP_ELEMENTS = 1 << 28  # `sdpa`: query heads go to SDPA in groups of about this many (B, h, T, Dc+Dr) elements


@dataclasses.dataclass
class Config:
    """What to measure (see the module docstring): batch `batch`, `num_heads` query heads, the indexer's
    `index_n_heads` and `top_k` (DeepSeek-V3.2's 128, 64 and 2,048 by default); the prompts' `seq_lens`, the decode's
    `contexts`; timing per row; the paired matmul's side (default 1024 on CPU, 8192 on CUDA)."""

    OPTIONS = {"sweep_batch": "batch", "heads": "num_heads"}  # the command line's --seq-lens sets `seq_lens`

    parts: Annotated[tuple, list_of(one_of(*PARTS), 2)] = PARTS
    kernels: Annotated[tuple, list_of(one_of(*KERNELS), 5)] = KERNELS
    batch: Annotated[int, POSITIVE] = 1
    num_heads: Annotated[int, POSITIVE] = 128
    index_n_heads: Annotated[int, POSITIVE] = 64
    top_k: Annotated[int, POSITIVE] = 2048
    # A 32k prompt takes minutes a call on 2 cores (SDPA's about five, the gather form's about four) and a row makes
    # about five calls: the longest of the profiles (`--seq-lens` picks fewer).
    seq_lens: Annotated[tuple, list_of(POSITIVE, 16)] = (1024, 2048, 4096, 8192, 16384, 32768)
    contexts: Annotated[tuple, list_of(POSITIVE, 16)] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    mask_max_len: Annotated[int, POSITIVE] = 2048
    check_len: Annotated[int, POSITIVE] = 32
    check_top_k: Annotated[int, POSITIVE] = 8
    seed: Annotated[int, integer(0, 2**63)] = 0
    min_run_time: Annotated[float, in_range(0, 1e4)] = 0.5
    min_repeats: Annotated[int, POSITIVE] = 2
    warmup_time: Annotated[float, in_range(0, 1e4)] = 0.1
    matmul_size: Annotated[int | None, POSITIVE] = None
    memory_budget_bytes: Annotated[int | None, BYTES] = None

    def resolve(self, device):
        """A copy with the lengths sorted and the device's defaults filled in; `ValueError` naming a bad value."""
        resolved = dataclasses.replace(
            self, parts=tuple(self.parts), kernels=tuple(self.kernels), seq_lens=tuple(sorted(self.seq_lens)),
            contexts=tuple(sorted(self.contexts)),
            matmul_size=self.matmul_size or (8192 if torch.device(device).type == "cuda" else 1024),
            memory_budget_bytes=self.memory_budget_bytes or core.memory_budget(device))
        problems = config_problems(resolved) + [f"{name}: must not be empty" for name in (
            "parts", "kernels", "seq_lens", "contexts") if not getattr(resolved, name)]
        if resolved.check_top_k >= resolved.check_len:
            problems.append(f"check_top_k: must be below check_len {resolved.check_len} (the check must choose), got "
                            f"{resolved.check_top_k}")
        if problems:
            raise ValueError("; ".join(problems))
        return resolved


class Row(core.Measured, core.PairedMatmul):
    """One part, kernel and length."""

    part: Annotated[str, one_of(*PARTS), '`"prefill"` (a causal prompt) or `"decode"` (one token after a cached '
                    'context).']
    kernel: Annotated[str, one_of(*KERNELS), "DSA's gather form (`gather`), its indexer and top-k alone (`indexer`), "
                      "DSA as a mask over dense attention (`mask`), dense latent attention on the absorbed path "
                      "(`absorbed`) or through SDPA's kernel (`sdpa`)."]
    batch: Annotated[int, POSITIVE, "B."]
    num_heads: Annotated[int, POSITIVE, "H, query heads (one latent K/V head for all)."]
    index_n_heads: Annotated[int, POSITIVE, "Hi, the indexer's heads."]
    top_k: Annotated[int, POSITIVE, "Positions each query attends to under DSA."]
    seq_len: Annotated[int, POSITIVE, "The prompt's tokens, or decoding, the positions cached before the new token."]
    flops: Annotated[int, integer(), "The matmuls' multiply-adds times 2 (`row_flops`)."]
    memory_bytes: Annotated[int | None, nullable(BYTES), "Decoding: the cache bytes the step reads at least (the "
                            "latent and rotary key of every position for dense attention; the indexer's key of every "
                            "position, and DSA the latent and rotary key of its chosen ones); null for a prompt."]
    tokens_per_s: Annotated[float | None, in_range(0, 1e15), "`B x tokens / ms_median`: a prompt's tokens, or the "
                            "one new token of each sequence."]


def visible_pairs(part, T):
    """(query, position) pairs a causal call sees: a prompt's `T (T + 1) / 2`, a decode step's `T + 1`."""
    return T * (T + 1) // 2 if part == "prefill" else T + 1


def queries_positions(part, T):
    """`(queries, positions)` of a call: a prompt's `T` over `T`, a decode step's one over `T + 1`."""
    return (1, T + 1) if part == "decode" else (T, T)


def chosen_pairs(part, T, top_k):
    """Pairs DSA attends to: each query's visible positions, at most `top_k` of them."""
    if part == "decode":
        return min(top_k, T + 1)
    full = min(top_k, T)  # queries 1 .. top_k see themselves and everything before; the rest keep top_k
    return full * (full + 1) // 2 + (T - full) * top_k


def row_flops(row):
    B, H, Hi, T, k = row["batch"], row["num_heads"], row["index_n_heads"], row["seq_len"], row["top_k"]
    Dc, Dr, Dn, Dv, Di = (WIDTHS[name] for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                                    "v_head_dim", "index_head_dim"))
    part, kernel = row["part"], row["kernel"]
    queries = T if part == "prefill" else 1
    indexer = 2 * B * Hi * visible_pairs(part, T) * (Di + 1)
    if kernel == "indexer":
        return indexer
    absorb = 2 * B * H * queries * Dc * (Dn + Dv)
    if kernel == "sdpa" and part == "prefill":  # MHA mode: the latent decompressed, then attention at head width
        return 2 * B * H * visible_pairs(part, T) * (Dn + Dr + max(Dn + Dr, Dv)) + absorb
    pairs = chosen_pairs(part, T, k) if kernel == "gather" else visible_pairs(part, T)
    attention = 2 * B * H * pairs * (2 * Dc + Dr) + absorb
    return attention + (indexer if kernel in ("gather", "mask") else 0)


def row_memory_bytes(row, element):
    """Decoding: the cache bytes a step reads at least (see `Row.memory_bytes`)."""
    B, T, k = row["batch"], row["seq_len"] + 1, row["top_k"]
    latent = WIDTHS["kv_lora_rank"] + WIDTHS["qk_rope_head_dim"]
    index = B * T * WIDTHS["index_head_dim"] * element
    if row["kernel"] in DENSE:
        return B * T * latent * element
    if row["kernel"] == "indexer":
        return index
    return index + B * (min(k, T) if row["kernel"] == "gather" else T) * latent * element


def row_peak_bytes(row, element):
    """The most memory a row's call holds at once, about (its `part`, `kernel`, `batch`, `num_heads`, `index_n_heads`,
    `seq_len`; elements of `element` bytes): its inputs (`core_inputs`), the cache's rows twice (the gathered or
    concatenated copies), the queries folded into the latent (`(B, H, T, Dc)`; SDPA's a head group at a time,
    `SDPA_GROUP_ELEMENTS`, five such tensors for a prompt's decompressed heads), the outputs twice (the groups and
    their concatenation), and the dense paths' `(B, H, T, S)` float32 scores four times over (logits, mask, softmax,
    its copy). The gather form holds less (its queries a block at a time): an upper bound there."""
    Dn, Dr, Dc, Dv, Di = (WIDTHS[name] for name in ("qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank",
                                                    "v_head_dim", "index_head_dim"))
    B, H, Hi, T, kernel = row["batch"], row["num_heads"], row["index_n_heads"], row["seq_len"], row["kernel"]
    queries, positions = queries_positions(row["part"], T)
    inputs = B * queries * (H * (Dn + Dr) + Hi * (Di + 1)) + B * positions * (Dc + Dr + Di)
    cache_copies = 2 * B * positions * (Dc + Dr + Di)
    sdpa_group = (5 if row["part"] == "prefill" else 3) * SDPA_GROUP_ELEMENTS
    latent_queries = sdpa_group if kernel == "sdpa" else B * H * queries * Dc * (kernel != "indexer")
    outputs = 2 * B * H * queries * Dv * (kernel != "indexer")
    dense_scores = 4 * B * H * queries * positions * 4 if kernel in ("absorbed", "mask") else 0
    return (inputs + cache_copies + latent_queries + outputs) * element + dense_scores


def build(config, top_k, device, dtype, sparse="gather"):
    """A DeepSeek-V3.2 layer at the sweep's heads and DeepSeek-V3.2's widths, in the form `sparse`, random weights from
    `config.seed` (the same whatever the form). The model's width and the compressed query's only size projections the
    sweep leaves out: small here."""
    H = config.num_heads
    layer_config = dict(model_type="deepseek_v32", hidden_size=256, num_attention_heads=H, q_lora_rank=64,
                        index_n_heads=config.index_n_heads, index_topk=top_k, rope_theta=ROPE_THETA, **WIDTHS)
    torch.manual_seed(config.seed)
    return DeepseekV32Attention.from_config(layer_config, 0, sparse=sparse).to(device, dtype).eval()


def core_inputs(module, shape, seed, device, dtype):
    """`(q_nope, q_rope, latent, k_rope, index_q, index_k, index_w)` for `shape` `(B, T, S)`: `T` queries over `S`
    positions in each of `B` sequences, drawn from `seed` on the CPU: the shapes the layer's attention takes after its
    projections (latent RMS-normalised)."""
    (B, T, S), H, Hi = shape, module.num_heads, module.indexer.n_heads
    generator = torch.Generator().manual_seed(seed)
    Dn, Dr, Dc, Di = module.qk_nope_head_dim, module.qk_rope_head_dim, module.kv_lora_rank, module.indexer.head_dim
    shapes = [(B, H, T, Dn), (B, H, T, Dr), (B, 1, S, Dc), (B, 1, S, Dr), (B, Hi, T, Di), (B, S, Di), (B, T, Hi)]
    tensors = [torch.randn(*shape, generator=generator) for shape in shapes]
    tensors[2] = F.normalize(tensors[2], dim=-1) * Dc ** 0.5
    tensors[6] = tensors[6] * (Hi * Di) ** -0.5
    return tuple(tensor.to(device, dtype) for tensor in tensors)


def causal_mask(T, S, device):
    """The `(T, S)` mask of `T` queries at the last positions of `S` (True = visible)."""
    return torch.arange(S - T, S, device=device)[:, None] >= torch.arange(S, device=device)[None, :]


def choose(module, index_q, index_k, index_w, top_k, causal):
    """The indexer's choice in the gather form's query blocks (`attend_gathered`'s): `(indices, valid)`, each
    `(B, T, k)`."""
    blocks = query_blocks(index_q.shape[2], index_k.shape[1], max(index_q.shape[1], module.num_heads))
    chosen = [top_k_positions(index_scores(index_q[:, :, rows], index_k, index_w[:, rows]), top_k, causal[rows])
              for rows in blocks]
    return tuple(torch.cat(parts, dim=1) for parts in zip(*chosen))


def attend(kernel, module, tensors):
    """The row's computation on `tensors` (`core_inputs`, or `attention_inputs` of tokens): each query's attention
    output `(B, H, T, Dv)`; the indexer alone, the positions it keeps `(B, T, k)`. `module` is built in the row's form
    (`build`): DSA's two forms are its own `attend`."""
    q_nope, q_rope, latent, k_rope, index_q, index_k, index_w = tensors
    T, S = q_nope.shape[2], latent.shape[2]
    causal = causal_mask(T, S, q_nope.device)
    if kernel in ("gather", "mask"):
        return module.attend(*tensors)
    if kernel == "indexer":
        return choose(module, index_q, index_k, index_w, module.index_topk, causal)[0]
    if kernel == "absorbed":
        return module.attend_absorbed(q_nope, q_rope, latent, k_rope, causal if T > 1 else None)
    return (sdpa_heads if T > 1 else sdpa_latent)(module, q_nope, q_rope, latent, k_rope)  # sdpa


def sdpa_heads(module, q_nope, q_rope, latent, k_rope):
    """A causal prompt through SDPA in MHA mode: each head's keys and values decompressed from the latent, the rotary
    key shared, the values padded with zeros to the keys' width (one width for SDPA's CPU kernel, the padding cut
    from the output), the query heads in groups (`SDPA_GROUP_ELEMENTS`). `(B, H, T, Dn)`, `(B, H, T, Dr)`,
    `(B, 1, T, Dc)`, `(B, 1, T, Dr)` -> `(B, H, T, Dv)`."""
    (B, H, T, Dn), Dr, Dv = q_nope.shape, q_rope.shape[-1], module.v_head_dim
    w_kv = module.kv_b_proj.weight.view(H, Dn + Dv, -1)  # (H, Dn+Dv, Dc)
    width = max(Dn + Dr, Dv)

    def widened(tensor):  # (..., D) -> (..., width): zeros after D, which change no score and no output
        return F.pad(tensor, (0, width - tensor.shape[-1])) if tensor.shape[-1] < width else tensor

    group = max(1, SDPA_GROUP_ELEMENTS // (B * T * width))  # heads whose queries, keys and values fit at once
    outputs = []
    for heads in [slice(first, first + group) for first in range(0, H, group)]:
        kv = torch.einsum("bsc,hdc->bhsd", latent[:, 0], w_kv[heads])  # (B, h, T, Dn+Dv): W^UK and W^UV applied
        key = widened(torch.cat([kv[..., :Dn], k_rope.expand(-1, kv.shape[1], -1, -1)], dim=-1))  # (B, h, T, width)
        query = widened(torch.cat([q_nope[:, heads], q_rope[:, heads]], dim=-1))  # (B, h, T, width)
        context = F.scaled_dot_product_attention(query, key, widened(kv[..., Dn:]), is_causal=True,
                                                 scale=module.scaling)  # (B, h, T, width)
        outputs.append(context[..., :Dv])  # (B, h, T, Dv)
    return torch.cat(outputs, dim=1)  # (B, H, T, Dv)


def sdpa_latent(module, q_nope, q_rope, latent, k_rope):
    """Queries over the latent cache through SDPA in MQA mode: the absorbed query against the latent and rotary key,
    one K/V head for every query head: a decode step's one query, which sees every position. Shapes as
    `sdpa_heads`', over `S` positions."""
    (B, H, T, Dn), Dv, Dc = q_nope.shape, module.v_head_dim, module.kv_lora_rank
    w_kv = module.kv_b_proj.weight.view(H, Dn + Dv, Dc)  # (H, Dn+Dv, Dc)
    key = torch.cat([latent, k_rope], dim=-1)  # (B, 1, S, Dc+Dr): one K/V head for every query head
    group = max(1, SDPA_GROUP_ELEMENTS // (B * T * key.shape[-1]))  # heads whose queries fit at once
    outputs = []
    for heads in [slice(first, first + group) for first in range(0, H, group)]:  # (B, h, T, Dc+Dr) queries at a time
        q = torch.cat([torch.einsum("bhtn,hnc->bhtc", q_nope[:, heads], w_kv[heads, :Dn]), q_rope[:, heads]], dim=-1)
        k = key.expand(-1, q.shape[1], -1, -1)  # (B, h, S, Dc+Dr): not copied
        # The values are the keys' first Dc features (FlashMLA's layout): keys and values of one width, which SDPA's
        # CPU kernel needs (values of Dc alone, or enable_gqa, send it to the math path, which writes every score).
        context = F.scaled_dot_product_attention(q, k, k, scale=module.scaling)[..., :Dc]
        outputs.append(torch.einsum("bhtc,hvc->bhtv", context, w_kv[heads, Dn:]))  # (B, h, T, Dv)
    return torch.cat(outputs, dim=1)  # (B, H, T, Dv)


def checked(kernel, module, x, decoding):
    """The row's computation on the tokens `x` `(1, T, C)` (decoding: the last token over all of them) against the
    float64 reference (`attention.reference`): the layer's output (its attention, then `o_proj`), or, for the indexer,
    the positions kept. `(got, expected)`."""
    with torch.no_grad():
        tensors = module.attention_inputs(x)
        if decoding:  # the last token's queries; every position's latent and keys
            q_nope, q_rope, latent, k_rope, index_q, index_k, index_w = tensors
            tensors = (q_nope[:, :, -1:], q_rope[:, :, -1:], latent, k_rope, index_q[:, :, -1:], index_k, index_w[:, -1:])
        got = attend(kernel, module, tensors)
        if kernel != "indexer":
            B, H, T, Dv = got.shape
            got = module.o_proj(got.transpose(1, 2).reshape(B, T, H * Dv))
    state, sizes = module.state_dict(), {name: WIDTHS[name] for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    selected = reference_indexer_selection(x, state, module.indexer.n_heads, module.indexer.head_dim, module.index_topk,
                                           sizes["qk_rope_head_dim"], ROPE_THETA)  # (1, T, T)
    if kernel == "indexer":
        T, S = got.shape[1], x.shape[1]
        kept = torch.zeros(1, T, S, dtype=torch.bool).scatter(-1, got.cpu(), True) & causal_mask(T, S, "cpu")
        return kept.double(), selected[:, -T:].double()
    expected = reference_latent_attention(x, state, module.num_heads, *sizes.values(), ROPE_THETA,
                                          selected=None if kernel in DENSE else selected)[0]
    return got, expected[:, -got.shape[1]:]


def run(config, envelope):
    config = config.resolve(envelope.device)
    header = {key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(config).items()}
    cases = ([("prefill", kernel, T) for T in config.seq_lens for kernel in config.kernels] * ("prefill" in config.parts)
             + [("decode", kernel, T) for T in config.contexts for kernel in config.kernels] * ("decode" in config.parts))
    section = envelope.open(NAME, header | {"rows": []}, len(cases))
    yardstick = core.matmul_yardstick(envelope.device, envelope.dtype, config.matmul_size)
    for case in cases:
        row = sparse_row(config, case, envelope, yardstick)
        envelope.add(section["rows"], row, "sparse {} {} T={}".format(*case))
        core.release(envelope.device)


def sparse_row(config, case, envelope, yardstick):
    """One case's row: checked at the small shape against float64, then timed at its own beside the matmul."""
    part, kernel, T = case
    device, dtype = envelope.device, envelope.dtype
    B, H, Hi = config.batch, config.num_heads, config.index_n_heads
    row = new_row(Row, part=part, kernel=kernel, batch=B, num_heads=H, index_n_heads=Hi, top_k=config.top_k,
                  seq_len=T, status="ok", tolerance=tolerance(device, envelope.result["dtype"]))
    row["flops"] = row_flops(row)
    element = torch.empty((), dtype=dtype).element_size()
    decoding = part == "decode"
    if decoding:
        row["memory_bytes"] = row_memory_bytes(row, element)
    queries, positions = queries_positions(part, T)
    if kernel == "mask" and not decoding and T > config.mask_max_len:
        row.update(status="skipped", reason=f"past mask_max_len {config.mask_max_len}: its (B, H, T, T) scores are "
                                            "the dense absorbed path's and more")
        return row
    needed = row_peak_bytes(row, element)
    if skip := core.over_budget(needed, config.memory_budget_bytes, "the inputs, the cache's copies, the latent "
                                                                   "queries, the outputs and the dense scores"):
        row.update(status="skipped", reason=skip)
        return row
    try:
        small_module = build(config, config.check_top_k, device, dtype, "mask" if kernel == "mask" else "gather")
        x = torch.randn(1, config.check_len, small_module.hidden_size, generator=torch.Generator().manual_seed(config.seed + 1))
        got, reference = checked(kernel, small_module, x.to(device, dtype), decoding)
        verdict = core.compared(got, reference, row["tolerance"])
    except Exception as error:  # noqa: BLE001 - this device cannot run it: the row says why
        row.update(status="skipped", reason=core.error_text(error))
        return row
    module = build(config, config.top_k, device, dtype, "mask" if kernel == "mask" else "gather")
    tensors = core_inputs(module, (B, queries, positions), config.seed, device, dtype)

    def call():
        with torch.no_grad():
            return attend(kernel, module, tensors)

    try:
        row.update(core.measure(call, lambda out: verdict, device, config, yardstick))
        row.update(core.matmul_rates(row))
        row["tokens_per_s"] = B * queries / (row["ms_median"] * 1e-3)
    except Exception as error:  # noqa: BLE001 - record the failure, keep the run going
        core.failed(row, error)
    return row


SECTION = record(field_rules(Config) | {"rows": list_of(rule_of(Row), MAX_ROWS)})


def validate(section, result):
    """The section's rules, then each row's FLOPs, bytes and rates recomputed from its own numbers."""
    problems = SECTION(section, NAME) or ([] if section["rows"] else ["sparse.rows: none"])
    element = torch.empty((), dtype=core.DTYPES.get(result["dtype"], torch.float32)).element_size()
    for index, row in enumerate([] if problems else section["rows"]):
        where = f"sparse.rows[{index}] ({row['part']}, {row['kernel']}, T={row['seq_len']})"
        decoding = row["part"] == "decode"
        wanted = {"flops": row_flops(row)}
        if decoding:
            wanted["memory_bytes"] = row_memory_bytes(row, element)
        elif row["memory_bytes"] is not None:
            problems.append(f"{where}: memory_bytes {row['memory_bytes']}: set on decode rows only")
        if row["status"] == "ok":
            wanted["tokens_per_s"] = row["batch"] * (1 if decoding else row["seq_len"]) / (row["ms_median"] * 1e-3)
        problems += core.timed_row_problems(where, row, wanted)
    return problems
