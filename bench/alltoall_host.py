"""Host cost of the alltoall backend's dispatch and combine at EP 1 on a GPU, per Python function.

    PYTHONPATH=. python bench/alltoall_host.py [T H K E]     (from the repo root, one GPU)
Prints, per phase: the median with CUDA events (the api view), the host time of one call with the
GPU idle before it (timing.host_us), and the top functions by own time over 200 calls (cProfile).
"""
import cProfile
import os
import pstats
import sys

import torch
import torch.distributed as dist

from moebench.backends.alltoall import AlltoallBackend
from moebench.timing import Timer, host_us
from moebench.workload import Workload, rank_inputs

T, H, K, E = (int(v) for v in sys.argv[1:5]) if len(sys.argv) >= 5 else (4096, 7168, 8, 256)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("gloo", rank=0, world_size=1)
dev = torch.device("cuda")
w = Workload(num_tokens=T, hidden=H, num_experts=E, topk=K, ep=1)
b = AlltoallBackend(knob_values={"ops_impl": "auto"})
b.setup(dist.group.WORLD, w, dev)
x, idx, wt, _, _ = rank_inputs(w, 0, dev)
d = b.dispatch(x, idx, wt)
y = d.x_RH.clone()
timer = Timer(dev, dist.group.WORLD)
for phase, fn in (("dispatch", lambda: b.dispatch(x, idx, wt)), ("combine", lambda: b.combine(y, d.handle))):
    st = timer.run(fn, 50, 200)
    print(f"## {phase}: median {st.median_us:.1f} us (cuda events), host {host_us(fn, True, 50):.1f} us per call, "
          f"ops {b.knobs()['ops']}")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
dist.destroy_process_group()
