"""Run a function on P local processes joined by a gloo process group, and bring their results back.

What `torchrun --nproc-per-node P` does for a script, as a function the tests and the example page can
call: P fresh processes (forked from a fork server that imported torch once), one `torch.distributed`
process group over a file store in a temporary folder (no network port to pick), each process's return
value saved and loaded back in rank order (`torch.load(weights_only=True)`: tensors, numbers, strings and
containers of them, never code). Nothing listens on the network: the processes meet through the file, and
the sockets gloo opens for the data listen on 127.0.0.1 only (`LOOPBACK_GLOO`), whatever the host name
resolves to and whatever `GLOO_SOCKET_IFNAME` says. A process that raises does not take the others down with it:
they run on until they finish or fail in turn (a ring attention waiting for the failed rank raises within
the group's timeout), and the call then raises one error with every failed rank's traceback. Processes
still running after `timeout_s` are ended.
"""

import contextlib
import datetime
import multiprocessing
import os
import pathlib
import pickle
import shutil
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing

_group_timeout = None  # set in each launched process: the timeout of its process group, which subgroups take too
LOOPBACK = "127.0.0.1"
LOOPBACK_GLOO = "gloo_loopback"  # the backend `loopback_gloo()` registers: gloo with its device on LOOPBACK


def run_on_processes(fn, world_size, *args, timeout_s=300.0, group_timeout_s=60.0):
    """Run `fn(*args)` in each of `world_size` new processes of one gloo process group; their results by rank.

    `fn` must be importable (a module-level function of a module, not of the script that calls this) and
    finds its rank with `torch.distributed.get_rank()`. Each process uses `os.cpu_count() // world_size` threads (at least one).
    The group's backend is gloo on 127.0.0.1 (`loopback_gloo()`), and so is every group `fn` makes with
    `torch.distributed.new_group` (or `subgroup`): no process listens on another address.

    Args:
        timeout_s: the whole run's limit; processes still running then are terminated.
        group_timeout_s: the process group's timeout: how long an operation waits for another process.

    Returns:
        `[result of rank 0, result of rank 1, ...]`: each `fn`'s return value (tensors, numbers, strings,
        and lists, tuples and dicts of them), through `torch.save` and `torch.load(weights_only=True)`.

    Raises:
        RuntimeError: a process raised (its traceback is in the message), died, ran past `timeout_s`, or
            returned something else (an object of its own class: loading it would run its code).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise ValueError(f"world_size must be a positive int, got world_size={world_size!r}")
    folder = pathlib.Path(tempfile.mkdtemp(prefix="attention-ring-"))
    start_method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if start_method == "forkserver":
        _start_fork_server(["torch", "torch.distributed", __name__, fn.__module__])
    try:
        with _main_script_hidden():
            context = torch.multiprocessing.start_processes(
                _process_main, args=(fn, world_size, args, str(folder), group_timeout_s), nprocs=world_size,
                join=False, start_method=start_method)
        deadline = time.monotonic() + timeout_s
        for process in context.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        late = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
        for rank in late:
            context.processes[rank].terminate()
            context.processes[rank].join()
        failures = []
        for rank, process in enumerate(context.processes):
            error_file = folder / f"error-{rank}.txt"
            if rank in late:
                failures.append(f"rank {rank}: still running after {timeout_s:g} s, terminated")
            elif error_file.exists():
                failures.append(f"rank {rank} raised:\n{error_file.read_text()}")
            elif process.exitcode != 0 or not (folder / f"result-{rank}.pt").exists():
                failures.append(f"rank {rank}: exited with code {process.exitcode} and no result")
        if failures:
            raise RuntimeError(f"{len(failures)} of {world_size} processes failed:\n" + "\n".join(failures))
        return [_load_result(folder / f"result-{rank}.pt", rank) for rank in range(world_size)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _load_result(path, rank):
    """One process's return value, loaded as data only: `weights_only=True` says so explicitly, so that
    `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` in the environment cannot turn the load into unpickling, which runs
    whatever code the file names. (Not through `attention.files.read_bytes`: nothing bounds the size of what
    `fn` returns, and the file comes from the launch's own process, in the folder `mkdtemp` made for it.)"""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message advises weights_only=False (running the file's code); only its reason is kept
        reason = str(error).split("WeightsUnpickler error: ", 1)[-1].split(" Please use", 1)[0].strip()
        raise RuntimeError(f"rank {rank} returned something other than tensors, numbers, strings, and lists, "
                           f"tuples and dicts of them, which torch.load(weights_only=True) refused: {reason}") from None


def loopback_gloo():
    """The name of a process group backend, `LOOPBACK_GLOO`, registered in this process on first call: gloo
    whose sockets listen on 127.0.0.1 only, for processes that all run on this machine.

    torch's own `"gloo"` listens on the address the host name resolves to (many hosts map their name to
    their network address), or on the interfaces `GLOO_SOCKET_IFNAME` names, and takes no address from
    `init_process_group`; gloo's sockets take no authentication, so a listener there is open to the
    network. Pass the name where `"gloo"` would go: `init_process_group(loopback_gloo(), ...)`; groups
    made later with `new_group` take the default group's backend, so they listen on 127.0.0.1 too.
    """
    if not hasattr(dist.Backend, LOOPBACK_GLOO.upper()):  # what register_backend sets
        dist.Backend.register_backend(LOOPBACK_GLOO, _new_loopback_gloo,
                                      devices=list(dist.Backend.backend_capability[dist.Backend.GLOO]))
    return LOOPBACK_GLOO


def _new_loopback_gloo(store, rank, world_size, timeout):
    """A gloo backend of one group whose device is on 127.0.0.1 (what `init_process_group` calls)."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)]
    return dist.ProcessGroupGloo(store, rank, world_size, options)


@contextlib.contextmanager
def _main_script_hidden():
    """Start processes without the calling script: multiprocessing runs the main script or module again in
    every process it starts (as `__mp_main__`), so a script that launches at top level, like an example page
    run with `python examples/ring.py`, would launch again from each (and a notebook kernel's would import
    the kernel). The processes run `fn`, imported from its module, and need nothing of the main module."""
    main = sys.modules["__main__"]
    script = main.__dict__.pop("__file__", None)
    spec, main.__spec__ = getattr(main, "__spec__", None), None
    try:
        yield
    finally:
        main.__spec__ = spec
        if script is not None:
            main.__file__ = script


def _start_fork_server(preload):
    """Start the fork server (once per process) with `preload` imported, from this process's `sys.path`.

    Each launch forks its processes from the server, so torch and the function's module are imported once,
    not once per process (seconds each); the server never ran torch's thread pool, so forking it is safe.
    Python before 3.12 starts the server without this process's `sys.path` (a module found through it, say
    a test file's, would fail to preload, silently, and be imported again by every process): it gets them
    through `PYTHONPATH`. (Where there is no fork server, Windows, every process is spawned.)
    """
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(preload)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if previous is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = previous


def subgroup(size, timeout_s=None):
    """Split the processes into consecutive groups of `size` (ranks 0..size-1, size..2*size-1, ...) and return
    the one this process belongs to. Every process must call it, with the same sizes in the same order.

    Args:
        timeout_s: the groups' timeout; default the launch's `group_timeout_s` (a group made by `new_group`
            does not inherit it otherwise).
    """
    global_size, rank = dist.get_world_size(), dist.get_rank()
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or global_size % size:
        raise ValueError(f"size must divide the number of processes {global_size}, got size={size!r}")
    timeout = _group_timeout if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    mine = None
    for first in range(0, global_size, size):
        group = dist.new_group(list(range(first, first + size)), timeout=timeout)
        if first <= rank < first + size:
            mine = group
    return mine


def _process_main(rank, fn, world_size, args, folder, group_timeout_s):
    global _group_timeout
    folder = pathlib.Path(folder)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    _group_timeout = datetime.timedelta(seconds=group_timeout_s)
    try:
        dist.init_process_group(loopback_gloo(), store=dist.FileStore(str(folder / "store"), world_size), rank=rank,
                                world_size=world_size, timeout=_group_timeout)
        result = fn(*args)
        torch.save(result, folder / f"result-{rank}.pt")
    except BaseException:
        (folder / f"error-{rank}.txt").write_text(traceback.format_exc())
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
