"""Host-side cost of one moebench.ops permute call, per Python function (cProfile), on a GPU.

    PYTHONPATH=. python bench/host_profile.py [T H K E] [impl ...]   (from the repo root)
Each impl: 200 calls, the GPU synchronised after each; prints the top functions by own time.
"""
import cProfile
import pstats
import sys

import torch

import moebench.ops as ops
from moebench.harness.timing import host_us

args = sys.argv[1:]
T, H, K, E = (int(v) for v in args[:4]) if len(args) >= 4 else (8192, 2048, 8, 128)
impls = args[4:] or ["cuda", "triton"]
x = torch.randn(T, H, device="cuda").bfloat16()
idx = torch.topk(torch.rand(T, E, device="cuda"), K, dim=1).indices
for impl in impls:
    for n_out in (None, T * K):
        fn = lambda: ops.permute(x, idx, E, impl=impl, num_out_rows=n_out)  # noqa: E731
        for _ in range(20):
            fn()
        print(f"## {impl} num_out_rows={n_out}: host median {host_us(fn, cuda=True, n=50):.1f} us per call")
        if n_out is None:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(200):
                fn()
                torch.cuda.synchronize()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(18)
