#!/usr/bin/env bash
# On the H200, EP 1 (T 4096, H 7168, K 8, E 256), side by side in one run:
#  1. issue 16: dispatch --backend alltoall,mcore-alltoall --profile at the tree before this change
#     (.ext/before, a `git archive` of main b5a63e4, carried) and at this checkout, interleaved twice;
#  2. issue 14: the same backends under --overlap with the default GEMM (received rows x H x H) and a
#     DeepSeek-V3-like FC1 (received rows x 2*2048 x H), then the overlap plot and the flags decision.
# Carry .whl (megatron-core 0.19.2 cp312) and .ext/before.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/ep1-h200.txt") 2>&1
source bench/device_env.sh
NEW=$PWD; SHA=${MOEBENCH_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
A=(--ep 1 --device cuda --backend alltoall,mcore-alltoall --profile)
for i in 1 2; do for t in before after; do
  d=$NEW; s=$SHA; [ $t = before ] && d=$NEW/.ext/before s=b5a63e4
  step "$t run $i"
  (cd "$d" && PYTHONPATH="$d:/tmp/site" MOEBENCH_EXT_DIR=/tmp/ext-$t MOEBENCH_GIT_SHA=$s timeout 150 python3 -m moebench.dispatch \
     "${A[@]}" --out "$OUT/ep1-$t-h200.jsonl" 2>&1 | grep -vi warn)
done; done
export MOEBENCH_GIT_SHA=$SHA MOEBENCH_EXT_DIR=/tmp/ext-after
for g in hh:gemm fc1:gemm:32768x4096x7168; do
  n=${g%%:*}; f="$OUT/ep1-overlap-$n-h200.jsonl"
  step "overlap ${g#*:}"
  timeout 200 python3 -m moebench.dispatch "${A[@]}" --overlap ${g#*:} --out "$f" 2>&1 | grep -vi warn
  python3 -m moebench.report "$f" --overlap-plot "$OUT/ep1-overlap-$n-h200.png" | tail -1
  python3 -m moebench.megatron flags --results "$f" --overlap 2>&1 | tee -a "$OUT/ep1-flags-h200.txt"
done
step "gpu tests"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_dispatch.py 2>&1 | tail -5
step done
