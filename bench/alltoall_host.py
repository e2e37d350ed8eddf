"""Host cost of the alltoall backend's dispatch and combine at EP 1 on a GPU, per Python function.

    PYTHONPATH=. python bench/alltoall_host.py [T H K E [OPS_IMPL]]     (from the repo root, one GPU)
Prints, per phase, in one process: the median with the launch behind the L2 flush (the timer's
way, timing.Timer.once), the median with the launch exposed (flush, barrier, then events: the
timer's order before issue 16), the sum of the call's kernels (timing.kernel_profile), their
ratios, the host time of one call with the GPU idle before it (timing.host_us), and the top
functions by own time over 200 calls (cProfile).
"""
import cProfile
import os
import pstats
import statistics
import sys

import torch
import torch.distributed as dist

from moebench.backends.alltoall import AlltoallBackend
from moebench.core.workload import Workload, rank_inputs
from moebench.harness.timing import Timer, host_us, kernel_profile

T, H, K, E = (int(v) for v in sys.argv[1:5]) if len(sys.argv) >= 5 else (4096, 7168, 8, 256)
IMPL = sys.argv[5] if len(sys.argv) >= 6 else "auto"
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("gloo", rank=0, world_size=1)
dev = torch.device("cuda")
w = Workload(num_tokens=T, hidden=H, num_experts=E, topk=K, ep=1)
b = AlltoallBackend(knob_values={"ops_impl": IMPL})
b.setup(dist.group.WORLD, w, dev)
x, idx, wt, _, _ = rank_inputs(w, 0, dev)
d = b.dispatch(x, idx, wt)
y = d.x_RH.clone()
timer = Timer(dev, dist.group.WORLD)


def exposed(fn) -> float:
    """The pre-issue-16 order: flush, barrier (the GPU drains), then events around fn."""
    timer.flush_buf.amax()
    timer.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


for phase, fn in (("dispatch", lambda: b.dispatch(x, idx, wt)), ("combine", lambda: b.combine(y, d.handle))):
    timer.warmup(fn, 50)
    hid, exp = [], []
    for _ in range(100):            # the two orders alternate, call by call
        hid.append(timer.once(fn) * 1e6)
        exp.append(exposed(fn))
    ksum = sum(r["us_per_iter"] for r in kernel_profile(fn, True, top=0))
    mh, me = statistics.median(hid), statistics.median(exp)
    print(f"## {phase} (ops_impl {IMPL}: {b.knobs()['ops']}): median {mh:.1f} us launch behind the flush, "
          f"{me:.1f} us launch exposed; kernels {ksum:.1f} us; ratio {mh / ksum:.3f} / {me / ksum:.3f}; "
          f"host {host_us(fn, True, 50):.1f} us per call")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(12)
dist.destroy_process_group()
