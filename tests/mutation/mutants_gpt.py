"""Plausible bugs in the tiny GPT (attention/gpt/): the block's norms, positions in a cache, the tied head, the
K/V heads handed to the attention class, generation and sampling (model.py), and how training draws its batches
and decays its parameters (data.py, train.py).

The model's reference (tests/test_gpt.py) is the same GPT with the float64 reference attention in every
block, so a bug in the GPT around the attention changes both alike: the shipped checkpoint's recorded
validation loss is the check that sees the block's structure, and cached decoding, the random
configurations and the generation and sampling tests see the rest. What a falling loss cannot tell (which target
each input is scored against, which starts a batch draws, which parameters decay, the sampled distribution) is
read in detail by tests/test_gpt_details.py.
"""

from mutant import Mutant

GPT = "attention/gpt/model.py"
DATA = "attention/gpt/data.py"
TRAIN = "attention/gpt/train.py"
CHECKPOINT = "tests/test_gpt.py -k recorded_validation_loss"
GENERATION = "tests/test_gpt.py -k 'appends_the_most_likely or divides_by_the_temperature'"
BATCHES = "tests/test_gpt_details.py -k training_batch_pairs"
DECAY = "tests/test_gpt_details.py -k optimizer_decays"
SAMPLED = "tests/test_gpt_details.py -k hand_computed_distribution"

MUTANTS = [
    Mutant("second_norm_skipped", GPT,
           "return x + self.mlp(self.ln_2(x))  # (B, T, C)", "return x + self.mlp(x)  # (B, T, C)",
           "the MLP fed the residual stream without its layer norm", CHECKPOINT),
    Mutant("final_norm_skipped", GPT,
           "return self.head(self.ln_f(x))  # (B, T, vocab_size)", "return self.head(x)  # (B, T, vocab_size)",
           "the final layer norm forgotten before the head", CHECKPOINT),
    Mutant("post_norm_block", GPT,
           "        h = self.ln_1(x)  # (B, T, C)\n"
           "        h = self.attn(h) if cache is None else self.attn(h, cache=cache)  # (B, T, C)\n"
           "        x = x + self.dropout(h)\n",
           "        h = self.attn(x) if cache is None else self.attn(x, cache=cache)  # (B, T, C)\n"
           "        x = self.ln_1(x + self.dropout(h))\n",
           "the original Transformer's post-norm block in place of GPT-2's pre-norm", CHECKPOINT),
    Mutant("positions_restart_in_a_cache", GPT,
           "x = x + self.position_embedding(torch.arange(start, start + T, device=idx.device))",
           "x = x + self.position_embedding(torch.arange(T, device=idx.device))",
           "a decoded token given position 0's embedding instead of its place after the cache",
           "tests/test_gpt.py -k 'cached_forward and gqa'"),
    Mutant("head_not_tied", GPT,
           "        self.head.weight = self.token_embedding.weight  # tied: one matrix embeds tokens and scores them (GPT-2)\n",
           "",
           "the head left untied from the token embedding: a second matrix the canonical state dict does not carry",
           "tests/test_gpt.py -k 'configurations_match and sdpa_causal'"),
    Mutant("kv_heads_not_passed", GPT,
           "keywords[\"num_kv_heads\"] = config.num_heads if config.num_kv_heads is None else config.num_kv_heads",
           "keywords[\"num_kv_heads\"] = config.num_heads",
           "the config's num_kv_heads never reaches a grouped-query class: it builds multi-head attention", GENERATION),
    Mutant("context_check_off_by_one", GPT,
           "if start + T > self.config.context_length:", "if start + T >= self.config.context_length:",
           "off by one: a sequence of exactly context_length tokens refused",
           "tests/test_gpt.py -k 'every_fitting_class and split_heads'"),
    Mutant("prefill_reads_the_first_position", GPT,
           "logits = self(idx, caches)[:, -1]  # the prompt in one call", "logits = self(idx, caches)[:, 0]  # the prompt in one call",
           "the first new token predicted from the prompt's first position instead of its last", GENERATION),
    Mutant("uncached_step_sees_only_the_last_token", GPT,
           "logits = (self(next_token, caches) if use_cache else self(idx))[:, -1]",
           "logits = (self(next_token, caches) if use_cache else self(next_token))[:, -1]",
           "without a cache, each step fed only the newest token: no context at all", GENERATION),
    Mutant("temperature_multiplies", GPT,
           "logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature",
           "logits = (logits - logits.amax(dim=-1, keepdim=True)) * temperature",
           "the temperature multiplied instead of divided: low temperatures flatten instead of sharpen", GENERATION),
    Mutant("top_k_drops_the_kth", GPT,
           "logits = logits.masked_fill(logits < kth, float(\"-inf\"))", "logits = logits.masked_fill(logits <= kth, float(\"-inf\"))",
           "off by one: top_k keeps k - 1 tokens (none for top_k=1: NaN probabilities)", GENERATION),
    # Training batches and the optimizer (issue 50): a falling loss hides each of these.
    Mutant("batch_targets_not_shifted", DATA,
           "    offsets = starts[:, None] + torch.arange(context_length)[None, :]  # (B, T)\n"
           "    return data[offsets], data[offsets + 1]\n",
           "    offsets = starts[:, None] + torch.arange(context_length)[None, :]  # (B, T)\n"
           "    return data[offsets], data[offsets]\n",
           "a training batch's targets are its inputs, not the next bytes: the model learns to copy", BATCHES),
    Mutant("batch_rows_share_one_start", DATA,
           "starts = torch.randint(len(data) - context_length, (batch_size,), generator=generator)  # (B,)",
           "starts = torch.randint(len(data) - context_length, (1,), generator=generator).expand(batch_size)  # (B,)",
           "one offset drawn per batch and every row cut from it: a batch of identical windows", BATCHES),
    Mutant("batch_last_start_never_drawn", DATA,
           "starts = torch.randint(len(data) - context_length, (batch_size,), generator=generator)  # (B,)",
           "starts = torch.randint(len(data) - context_length - 1, (batch_size,), generator=generator)  # (B,)",
           "off by one: the last start whose target still fits in the text is never drawn", BATCHES),
    Mutant("optimizer_decays_norms", TRAIN,
           "    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]  # matrices decay; biases and norms do not\n"
           "    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]\n",
           "    decay = [p for n, p in model.named_parameters() if not n.endswith(\"bias\")]  # biases do not decay\n"
           "    no_decay = [p for n, p in model.named_parameters() if n.endswith(\"bias\")]\n",
           "the no-decay group chosen by the name 'bias': the layer norms' weights are decayed towards 0", DECAY),
    # Sampling, through generate (issue 50): the distribution drawn from, computed by hand.
    Mutant("temperature_skipped", GPT,
           "logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature",
           "logits = logits - logits.amax(dim=-1, keepdim=True)",
           "the temperature never applied: every positive temperature samples as 1", SAMPLED),
    Mutant("top_k_keeps_one_more", GPT,
           "kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)",
           "kth = torch.topk(logits, min(top_k + 1, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)",
           "off by one: top_k keeps k + 1 tokens", SAMPLED),
]
