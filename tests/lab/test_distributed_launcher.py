"""The rank launcher: real gloo ranks, results back in rank order, and every failure (raise,
crash, hang) reported by rank within the timeout, with no rank process left behind."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from harness.lab import distributed
from harness.lab.distributed import RankError, backend_for, run_ranks


def all_reduce_rank(ctx):
    value = torch.tensor([float(ctx.rank)])
    dist.all_reduce(value)
    return {"rank": ctx.rank, "sum": value.item(), "backend": ctx.backend}


def rank1_raises(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    dist.all_reduce(torch.ones(1))  # waits for rank 1, which never comes


def rank1_crashes(ctx):
    if ctx.rank == 1:
        print("about to crash", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.all_reduce(torch.ones(1))


def rank1_raises_while_rank0_works(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on rank 1")
    time.sleep(3600)  # in no collective: nothing tells rank 0 that rank 1 is gone


def rank1_hangs(ctx):
    if ctx.rank == 1:
        time.sleep(3600)
    return ctx.rank


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_results_come_back_in_rank_order(world_size):
    results = run_ranks(all_reduce_rank, world_size)
    expected = float(sum(range(world_size)))
    assert results == [{"rank": r, "sum": expected, "backend": "gloo"} for r in range(world_size)]


POLL_S = 0.05  # how often the launcher looks at its ranks (harness.lab.distributed._wait)


class LauncherClock:
    """The launcher's clock, advanced by its own sleeps between two looks at its ranks: its
    deadline and grace counted in looks, whatever the machine's load makes each last (a wall
    clock bound, the deadline plus 15 s, was the test's once: on a loaded runner a rank's start
    alone takes seconds). Its time of day stays the wall clock's."""

    time = staticmethod(time.time)

    def __init__(self):
        self.now, self.failed_at = 0.0, None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
        self.now += seconds

    def noting_failures(self, failure):
        """`failure` (the launcher's reading of a failed rank), noting when it first ran."""

        def noted(*args, **kwargs):
            if self.failed_at is None:
                self.failed_at = self.now
            return failure(*args, **kwargs)

        return noted


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "timeout_s", "cause"),
    [
        (rank1_raises, 60, r"rank 1 raised ValueError: boom on rank 1"),
        (rank1_crashes, 60, r"rank 1 crashed: killed by SIGSEGV; last output: about to crash"),
        (rank1_raises_while_rank0_works, 60, r"rank 1 raised .*; rank 0 stopped after rank 1"),
        # 10 s, not less: the deadline counts from the spawn, and on a busy 2-core machine two
        # ranks importing torch took over 5 s, so that rank 0 too read as hung.
        (rank1_hangs, 10, r"rank 1 hung: no result within 10 s.*rank 0 finished and waited"),
    ],
)
def test_a_failing_rank_is_named_quickly_and_nothing_is_left_running(
    target, timeout_s, cause, monkeypatch
):
    clock = LauncherClock()
    monkeypatch.setattr(distributed, "time", clock)
    monkeypatch.setattr(distributed, "_failure", clock.noting_failures(distributed._failure))
    with pytest.raises(RankError, match=r"2 ranks failed \(gloo\): " + cause) as error:
        run_ranks(target, 2, timeout_s=timeout_s)  # the root cause is named first
    # Quickly: the other ranks ended GRACE_S after the first failure, not at the deadline; a
    # hang at the deadline, not after it.
    limit = timeout_s if clock.failed_at is None else clock.failed_at + distributed.GRACE_S
    assert clock.now <= limit + POLL_S, (clock.failed_at, clock.now)
    assert "; rank 0 " in str(error.value)  # what became of the other rank
    assert multiprocessing.active_children() == []


def test_several_nccl_ranks_on_one_gpu_are_refused():
    if torch.cuda.device_count() >= 4:
        pytest.skip(f"this machine has {torch.cuda.device_count()} GPUs: 4 NCCL ranks are fine")
    with pytest.raises(Exception, match=r"NCCL needs one GPU per rank: world size 4"):
        backend_for("cuda", 4)


@pytest.mark.slow
def test_the_same_target_runs_under_torchrun(tmp_path):
    """The multi-node path: torchrun sets up the ranks, harness.lab.distributed runs the target."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node=2", "-m", "harness.lab.distributed",
         "test_distributed_launcher:all_reduce_rank", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = [pickle.loads((tmp_path / f"rank{r}.pickle").read_bytes()) for r in range(2)]
    assert results == [{"result": {"rank": r, "sum": 1.0, "backend": "gloo"}} for r in range(2)]
