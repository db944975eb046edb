"""Plausible bugs in the general-purpose MultiHeadAttention (attention/general.py)."""

from mutant import Mutant

GENERAL = "attention/general.py"
TESTS = "tests/test_general.py"

MUTANTS = [
    Mutant("weights_returned_after_dropout", GENERAL,
           "            context = F.dropout(attn_weights, dropout_p, training=True) @ v  # (B, H, Tq, D)\n",
           "            attn_weights = F.dropout(attn_weights, dropout_p, training=True)\n"
           "            context = attn_weights @ v  # (B, H, Tq, D)\n",
           "need_weights returns the weights after dropout (issue 35, survivor 4)", TESTS),
    Mutant("weights_path_scale_by_head_dim", GENERAL,
           "scores = q @ k.transpose(-2, -1) / math.sqrt(D)", "scores = q @ k.transpose(-2, -1) / D",
           "the explicit path's scale 1/D instead of 1/sqrt(D)", TESTS),
    Mutant("dropout_in_eval", GENERAL,
           "dropout_p = self.dropout_p if self.training else 0.0", "dropout_p = self.dropout_p",
           "SDPA has no train/eval switch: dropout passed in eval too", TESTS),
    Mutant("empty_rows_not_opened", GENERAL,
           "            attn_mask = mask | ~row_has_key  # (B|1, H|1, Tq|1, Tk|1)\n",
           "            attn_mask = mask  # (B|1, H|1, Tq|1, Tk|1)\n",
           "a query with no key softmaxes over nothing: NaN in the output and the gradients", TESTS),
    Mutant("empty_rows_not_zeroed", GENERAL,
           "            if row_has_key is not None:\n                context = context * row_has_key\n",
           "",
           "a fully masked query gets the mean of the values instead of zeros (SDPA path)", TESTS),
    Mutant("weights_of_empty_rows_not_zeroed", GENERAL,
           "            if row_has_key is not None:\n                attn_weights = attn_weights * row_has_key\n",
           "",
           "a fully masked query's weights spread uniformly instead of zeros (explicit path)", TESTS),
    Mutant("mask_inverted", GENERAL,
           "scores = scores.masked_fill(~attn_mask, float(\"-inf\"))", "scores = scores.masked_fill(attn_mask, float(\"-inf\"))",
           "the explicit path reads the mask as True = masked (nn.MultiheadAttention's convention)", TESTS),
    Mutant("rope_keys_rotated_by_query_length", GENERAL,
           "k = apply_rotary(k, *rotary_cos_sin(Tk, D, self.rope_base, k.device, k.dtype))",
           "k = apply_rotary(k, *rotary_cos_sin(Tq, D, self.rope_base, k.device, k.dtype))",
           "cross-attention: the keys rotated with the query length's table", TESTS),
    Mutant("rope_keys_not_rotated", GENERAL,
           "            k = apply_rotary(k, *rotary_cos_sin(Tk, D, self.rope_base, k.device, k.dtype))  # (B, H, Tk, D)\n",
           "",
           "only the queries rotated: the scores no longer depend on relative position only", TESTS),
    Mutant("value_defaults_to_query", GENERAL,
           "        value = key if value is None else value\n", "        value = query if value is None else value\n",
           "cross-attention called with key only: values taken from the query sequence", TESTS),
    Mutant("heads_merged_without_transpose", GENERAL,
           "context = context.transpose(1, 2).reshape(B, Tq, self.d_model)", "context = context.reshape(B, Tq, self.d_model)",
           "heads merged by reshape without moving the head axis back", TESTS),
]
