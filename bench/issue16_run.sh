#!/usr/bin/env bash
# Issue 16 on one H200, side by side. Runs from git-archive snapshots carried as .ext/new (the commit
# under test) and .ext/old (the commit before issue 16's second round), so an edit in the working tree
# cannot leak in. Carry .ext/new, .ext/old and .whl (megatron-core for mcore-alltoall).
#   NEW_SHA=<sha> OLD_SHA=<sha> bash bench/issue16_run.sh STEP...
# Runs 7-9 (bench/results/README.md) used this script at their shas, where `route` and `pdl` also ran
# cuda@4096 and an `ab-pdl` step timed EP 1 dispatch with it: the CUDA permute's PDL, since removed
# (no measurable gain).
# Steps: selftest (nvcc build + run of csrc/tests/permute_selftest.cu), tests (GPU tier of the ops
# and the timer), ab (dispatch --ep 1 alltoall + mcore-alltoall, old and new interleaved twice),
# host (bench/alltoall_host.py with --ops-impl auto and cuda), permute (moebench.permute, CUDA vs
# Triton, two processes in opposite order), variants (Triton copy variants with the kernel profile),
# route (Triton index-kernel knobs and programmatic dependent launch on/off, with the kernel
# profile), pdl (the defaults, and Triton without programmatic dependent launch, two processes in
# opposite order), ab-new (the new snapshot alone, twice), drift (EP 1 alltoall, 60 samples, four
# processes, GPU clocks logged every 250 ms), gpu (the whole `pytest -m gpu tests`).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee -a "$OUT/issue16-h200.txt") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
ROOT=$PWD; t0=$(date +%s); step() { echo "### $1 ($(( $(date +%s) - t0 )) s)"; }
in_tree() {  # in_tree old|new CMD...: run CMD in that snapshot with its own extension cache and sha
  local t=$1; shift
  local sha=$NEW_SHA; [ "$t" = old ] && sha=$OLD_SHA
  (cd "$ROOT/.ext/$t" && PYTHONPATH="$ROOT/.ext/$t:/tmp/site" MOEBENCH_EXT_DIR=/tmp/ext-$t MOEBENCH_GIT_SHA=$sha "$@")
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for s in "$@"; do case $s in
selftest)
  step selftest
  (cd .ext/new && nvcc -O3 -std=c++17 -arch=sm_90a -Icsrc csrc/moe_permute.cu csrc/tests/permute_selftest.cu \
     -o /tmp/permute_selftest && /tmp/permute_selftest) ;;
tests)
  step tests
  in_tree new timeout 240 python3 -m pytest -q -m gpu tests/test_ops_gpu.py tests/test_timing.py -p no:cacheprovider \
    2>&1 | tail -15 | tee "$OUT/issue16-gpu-tests.log" ;;
ab)
  for i in 1 2; do for t in old new; do
    step "ab $t run $i"
    in_tree $t timeout 150 python3 -m moebench.dispatch --ep 1 --device cuda --backend alltoall,mcore-alltoall \
      --out "$OUT/ep1-issue16-h200.jsonl" 2>&1 | grep -E "^(alltoall|mcore|backend)"
  done; done ;;
host)
  for impl in auto cuda; do
    step "host $impl"
    in_tree new timeout 150 python3 bench/alltoall_host.py 4096 7168 8 256 $impl 2>&1 | grep -v Warning
  done ;;
permute)
  for order in cuda,triton triton,cuda; do
    step "permute $order"
    in_tree new timeout 200 python3 -m moebench.permute --shapes 4096x7168x8x256,16384x7168x8x256 \
      --ops permute,permute_wait --ops-impl $order --iters 40 --out "$OUT/permute-issue16-h200.jsonl" 2>&1 \
      | grep -vi warn
  done ;;
variants)
  step "permute variants (kernel profile)"
  in_tree new timeout 200 python3 -m moebench.permute --shapes 4096x7168x8x256 --ops permute,permute_wait \
    --ops-impl cuda,triton,triton@2048:8,triton@1024:8,triton@4096:8 --iters 40 --profile \
    --out "$OUT/permute-issue16-variants-h200.jsonl" 2>&1 | grep -vi warn ;;
route)
  step "permute route knobs (kernel profile)"
  P=triton@1024:4:1024:4:0:1   # copy knobs at their defaults; then SB:RW:EB:BB:SW:PDL
  V=cuda,triton; for r in 256:4:64:64:4:0 256:8:64:64:4:0 256:2:64:64:4:0 256:1:64:64:4:0 512:8:64:64:4:0 \
    1024:8:64:64:4:0 256:4:32:128:4:0 256:4:16:128:4:0 256:4:32:128:8:0 256:4:16:128:2:0 256:4:64:128:8:0 \
    256:4:32:64:4:0 256:4:64:64:4:1 256:8:16:128:4:1 512:8:32:128:4:1; do V=$V,$P:$r; done
  in_tree new timeout 300 python3 -m moebench.permute --shapes 4096x7168x8x256 --ops permute,permute_wait \
    --ops-impl $V --iters 40 --profile --out "$OUT/permute-issue16-route-h200.jsonl" 2>&1 | grep -vi warn ;;
pdl)
  F=cuda,triton,triton@1024:4:1024:4:0:1:256:4:16:128:4:0   # the defaults, then Triton without PDL
  for order in $F $(echo $F | tr , '\n' | tac | paste -sd,); do
    step "permute PDL on/off $order"
    in_tree new timeout 200 python3 -m moebench.permute --shapes 4096x7168x8x256,16384x7168x8x256 \
      --ops permute,permute_wait --ops-impl $order --iters 40 --out "$OUT/permute-issue16-pdl-h200.jsonl" 2>&1 \
      | grep -vi warn
  done ;;
ab-new)
  for i in 1 2; do
    step "ab new run $i"
    in_tree new timeout 150 python3 -m moebench.dispatch --ep 1 --device cuda --backend alltoall,mcore-alltoall \
      --out "$OUT/ep1-issue16-final-h200.jsonl" 2>&1 | grep -E "^(alltoall|mcore|backend)"
  done ;;
drift)
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 250 \
    > "$OUT/issue16-drift-clocks.csv" & SMI=$!
  for i in 1 2 3 4; do
    step "drift run $i"
    in_tree new timeout 150 python3 -m moebench.dispatch --ep 1 --device cuda --backend alltoall --iters 60 \
      --out "$OUT/ep1-issue16-drift-h200.jsonl" 2>&1 | grep -E "^(alltoall|backend)"
  done
  kill $SMI ;;
gpu)
  step "gpu tier"
  in_tree new timeout 320 python3 -m pytest -q -rfE -m gpu tests -p no:cacheprovider 2>&1 | tail -30 \
    | tee "$OUT/issue16-gpu-tier.log" ;;
*) echo "unknown step $s"; exit 2 ;;
esac; done
step done
