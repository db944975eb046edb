"""Plausible bugs in multi-head latent attention (attention/models/deepseek_v3.py): the absorbed path, the
split of the rotary slice, YaRN's mscale, the latent cache, and the cost counts.

The fast checks: the layer against transformers' DeepSeek-V2/V3 layers (both paths, four tiny random
configurations: query compression or not, YaRN with an attention factor and an mscale that are not 1,
interleaved pairs or halves), decoding step by step against the full forward, and the counts against
torch's FLOP counter and allocated caches (tests/test_mla.py).
"""

from mutant import Mutant

MLA = "attention/models/deepseek_v3.py"
LAYER = "tests/test_mla.py -k 'matches_transformers or decoding_every_step'"
COUNTS = "tests/test_mla.py -k 'flops or bytes'"

MUTANTS = [
    # The absorbed path.
    Mutant("absorbed_heads_interleaved", MLA,
           "w_kv = self.kv_b_proj.weight.view(H, Dn + Dv, Dc)", "w_kv = self.kv_b_proj.weight.view(Dn + Dv, H, Dc).transpose(0, 1)",
           "kv_b_proj's rows read as (feature, head) instead of head by head: every head folds another's W^UK, W^UV", LAYER),
    Mutant("absorbed_rotary_scores_forgotten", MLA,
           "scores = (per_head_matmul(q_latent.reshape(B, 1, H * T, Dc), latent.transpose(2, 3))  # (B, 1, H*T, Dc) @ (B, 1, Dc, S) -> (B, 1, H*T, S)\n"
           "                  + per_head_matmul(q_rope.reshape(B, 1, H * T, Dr), k_rope.transpose(2, 3)))",
           "scores = (per_head_matmul(q_latent.reshape(B, 1, H * T, Dc), latent.transpose(2, 3)))",
           "the absorbed scores over the latent only: the decoupled rotary key's part forgotten", LAYER),
    Mutant("absorbed_unscaled", MLA,
           "scores = scores.view(B, H, T, S) * self.scaling  # (B, H, T, S)", "scores = scores.view(B, H, T, S)  # (B, H, T, S)",
           "the absorbed path's softmax scale forgotten (SDPA applies it in the naive path)", LAYER),
    Mutant("absorbed_value_up_projection_of_the_key", MLA,
           "return torch.einsum(\"bhtc,hvc->bhtv\", context_latent, w_uv)",
           "return torch.einsum(\"bhtc,hvc->bhtv\", context_latent, w_kv[:, -Dv:].flip(1))",
           "W^UV taken in reversed feature order when sliced from kv_b_proj", LAYER),
    # The rotary slice and the latent.
    Mutant("query_rope_slice_from_the_front", MLA,
           "q_nope, q_rope = q.split([Dn, Dr], dim=-1)", "q_rope, q_nope = q.split([Dr, Dn], dim=-1)",
           "each head's rotary part taken from the front of the query instead of the back", LAYER),
    Mutant("rope_key_slice_from_the_front", MLA,
           "latent, k_rope = self.kv_a_proj_with_mqa(x).split([Dc, Dr], dim=-1)",
           "k_rope, latent = self.kv_a_proj_with_mqa(x).split([Dr, Dc], dim=-1)",
           "the shared rotary key taken from the front of kv_a_proj_with_mqa's output", LAYER),
    Mutant("latent_not_normalised", MLA,
           "latent = self.kv_a_layernorm(latent).unsqueeze(1)", "latent = latent.unsqueeze(1)",
           "kv_a_layernorm forgotten: the cached latent is not normalised", LAYER),
    Mutant("rope_halves_for_interleaved", MLA,
           "        if self.rope_interleave:\n", "        if not self.rope_interleave:\n",
           "DeepSeek's interleaved rotary pairs read as halves (and halves as pairs)", LAYER),
    # YaRN's scales.
    Mutant("mscale_not_squared", MLA,
           "scale *= mscale * mscale", "scale *= mscale",
           "the score scale multiplied by mscale once, not by its square as DeepSeek's code does", LAYER),
    Mutant("rope_attention_factor_dropped", MLA,
           "    angles = positions[:, None] * module.rope_tables[(like.device, dtype)][None, :]  # (T, D/2)\n"
           "    scale = module.attention_scaling\n",
           "    angles = positions[:, None] * module.rope_tables[(like.device, dtype)][None, :]  # (T, D/2)\n"
           "    scale = 1.0\n",
           "YaRN's attention factor (mscale / mscale_all_dim) left off the rotary parts", LAYER),
    Mutant("yarn_mscale_ignored", MLA,
           "return 1.0 if scale <= 1 else 0.1 * multiplier * math.log(scale) + 1.0",
           "return 1.0 if scale <= 1 else 0.1 * math.log(scale) + 1.0",
           "YaRN's attention factor without mscale and mscale_all_dim (0.1 ln(factor) + 1 over itself: 1): the rotary "
           "frequencies copied from the reference agreed with it; MLA's own copy of the models' RoPE does not",
           "tests/test_mla.py -k matches_reference_forward"),
    # The cache.
    Mutant("rotary_positions_restart_in_a_cache", MLA,
           "            return apply_rotary_interleaved(x, *interleaved_cos_sin(self, start, T, x))",
           "            return apply_rotary_interleaved(x, *interleaved_cos_sin(self, 0, T, x))",
           "a decoded token rotated as position 0 instead of its place after the cache", LAYER),
    Mutant("latent_cache_mask_top_left", "attention/decoding/caches.py",
           "query_pos = torch.arange(start, start + T, device=latent.device)  # (T,)",
           "query_pos = torch.arange(T, device=latent.device)  # (T,)",
           "a chunk's queries counted from 0: the causal mask aligned top-left once the cache holds a past", LAYER),
    # The cost counts.
    Mutant("absorbed_flops_without_the_value_up_projection", MLA,
           " + 2 * H * T * S * Dc + 2 * H * T * Dc * Dv\n", " + 2 * H * T * S * Dc\n",
           "the absorbed path's W^UV after attention left out of its FLOPs", COUNTS),
    Mutant("naive_bytes_write_only", MLA,
           "return read + 2 * batch_size * context * H * (Dn + Dr + Dv) * element_size",
           "return read + batch_size * context * H * (Dn + Dr + Dv) * element_size",
           "the naive path's expanded keys and values counted once, written but not read back", COUNTS),
    Mutant("kv_cache_bytes_keys_only", MLA,
           "return 2 * num_kv_heads * config_value(config, \"v_head_dim\")", "return num_kv_heads * config_value(config, \"v_head_dim\")",
           "the comparison KV cache counted with keys only", COUNTS),
    # Configs, caches and masks (issue 44).
    Mutant("cache_of_another_layer_accepted", MLA,
           "    if cache.layer != layer:\n", "    if cache.layer is None:\n",
           "a cache checked only for its sizes: every MLA layer has the same, so one layer attends over another's latents",
           "tests/test_mla.py -k another_layer"),
    Mutant("rope_parameters_unchecked", MLA,
           "    check_rope_parameters(head_dim, parameters)\n    base, kind", "    base, kind",
           "RoPE's parameters used as they come: a rope_theta or YaRN factor of 0 gives NaN, a missing field a bare KeyError",
           "tests/test_mla.py -k out_of_range"),
    Mutant("absorbed_query_with_no_key_nan", MLA,
           "            attn_weights = attn_weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)\n", "            pass\n",
           "the absorbed path's softmax of a fully masked row left as it is: NaN, where the naive path (SDPA) gives zeros",
           "tests/test_masked_rows.py -k 'MLA and absorbed'"),
]
