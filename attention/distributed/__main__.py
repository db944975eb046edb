"""Context-parallel attention under `torchrun`: checked against the float64 reference, optionally measured.

    torchrun --nproc-per-node 4 -m attention.distributed --seq-len 8192 --heads 16 --kv-heads 4

Each process takes GPU `LOCAL_RANK` and NCCL where CUDA is available, else the CPU and gloo. Every rank
draws the whole sequence from the seed and keeps its shard; the engine runs forward and backward; the
output and gradient shards are gathered on rank 0, which prints the largest difference from the float64
reference (`attention.reference.reference_kernel`) on the whole sequence, and with `--save` writes them.

Engines: `ring` (`attention.distributed.ring.ring_attention`, any backend with point-to-point operations)
and `context_parallel` (PyTorch's `torch.distributed.tensor.experimental.context_parallel` around
`F.scaled_dot_product_attention`; CUDA only, `--kv-heads` equal to `--heads`, the sequence length a multiple
of twice the process count). `--measure` adds `attention.bench.sweeps.ring.measure_ring` (ring only),
printed as JSON by rank 0.

What listens on the network: on CPUs, when every rank runs on this machine (torchrun's `LOCAL_WORLD_SIZE`
equals `WORLD_SIZE`), the gloo group's sockets listen on 127.0.0.1 only (`launch.loopback_gloo`); across
machines, on the address the host name resolves to (or `GLOO_SOCKET_IFNAME`'s). torchrun itself, whatever
its options (`--standalone`, `--master-addr 127.0.0.1`, `--rdzv-endpoint 127.0.0.1:PORT`, `--local-addr
127.0.0.1`: torch 2.13, checked), serves its rendezvous store on every interface (`[::]:PORT`), without
authentication: that is torch's behaviour. To keep one machine's run off the network, run torchrun in a
network namespace of its own whose only interface is loopback (Linux; checked on CPUs with gloo):

    unshare --user --map-root-user --net sh -c 'ip link set lo up && torchrun --nproc-per-node 4 -m attention.distributed'
"""

import argparse
import datetime
import io
import json
import math
import os

import torch
import torch.distributed as dist

from attention.checks import positive_int_option as positive_int
from attention.distributed import launch
from attention.distributed.check import DTYPES, RESULTS, case_inputs, context_parallel_attention
from attention.distributed.ring import gather_sequence, ring_attention, shard_sequence
from attention.files import check_new_file, write_bytes


def positive_seconds(text):
    """A finite number of seconds above 0, for argparse: "30" -> 30.0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got {text!r}")
    return value


def parse_args(argv=None):
    """The options, checked before any process group is joined: a bad value is a usage error naming the option."""
    parser = argparse.ArgumentParser(prog="python -m attention.distributed", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("ring", "context_parallel"), default="ring")
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--kv-heads", type=positive_int, default=2, help="key/value heads; divides --heads")
    parser.add_argument("--seq-len", type=positive_int, default=1000)
    parser.add_argument("--head-dim", type=positive_int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--layout", choices=("zigzag", "contiguous"), default="zigzag")
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=positive_seconds, default=300.0, help="the process group's timeout")
    parser.add_argument("--save", help="rank 0 writes the case and the whole-sequence results here (torch.save); "
                                       "an existing file is refused unless --force")
    parser.add_argument("--force", action="store_true", help="with --save: replace an existing file")
    parser.add_argument("--measure", action="store_true", help="also time and measure the ring (measure_ring)")
    args = parser.parse_args(argv)
    if args.heads % args.kv_heads:
        parser.error(f"--kv-heads must divide --heads, got --heads {args.heads} --kv-heads {args.kv_heads}")
    if args.save is not None:  # checked now, not after the run: a folder, a missing folder, an existing file
        try:
            check_new_file(args.save, args.force)
        except (ValueError, FileExistsError) as error:
            parser.error(f"--save {error}")
    return args


def main(argv=None):
    """Run the check on this process; every process of the group runs it. Joins the process group that
    `torchrun` describes (environment variables), or uses the one already initialized."""
    args = parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if args.engine == "context_parallel" and not on_gpu:
        raise SystemExit("--engine context_parallel: PyTorch's context_parallel dispatches the CUDA attention "
                         "kernels only (its CPU kernel has no sharding rule); run it on GPUs, or use --engine ring")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else torch.device("cpu")
    if on_gpu:  # pragma: no cover (cuda: each process takes the GPU LOCAL_RANK names)
        torch.cuda.set_device(device)
    joined = not dist.is_initialized()
    if joined:
        dist.init_process_group(_backend(on_gpu), timeout=datetime.timedelta(seconds=args.timeout_s))
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        case = {"world_size": world_size, "batch": args.batch, "num_heads": args.heads, "num_kv_heads": args.kv_heads,
                "seq_len": args.seq_len, "head_dim": args.head_dim, "causal": args.causal, "layout": args.layout,
                "dtype": args.dtype, "seed": args.seed, "engine": args.engine}
        if args.engine == "ring":
            results = _ring(case, rank, world_size, device)
        else:  # pragma: no cover (cuda: context_parallel runs on GPUs only, refused on CPUs above)
            # Its layout is not chosen: zigzag (its head-tail balance) for causal attention when the length allows.
            balanced = args.causal and args.seq_len % (2 * world_size) == 0
            case["layout"] = "zigzag" if balanced else "contiguous"
            results = context_parallel_attention(case, device)
        if rank == 0:
            _report(case, results, dist.get_backend(), device)
            if args.save:
                saved = io.BytesIO()
                torch.save({"case": case, **{name: tensor.cpu() for name, tensor in results.items()}}, saved)
                write_bytes(args.save, saved.getvalue(), force=args.force)
        if args.measure and args.engine == "ring":
            from attention.bench.sweeps.ring import measure_ring  # the entry point measures with the benchmark's core

            measured = measure_ring(dict(batch=args.batch, num_heads=args.heads, num_kv_heads=args.kv_heads,
                                         seq_len=args.seq_len, head_dim=args.head_dim, causal=args.causal,
                                         layout=args.layout, dtype=args.dtype), device=device)
            if rank == 0:
                print(json.dumps(measured))
    finally:
        if joined:
            dist.destroy_process_group()


def _backend(on_gpu):
    """NCCL on GPUs; on CPUs gloo, listening on 127.0.0.1 only where every rank runs on this machine (torchrun
    sets `LOCAL_WORLD_SIZE`, the processes on this machine, and `WORLD_SIZE`, all of them)."""
    if on_gpu:  # pragma: no cover (cuda: NCCL, the GPUs' backend)
        return "nccl"
    local_size = os.environ.get("LOCAL_WORLD_SIZE")
    return launch.loopback_gloo() if local_size is not None and local_size == os.environ.get("WORLD_SIZE") else "gloo"


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
