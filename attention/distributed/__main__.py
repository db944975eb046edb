"""Context-parallel attention under `torchrun`: checked against the float64 reference, optionally measured.

    torchrun --nproc-per-node 4 -m attention.distributed --seq-len 8192 --heads 16 --kv-heads 4

Each process takes GPU `LOCAL_RANK` and NCCL where CUDA is available, else the CPU and gloo. Every rank
draws the whole sequence from the seed and keeps its shard; the engine runs forward and backward; the
output and gradient shards are gathered on rank 0, which prints the largest difference from the float64
reference (`attention.reference.reference_kernel`) on the whole sequence, and with `--save` writes them.

Engines: `ring` (`attention.distributed.ring.ring_attention`, any backend with point-to-point operations)
and `context_parallel` (PyTorch's `torch.distributed.tensor.experimental.context_parallel` around
`F.scaled_dot_product_attention`; CUDA only, `--kv-heads` equal to `--heads`, the sequence length a multiple
of twice the process count). `--measure` adds `attention.distributed.measure.measure_ring` (ring only),
printed as JSON by rank 0.
"""

import argparse
import datetime
import json
import os

import torch
import torch.distributed as dist

from attention.distributed.check import DTYPES, RESULTS, case_inputs, context_parallel_attention
from attention.distributed.ring import gather_sequence, ring_attention, shard_sequence


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attention.distributed", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("ring", "context_parallel"), default="ring")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1000)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=300.0, help="the process group's timeout")
    parser.add_argument("--save", help="rank 0 writes the case and the whole-sequence results here (torch.save)")
    parser.add_argument("--measure", action="store_true", help="also time and measure the ring (measure_ring)")
    return parser.parse_args(argv)


def main(argv=None):
    """Run the check on this process; every process of the group runs it. Joins the process group that
    `torchrun` describes (environment variables), or uses the one already initialized."""
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if args.engine == "context_parallel" and not on_gpu:
        raise SystemExit("--engine context_parallel: PyTorch's context_parallel dispatches the CUDA attention "
                         "kernels only (its CPU kernel has no sharding rule); run it on GPUs, or use --engine ring")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    joined = not dist.is_initialized()
    if joined:
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        case = {"world_size": world_size, "batch": args.batch, "num_heads": args.heads, "num_kv_heads": args.kv_heads,
                "seq_len": args.seq_len, "head_dim": args.head_dim, "causal": args.causal, "layout": args.layout,
                "dtype": args.dtype, "seed": args.seed, "engine": args.engine}
        if args.engine == "ring":
            results = _ring(case, rank, world_size, device)
        else:  # its layout is not chosen: zigzag (its head-tail balance) for causal attention when the length allows
            balanced = args.causal and args.seq_len % (2 * world_size) == 0
            case["layout"] = "zigzag" if balanced else "contiguous"
            results = context_parallel_attention(case, device)
        if rank == 0:
            _report(case, results, dist.get_backend(), device)
            if args.save:
                torch.save({"case": case, **{name: tensor.cpu() for name, tensor in results.items()}}, args.save)
        if args.measure and args.engine == "ring":
            from attention.distributed.measure import measure_ring

            measured = measure_ring(args.batch, args.heads, args.kv_heads, args.seq_len, args.head_dim,
                                    causal=args.causal, layout=args.layout, dtype=DTYPES[args.dtype], device=device)
            if rank == 0:
                print(json.dumps(measured))
    finally:
        if joined:
            dist.destroy_process_group()


def _ring(case, rank, world_size, device):
    """The whole sequence's output and gradients, computed by the ring on every rank and gathered."""
    q, k, v, grad_out = (shard_sequence(t, rank, world_size, case["layout"]).to(device) for t in case_inputs(case))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = ring_attention(q, k, v, case["causal"], layout=case["layout"], seq_len=case["seq_len"])
    out.backward(grad_out)
    return {name: gather_sequence(tensor.detach(), case["seq_len"], case["layout"])
            for name, tensor in zip(RESULTS, (out, q.grad, k.grad, v.grad))}


def _report(case, results, backend, device):
    from attention.reference import reference_kernel

    q, k, v, grad_out = (t.to(device=device, dtype=torch.float64) for t in case_inputs(case))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    T = case["seq_len"]
    mask = torch.ones(T, T, dtype=torch.bool, device=device).tril() if case["causal"] else None
    out, _ = reference_kernel(q, k, v, mask=mask)
    out.backward(grad_out)
    expected = dict(zip(RESULTS, (out.detach(), q.grad, k.grad, v.grad)))
    errors = ", ".join(f"{name} {(results[name].double() - expected[name]).abs().max().item():.1e}" for name in RESULTS)
    print(f"{case['engine']} on {case['world_size']} processes ({backend}, {device.type}, {case['dtype']}), "
          f"T = {T}, {'causal' if case['causal'] else 'not causal'}, {case['layout']}: largest difference from "
          f"the float64 reference: {errors}")


if __name__ == "__main__":
    main()
