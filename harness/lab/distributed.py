"""Real torch.distributed ranks for the distributed scenarios.

`run_ranks(target, world_size, device)` starts one process per rank, joins them into a process
group (gloo on the CPU; NCCL only with one GPU per rank: several NCCL ranks on one GPU do not
work), calls `target(ctx, *args)` on each and returns the per-rank results (anything picklable:
keep them plain, lists rather than tensors). A rank that raises, crashes or hangs becomes a
`RankError` naming the rank and the cause, within the timeout, with every rank process ended.

`AMP_HARNESS_RANK_SETUP=MODULE:FUNCTION` names a function every spawned rank calls before the
target (a monkeypatch made in the parent does not reach spawned ranks): tests/ uses it to break
PyTorch inside the ranks and show that the distributed scenarios then fail.

The same targets run across nodes under torchrun:

    torchrun --nnodes N --nproc-per-node G ... -m harness.lab.distributed MODULE:FUNCTION --out DIR

(`--standalone` on one machine.)
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from harness.common.errors import HarnessError

SETUP_ENV = "AMP_HARNESS_RANK_SETUP"
GRACE_S = 3.0  # how long the other ranks get to finish once one has failed
# What the fork server imports once for all its ranks: besides torch, what a rank would import
# itself each time: DistributedDataParallel's constructor imports dynamo (0.9 s of CPU a rank),
# the FSDP2 rehearsal FSDP. A module that fails to import is skipped by the fork server.
PRELOADED = ["torch", "torch.distributed", "torch._dynamo", "torch.distributed.fsdp", __name__]


class RankError(HarnessError):
    """One or more ranks failed; the message names each rank and its cause."""


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    backend: str  # "gloo" or "nccl"
    device: torch.device  # cpu, or this rank's own GPU


def backend_for(device_type: str, world_size: int) -> str:
    if device_type == "cpu":
        return "gloo"
    gpus = torch.cuda.device_count()
    if world_size > gpus:
        raise HarnessError(
            f"NCCL needs one GPU per rank: world size {world_size}, found {gpus} GPU(s) "
            "(several NCCL ranks on one GPU do not work); run on the CPU with gloo instead"
        )
    return "nccl"


def _context(rank: int, world_size: int, backend: str, local_rank: int) -> RankContext:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return RankContext(rank, world_size, backend, torch.device("cuda", local_rank))
    return RankContext(rank, world_size, backend, torch.device("cpu"))


def _rank_main(
    target, args, rank, world_size, backend, folder: str, timeout_s: float, environ: dict
) -> None:
    """The body of one rank: its output goes to a log file, its result to a pickle."""
    # The caller's environment now, not the fork server's from when it started (SETUP_ENV,
    # a user's GLOO_* or NCCL_* settings made since).
    os.environ.clear()
    os.environ.update(environ)
    folder = Path(folder)
    log = os.open(folder / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    torch.set_num_threads(1)  # N ranks share the machine's cores
    # Spawned ranks all live on this machine: listen on loopback, not on whatever address the
    # hostname resolves to (a network interface on some hosts). A user's own choice wins.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
    try:
        if os.environ.get(SETUP_ENV):
            _resolve(os.environ[SETUP_ENV])()
        dist.init_process_group(
            backend, init_method=(folder / "store").as_uri(), rank=rank, world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )  # fmt: skip
        context = _context(rank, world_size, backend, rank)
        # Every rank connected before any runs its target: a rank that failed at once left a
        # peer still making its connections to fail too ("Gloo connectFullMesh failed ...
        # Connection closed by peer"), named as a second failure, on a loaded machine.
        dist.barrier()
        outcome = {"result": target(context, *args)}
        (folder / f"rank{rank}.pickle").write_bytes(pickle.dumps(outcome))
        dist.barrier()  # no rank leaves while another is still inside a collective
    except BaseException as exc:  # reported to the parent, with the traceback
        # Timed before this rank exits, which makes the other ranks fail too.
        outcome = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
            "when": time.time(),
        }
        (folder / f"rank{rank}.pickle").write_bytes(pickle.dumps(outcome))
    # Leave without tearing the process group down: gloo's teardown races a peer that has
    # already gone ("terminate called without an active exception", SIGABRT, seen here once in
    # a few hundred runs). The result is written; the OS closes the sockets.
    os._exit(1 if "error" in outcome else 0)


def _loopback_interface() -> str:
    """The name of the loopback interface ("lo" on Linux, "lo0" on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n.startswith("lo")), "lo")


def _tail(path: Path, lines: int = 5) -> str:
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    return " | ".join(text.splitlines()[-lines:])


def _failure(process, folder: Path, rank: int) -> tuple[float, str]:
    """(when, cause) of a rank that ended badly; `when` orders the root cause first."""
    result, log = folder / f"rank{rank}.pickle", folder / f"rank{rank}.log"
    if result.exists():
        outcome = pickle.loads(result.read_bytes())
        if "error" in outcome:
            return outcome["when"], f"raised {outcome['error'][:300]}"
    code = process.exitcode
    if code is not None and code < 0:
        cause = f"crashed: killed by {signal.Signals(-code).name}"
    else:
        cause = f"exited with code {code} without a result"
    output = _tail(log)
    # A crashed rank writes nothing more: its last output is the latest sign of life.
    when = log.stat().st_mtime if log.exists() else time.time()
    return when, f"{cause}; last output: {output}" if output else cause


def run_ranks(
    target: Callable, world_size: int, device_type: str = "cpu", args: tuple = (),
    timeout_s: float = 60.0,
) -> list:  # fmt: skip
    """Run `target(RankContext, *args)` on `world_size` ranks; results in rank order.

    `target` must be importable by name (a module-level function): ranks are not forked from
    this process, so that no thread or CUDA state of the parent leaks into them."""
    backend = backend_for(device_type, world_size)
    spawn = _rank_starter()
    with tempfile.TemporaryDirectory(prefix="amp-ranks-") as tmp:
        folder = Path(tmp)
        processes = [
            spawn.Process(
                target=_rank_main,
                args=(target, args, rank, world_size, backend, tmp, timeout_s, dict(os.environ)),
                name=f"amp-rank{rank}",
            )
            for rank in range(world_size)
        ]
        for process in processes:
            process.start()
        failures = _wait(processes, folder, time.monotonic() + timeout_s, timeout_s)
        if failures:
            raise RankError(
                f"{len(failures)} of {world_size} ranks failed ({backend}): " + "; ".join(failures)
            )
        return [pickle.loads((folder / f"rank{r}.pickle").read_bytes())["result"]
                for r in range(world_size)]  # fmt: skip


def _rank_starter():
    """Where ranks come from: a fork server that imported torch once (a clean process, no
    thread or CUDA state of this one), each rank a fork of it: a rank starts in milliseconds
    instead of importing torch anew (1-2 s of CPU each, several ranks a scenario). Spawned
    where there is no fork server (Windows)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    return context


def _wait(processes, folder: Path, deadline: float, timeout_s: float) -> list[str]:
    """Wait for every rank; on a failure or at the deadline end the rest. Returns the causes,
    the first failure first (the others usually fail because of it)."""
    failed: dict[int, tuple[float, str]] = {}
    stop_at = deadline
    while any(p.is_alive() for p in processes) and time.monotonic() < stop_at:
        for rank, process in enumerate(processes):
            if rank not in failed and not process.is_alive() and process.exitcode != 0:
                failed[rank] = _failure(process, folder, rank)
                stop_at = min(stop_at, time.monotonic() + GRACE_S)
        time.sleep(0.05)
    first = min(failed, key=lambda r: failed[r][0]) if failed else None
    for rank, process in enumerate(processes):
        if process.is_alive():
            process.kill()
            process.join()
            when = time.time()
            if first is not None:
                cause = f"stopped after rank {first} failed"
            elif (folder / f"rank{rank}.pickle").exists():  # done, waiting for the others
                cause, when = "finished and waited for the other ranks", when + 1  # listed last
            else:
                output = _tail(folder / f"rank{rank}.log") or "(none)"
                cause = f"hung: no result within {timeout_s:g} s; last output: {output}"
            failed.setdefault(rank, (when, cause))
        else:
            process.join()
            if process.exitcode != 0 and rank not in failed:
                failed[rank] = _failure(process, folder, rank)
    return [
        f"rank {rank} {cause}"
        for rank, (_, cause) in sorted(failed.items(), key=lambda kv: kv[1][0])
    ]


def _resolve(name: str) -> Callable:
    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    """torchrun entry: run MODULE:FUNCTION on this rank, write its result to OUT/rank<N>.pickle."""
    parser = argparse.ArgumentParser(prog="python -m harness.lab.distributed")
    parser.add_argument("target", help="MODULE:FUNCTION taking a RankContext")
    parser.add_argument("--out", required=True, help="folder for the per-rank results")
    args = parser.parse_args(argv)
    target = _resolve(args.target)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)  # env:// rendezvous, as torchrun sets it up
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        result = target(_context(rank, world_size, backend, local_rank))
    finally:
        dist.destroy_process_group()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{rank}.pickle").write_bytes(pickle.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
