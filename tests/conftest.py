"""Test tiers and what the tests share.

Tiers: the default CPU tier runs anywhere; `gpu` / `multigpu` tests skip without GPUs; `slow` marks the
tests that launch many processes or run the Triton interpreter at length (`-m "not slow"` leaves them out); `alone`
the GPU tests that time the GPU or read its memory, which the GPU tier runs with nothing beside them (the rest runs
side by side under pytest-xdist, slow tests first: slow_first).
tests/ mirrors moebench/ by concern (core, env, ops, backends, harness, records, checks, megatron, tools).

Shared here, never imported from another test file: paths (ROOT, FAKES), the environment that puts the
fake deep_ep first (`fake_env`), a tool run in this process (`run_tool`), process-tree helpers for the tests
that signal a tool, a Triton launch spy, and fake backends registered by their "conftest:Class" path (rank
processes import them by it).
"""
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from moebench import cli
from moebench.backends import base
from moebench.backends.alltoall import AlltoallBackend
from moebench.records import provenance

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")          # never use NVLink multicast on shared hosts
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

ROOT = Path(__file__).resolve().parent.parent
FAKES = ROOT / "tests" / "fakes"
FIXTURES = ROOT / "tests" / "fixtures"
SMALL = ["--device", "cpu", "--ep", "2", "--num-tokens", "8", "--num-experts", "8", "--topk", "2", "--iters", "1"]


def pytest_collection_modifyitems(config, items):
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and ngpu < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multigpu" in item.keywords and ngpu < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2+ CUDA GPUs, {ngpu} visible"))
    if hasattr(config, "workerinput"):          # a pytest-xdist worker: every worker orders alike
        items[:] = slow_first(items)


def slow_first(items: list) -> list:
    """The `slow` tests (they launch processes: 15-50 s each in the GPU tier) first, each followed by one quick
    test, then the rest: xdist's load scheduling hands each worker its first two tests, so every worker starts
    on a slow one, and the quick ones fill the workers that finish early (`-n N --dist load --maxschedchunk 1`)."""
    slow = [i for i in items if "slow" in i.keywords]
    quick = [i for i in items if "slow" not in i.keywords]
    paired = [t for k, s in enumerate(slow) for t in (s, *quick[k:k + 1])]
    return paired + quick[len(slow):]


def fake_env(**extra) -> dict:
    """The environment of a subprocess that should find the fake deep_ep (tests/fakes) before anything."""
    return {**os.environ, "PYTHONPATH": f"{FAKES}{os.pathsep}{ROOT}", **extra}


# ---- process trees (Linux /proc) --------------------------------------------------------------------
def proc_stats():
    """(pid, the fields of /proc/PID/stat after the command name: state, ppid, pgrp, ...) of every process."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                yield int(d.name), (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    return [p for p, fields in proc_stats() if int(fields[1]) == pid]


def ranks_of(pid: int) -> list[int]:
    """The rank processes the tool `pid` started: the children of its rank server (harness/server.py
    rank_server), a child of the tool beside multiprocessing's resource tracker."""
    return [r for c in children_of(pid) for r in children_of(c)]


def alive(pid: int) -> bool:
    """Running, neither gone nor a zombie."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, timeout_s: float):
    """cond()'s first truthy value within timeout_s (polled every 0.2 s), else its last value."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    return cond()


# ---- a tool in this process ---------------------------------------------------------------------------
@pytest.fixture
def run_tool(capsys):
    """run_tool(MODULE, *argv): the tool as `python -m MODULE argv` runs it, its main through cli.run (the same
    edges: one-line errors, exit codes), in this process, which spares the start of a Python with torch (~2 s
    on 2 cores) where no process-level behaviour is under test. Returns CompletedProcess(argv, returncode,
    stdout, stderr); the SIGTERM handler and the stdout wrapper cli.run installs are undone after."""
    def run(module: str, *argv: str) -> subprocess.CompletedProcess:
        main = importlib.import_module(module).main
        handler, stdout = signal.getsignal(signal.SIGTERM), sys.stdout
        try:
            rc = cli.run(main, module, list(argv))
        finally:
            signal.signal(signal.SIGTERM, handler)
            sys.stdout = stdout
        cap = capsys.readouterr()
        return subprocess.CompletedProcess([module, *argv], rc, cap.out, cap.err)
    return run


@contextlib.contextmanager
def first_on_path(path: str):
    """`path` first on sys.path and PYTHONPATH while the ranks start (they take this process's sys.path), and the
    records' provenance read with it (the DeepEP build they name)."""
    if not path:
        yield
        return
    saved_path, saved_env = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path.insert(0, path)
    os.environ["PYTHONPATH"] = os.pathsep.join([path, *([saved_env] if saved_env else [])])
    importlib.invalidate_caches()
    provenance.provenance.cache_clear()
    try:
        yield
    finally:
        sys.path[:] = saved_path
        if saved_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_env
        importlib.invalidate_caches()
        provenance.provenance.cache_clear()


# ---- what a timed call runs through torch ------------------------------------------------------------
GLUE = ("mul", "index", "index_select", "gather", "index_copy", "index_put", "nonzero", "masked_select", "cat",
        "_to_copy", "copy", "where", "scatter", "scatter_add", "repeat_interleave")   # elementwise, gather, scatter


class TorchOps:
    """The torch ops a block runs (aten's, by name, in order), as a profiler of glue: a call made `opaque` (a library's
    entry point, moebench's own ops) is listed as one op under its name and what it runs inside is its own work, left
    out. `glue()`: the ops of GLUE among them (elementwise math, gathers, scatters, copies, dtype conversions)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        self.ops, self.depth = [], 0
        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not outer.depth:
                    outer.ops.append(func.overloadpacket.__name__.rstrip("_"))
                return func(*args, **(kwargs or {}))
        self.mode = Mode()

    def opaque(self, owner, *names, label: str = ""):
        """owner.NAME (for each name) runs as one op, listed as label + NAME; patched for good (a rank process)."""
        for n in names:
            def call(*a, _fn=getattr(owner, n), _name=label + n, **k):
                if not self.depth:
                    self.ops.append(_name)
                self.depth += 1
                try:
                    return _fn(*a, **k)
                finally:
                    self.depth -= 1
            setattr(owner, n, call)
        return self

    def run(self, fn):
        """fn() under the recorder: (its result, the ops it ran)."""
        start = len(self.ops)
        with self.mode:
            out = fn()
        return out, self.ops[start:]

    @staticmethod
    def glue(ops: list[str]) -> list[str]:
        return [o for o in ops if o in GLUE]


# ---- Triton ------------------------------------------------------------------------------------------
class LaunchSpy:
    """Stands in for a Triton kernel launched as kernel[grid](...); counts launches."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def run_interpreted(path, shards: tuple[str, ...], timeout_s: float = 600.0) -> str:
    """Run the test file `path` under Triton's interpreter (chosen when triton.jit runs: a fresh process), one process
    per `-k` shard, side by side: the interpreter is one core's work, and the CPU tier's machine has two. '' when
    every shard passes, else each failing one's tail (a shard that selects nothing fails: pytest exits 5)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", str(path), "-k"]
    procs = [subprocess.Popen(argv + [k], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for k in shards]
    deadline, bad = time.monotonic() + timeout_s, []
    try:
        for k, p in zip(shards, procs):
            try:
                out = p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                out = f"timed out after {timeout_s:.0f} s"
            if p.returncode != 0:
                bad.append(f"[-k {k}] {out[-3000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    return "\n".join(bad)


# ---- fake backends: register with base.REGISTRY[name] = "conftest:Class" ------------------------------
class WaiveOnRank1(AlltoallBackend):
    name = "test-waive-rank1"

    def setup(self, group, w, device):
        if dist.get_rank(group) == 1:
            raise base.Unavailable("no widget on rank 1")
        super().setup(group, w, device)


class WrongTokens(AlltoallBackend):
    name = "test-wrong"

    def dispatch(self, *a, **k):
        d = super().dispatch(*a, **k)
        d.x_RH = d.x_RH.flip(0)           # the right multiset only by accident: order across experts breaks
        return d


class WrongBytes(AlltoallBackend):
    """Reports one byte more than it received, as a backend whose own rule disagreed would."""
    name = "test-wrong-bytes"

    def native_bytes(self, d):
        from moebench.core.traffic import traffic_of
        from moebench.core.workload import make_routing
        w = self.w
        pairs = traffic_of([make_routing(w, r)[0] for r in range(w.ep)], w).pairs_SD.sum(0).double()
        return float(pairs[dist.get_rank(self.group)] * w.bytes_per_token) + 1


class EpBenchLoop(AlltoallBackend):
    """alltoall timed in its cached view as NCCL EP's ep_bench times its calls (views/cached.py `paired`)."""
    name = "test-ep-bench"
    cached_loop = "ep_bench"
    calls: list = []

    def cached_phases(self, *args):
        calls = super().cached_phases(*args)
        return {p: (lambda fn=fn, p=p: (EpBenchLoop.calls.append(p), fn())[1]) for p, fn in calls.items()}


class FlakyCombine(AlltoallBackend):
    """Returns one wrong combined row in every 25th combine from the 25th on (about 4% of calls), as DeepEP's
    low-latency combine did on Blackwell: the one check before timing (the first combine) passes it."""
    name = "test-flaky"
    combines = 0

    def combine(self, y_RH, handle):
        out = super().combine(y_RH, handle)
        FlakyCombine.combines += 1
        if FlakyCombine.combines % 25 == 0:
            out = out.clone()
            out[3] = out[3] * 2 + 1
        return out


class WeighsTwice(AlltoallBackend):
    """Weighs the expert rows in combine as well (unpermute with the routing weights), though the experts applied the
    probs dispatch handed them: a backend still built for the old contract."""
    name = "test-weighs-twice"

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        self._w = topk_w_TK
        return super().dispatch(x_TH, topk_idx_TK, topk_w_TK, scales_TS)

    def combine(self, y_RH, handle):
        from moebench import ops
        unweighted = ops.unpermute
        ops.unpermute = lambda y, row_map, w, impl="auto": unweighted(y, row_map, self._w.float(), impl=impl)
        try:
            return super().combine(y_RH, handle)
        finally:
            ops.unpermute = unweighted


class CrashesInSoak(AlltoallBackend):
    """Dies with SIGSEGV on rank 1 at its 40th dispatch (a soak reaches it; a check and a short timing do not)."""
    name = "test-crash-late"
    dispatches = 0

    def dispatch(self, *a, **k):
        CrashesInSoak.dispatches += 1
        if CrashesInSoak.dispatches == 40 and dist.get_rank(self.group) == 1:
            import signal
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().dispatch(*a, **k)


class WrongAfterRebuild(AlltoallBackend):
    """Right until it is built a second time in one process (--recreate), then every combine is off: a buffer that
    does not come back whole from a destroy and re-create."""
    name = "test-rebuild"
    built = 0

    def setup(self, group, w, device):
        WrongAfterRebuild.built += 1
        super().setup(group, w, device)

    def combine(self, y_RH, handle):
        out = super().combine(y_RH, handle)
        return out * 2 + 1 if WrongAfterRebuild.built > 1 else out
