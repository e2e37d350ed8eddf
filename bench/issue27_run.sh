#!/usr/bin/env bash
# Issues 27 and 26 on the one-GPU H200: DeepEP hybrid-ep built with and without NVSHMEM, the container gate
# on both builds, deepep-ll / Megatron's flex paths / the graph view with shared-GPU ranks, Megatron training
# on the flex path with shared-GPU ranks, the alltoall graph view at EP 1, the GPU test tier.
# Carry .ext/DeepEP (a `git archive` of hybrid-ep 94a9f8f) and .whl (megatron-core 0.19.2, nvshmem4py-cu13
# 0.4.1). Builds land in .ext/deepep-builds (ignored: kept while the machine stays warm). On the device:
#   MOEBENCH_GIT_SHA=<sha> bash bench/issue27_run.sh build gpu wait pack ep1 check-no
#   MOEBENCH_GIT_SHA=<sha> bash bench/issue27_run.sh unpack check-yes shared megatron      (carry .ext/deepep-pack too)
#   CALLS="1 4 16" FLUSH="flush noflush" bash bench/issue27_run.sh ep1 floor unpack repair graph-shared tier  (issue 26)
# `build` starts the two builds in the background (the GPU steps after it run meanwhile), `wait` waits for
# them. Every step has its own timeout; a step that fails is logged and the next one runs.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee -a "$OUT/${LOG_NAME:-issue27-h200.txt}") 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
source bench/device_env.sh
BASE=$PYTHONPATH B=$PWD/.ext/deepep-builds
NO=syslink YES=nvshmem+syslink              # the two builds: HybridEP needs the system g++ (syslink) in both
use() { export PYTHONPATH="$BASE:$B/$1"; }   # which DeepEP build the next commands see
D="timeout 240 python3 -m moebench.dispatch --timeout 200"
C="python3 -m moebench.check --iters 3 --timeout 150 --num-tokens 256 -t env -t megatron -t nvshmem -p transport"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for s in "$@"; do case $s in
build)
  step "build DeepEP hybrid-ep: $NO and $YES (all extensions at once, in the background)"
  (BUILD_ROOT=$B FIX="$NO $YES" MAX_JOBS=13 timeout 500 bash bench/deepep_build.sh .ext/DeepEP > /tmp/build.log 2>&1;
   echo "build rc=$?" >> /tmp/build.log) & BUILD=$! ;;
wait)
  step "wait for the builds"; wait "$BUILD"
  grep -h '^{' /tmp/build.log > "$OUT/deepep-build-nvshmem-h200.json"; grep -E "rc=|failed|NVSHMEM was|PYTHONPATH" /tmp/build.log
  grep -q "build rc=0" /tmp/build.log || tail -40 /tmp/build.log ;;
pack)
  step "pack the NVSHMEM build for a later call (carried back as .ext/deepep-pack)"
  tar -C "$B" -I 'xz -T0 -3' -cf /tmp/b.tar.xz "$YES" && ls -la /tmp/b.tar.xz && split -b 15M /tmp/b.tar.xz "$OUT/deepep-nvshmem.tar.xz." ;;
unpack)
  if [ -d "$B/$YES" ]; then echo "# $B/$YES is still here (warm machine)"
  else step "unpack the carried NVSHMEM build"; mkdir -p "$B" && cat .ext/deepep-pack/deepep-nvshmem.tar.xz.* | tar -xJ -C "$B"; fi ;;
repair)   # the call-1 build (before the deepep_build.sh fix) lacks deep_ep/backend, the headers HybridEP's JIT needs
  [ -d "$B/$YES/deep_ep/backend" ] || { cp -r .ext/DeepEP/csrc/hybrid_ep/backend "$B/$YES/deep_ep/backend" &&
    cp .ext/DeepEP/csrc/hybrid_ep/utils.cuh "$B/$YES/deep_ep/backend/" && echo "# repaired $B/$YES/deep_ep/backend"; } ;;
hybridep)
  use $YES; step "check: HybridEP on the NVSHMEM build (shared-GPU round trips)"
  timeout 200 python3 -m moebench.check --iters 3 --timeout 150 --num-tokens 256 -t env -p hybridep \
    --out "$OUT/check-nvshmem-hybridep-h200.json" --junit "$OUT/check-nvshmem-hybridep-h200.xml" | cut -c1-400
  for m in permute plain; do
    step "hybridep EP 2 mode $m (shared GPU), all views"
    $D --backend hybridep --knob mode=$m --ep 2 --ranks-per-gpu 2 --num-tokens 512 --hidden 2048 --num-experts 32 \
      --topk 4 --iters 5 --out "$OUT/shared-gpu-hybridep-h200.jsonl" 2>&1 | grep -E "^(hybridep|backend|# )" | cut -c1-260
  done
  step "mcore-hybridep EP 2 (shared GPU)"
  $D --backend mcore-hybridep --ep 2 --ranks-per-gpu 2 --num-tokens 512 --hidden 2048 --num-experts 32 --topk 4 \
    --iters 5 --out "$OUT/shared-gpu-hybridep-h200.jsonl" 2>&1 | grep -E "^(mcore|backend|# )" | cut -c1-260 ;;
timing)
  step "pytest -m gpu tests/test_timing.py on a quiet host (call 1 ran it beside the builds)"
  (export PYTHONPATH=$BASE; timeout 120 python3 -m pytest -q -m gpu tests/test_timing.py -p no:cacheprovider 2>&1 | tail -3) ;;
ep1)      # CALLS: the --graph-calls values, FLUSH: flush and/or noflush (--no-flush-l2), side by side (issue 26)
  for fl in ${FLUSH:-flush}; do for calls in ${CALLS:-4}; do for dt in bf16 fp8; do
    step "alltoall EP 1 $dt, all views (graph: the cached calls captured, $calls pairs per graph), $fl"
    $D --ep 1 --device cuda --backend alltoall --dtype $dt --profile --graph-calls $calls \
      $([ "$fl" = noflush ] && echo --no-flush-l2) --out "$OUT/${EP1_OUT:-ep1-graph-h200.jsonl}" 2>&1 \
      | grep -E "^(alltoall|backend|# )" | cut -c1-260
  done; done; done ;;
floor)    # the graph view's own floor: n copy kernels mark to mark in a graph vs their kernel sum (issue 26)
  step "bench/graph_floor.py: graph vs kernel sum for chains of 1-4 kernels"
  (export PYTHONPATH=$BASE; timeout 200 python3 bench/graph_floor.py 32 "$OUT/${FLOOR_OUT:-graph-floor-h200.jsonl}") ;;
graph-shared)
  use $YES; J=$OUT/${SHARED_OUT:-graph-shared-gpu-h200.jsonl}
  step "deepep-ll EP 2, 2 ranks on one GPU (T 128, H 7168, K 8, E 256): the graph view holds 4 LL pairs"
  $D --backend deepep-ll --ep 2 --ranks-per-gpu 2 --num-tokens 128 --hidden 7168 --topk 8 --num-experts 256 \
    --iters 8 --out "$J" 2>&1 | grep -E "^(deepep|backend|# )" | cut -c1-260
  step "deepep, hybridep EP 2 (shared GPU), all views"
  $D --backend deepep,hybridep --ep 2 --ranks-per-gpu 2 --num-tokens 512 --hidden 2048 --num-experts 32 --topk 4 \
    --iters 8 --out "$J" 2>&1 | grep -E "^(deepep|hybridep|backend|# )" | cut -c1-260 ;;
check-no)
  step "check: the build without NVSHMEM ($NO): megatron FAIL, deepep.ll-roundtrip WAIVED with the reason"; use $NO
  timeout 150 $C -t deepep.import -t deepep.ll-roundtrip --out "$OUT/check-nonvshmem-h200.json" \
    --junit "$OUT/check-nonvshmem-h200.xml" | cut -c1-400 ;;
check-yes)
  step "check: the build with NVSHMEM ($YES): every DeepEP/HybridEP check, shared-GPU round trips"; use $YES
  timeout 400 $C -p deepep -p hybridep --out "$OUT/check-nvshmem-h200.json" --junit "$OUT/check-nvshmem-h200.xml" \
    | cut -c1-400 ;;
shared)
  use $YES; J=$OUT/shared-gpu-nvshmem-h200.jsonl
  for ep in 2 4; do
    step "deepep-ll EP $ep, $ep ranks on one GPU (T 128, H 7168, K 8, E 256)"
    $D --backend deepep-ll --ep $ep --ranks-per-gpu $ep --num-tokens 128 --hidden 7168 --topk 8 --num-experts 256 \
      --iters 5 --out "$J" 2>&1 | grep -E "^(deepep|backend|# )" | cut -c1-260
  done
  step "mcore-deepep, mcore-hybridep, deepep, hybridep EP 2 (shared GPU), all views"
  $D --backend mcore-deepep,mcore-hybridep,deepep,hybridep --ep 2 --ranks-per-gpu 2 --num-tokens 512 --hidden 2048 \
    --num-experts 32 --topk 4 --iters 5 --out "$J" 2>&1 | grep -E "^(mcore|deepep|hybridep|backend|# )" | cut -c1-260 ;;
megatron)
  use $YES; M=$OUT/megatron-shared-gpu-h200.jsonl
  for disp in ${DISPATCHERS:-hybridep deepep}; do
    step "megatron validate --dispatcher $disp --ep 2 --ranks-per-gpu 2 (alltoall control first)"
    timeout 280 python3 -m moebench.megatron validate --dispatcher $disp --ep 2 --ranks-per-gpu 2 --steps 20 \
      --hidden 512 --heads 8 --ffn-hidden 1024 --seq-length 256 --vocab 8192 --num-experts 8 --topk 2 \
      --timeout 240 --out "$M" 2>&1 | grep -vi "warn" | tail -12
  done ;;
gpu)
  step "pytest -m gpu: the ops (one pinned ring), the views and the NCCL path (deep_ep not on the path)"
  (export PYTHONPATH=$BASE; timeout 300 python3 -m pytest -q -m gpu ${TESTS:-tests/test_ops_gpu.py \
     tests/test_gpu_dispatch.py tests/test_timing.py} -p no:cacheprovider 2>&1 | tail -25 > "$OUT/${TESTS_LOG:-issue27-gpu-tests.log}")
  tail -6 "$OUT/${TESTS_LOG:-issue27-gpu-tests.log}" ;;
tier)
  use $YES; step "pytest -m gpu: the rest of the GPU tier (Megatron, the check, the mcore backends; deep_ep on the path)"
  timeout ${TIER_S:-400} python3 -m pytest -q -m gpu tests/test_backend_mcore.py tests/test_check.py \
    tests/test_megatron_train.py -p no:cacheprovider 2>&1 | tail -25 > "$OUT/${TIER_LOG:-gpu-tier-rest.log}"
  tail -6 "$OUT/${TIER_LOG:-gpu-tier-rest.log}" ;;
*) echo "unknown step $s" ;;
esac; done
step done
