#!/usr/bin/env bash
# moebench.dispatch on the one-GPU H200: memory rows, soaks, and the GPU test tier's time. Carry
# .ext/deepep-pack (the NVSHMEM DeepEP build that bench/megatron_lm_h200.sh packs) and .whl (megatron-core).
# Steps, in the order given:
#   ep1     alltoall and mcore-alltoall at EP 1 (T 4096, H 7168, K 8, E 256, bf16): times and memory columns
#   shared  deepep, deepep-ll and hybridep at EP 2 with 2 ranks sharing the GPU (T 64, H 2048, K 4, E 16),
#           each soaked with $SOAK (default 2000) calls on fresh routing: memory rows and soak records
#           (functional: shared-GPU times are no performance figures); SHARED_BACKENDS picks fewer,
#           SOAK_TIMEOUT (default 480 s) is each backend's soak budget, so one backend fits a 600 s device call
#   gputier pytest -m gpu over tests/ with the DeepEP build on the path, timed (goal: under 5 minutes)
# Usage on the device: MOEBENCH_GIT_SHA=<sha> bash bench/dispatch_h200.sh ep1 shared gputier
#   one backend's soak per device call: SHARED_BACKENDS=hybridep bash bench/dispatch_h200.sh shared
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee -a "$OUT/dispatch-h200.txt") 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
source bench/device_env.sh
D="python3 -m moebench.dispatch --device cuda"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
for s in "$@"; do case $s in
ep1)
  step "alltoall and mcore-alltoall, EP 1, T 4096 H 7168 K 8 E 256: times and memory"
  timeout 300 $D --ep 1 --backend alltoall,mcore-alltoall --num-tokens 4096 --hidden 7168 --num-experts 256 \
    --topk 8 --iters 30 --out "$OUT/dispatch-memory-ep1-h200.jsonl" ;;
shared)
  use_deepep_build
  B=${SHARED_BACKENDS:-deepep,deepep-ll,hybridep}
  step "$B: EP 2 on one GPU, memory rows and soaks of ${SOAK:-2000} calls (--timeout ${SOAK_TIMEOUT:-480} s each)"
  timeout "${SHARED_TIMEOUT:-580}" $D --ep 2 --ranks-per-gpu 2 --backend "$B" --num-tokens 64 --hidden 2048 \
    --num-experts 16 --topk 4 --iters 20 --soak "${SOAK:-2000}" --timeout "${SOAK_TIMEOUT:-480}" \
    --out "$OUT/dispatch-shared-soak-h200.jsonl" ;;
gputier)
  use_deepep_build
  # the CUDA extension is built first, as an install builds it (setup.py): its JIT build is not test time
  b0=$SECONDS; python3 -c "import moebench.ops as o; print('impl_status', o.impl_status())" 2>&1 | tail -2
  echo "# moebench._C build: $((SECONDS - b0)) s"
  step "pytest -m gpu tests (DeepEP on the path)"
  # -v and a seconds-since-start stamp per line: which tests took the time, even when the timeout cuts the run
  timeout "${TIER_TIMEOUT:-330}" python3 -m pytest -v -m gpu tests -p no:cacheprovider --durations=25 2>&1 \
    | { s0=$SECONDS; while IFS= read -r l; do printf '%4d %s\n' $((SECONDS - s0)) "$l"; done; } > "$OUT/gpu-tier.log"
  echo "gpu tier rc=${PIPESTATUS[0]}"; grep -E "passed|failed|error" "$OUT/gpu-tier.log" | tail -3 ;;
*) echo "unknown step $s" ;;
esac; done
step done
