#!/usr/bin/env bash
# On the H200, EP 1 (T 4096, H 7168, K 8, E 256): the alltoall path with the split sizes summed on the
# device, --ops-impl auto (CUDA permute, Triton unpermute) against cuda (CUDA unpermute too), interleaved
# twice in one run. `MOEBENCH_GIT_SHA=<sha> bash bench/ep1_final.sh`; carry nothing.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/ep1-final-h200.txt") 2>&1
source bench/device_env.sh
for i in 1 2; do for impl in auto cuda; do
  step "ops-impl $impl, run $i"
  timeout 100 python3 -m moebench.dispatch --ep 1 --device cuda --backend alltoall --ops-impl $impl \
    --out "$OUT/ep1-final-h200.jsonl" 2>&1 | grep -E "^(alltoall|backend)"
done; done
step done
