#!/usr/bin/env bash
# Issue 16 items 3-4 on one H200, one device call: JIT-build moebench._C, the GPU tests of the ops
# (the new cuda@256.. gather variants, triton's direct launch and copy_cs knob), then side by side
# in one `python -m moebench.permute` run: CUDA default vs Triton (permute and permute_wait; host
# overhead, item 3) and the exploration variants (item 4); then Triton with its direct launch off
# (MOEBENCH_TRITON_DIRECT=0) for the host-time A/B.
# Usage (device): bash bench/permute16_gpu.sh IMPLS   (IMPLS: the --ops-impl list)
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
source bench/device_env.sh
IMPLS="${1:-cuda,triton,cuda@256}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
step build
python3 -c "import moebench.ops as o; print('impl_status', o.impl_status())" 2>&1 | tail -3
step tests
timeout 150 python3 -m pytest -q -m gpu tests/test_ops_gpu.py -x -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
step permute
python3 -m moebench.permute --shapes 4096x7168x8x256,16384x7168x8x256 --ops permute,permute_wait \
  --ops-impl "$IMPLS" --iters 40 --profile --out "$OUT/permute16.jsonl" 2>&1 | tee "$OUT/permute16.txt"
step nodirect
MOEBENCH_TRITON_DIRECT=0 python3 -m moebench.permute --shapes 4096x7168x8x256 --ops permute,permute_wait \
  --ops-impl triton,cuda --iters 40 --profile --out "$OUT/permute16-nodirect.jsonl" 2>&1 | tee "$OUT/permute16-nodirect.txt"
step done
