#!/usr/bin/env bash
# moebench.dispatch on one H200 or H100 (files named after the card, $GPU): the fp8 regression, memory rows,
# soaks, and the GPU test tier.
# Carry .whl (megatron-core) and either .ext/DeepEP (the source: step `build`) or .ext/deepep-pack (a packed build).
# Steps, in the order given:
#   fp8q    alltoall at EP 1 (T 4096, H 7168, K 8, E 256), fp8 with --ops-impl torch, triton and cuda, and bf16: the
#           main job's oracle on the GPU (fp8 failed there at 22abc24), api view only, a minute at most
#   ep1     alltoall and mcore-alltoall at EP 1, same shape, bf16, then alltoall fp8: times and memory columns
#   build   DeepEP hybrid-ep with NVSHMEM from .ext/DeepEP (README's recipe); `bgbuild` starts it in the background
#           and the next `wait` step waits for it (the steps between must not be timings anyone reports)
#   pack    that build as xz pieces under $OUT (carried back as .ext/deepep-pack by a later call)
#   shared  deepep, deepep-ll and hybridep at EP 2 with 2 ranks sharing the GPU (T 64, H 2048, K 4, E 16), each
#           soaked with $SOAK (default 2000) calls on fresh routing within $SOAK_SECONDS (default 150) after its
#           setup: memory rows and soak records with where each call's time went (functional); SHARED_BACKENDS
#           picks fewer; SOAK_VIEWS the views (default api,graph: the graph's replays are soaked too); END (seconds
#           after the script's start) shares what is left of it among the soaks
#   gputier pytest -m gpu over tests/ with the DeepEP build on the path, timed (goal: under 5 minutes): the backends'
#           oracle cases side by side (TIER_WORKERS, default 4), then the rest; TIER_TESTS names fewer paths (a partial
#           run, not the gate); bench/nextgen_h200.sh runs it with ncclep and deepep-v2 expected
# Usage on the device: MOEBENCH_GIT_SHA=<sha> bash bench/dispatch_h200.sh fp8q build pack shared
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
source bench/device_env.sh
exec > >(tee -a "$OUT/dispatch-$GPU.txt") 2>&1
D="python3 -m moebench.dispatch --device cuda"
BIG="--num-tokens 4096 --hidden 7168 --num-experts 256 --topk 8"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
bpid=""
for s in "$@"; do case $s in
fp8q)
  step "alltoall EP 1 fp8 (torch, triton, cuda) and bf16 through the oracle, api view"
  for i in torch triton cuda; do
    timeout 120 $D --ep 1 --backend alltoall $BIG --dtype fp8 --ops-impl $i --views api --iters 5 \
      --out "$OUT/fp8-ep1-$GPU.jsonl" | grep -E "^alltoall|FAIL|error"
  done
  timeout 120 $D --ep 1 --backend alltoall $BIG --views api --iters 5 --out "$OUT/fp8-ep1-$GPU.jsonl" \
    | grep -E "^alltoall|FAIL|error" ;;
ep1)
  step "alltoall and mcore-alltoall, EP 1, T 4096 H 7168 K 8 E 256: times and memory; alltoall fp8"
  timeout 300 $D --ep 1 --backend alltoall,mcore-alltoall $BIG --iters 30 --out "$OUT/dispatch-memory-ep1-$GPU.jsonl"
  timeout 200 $D --ep 1 --backend alltoall $BIG --dtype fp8 --iters 30 --out "$OUT/dispatch-memory-ep1-$GPU.jsonl" ;;
build)
  build_deepep ;;
bgbuild)
  build_deepep > /tmp/deepep-build-step.log 2>&1 & bpid=$! ;;
wait)
  [ -n "$bpid" ] && wait "$bpid"; cat /tmp/deepep-build-step.log 2>/dev/null ;;
pack)
  pack_deepep ;;
shared)
  use_deepep_build
  B=${SHARED_BACKENDS:-deepep-ll,deepep,hybridep}; nb=$(( $(tr -cd , <<<"$B" | wc -c) + 1 ))
  left=$(( ${END:-100000} - $(date +%s) + t0 )); wall=$(( left < ${SHARED_TIMEOUT:-590} ? left : ${SHARED_TIMEOUT:-590} ))
  ss=${SOAK_SECONDS:-$(( (wall - 50 * nb) / nb ))}; ss=$(( ss > 150 ? 150 : ss ))
  if [ "$ss" -lt 20 ]; then echo "# shared: $wall s left, too little for $nb soaks"; continue; fi
  step "$B: EP 2 on one GPU, memory rows and soaks of ${SOAK:-2000} calls within $ss s each ($wall s left)"
  timeout "$wall" $D --ep 2 --ranks-per-gpu 2 --backend "$B" --num-tokens 64 --hidden 2048 \
    --num-experts 16 --topk 4 --iters 20 --views "${SOAK_VIEWS:-api,graph}" --soak "${SOAK:-2000}" --soak-seconds "$ss" \
    --timeout 400 --out "$OUT/dispatch-shared-soak-$GPU.jsonl"
  echo "dispatch rc=$? (3: a soak ran out of its budget with nothing corrupted)" ;;
gputier)
  use_deepep_build
  # the CUDA extension is built first, as an install builds it (setup.py): its JIT build is not test time
  b0=$SECONDS; python3 -c "import moebench.ops as o; print('impl_status', o.impl_status())" 2>&1 | tail -2
  echo "# moebench._C build: $((SECONDS - b0)) s"
  # -v and a seconds-since-start stamp per line: which tests took the time, even when the timeout cuts the run.
  # The backends' oracle cases (each its own rank processes, shared-GPU ranks, no timing asserted) run side by side
  # on the GPU's memory (-n TIER_WORKERS); the rest, timings among them, one at a time after them.
  stamp() { s0=$SECONDS; while IFS= read -r l; do printf '%4d %s\n' $((SECONDS - s0)) "$l"; done; }
  if [ -n "${TIER_TESTS:-}" ]; then groups=("$TIER_TESTS"); else groups=("tests/backends -n ${TIER_WORKERS:-4}" \
    "tests --ignore=tests/backends"); fi
  : > "$OUT/gpu-tier.log"; g0=$SECONDS
  for g in "${groups[@]}"; do
    step "pytest -m gpu $g (DeepEP on the path)"
    timeout "${TIER_TIMEOUT:-330}" python3 -m pytest -v -m gpu $g -p no:cacheprovider --durations=15 2>&1 | stamp \
      >> "$OUT/gpu-tier.log"
    echo "gpu tier ($g) rc=${PIPESTATUS[0]}"; grep -E "passed|failed|error" "$OUT/gpu-tier.log" | tail -1
  done
  echo "# gpu tier: $((SECONDS - g0)) s in all" | tee -a "$OUT/gpu-tier.log" ;;
*) echo "unknown step $s" ;;
esac; done
step done
