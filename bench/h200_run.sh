#!/usr/bin/env bash
# The H200 (one GPU) acceptance run that produced bench/results/h200-*: GPU-tier tests, the
# check suite, the main job at EP 1 (NCCL path), the dsv3 sweep, and the megatron-core check.
# Usage on the device machine, with .whl (megatron-core 0.19.2 wheel) carried:
#   MOEBENCH_GIT_SHA=<sha> bash bench/h200_run.sh      (writes under $OUT)
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
source bench/device_env.sh
step "build"; python3 -c "import moebench.ops as o; print(o.impl_status())" 2>&1 | tail -2
D="python3 -m moebench.dispatch --ep 1 --device cuda --out $OUT/h200-dispatch.jsonl"
step "dispatch"; $D --backend alltoall,mcore-alltoall 2>&1 | tail -6; $D --backend alltoall --dtype fp8 2>&1 | tail -3
step "check"; timeout 180 python3 -m moebench.check --out "$OUT/h200-check.json" --junit "$OUT/h200-check.xml" 2>&1 | tail -20
step "megatron"; timeout 200 python3 -m moebench.megatron validate --dispatcher alltoall --steps 50 --ep 1 \
  --out "$OUT/h200-megatron-validate.jsonl" 2>&1 | tail -8
step "gpu tests"; timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -6 | tee "$OUT/h200-gpu-tests.log"
step "sweep"; timeout 200 $D --backend alltoall --sweep dsv3 --iters 5 2>&1 | grep -v "^#" | tail -8
step "done"
