"""The KV-cache calculator's data and table: each published model's cache as a few terms per kind of layer, read
from `attention.models.published.layer_cache_bytes` (the one definition of what a layer keeps), so the page's
JavaScript computes the same bytes as `kv_cache_bytes` at any context, batch and element type.

A layer's cache after `n` positions in a dtype of `e` bytes is `per_position * e * min(n, window) + per_entry * e *
floor(n / rate) + state * max(e, 4) + fixed * e`: keys and values (or a latent, a rotary key and an indexer key) per
position, up to a window where the layer is local; one compressed entry per `rate` positions (DeepSeek-V4's CSA and
HCA); a linear layer's recurrent state (float32 at least); and what a layer keeps whatever the context (a short
convolution's last inputs, a compressor's open window). `layer_terms` reads the numbers off `layer_cache_bytes` at a
few contexts and element sizes and checks that they reproduce it.
"""

import json

import torch

from attention.models.published import kv_cache_bytes, layer_cache_bytes, published_entries, published_layers

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float8_e4m3fn": torch.float8_e4m3fn}
CONTEXTS = (4096, 32768, 131072, 1048576)
PROBE = 2**40  # a context longer than any window


def layer_terms(layer):
    """`{"kind", "per_position", "window", "per_entry", "rate", "state", "fixed"}` of `layer`'s cache (see the module
    docstring)."""
    one, four = torch.float8_e4m3fn, torch.float32  # elements of 1 and 4 bytes
    per_position = layer_cache_bytes(layer, 2, one) - layer_cache_bytes(layer, 1, one)
    fixed_one = layer_cache_bytes(layer, 1, one) - per_position  # state * 4 + fixed * 1
    fixed_four = layer_cache_bytes(layer, 1, four) - 4 * per_position  # state * 4 + fixed * 4
    fixed = (fixed_four - fixed_one) // 3
    state = (fixed_one - fixed) // 4
    rate = getattr(layer, "compress_rate", None)  # positions per compressed entry (read off the layer, then checked)
    per_entry = 0 if rate is None else (layer_cache_bytes(layer, rate, one) - layer_cache_bytes(layer, rate - 1, one)
                                        - per_position)
    longest = layer_cache_bytes(layer, PROBE, one) - fixed_one - (0 if rate is None else per_entry * (PROBE // rate))
    window = None if longest == per_position * PROBE else longest // per_position
    kind = layer.layer_type + (" (shared K/V)" if getattr(layer, "kv_sharing", None) == "reuse" else "")
    terms = {"kind": kind, "per_position": per_position, "window": window, "per_entry": per_entry, "rate": rate,
             "state": state, "fixed": fixed}
    for context in (1, 3, 4097, 4099, 131075, PROBE):
        for dtype in DTYPES.values():
            if terms_bytes([terms | {"count": 1}], context, 1, dtype.itemsize) != layer_cache_bytes(layer, context, dtype):
                raise ValueError(f"{type(layer).__name__} layer {layer.layer_idx}: its cache is not of the calculator's "
                                 f"form at context {context}, {dtype}")
    return terms


def terms_bytes(groups, context, batch, itemsize):
    """Bytes of `batch` sequences of `context` positions from `groups` (`model_groups`): the page's JavaScript, in
    Python."""
    return batch * sum(group["count"] * (group["per_position"] * itemsize * min(context, group["window"] or context)
                                         + (group["per_entry"] * itemsize * (context // group["rate"])
                                            if group["rate"] else 0)
                                         + group["state"] * max(itemsize, 4) + group["fixed"] * itemsize)
                       for group in groups)


def model_groups(name):
    """The layers of the published model `name`, runs of equal terms merged, in order: `[{..terms, "count"}]`."""
    groups = []
    for layer in published_layers(name):
        terms = layer_terms(layer)
        same = next((group for group in groups if {k: v for k, v in group.items() if k != "count"} == terms), None)
        if same is None:
            groups.append(terms | {"count": 1})
        else:
            same["count"] += 1
    return groups


def describe(group):
    """One group in words, e.g. "16 full_attention layers: 1,024 values per position, at most 4,096 positions"."""
    words = f"{group['count']} {group['kind']} layer{'s' if group['count'] > 1 else ''}: "
    parts = []
    if group["per_position"]:
        parts.append(f"{group['per_position']:,} values per position"
                     + (f", at most {group['window']:,} positions" if group["window"] else ""))
    if group["per_entry"]:
        parts.append(f"{group['per_entry']:,} values per compressed entry, one per {group['rate']:,} positions")
    if group["state"]:
        parts.append(f"a state of {group['state']:,} values (float32 at least)")
    if group["fixed"]:
        parts.append(f"{group['fixed']:,} values whatever the context "
                     + ("(the convolution's last inputs)" if group["state"] else "(the window being compressed)"))
    return words + ("; ".join(parts) or "no cache of their own (they read an earlier layer's)")


def calculator_data():
    """What the page's calculator reads: every published model's groups, its source and the element types."""
    models = []
    for name, entry in published_entries().items():
        groups = model_groups(name)
        models.append({"name": name, "source": entry["source"], "groups": groups,
                       "lines": [describe(group) for group in groups]})
    return {"models": models, "dtypes": {name: dtype.itemsize for name, dtype in DTYPES.items()}}


def data_script():
    """The data as a JSON `<script>` block the page's JavaScript reads (`</` escaped: it cannot close the block)."""
    text = json.dumps(calculator_data(), separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="kv-calculator-data">{text}</script>'


def contexts_table(dtype=torch.bfloat16):
    """Markdown: each published model's cache for one sequence at the common contexts, in GiB, from `kv_cache_bytes`."""
    header = "| Model | " + " | ".join(f"{n // 2**20}M" if n >= 2**20 else f"{n // 1024}k" for n in CONTEXTS) + " |"
    lines = [header, "|---|" + "---:|" * len(CONTEXTS)]
    for name, entry in published_entries().items():
        cells = [f"{kv_cache_bytes(name, n, dtype=dtype) / 2**30:.2f}" for n in CONTEXTS]
        lines.append(f"| [{name}]({entry['source']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)
