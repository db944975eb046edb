"""Sentences that read measured numbers, written from the numbers so that they stay true on whichever machine builds
the page (tests/test_prose.py builds each from two recorded hosts' numbers). A claim about a recorded run names the run
(its results file). Presentation only: nothing here runs while a benchmark measures.
"""

import math

# Two times within this share of each other are "about the same": one build-time measurement on a
# shared machine moves by this much between runs.
ABOUT_THE_SAME = 0.15


def ratio_words(value, reference, within=ABOUT_THE_SAME):
    """How `value` compares with `reference` (both positive): `("about the same", r)`, `("more", r)` or
    `("less", r)`, with `r = value / reference`."""
    if value <= 0 or reference <= 0:
        raise ValueError(f"ratio_words needs positive numbers, got value={value!r}, reference={reference!r}")
    ratio = value / reference
    return ("about the same" if abs(ratio - 1) <= within else "more" if ratio > 1 else "less"), ratio


def times(ratio, sign="x"):
    """A factor in words: `2.0` -> "2.0x", `0.5` -> "0.50x", `0.005` -> "0.005x" (never "0.00x")."""
    digits = ".1f" if ratio >= 1 else ".2f" if ratio >= 0.1 else ".2g"
    return f"{ratio:{digits}}{sign}"


def file_label(name, stale):
    """A results file named in prose: `` `name` `` and, for a run older than the code, "(stale)"."""
    return f"`{name}`" + (" (stale)" if stale else "")


def bf16_matmul_sentence(cpu_name, flags, fp32_tflops, bf16_tflops):
    """The build's CPU's bfloat16 matmul rate against its float32 one, explained by its flags (`machine.cpu_flags`)."""
    kind, ratio = ratio_words(bf16_tflops, fp32_tflops, within=0.05)
    verdict = {"about the same": "about as fast as", "more": f"{times(ratio)} faster than",
               "less": f"at {times(ratio)} the speed of"}[kind]
    instructions = ("whose instruction-set flags were not recorded" if flags is None else
                    "with AMX, tile units that multiply bfloat16 matrices" if "amx_bf16" in flags else
                    "with AVX-512 BF16 (bfloat16 dot products in vector registers) but no AMX" if "avx512_bf16" in flags
                    else "with neither AMX nor AVX-512 BF16, so no instruction multiplies bfloat16 numbers: they are "
                         "widened to float32 first")
    return (f"This build's CPU, {cpu_name}, is a CPU {instructions}. Its bfloat16 matmul ran {verdict} its float32 "
            f"one ({bf16_tflops:.3g} against {fp32_tflops:.3g} TFLOP/s).")


def bf16_pieces_sentence(speed):
    """The pieces of one attention call, each as bfloat16 speed against float32 (above 1: bfloat16 faster).

    `speed`: {"matmul", "projections", "sdpa", "scores", "mask", "softmax", "weights_v", "written_out"} ->
    float32 ms / bfloat16 ms.
    """

    def word(value):
        kind, _ = ratio_words(value, 1.0, within=0.05)
        return {"about the same": "about as fast", "more": "faster", "less": "slower"}[kind]

    def at(piece):
        return f"{times(speed[piece], '×')} ({word(speed[piece])})"

    return (f"In bfloat16, measured now: the large matmul runs at {at('matmul')} its float32 speed, the projections "
            f"at {at('projections')} and the weights times `V` at {at('weights_v')}. SDPA's fused kernel, which never "
            f"writes the scores out, runs at {at('sdpa')}. The steps that move the `(B, H, T, T)` scores through "
            f"memory, with half the bytes per element, run at {at('mask')} (the mask) and {at('softmax')} (the "
            f"softmax), and `Q Kᵀ`, a matmul whose output is those scores, at {at('scores')}. The written-out core as "
            f"a whole runs at {at('written_out')}.")


def bf16_conclusion(projection_speed, elementwise_speed, amx):
    """What the pieces mean for whole classes on this CPU: from the projections' and the score steps'
    bfloat16 speeds (float32 ms / bfloat16 ms) and whether the CPU has AMX (True, False or None)."""
    why = {True: "AMX multiplies bfloat16 directly", False: "without AMX the bfloat16 matmuls are emulated",
           None: "the flags were not recorded"}[amx]
    opening = {"less": "every class pays for slower projections, and a class whose time is nearly all matmuls loses most",
               "more": "every class gains from faster projections, and a class whose time is nearly all matmuls gains "
                       "most", "about the same": "the projections cost about the same in both dtypes"}[
        ratio_words(projection_speed, 1.0, within=0.05)[0]]
    rest = {"more": "a class that spends much of its time moving the `(B, H, T, T)` scores gains from the halved bytes "
                    "too", "less": "moving the `(B, H, T, T)` scores in bfloat16 is no faster either, despite half the bytes",
            "about the same": "moving the `(B, H, T, T)` scores takes about as long in both dtypes, despite half the "
                              "bytes"}[ratio_words(elementwise_speed, 1.0, within=0.05)[0]]
    return f"So on this CPU ({why}) {opening}; {rest}."


def tiled_against_naive_sentence(run_label, tiled_ms, naive_ms, naive_label="split_heads"):
    """`tiled`'s training time against the naive class's (`tiled_ms`, `naive_ms`: {T: ms} where each ran):
    from which length `tiled` is faster, and by how much at the longest length both ran."""
    both = sorted(set(tiled_ms) & set(naive_ms))
    if not both:
        return f"In {run_label}, `tiled` and `{naive_label}` never ran at the same length."
    faster_from = None
    for t in reversed(both):  # the shortest length from which tiled is faster at every longer one
        if tiled_ms[t] >= naive_ms[t]:
            break
        faster_from = t
    longest = both[-1]
    kind, ratio = ratio_words(naive_ms[longest], tiled_ms[longest])
    at_longest = (f"at `T = {longest:,}` `tiled` takes {tiled_ms[longest]:,.0f} ms against `{naive_label}`'s "
                  f"{naive_ms[longest]:,.0f} ms")
    if faster_from is None:
        verdict = f"`tiled` is not the faster of the two at the longest length; {at_longest}"
    elif faster_from == both[0]:
        verdict = f"`tiled` is the faster of the two at every length measured; {at_longest}, {times(ratio)} faster"
    else:
        verdict = (f"`{naive_label}` is faster below `T = {faster_from:,}`, `tiled` from there on; {at_longest}, "
                   f"{times(ratio)} faster")
    return f"In {run_label}, forward + backward: {verdict}."


def compiled_sentence(run_label, seq_len, rows):
    """`torch.compile`d `tiled` against compiled `sdpa_causal` in a recorded run, per mode: `rows` is
    {mode title: (tiled ms, sdpa_causal ms)}."""
    parts = []
    for mode_title, (tiled_ms, sdpa_ms) in rows.items():
        kind, ratio = ratio_words(tiled_ms, sdpa_ms, within=0.05)
        relation = {"about the same": f"within {abs(ratio - 1):.0%} of", "less": f"{times(1 / ratio)} faster than",
                    "more": f"{times(ratio)} as long as"}[kind]
        parts.append(f"{mode_title}, `tiled` takes {tiled_ms:,.1f} ms, {relation} `sdpa_causal`'s {sdpa_ms:,.1f} ms")
    return f"Compiled with `torch.compile` ({run_label}, `T = {seq_len:,}`): " + "; ".join(parts) + "."


def custom_mask_sentence(run_name, stale, rows, score_tensor_mib):
    """Which grouped-query class suits a custom mask on a CPU, from a recorded run's headline rows.

    `rows`: {"gqa" | "gqa_flex" | "sdpa_mask" | "flex": {"forward" | "forward_backward": (ms, peak MiB)}} (the
    last two, multi-head classes with a mask through SDPA and FlexAttention, only for training);
    `score_tensor_mib`: the size of one `(B, H, T, T)` score tensor at that shape, to say how many the peak holds.
    """
    run = file_label(run_name, stale)
    sentences = []
    for mode, what in (("forward", "A forward pass (inference)"), ("forward_backward", "A training step")):
        (flex_ms, flex_mib), (sdpa_ms, sdpa_mib) = rows["gqa_flex"][mode], rows["gqa"][mode]
        time_kind, time_ratio = ratio_words(flex_ms, sdpa_ms)
        memory_kind, memory_ratio = ratio_words(flex_mib, sdpa_mib)
        costs = [f"{times(time_ratio)} the time" for kind in (time_kind,) if kind == "more"]
        costs += [f"{times(memory_ratio)} the memory ({flex_mib / score_tensor_mib:.1f} score tensors' worth)"
                  for kind in (memory_kind,) if kind == "more"]
        verdict = f"costs {' and '.join(costs)}" if costs else "costs no more than `gqa`"
        sentences.append(f"{what} of `gqa_flex` takes {flex_ms:,.0f} ms and {flex_mib:,.0f} MiB against `gqa`'s "
                         f"{sdpa_ms:,.0f} ms and {sdpa_mib:,.0f} MiB: it {verdict}.")
    training_dearer = any(ratio_words(rows["gqa_flex"]["forward_backward"][i], rows["gqa"]["forward_backward"][i])[0]
                          == "more" for i in (0, 1))
    (mask_ms, mask_mib), (flex_ms, flex_mib) = rows["sdpa_mask"]["forward_backward"], rows["flex"]["forward_backward"]
    mask_cheaper = mask_ms < flex_ms and mask_mib < flex_mib
    evidence = (f" (the multi-head classes in the same run: `sdpa_mask`, a boolean mask through SDPA, trains in "
                f"{mask_ms:,.0f} ms and {mask_mib:,.0f} MiB, `flex` in {flex_ms:,.0f} ms and {flex_mib:,.0f} MiB)")
    advice = (("So on a CPU `gqa_flex` suits a custom mask or score for inference; to train with a mask, pass it as a "
               "boolean `attn_mask` to SDPA with `enable_gqa=True` (the `gqa` class's kernel call, with the mask in "
               "place of `is_causal=True`)" + evidence + ". On a GPU, FlexAttention compiles its backward too; no "
               "GPU run is recorded yet.") if training_dearer and mask_cheaper else
              ("So on a CPU `gqa_flex` suits a custom mask or score for inference; training with one costs more, and "
               "SDPA with a boolean mask is no cheaper here" + evidence + ".") if training_dearer else
              "So on a CPU `gqa_flex` is the class for a custom mask or score, for inference and training alike.")
    return f"In {run}, at its headline shape: " + " ".join(sentences) + " " + advice


def memory_growth_sentence(run_label, short, long, peaks):
    """How each class's peak memory grew from `T = short` to `T = long` (`peaks`: {label: (bytes at short,
    bytes at long)}), against x(long/short)² for memory like T² and x(long/short) for T."""
    factor = long / short
    parts = []
    for label, (at_short, at_long) in peaks.items():
        growth = at_long / at_short
        # Nearer T² or T, compared on a log scale; below T it is mostly fixed memory (weights, inputs).
        exponent = math.log(growth) / math.log(factor)
        like = "like T²" if exponent > 1.5 else "like T" if exponent > 0.75 else "less than T: mostly fixed memory"
        parts.append(f"`{label}` ×{growth:.2f} ({like})")
    return (f"In {run_label}, from `T = {short:,}` to `{long:,}` (×{factor:g}; T² would be ×{factor ** 2:g}), each "
            "class's peak memory grew: " + ", ".join(parts) + ".")


def flops_and_time_sentence(baseline, shares):
    """How time followed FLOPs: `shares` is {class: (its FLOPs / the baseline's, its time / the baseline's)}."""
    parts = [f"`{name}` does {flops:.0%} of `{baseline}`'s forward FLOPs in {time:.0%} of its time"
             for name, (flops, time) in shares.items()]
    follows = {ratio_words(time, flops, within=0.1)[0] for flops, time in shares.values()}
    verdict = {"about the same": "follows the FLOPs", "more": "falls less than the FLOPs",
               "less": "falls more than the FLOPs"}[follows.pop()] if len(follows) == 1 else \
        "does not follow the FLOPs in the same way for both"
    return "; ".join(parts) + f": here the time {verdict}."
