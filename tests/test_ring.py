"""Ring attention (attention/distributed/) across processes, against the float64 reference on the whole sequence.

One launch of 4 local processes (gloo) runs every case at once: a case for P processes runs on each
consecutive group of P (so P = 1, 2 and 4 share the launch, and the two groups of 2 check group-relative
ranks), forward and backward, causal and not, both layouts, T not divisible by P (padding), grouped K/V
heads; PyTorch's own ring (the engine of `context_parallel`) runs beside it on the CPU flash kernel. The same
launch runs the `torchrun` entry point and the measurement. A second launch makes one process crash and one
stop answering mid-ring: the others must end with a clear error, not hang. A third calls the ring differently
on each rank: every rank must raise the same ValueError, not abort in gloo. What the processes listen on is
read from /proc (tests/listening.py): 127.0.0.1 only, also where GLOO_SOCKET_IFNAME names a network interface
and where the host name resolves to the network address (a namespace of its own). The rest runs in this process.
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from helpers import tolerance
from listening import listening, non_loopback_interface, report_listeners

import attention.distributed.__main__ as cli
from attention.distributed import ContextParallelAttention, check, launch
from attention.distributed.__main__ import main as cli_main
from attention.bench.sweeps.ring import measure_ring
from attention.distributed.accounting import count_sent_bytes, expected_sent_bytes, ring_work
from attention.distributed.ring import (chunk_ranges, padded_length, ring_attention, shard_sequence,
                                        unshard_sequence)
from attention.reference import reference_kernel

WORLD_SIZE = 4  # processes per launch


def _case(world_size, causal, layout, heads, kv_heads, seq_len, dtype="float32", engine="ring", batch=2, head_dim=8):
    return dict(world_size=world_size, batch=batch, num_heads=heads, num_kv_heads=kv_heads, seq_len=seq_len,
                head_dim=head_dim, causal=causal, layout=layout, dtype=dtype, engine=engine)


CASES = []
for _P in (1, 2, 4):
    CASES += [
        _case(_P, True, "zigzag", 4, 2, 37),  # GQA, 37 = padded to 40 on 4 processes
        _case(_P, True, "contiguous", 4, 2, 37),
        _case(_P, False, "zigzag", 4, 1, 37),  # one K/V head (MQA)
        _case(_P, False, "contiguous", 2, 2, 32),
        _case(_P, True, "zigzag", 4, 2, 24, dtype="float64"),  # no rounding to hide behind
        _case(_P, True, "zigzag", 4, 2, 37, dtype="bfloat16"),
    ]
CASES += [
    _case(4, True, "zigzag", 2, 2, 5),  # padded to 8 in chunks of 1: three chunks hold padding only
    _case(2, True, "zigzag", 2, 2, 32, engine="torch"),  # PyTorch's ring with its head-tail balancing
    _case(4, True, "zigzag", 2, 2, 32, engine="torch"),
    _case(4, True, "contiguous", 2, 2, 32, engine="torch"),
    _case(2, False, "contiguous", 2, 2, 32, engine="torch"),
]
for _seed, _c in enumerate(CASES):
    _c["seed"] = _seed
CASE_IDS = [f"{c['engine']}-P{c['world_size']}-{'causal' if c['causal'] else 'full'}-{c['layout']}-H{c['num_heads']}"
            f"kv{c['num_kv_heads']}-T{c['seq_len']}-{c['dtype']}" for c in CASES]
CLI_ARGS = ["--seq-len", "50", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--batch", "2"]
MEASURE = dict(batch=1, num_heads=4, num_kv_heads=2, seq_len=64, head_dim=8)
CONTEXT_PARALLEL_CASE = dict(_case(WORLD_SIZE, True, "zigzag", 2, 2, 32), seed=99)


def _launched_worker(cases, cli_path):
    """Every case, the torchrun entry point on all processes, measure_ring on groups of 2 and 4, and PyTorch's
    public context_parallel on the CPU."""
    shards = check.run_cases_here(cases)
    cli_main(CLI_ARGS + ["--save", cli_path])
    measured = {size: measure_ring(MEASURE, launch.subgroup(size), repeats=1) for size in (2, 4)}
    context_parallel = check.try_context_parallel(CONTEXT_PARALLEL_CASE)
    return {"shards": shards, "measured": measured, "context_parallel": context_parallel,
            "listening": listening(os.getpid()) if sys.platform == "linux" else None}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    cli_path = str(tmp_path_factory.mktemp("ring") / "cli.pt")
    per_rank = launch.run_on_processes(_launched_worker, WORLD_SIZE, CASES, cli_path, timeout_s=600)
    return {"results": check.join_shards(CASES, [r["shards"] for r in per_rank]),
            "cli": torch.load(cli_path), "measured": [r["measured"] for r in per_rank],
            "context_parallel": per_rank[0]["context_parallel"], "listening": [r["listening"] for r in per_rank]}


def reference_results(case):
    """Output and gradients of the float64 reference on the whole sequence, for the case's inputs."""
    q, k, v, grad_out = (t.to(torch.float64) for t in check.case_inputs(case))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    T = case["seq_len"]
    mask = torch.ones(T, T, dtype=torch.bool).tril() if case["causal"] else None  # (T, T), True = attend
    out, _ = reference_kernel(q, k, v, mask=mask)
    out.backward(grad_out.to(torch.float64))
    return dict(zip(check.RESULTS, (out.detach(), q.grad, k.grad, v.grad)))


def assert_matches_reference(results, case, names=check.RESULTS):
    expected = reference_results(case)
    dtype = check.DTYPES[case["dtype"]]
    tol = {} if dtype == torch.float64 else tolerance("cpu", dtype)  # float64: assert_close's own, 1e-7
    for name in names:
        assert results[name].dtype == dtype, name
        torch.testing.assert_close(results[name].double(), expected[name], **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("index", range(len(CASES)), ids=CASE_IDS)
def test_distributed_output_and_gradients_match_reference(launched, index):
    case = CASES[index]
    groups = launched["results"][index]
    assert len(groups) == WORLD_SIZE // case["world_size"]
    # Low-precision gradients sum many rounded terms: checked in float32 and float64 (as tests/test_cuda.py does).
    names = ("out",) if case["dtype"] == "bfloat16" else check.RESULTS
    for results in groups:  # each group of P processes computed the whole sequence
        assert results["out"].shape == (case["batch"], case["num_heads"], case["seq_len"], case["head_dim"])
        assert_matches_reference(results, case, names)


def test_torchrun_entry_point_gathers_the_whole_sequence(launched):
    saved = launched["cli"]
    case = saved["case"]
    assert case["world_size"] == WORLD_SIZE and case["seq_len"] == 50 and case["engine"] == "ring"
    assert_matches_reference(saved, case)


def test_context_parallel_on_cpu_is_right_or_refuses_naming_the_cpu_kernel(launched):
    """What the page says about PyTorch's public path on CPU: in 2.13 it stops at the CPU kernel's op; a
    PyTorch where it runs must give the reference's output and gradients (and the page then says so)."""
    result = launched["context_parallel"]
    if result["error"] is None:
        assert_matches_reference(result, CONTEXT_PARALLEL_CASE)
    else:
        assert "_scaled_dot_product_flash_attention_for_cpu" in result["error"], result["error"]


@pytest.mark.parametrize("size", [2, 4])
def test_bytes_sent_are_what_the_ring_should_send(launched, size):
    B, H_kv, D = MEASURE["batch"], MEASURE["num_kv_heads"], MEASURE["head_dim"]
    local_len = padded_length(MEASURE["seq_len"], size, "zigzag") // size
    block = 2 * B * H_kv * local_len * D * 4  # K and V of one shard, float32
    for measured in (per_rank[size] for per_rank in launched["measured"]):
        assert measured["world_size"] == size and measured["local_len"] == local_len
        assert measured["forward"]["sent_bytes"] == [block] * (size - 1)  # counted where they leave
        assert measured["forward_backward"]["sent_bytes"] == ([block] * (size - 1) + [block, block] * (size - 1)
                                                              + [block])
        for mode in ("forward", "forward_backward"):
            assert measured[mode]["sent_bytes"] == measured[mode]["expected_sent_bytes"]
            assert measured[mode]["peak_bytes"] > 0 and measured[mode]["seconds"] > 0


def _failing_worker(mode_by_group, group_timeout_s):
    """Groups of 2 run forward and backward; rank 1 of each group fails at its second exchange: by raising
    (its process ends) or by going silent past the group's timeout. The groups are made with the short
    timeout once every process is up (a slow start must not look like a failure)."""
    dist.barrier()
    group = launch.subgroup(2, timeout_s=group_timeout_s)
    group_index, group_rank = divmod(dist.get_rank(), 2)
    if group_rank == 1:
        mode, calls, original = mode_by_group[group_index], [], dist.batch_isend_irecv

        def failing(operations):
            calls.append(1)
            if len(calls) == 2:  # the forward's exchange went through; the backward's first one does not
                if mode == "silent":
                    time.sleep(group_timeout_s + 1)  # outlasts the neighbour's wait
                raise RuntimeError(f"injected failure ({mode})")
            return original(operations)

        dist.batch_isend_irecv = failing
    case = _case(2, True, "zigzag", 2, 2, 16)
    case["seed"] = 0
    check.run_case(case, group)
    return "finished"


def test_a_failing_process_ends_the_others_with_a_clear_error():
    group_timeout_s = 5
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        launch.run_on_processes(_failing_worker, 4, ["crash", "silent"], group_timeout_s, timeout_s=120)
    message = str(raised.value)
    assert "4 of 4 processes failed" in message and "still running" not in message, message
    reports = {rank: message.split(f"rank {rank} raised:")[1].split("\nrank ")[0] for rank in range(4)}
    assert "injected failure (crash)" in reports[1] and "injected failure (silent)" in reports[3]
    for survivor in (0, 2):  # each waited for its neighbour, and said so
        assert "ring attention stopped at step 0 of 2 on rank 0" in reports[survivor], reports[survivor]
        assert "key and value gradients" in reports[survivor] or "keys and values" in reports[survivor]
    for failed in (1, 3):  # an exchange that fails as it is posted says where the ring stopped too
        assert "ring attention stopped at step 0 of 2 on rank 1: exchanging keys and values" in reports[failed], \
            reports[failed]
    assert time.monotonic() - started < 100  # ended by the errors and the 5 s timeout, not by the launcher's limit


def _stuck_or_vanishing_worker(how):
    if how == "stuck":  # never returns: the launcher's own limit must end it
        time.sleep(600)
    os._exit(3)  # ends without a result or an error report, as a process killed from outside does


def test_a_process_that_hangs_or_vanishes_is_reported_not_waited_for():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"1 of 1 processes failed:\nrank 0: still running after 20 s, terminated"):
        launch.run_on_processes(_stuck_or_vanishing_worker, 1, "stuck", timeout_s=20)
    assert time.monotonic() - started < 300  # ended by timeout_s, not by the sleep
    with pytest.raises(RuntimeError, match=r"1 of 1 processes failed:\nrank 0: exited with code 3 and no result"):
        launch.run_on_processes(_stuck_or_vanishing_worker, 1, "vanish", timeout_s=300)


def test_run_cases_checks_every_case_fits_the_launch_then_runs_each_group_against_the_reference():
    with pytest.raises(ValueError, match=r"case world_size 3 does not divide world_size=4"):
        check.run_cases([_case(2, True, "zigzag", 2, 1, 8), _case(3, True, "zigzag", 2, 1, 9)], world_size=4)
    case = dict(_case(1, True, "zigzag", 2, 1, 9, batch=1, head_dim=4), seed=5)  # one process per group: two groups
    (groups,) = check.run_cases([case], world_size=2, timeout_s=300)
    assert len(groups) == 2
    for results in groups:
        assert_matches_reference(results, case)


def _disagreeing_worker(calls):
    """Rank r makes each call with `calls[i][r]` (its shapes, dtype and options); every error, as `type: message`,
    or "ran". After them, rank 1 leaves and rank 0 calls the ring alone: its error, last."""
    rank, outcomes = dist.get_rank(), []
    for call in calls:
        L, kv_heads, dtype, options = call[rank]
        q = torch.randn(1, 2, L, 4).to(dtype)
        kv = torch.randn(1, kv_heads, L, 4).to(dtype)
        try:
            ring_attention(q, kv, kv, **options)
            outcomes.append("ran")
        except (TypeError, ValueError) as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    if rank == 0:
        time.sleep(0.5)  # rank 1 is gone (its process has ended)
        try:
            ring_attention(torch.randn(1, 2, 4, 4), torch.randn(1, 1, 4, 4), torch.randn(1, 1, 4, 4))
        except RuntimeError as error:
            outcomes.append(f"{type(error).__name__}: {error}")
    return outcomes


AGREED = (4, 1, torch.float32, dict(layout="contiguous"))
DISAGREEING = [  # (rank 0's call, rank 1's call), what the error must say
    ((4, 1, torch.float32, dict(layout="contiguous")), (6, 1, torch.float32, dict(layout="contiguous")),
     "L (positions per shard) is 4 on rank 0, 6 on rank 1; seq_len is 8 on rank 0, 12 on rank 1"),
    (AGREED, (4, 2, torch.float32, dict(layout="contiguous")), "H_kv is 1 on rank 0, 2 on rank 1"),
    (AGREED, (4, 1, torch.float64, dict(layout="contiguous")), "dtype is torch.float32 on rank 0, torch.float64 on rank 1"),
    (AGREED, (4, 1, torch.float32, dict(layout="contiguous", causal=False)), "causal is True on rank 0, False on rank 1"),
    (AGREED, (4, 1, torch.float32, dict(layout="zigzag")), "layout is contiguous on rank 0, zigzag on rank 1"),
    (AGREED, (4, 1, torch.float32, dict(layout="contiguous", seq_len=7)), "seq_len is 8 on rank 0, 7 on rank 1"),
]


def test_ranks_called_differently_all_raise_a_value_error_naming_what_differs():
    calls = [(first, second) for first, second, _ in DISAGREEING]
    calls += [(AGREED, (4, 1, torch.int64, dict(layout="contiguous"))), (AGREED, AGREED)]  # rank 1 refuses; then alike
    outcomes = launch.run_on_processes(_disagreeing_worker, 2, calls, group_timeout_s=20, timeout_s=120)
    for index, (_, _, differs) in enumerate(DISAGREEING):  # the same error on both ranks, instead of gloo's abort
        for rank in (0, 1):
            assert outcomes[rank][index] == (
                "ValueError: ring_attention needs the same call on every rank of the group (shards of one shape and "
                f"dtype, the same causal, layout and seq_len), and the 2 ranks differ: {differs}"), outcomes[rank][index]
    refused = len(DISAGREEING)
    assert outcomes[0][refused] == ("ValueError: ring_attention: rank 1 of the group refused its arguments (see its "
                                    "own error); every rank stops before the ring starts")
    assert outcomes[1][refused].startswith("TypeError: q, k, v must be floating-point tensors of one dtype, got "
                                           "q.dtype=torch.int64"), outcomes[1][refused]
    assert outcomes[0][refused + 1] == outcomes[1][refused + 1] == "ran"  # the group is still usable
    assert len(outcomes[1]) == refused + 2
    alone = outcomes[0][refused + 2]
    assert alone.startswith("RuntimeError: ring attention stopped before step 0 of 2 on rank 0: comparing the ranks' "
                            "arguments failed. Another process of the group failed"), alone


class _RunsCodeWhenLoaded:
    """A result whose unpickling calls `Path.touch` on a marker: what a load that runs a file's code would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def _returns_code(marker):
    return {"out": torch.zeros(2), "note": _RunsCodeWhenLoaded(marker)}


def test_results_are_loaded_as_data_even_where_the_environment_forces_unpickling(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch.load's default becomes weights_only=False
    marker = tmp_path / "code-ran"
    with pytest.raises(RuntimeError, match="rank 0 returned something other than tensors, numbers, strings, and lists, "
                                           r"tuples and dicts of them, which torch.load\(weights_only=True\) refused"):
        launch.run_on_processes(_returns_code, 1, str(marker), timeout_s=120)
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------------
# What listens: every socket of the launch's processes on 127.0.0.1, whatever the host name or GLOO_SOCKET_IFNAME
# ---------------------------------------------------------------------------------------------------------


def _interface_or_skip():
    if sys.platform != "linux":
        pytest.skip(f"reads listening sockets from /proc (Linux), this is {sys.platform}")
    interface = non_loopback_interface()
    if interface is None:
        pytest.skip("no network interface other than loopback has an IPv4 address: nothing to listen on instead")
    return interface


def _assert_on_loopback_only(report):
    assert len(report["listening"]) >= 2, report  # the launch's group and the one made inside
    assert all(host == "127.0.0.1" for host, _ in report["listening"]), report["listening"]


def test_the_launch_listens_on_loopback_only(launched):
    """The 4 processes of the launch above, with their groups of 1, 2 and 4 (as the host name resolves here)."""
    if sys.platform != "linux":
        pytest.skip(f"reads listening sockets from /proc (Linux), this is {sys.platform}")
    for report in launched["listening"]:
        assert report and all(host == "127.0.0.1" for host, _ in report), report


def test_a_launched_process_listens_on_loopback_whatever_gloo_socket_ifname_names(tmp_path, monkeypatch):
    """A launched process (`_process_main`, one rank, here) where GLOO_SOCKET_IFNAME names a network
    interface, as it would in the environment of a launch: torch's gloo listens there."""
    name, _ = _interface_or_skip()
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", name)
    threads = torch.get_num_threads()
    try:
        launch._process_main(0, report_listeners, 1, (), str(tmp_path), 30.0)
    except SystemExit:
        pytest.fail((tmp_path / "error-0.txt").read_text())
    finally:
        torch.set_num_threads(threads)
    _assert_on_loopback_only(torch.load(tmp_path / "result-0.pt", weights_only=True))


def test_a_launched_process_listens_on_loopback_where_the_host_name_resolves_elsewhere(tmp_path):
    """The same in a new process with a host name and an /etc/hosts of its own (mount and UTS namespaces) that
    map the name to this machine's network address, as many hosts' files do: torch's gloo listens there."""
    _, address = _interface_or_skip()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give a process a host name and an /etc/hosts of its own")
    tried = subprocess.run(["unshare", "-m", "-u", "true"], capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"unshare -m -u is not allowed here: {tried.stderr.strip()}")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{address} ring-test-host\n")
    # launch.py imports torch only: loaded from its file, without the package's imports (seconds of them)
    script = ("import importlib.util, json, pathlib, sys, torch\nfrom listening import report_listeners\n"
              "spec = importlib.util.spec_from_file_location('launch', sys.argv[1])\n"
              "launch = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(launch)\n"
              "launch._process_main(0, report_listeners, 1, (), sys.argv[2], 30.0)\n"
              "print(json.dumps(torch.load(pathlib.Path(sys.argv[2], 'result-0.pt'), weights_only=True)))")
    tests = pathlib.Path(__file__).resolve().parent
    namespace = ["unshare", "-m", "-u", "sh", "-c", 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"',
                 "sh", str(hosts), "ring-test-host"]
    done = subprocess.run([*namespace, sys.executable, "-c", script, launch.__file__, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tests)})
    error_file = tmp_path / "error-0.txt"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:] + (
        error_file.read_text() if error_file.exists() else "")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["resolves_to"] == address  # what the test is about: the name resolves to the network address
    _assert_on_loopback_only(report)


def test_the_entry_point_listens_on_loopback_when_every_rank_is_on_this_machine(monkeypatch):
    """`python -m attention.distributed` as torchrun starts it (one process here), with GLOO_SOCKET_IFNAME
    naming a network interface: its gloo group listens on 127.0.0.1. (The store on MASTER_PORT is the one
    torchrun's agent serves, on every interface: torch's behaviour, said in the docstring.)"""
    name, _ = _interface_or_skip()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        store_port = free.getsockname()[1]
    for variable, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(store_port), GLOO_SOCKET_IFNAME=name).items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU path, gloo, on any machine
    seen, report = [], cli._report
    monkeypatch.setattr(cli, "_report", lambda *args: (seen.extend(listening(os.getpid())), report(*args)))
    cli_main(["--seq-len", "8", "--heads", "2", "--kv-heads", "1", "--head-dim", "4"])
    gloo = [(host, port) for host, port in seen if port != store_port]
    assert gloo and all(host == "127.0.0.1" for host, _ in gloo), seen
    assert not dist.is_initialized()


# ---------------------------------------------------------------------------------------------------------
# In this process: layouts, sharding, the single-process ring, errors, the work and bytes formulas
# ---------------------------------------------------------------------------------------------------------


def test_ring_attention_keeps_the_family_contract():
    import inspect

    assert isinstance(ring_attention, ContextParallelAttention)
    contract = list(inspect.signature(ContextParallelAttention.__call__).parameters.values())[1:]  # without self
    ours = list(inspect.signature(ring_attention).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in contract]


def test_chunk_ranges_of_each_layout():
    assert chunk_ranges(0, 2, 4, "zigzag") == [(0, 2), (6, 8)]
    assert chunk_ranges(1, 2, 4, "zigzag") == [(2, 4), (4, 6)]
    assert chunk_ranges(1, 2, 4, "contiguous") == [(4, 8)]
    covered = sorted(p for rank in range(4) for start, end in chunk_ranges(rank, 4, 6, "zigzag") for p in range(start, end))
    assert covered == list(range(24))


def test_zigzag_is_pytorchs_head_tail_balance():
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

    for world_size in (2, 4):
        positions = torch.arange(32)
        ours = torch.cat([shard_sequence(positions, rank, world_size, "zigzag", seq_dim=0) for rank in range(world_size)])
        theirs = _HeadTailLoadBalancer(32, world_size, "cpu")._generate_indices()[0]
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world_size,seq_len", [(1, 7), (2, 9), (3, 10), (4, 37), (4, 5)])
def test_shard_then_unshard_is_the_identity_with_gradients(layout, world_size, seq_len):
    x = torch.randn(2, seq_len, 3, requires_grad=True)  # (B, T, C): sharded along dim 1
    shards = [shard_sequence(x, rank, world_size, layout, seq_dim=1) for rank in range(world_size)]
    padded = padded_length(seq_len, world_size, layout)
    assert all(shard.shape == (2, padded // world_size, 3) for shard in shards)
    assert padded % (world_size * (2 if layout == "zigzag" else 1)) == 0 and 0 <= padded - seq_len < 2 * world_size
    whole = unshard_sequence(shards, seq_len, layout, seq_dim=1)
    assert torch.equal(whole, x)
    weights = torch.randn_like(x)
    (whole * weights).sum().backward()
    assert torch.equal(x.grad, weights)


@pytest.mark.parametrize("causal", [True, False])
def test_without_a_process_group_one_process_holds_the_whole_sequence(causal):
    assert not dist.is_initialized()
    case = _case(1, causal, "zigzag", 4, 2, 21)
    case["seed"] = 7
    q, k, v, grad_out = check.case_inputs(case)
    padded = [shard_sequence(t, 0, 1, "zigzag").requires_grad_(True) for t in (q, k, v)]  # 21 -> 22 positions
    out = ring_attention(*padded, causal, seq_len=21)
    assert torch.equal(out[:, :, -1], torch.zeros_like(out[:, :, -1]))  # the padded position: zero output
    grad = shard_sequence(grad_out, 0, 1, "zigzag")
    grad[:, :, -1] = torch.randn_like(grad[:, :, -1])  # a loss that does not mask the padding changes nothing
    out.backward(grad)
    results = {name: unshard_sequence([t], 21, "zigzag") for name, t in
               zip(check.RESULTS, (out.detach(), *(t.grad for t in padded)))}
    assert_matches_reference(results, case)


def test_bad_arguments_raise_clear_errors():
    q = torch.randn(1, 4, 8, 16)
    kv = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="H_kv dividing H"):
        ring_attention(q, torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16))
    with pytest.raises(ValueError, match="q must be"):
        ring_attention(q, torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16))
    with pytest.raises(ValueError, match="layout must be one of"):
        ring_attention(q, kv, kv, layout="striped")
    with pytest.raises(ValueError, match=r"seq_len must be an int in \[1, 1 processes x 8 = 8\], got seq_len=9"):
        ring_attention(q, kv, kv, seq_len=9)
    with pytest.raises(ValueError, match="shard_sequence pads it to 6"):
        ring_attention(q, kv, kv, seq_len=5)  # 8 positions cannot hold 5: they would be 6
    with pytest.raises(ValueError, match="local_len must be even"):
        chunk_ranges(0, 2, 5, "zigzag")
    with pytest.raises(TypeError, match="q, k, v must be tensors"):
        ring_attention(q.numpy(), kv, kv)
    with pytest.raises(ValueError, match="rank must be in"):
        shard_sequence(q, 2, 2)
    with pytest.raises(ValueError, match="cannot hold seq_len=20"):
        unshard_sequence([q, q], 20, "zigzag")
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        launch.run_on_processes(print, 0)


def test_integer_tensors_mixed_dtypes_and_sizes_of_zero_are_refused():
    q, kv = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(TypeError, match="floating-point tensors of one dtype, got q.dtype=torch.int64, k.dtype=torch.int64"):
        ring_attention(q.long(), kv.long(), kv.long())
    with pytest.raises(TypeError, match="got q.dtype=torch.float32, k.dtype=torch.float64, v.dtype=torch.float64"):
        ring_attention(q, kv.double(), kv.double())
    with pytest.raises(ValueError, match=r"no size 0, got q \(1, 4, 8, 0\)"):  # head_dim 0: no scale 1/sqrt(0)
        ring_attention(torch.randn(1, 4, 8, 0), torch.randn(1, 2, 8, 0), torch.randn(1, 2, 8, 0))
    with pytest.raises(ValueError, match=r"no size 0, got q \(1, 4, 8, 16\), k \(1, 0, 8, 16\)"):
        ring_attention(q, torch.randn(1, 0, 8, 16), torch.randn(1, 0, 8, 16))


@pytest.mark.parametrize("argv, says", [
    (["--heads", "0"], "argument --heads: expected a positive integer, got '0'"),
    (["--batch", "0"], "argument --batch: expected a positive integer, got '0'"),
    (["--kv-heads", "0"], "argument --kv-heads: expected a positive integer, got '0'"),
    (["--head-dim", "0"], "argument --head-dim: expected a positive integer, got '0'"),
    (["--seq-len", "-3"], "argument --seq-len: expected a positive integer, got '-3'"),
    (["--kv-heads", "3"], "--kv-heads must divide --heads, got --heads 8 --kv-heads 3"),
    (["--timeout-s", "0"], "argument --timeout-s: expected a finite number of seconds above 0, got '0'"),
    (["--timeout-s", "-5"], "argument --timeout-s: expected a finite number of seconds above 0, got '-5'"),
    (["--timeout-s", "nan"], "argument --timeout-s: expected a finite number of seconds above 0, got 'nan'"),
    (["--timeout-s", "inf"], "argument --timeout-s: expected a finite number of seconds above 0, got 'inf'"),
    (["--timeout-s", "soon"], "argument --timeout-s: expected a finite number of seconds above 0, got 'soon'"),
])
def test_the_entry_point_refuses_bad_options_before_joining_a_group(argv, says, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_the_entry_point_takes_the_group_timeout_in_seconds():
    assert cli.parse_args(["--timeout-s", "2.5"]).timeout_s == 2.5
    assert cli.parse_args([]).timeout_s == 300.0


def test_the_entry_point_checks_where_it_saves_before_running(tmp_path, capsys):
    existing = tmp_path / "notes.txt"
    existing.write_text("precious")
    for path, says in [(tmp_path, f"--save {tmp_path}: a folder; name a file to write"),
                       (tmp_path / "missing" / "results.pt", f"its folder {tmp_path / 'missing'} does not exist"),
                       (existing, f"--save {existing}: exists already; pass --force to replace it")]:
        with pytest.raises(SystemExit) as exited:
            cli.parse_args(["--save", str(path)])
        assert exited.value.code == 2 and says in capsys.readouterr().err
    assert cli.parse_args(["--save", str(existing), "--force"]).force
    assert existing.read_text() == "precious"


def test_context_parallel_on_cpus_is_refused_before_joining_a_group(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"--engine context_parallel: .* CUDA attention kernels only .* "
                                         r"run it on GPUs, or use --engine ring"):
        cli_main(["--engine", "context_parallel"])
    assert not dist.is_initialized()


def _one_process_torchrun_environment(monkeypatch):
    """The variables torchrun sets for a run of one process on this machine (store on a free loopback port)."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        store_port = free.getsockname()[1]
    for variable, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(store_port)).items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU path, gloo, on any machine


def test_the_entry_point_on_one_process_reports_saves_and_measures(tmp_path, monkeypatch, capsys):
    """`torchrun --nproc-per-node 1 -m attention.distributed --no-causal --layout contiguous --save F --measure`:
    the line naming the case and its differences from the reference, the whole sequence saved (equal to the
    reference), the measurement printed as JSON; the group it joined is left."""
    _one_process_torchrun_environment(monkeypatch)
    saved = tmp_path / "results.pt"
    cli_main(["--seq-len", "12", "--heads", "2", "--kv-heads", "1", "--head-dim", "4", "--no-causal",
              "--layout", "contiguous", "--save", str(saved), "--measure"])
    assert not dist.is_initialized()
    report, measured = capsys.readouterr().out.strip().splitlines()
    assert report.startswith(f"ring on 1 processes ({launch.LOOPBACK_GLOO}, cpu, float32), T = 12, not causal, "
                             "contiguous: largest difference from the float64 reference: out "), report
    results = torch.load(saved)
    case = results["case"]
    assert case == dict(_case(1, False, "contiguous", 2, 1, 12, batch=1, head_dim=4), seed=0)
    assert_matches_reference(results, case)
    measured = json.loads(measured)
    assert measured["world_size"] == 1 and measured["local_len"] == 12 and measured["causal"] is False
    assert measured["forward"]["sent_bytes"] == []  # one process: the ring sends nothing


@pytest.mark.parametrize("local_world_size, world_size, backend", [
    ("4", "4", launch.LOOPBACK_GLOO),  # every rank on this machine: sockets on 127.0.0.1
    ("4", "8", "gloo"),  # ranks on other machines reach this one on its network address
    (None, "4", "gloo"),  # not started by torchrun: nothing says the ranks share this machine
])
def test_the_entry_point_listens_on_loopback_only_when_every_rank_is_on_this_machine(
        local_world_size, world_size, backend, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", world_size)
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    assert cli._backend(on_gpu=False) == backend


def test_the_entry_point_runs_as_a_module_and_refuses_a_bad_option():
    root = pathlib.Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "attention.distributed", "--heads", "6", "--kv-heads", "4"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 2 and done.stdout == ""
    assert "--kv-heads must divide --heads, got --heads 6 --kv-heads 4" in done.stderr


def test_causal_work_is_balanced_by_the_zigzag_layout():
    P, T = 4, 64
    chunk = T // (2 * P)
    zigzag = ring_work(P, T, "zigzag")
    # Step 0: the rank's two chunks against themselves: two diagonal tiles and one full; later steps two full tiles.
    assert zigzag == [[3 * chunk * chunk] + [2 * chunk * chunk] * (P - 1)] * P
    contiguous = ring_work(P, T, "contiguous")
    L = T // P
    # Rank r scores its diagonal block, then the r blocks before it; the blocks after it are skipped.
    assert contiguous == [[L * L] + [L * L if step <= rank else 0 for step in range(1, P)] for rank in range(P)]
    assert ring_work(P, T, "contiguous", causal=False) == [[L * L] * P] * P


def test_expected_bytes_formula_and_the_counter():
    sent = expected_sent_bytes(batch=2, num_kv_heads=3, local_len=5, head_dim=7, dtype=torch.bfloat16, world_size=3)
    block, gradients = 2 * 2 * 3 * 5 * 7 * 2, 2 * 2 * 3 * 5 * 7 * 4  # K and V in bf16; their gradients in float32
    assert sent["forward"] == [block, block]
    assert sent["forward_backward"] == [block, block, block, gradients, block, gradients, gradients]
    assert expected_sent_bytes(1, 1, 4, 4, torch.float32, 1) == {"forward": [], "forward_backward": []}
    original = dist.batch_isend_irecv
    with count_sent_bytes() as counted:
        assert dist.batch_isend_irecv is not original
    assert dist.batch_isend_irecv is original and counted == []


def test_measure_on_one_process_without_a_group():
    measured = measure_ring(dict(batch=1, num_heads=2, num_kv_heads=1, seq_len=16, head_dim=8), repeats=1)
    assert measured["world_size"] == 1 and measured["local_len"] == 16
    assert measured["forward"]["sent_bytes"] == [] and measured["forward"]["peak_bytes"] > 0


# ---------------------------------------------------------------------------------------------------------
# GPUs: the same check under torchrun with NCCL, for the ring and for PyTorch's context_parallel
# ---------------------------------------------------------------------------------------------------------

needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs at least two NVIDIA GPUs (CUDA, NCCL)")


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.parametrize("engine,extra", [("ring", ["--kv-heads", "2"]), ("ring", ["--kv-heads", "2", "--dtype", "bfloat16"]),
                                          ("context_parallel", ["--kv-heads", "8"]),
                                          ("context_parallel", ["--kv-heads", "8", "--no-causal"])])
def test_torchrun_on_gpus_matches_reference(tmp_path, engine, extra):
    import subprocess
    import sys

    processes = min(4, torch.cuda.device_count())
    saved = tmp_path / "results.pt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "-m",
               "attention.distributed", "--engine", engine, "--seq-len", str(64 * processes), "--heads", "8",
               "--head-dim", "64", "--save", str(saved), *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    results = torch.load(saved)
    case = results["case"]
    names = ("out",) if case["dtype"] == "bfloat16" else check.RESULTS
    expected = reference_results(case)
    dtype = check.DTYPES[case["dtype"]]
    for name in names:
        torch.testing.assert_close(results[name].double(), expected[name], **tolerance("cuda", dtype),
                                   msg=lambda m: f"{name}: {m}")

