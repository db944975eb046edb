"""Plausible bugs in the attention of current open models (attention/models/, latent attention aside:
mutants_latent.py): where QK-norm goes, the soft-cap, the sinks, windows and chunks, RoPE per layer type,
the query scale.

Each family's layers are checked against transformers' own layer, built from a tiny random configuration
that switches the family's mechanisms on at sizes where they bite (tests/test_models.py): that comparison
(`equals_transformers`, one family at a time) is the fast check of most bugs here. The comparisons with the
float64 reference (`float64_reference`), whose settings come from the configuration and not from the layer, need no
transformers: the blind spots of a reference that read the layer's own attributes (a wrong scale, wrong YaRN
frequencies) are planted for them. A helper repeated as a marked copy (`# Same as attention/models/llama.py::...`)
is mutated in the file it is defined in.
"""

from mutant import Mutant

MODELS = "attention/models/"


def matches_transformers(family):
    """The comparison with transformers' layer, every layer of one family (`-k` matches the test ids)."""
    return f"tests/test_models.py -k 'equals_transformers and {family}'"


LLAMA = "tests/test_models.py -k 'equals_transformers and (llama- or mistral or qwen2)'"


def matches_the_reference(family):
    """The comparison with the float64 reference, set from the config (no transformers needed)."""
    return f"tests/test_models.py -k 'float64_reference and {family}'"

MUTANTS = [
    # Where QK-norm goes.
    Mutant("qwen3_qk_norm_after_rope", MODELS + "qwen3.py",
           "        q = self.q_norm(self.q_proj(x).view(B, T, -1, self.head_dim)).transpose(1, 2)  # (B, T, H, D) normed -> (B, H, T, D)\n"
           "        k = self.k_norm(self.k_proj(x).view(B, T, -1, self.head_dim)).transpose(1, 2)  # (B, H_kv, T, D)\n"
           "        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H_kv, T, D)\n"
           "        cos, sin = rotary_cos_sin(self, start, T, x)  # (T, D) each\n"
           "        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v",
           "        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)\n"
           "        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)\n"
           "        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H_kv, T, D)\n"
           "        cos, sin = rotary_cos_sin(self, start, T, x)  # (T, D) each\n"
           "        return self.q_norm(apply_rotary(q, cos, sin)), self.k_norm(apply_rotary(k, cos, sin)), v",
           "Qwen3's QK-norm applied after RoPE (Llama 4's order) instead of before", matches_transformers("qwen3")),
    Mutant("olmo2_keys_not_normed", MODELS + "olmo2.py",
           "k = self.k_norm(self.k_proj(x)).view(B, T, -1, self.head_dim)", "k = self.k_proj(x).view(B, T, -1, self.head_dim)",
           "OLMo 2's k_norm forgotten: only the queries normalised", matches_transformers("olmo2")),
    Mutant("gemma3_norm_weight_without_the_one", MODELS + "gemma3.py",
           "return (y * (1.0 + self.weight.to(compute))).to(x.dtype)", "return (y * self.weight.to(compute)).to(x.dtype)",
           "Gemma's RMSNorm read as Llama's: `weight` instead of `1 + weight` (Gemma's weights start at 0)",
           matches_transformers("gemma3")),
    Mutant("llama4_l2_norm_before_rope", MODELS + "llama4.py",
           "        if self.use_rope:\n"
           "            cos, sin = interleaved_cos_sin(self, start, T, x)  # (T, D/2) each\n"
           "            q, k = apply_rotary_interleaved(q, cos, sin), apply_rotary_interleaved(k, cos, sin)\n"
           "        if self.qk_norm == \"l2\":  # after RoPE: a unit-RMS query and key per head, no weight\n"
           "            q, k = l2_norm(q, self.norm_eps), l2_norm(k, self.norm_eps)\n",
           "        if self.qk_norm == \"l2\":\n"
           "            q, k = l2_norm(q, self.norm_eps), l2_norm(k, self.norm_eps)\n"
           "        if self.use_rope:\n"
           "            cos, sin = interleaved_cos_sin(self, start, T, x)  # (T, D/2) each\n"
           "            q, k = apply_rotary_interleaved(q, cos, sin), apply_rotary_interleaved(k, cos, sin)\n",
           "Llama 4's weightless L2 norm moved before RoPE (Qwen3's order)", matches_transformers("llama4"),
           equivalent="a rotation keeps every pair's length, so the mean of squares a weightless RMS norm divides by is the "
                      "same before and after RoPE: the two orders agree to rounding whenever RoPE's attention factor is 1 "
                      "(Llama 4's llama3 rope_type always gives 1; only a norm with a weight, as Qwen3's, tells them apart)"),
    # The soft-cap and the query scale (Gemma 2).
    Mutant("gemma2_softcap_not_divided", MODELS + "gemma2.py",
           "scores = softcap * torch.tanh(scores / softcap)", "scores = softcap * torch.tanh(scores)",
           "the soft-cap as cap * tanh(s): the logits squashed near 0 instead of only near the cap",
           matches_transformers("gemma2")),
    Mutant("gemma2_softcap_after_the_mask", MODELS + "gemma2.py",
           "    if softcap is not None:\n"
           "        scores = softcap * torch.tanh(scores / softcap)  # the soft-cap: every logit in (-softcap, softcap)\n"
           "    if mask is not None:\n"
           "        scores = scores.masked_fill(~mask, float(\"-inf\"))\n",
           "    if mask is not None:\n"
           "        scores = scores.masked_fill(~mask, float(\"-inf\"))\n"
           "    if softcap is not None:\n"
           "        scores = softcap * torch.tanh(scores / softcap)\n",
           "the cap applied after the mask: tanh(-inf) = -1, so masked keys get the finite logit -cap and are attended",
           matches_transformers("gemma2")),
    Mutant("gemma2_query_scale_of_head_dim", MODELS + "gemma2.py",
           "self.scaling = query_pre_attn_scalar ** -0.5", "self.scaling = self.head_dim**-0.5",
           "the query scale 1/sqrt(head_dim), not query_pre_attn_scalar ** -0.5 (they differ in Gemma 2 27B)",
           matches_transformers("gemma2")),
    # Sinks (gpt-oss).
    Mutant("gpt_oss_sink_ignored", MODELS + "gpt_oss.py",
           "attn_weights = torch.softmax(scores, dim=-1)[..., :-1]", "attn_weights = torch.softmax(scores[..., :-1], dim=-1)",
           "the sink column dropped before the softmax instead of after: rows sum to 1, the sinks do nothing",
           matches_transformers("gpt_oss")),
    Mutant("gpt_oss_sinks_in_kv_head_order", MODELS + "gpt_oss.py",
           "sink = sinks.to(scores.dtype).view(1, H_kv, group, 1, 1)",
           "sink = sinks.to(scores.dtype).view(1, group, H_kv, 1, 1).transpose(1, 2)",
           "the per-head sinks laid out K/V head minor: query head h gets another head's sink",
           matches_transformers("gpt_oss")),
    # Windows and chunks.
    Mutant("window_one_key_too_many", MODELS + "llama.py",
           "    return (distance >= 0) & (distance < sliding_window)\n", "    return (distance >= 0) & (distance <= sliding_window)\n",
           "off by one: a sliding window of sliding_window + 1 keys (Mistral, Qwen2)", LLAMA),
    Mutant("gemma2_window_one_key_too_few", MODELS + "gemma2.py",
           "return (distance >= 0) & (distance < (length if sliding_window is None else sliding_window))",
           "return (distance >= 0) & (distance < (length if sliding_window is None else sliding_window) - 1)",
           "off by one: a window of sliding_window - 1 keys", matches_transformers("gemma2")),
    Mutant("llama4_chunks_as_a_window", MODELS + "llama4.py",
           "return (k >= 0) & (k <= q) & (k // chunk == q // chunk)", "return (k >= 0) & (k <= q) & (q - k < chunk)",
           "Llama 4's chunked attention written as a sliding window of chunk keys", matches_transformers("llama4")),
    # RoPE: the base of local layers, the scaling types, the positions of a continued sequence.
    Mutant("gemma3_local_layers_rotate_with_the_global_base", MODELS + "gemma3.py",
           "        parameters = mapping(f\"rope_parameters[{layer_type!r}]\", parameters[layer_type])\n",
           "        parameters = mapping(f\"rope_parameters[{layer_type!r}]\", parameters[\"full_attention\"])\n",
           "Gemma 3's local layers given the global layers' RoPE (base 1,000,000, stretched) instead of base 10,000",
           matches_transformers("gemma3")),
    Mutant("gemma3_pattern_off_by_one", MODELS + "gemma3.py",
           "return \"sliding_attention\" if (layer_idx + 1) % pattern else \"full_attention\"",
           "return \"sliding_attention\" if layer_idx % pattern else \"full_attention\"",
           "a published config's 5:1 schedule shifted by one: layer 0 global, layer 5 local",
           "tests/test_models.py -k 'published and Gemma'"),
    Mutant("llama3_rope_blend_inverted", MODELS + "llama.py",
           "return (1 - blend) * inv_freq / factor + blend * inv_freq, 1.0",
           "return blend * inv_freq / factor + (1 - blend) * inv_freq, 1.0",
           "Llama 3.1's RoPE scaling stretches the fast pairs and keeps the slow ones", LLAMA),
    Mutant("gemma3_query_scale_of_head_dim", MODELS + "gemma3.py",
           "self.scaling = query_pre_attn_scalar ** -0.5", "self.scaling = self.head_dim**-0.5",
           "Gemma 3's query scale 1/sqrt(head_dim), not query_pre_attn_scalar ** -0.5 (168 against 128 in the 27B): "
           "a reference set from the layer's own `scaling` agreed with it", matches_the_reference("gemma3")),
    Mutant("yarn_ramp_reversed", MODELS + "llama.py",
           "return (1 - ramp) * inv_freq + ramp * inv_freq / factor, float(attention_factor)",
           "return (1 - ramp) * inv_freq / factor + ramp * inv_freq, float(attention_factor)",
           "YaRN's ramp the wrong way round: the fast pairs divided by the factor and the slow ones kept (a reference "
           "rotating with the layer's own frequencies agreed with it)", matches_the_reference("qwen2")),
    Mutant("yarn_attention_factor_dropped", MODELS + "llama.py",
           "return (1 - ramp) * inv_freq + ramp * inv_freq / factor, float(attention_factor)",
           "return (1 - ramp) * inv_freq + ramp * inv_freq / factor, 1.0",
           "YaRN's 0.1 ln(factor) + 1 on cos and sin forgotten", LLAMA),
    Mutant("rope_positions_restart_in_a_cache", MODELS + "llama.py",
           "    positions = torch.arange(start, start + length, device=like.device, dtype=dtype)  # (T,)\n"
           "    angles = positions[:, None] * inv_freq[None, :]  # (T, D/2)\n"
           "    angles = torch.cat([angles, angles], dim=-1)  # (T, D)",
           "    positions = torch.arange(length, device=like.device, dtype=dtype)  # (T,)\n"
           "    angles = positions[:, None] * inv_freq[None, :]  # (T, D/2)\n"
           "    angles = torch.cat([angles, angles], dim=-1)  # (T, D)",
           "a decoding step rotated as position 0 instead of its place after the cache",
           "tests/test_models.py -k 'cached_decoding and (llama- or mistral)'"),
    # Decoding through the grouped matmuls.
    Mutant("llama4_decode_kernel_ignored", MODELS + "llama4.py",
           "attn_output = cached_attention(q, keys, values, mask, self.scaling, self.decode_kernel,",
           "attn_output = cached_attention(q, keys, values, mask, self.scaling, \"auto\",",
           "the layer's decode_kernel never passed on: every cached call takes auto's choice",
           "tests/test_models.py -k 'decode_kernel and llama4'"),
    Mutant("gemma3_decode_default_scale", MODELS + "gemma3.py",
           "attn_output = cached_attention(q, keys, values, mask, self.scaling, self.decode_kernel,",
           "attn_output = cached_attention(q, keys, values, mask, None, self.decode_kernel,",
           "Gemma 3's scale (1/sqrt(query_pre_attn_scalar)) replaced by 1/sqrt(head_dim), SDPA's default",
           matches_transformers("gemma3")),
    Mutant("llama_full_forward_as_over_a_cache", MODELS + "llama.py",
           "over_cache=cache is not None)", "over_cache=True)",
           "a call without a cache attended as over one: no mask (a global layer) read as every key, not causal",
           matches_transformers("llama-")),
    Mutant("cached_sdpa_causal_over_a_cache", "attention/decoding/kernels.py",
           "attn_mask=mask, dropout_p=dropout_p, scale=scale,", "attn_mask=mask, dropout_p=dropout_p, scale=scale, is_causal=mask is None,",
           "SDPA's is_causal over a cache: one new token (no mask) aligned top-left, it attends to position 0 only",
           "tests/test_models.py -k 'decode_kernel and sdpa and llama-'"),
    # The written-out layers (soft-cap, sinks): K/V heads read where they lie.
    Mutant("gemma2_values_broadcast_over_query_heads", MODELS + "gemma2.py",
           "attn_output = per_head_matmul(attn_weights.reshape(B, H_kv, group * T, S), v)",
           "attn_output = (attn_weights @ v.unsqueeze(2)).reshape(B, H_kv, group * T, -1)",
           "the weighted values as a matmul broadcasting V over each K/V head's query heads: right numbers, but a copy of "
           "the value cache per query head at every step", "tests/test_models.py -k 'reads_the_cache and gemma2'"),
    # Configs and masks (issue 44): a dropped check lets a value through that gives silent zeros, NaN or full attention.
    Mutant("sliding_window_unchecked", MODELS + "llama.py",
           "    check_int(\"sliding_window\", sliding_window)\n    return sliding_window\n", "    return sliding_window\n",
           "a sliding layer's window taken as it is: 0 or a negative window gives an attention context of exactly zero, "
           "None full attention", "tests/test_models.py -k 'out_of_range and llama and sliding_window'"),
    Mutant("layer_kind_unchecked", MODELS + "llama.py",
           "if not isinstance(kind, str) or kind not in kinds:", "if not isinstance(kind, str):",
           "layer_types entries not checked against the family's kinds: 'banana' (or Llama 4's 'sliding_attention') "
           "runs as full attention", "tests/test_models.py -k 'out_of_range and layer_types'"),
    Mutant("gemma2_query_with_no_key_nan", MODELS + "gemma2.py",
           "    if mask is not None:  # a query with no key to attend to: zeros, not the NaN of a softmax over nothing\n"
           "        attn_weights = attn_weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)\n", "",
           "the soft-capped softmax of a fully masked row left as it is: NaN, where every other kernel gives zeros",
           "tests/test_masked_rows.py -k gemma2"),
]
