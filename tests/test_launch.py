"""The launcher never hangs: a rank that raises, crashes or hangs ends the run with its error."""
import ctypes
import time

import pytest
import torch
import torch.distributed as dist

from moebench.harness.launch import LaunchError, run_ranks


def sum_ranks(ctx):
    t = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def raise_on_rank1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    dist.barrier()          # the others wait for rank 1, which never comes
    return ctx.rank


def segfault_on_rank0(ctx):
    if ctx.rank == 0:
        ctypes.string_at(0)
    dist.barrier()


def hang(ctx):
    time.sleep(60)


def test_ranks_run_and_return_in_order():
    assert run_ranks(sum_ranks, 3, "cpu", timeout_s=60) == [6.0, 6.0, 6.0]


def test_a_rank_that_raises_fails_the_run_quickly():
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1 failed: ValueError: boom on purpose"):
        run_ranks(raise_on_rank1, 2, "cpu", timeout_s=60)
    assert time.monotonic() - t0 < 30


def test_a_rank_that_crashes_is_named_with_its_signal():
    with pytest.raises(LaunchError, match="rank 0 died.*SIGSEGV"):
        run_ranks(segfault_on_rank0, 2, "cpu", timeout_s=60)


def test_a_hang_ends_at_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(LaunchError, match="did not finish within 3 s"):
        run_ranks(hang, 2, "cpu", timeout_s=3)
    assert time.monotonic() - t0 < 20
