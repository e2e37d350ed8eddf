#!/usr/bin/env bash
# Issue 14 on an 8-GPU H200 machine (run kind nvidia-h200-x8), for when one is lent: exposed time and
# GEMM slowdown of every backend under a concurrent expert GEMM at EP 8, the SM knob swept, then the
# plot and the overlap decision. Carry .ext/DeepEP (hybrid-ep, built here with FIX=syslink) and .whl.
#   MOEBENCH_GIT_SHA=<sha> bash bench/overlap_multigpu.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/overlap-ep8.txt") 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
source bench/device_env.sh
[ "$(nvidia-smi -L | wc -l)" -ge 8 ] || { echo "needs 8 GPUs"; exit 1; }
FIX=nvshmem+syslink bash bench/deepep_build.sh .ext/DeepEP > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
export PYTHONPATH="$PYTHONPATH:/tmp/deepep/syslink"
for g in gemm gemm:4096x4096x7168; do
  J=$OUT/overlap-ep8-${g//:/-}.jsonl        # one file per GEMM shape: the plot and the decision are per shape
  step "alltoall, mcore-alltoall under $g"
  timeout 600 python3 -m moebench.dispatch --ep 8 --backend alltoall,mcore-alltoall --overlap $g --out "$J"
  for s in 8 16 24 32; do
    step "deepep, hybridep, mcore-* at $s SMs under $g"
    timeout 600 python3 -m moebench.dispatch --ep 8 --backend deepep,hybridep,mcore-deepep,mcore-hybridep \
      --num-sms $s --overlap $g --out "$J"
  done
  python3 -m moebench.report "$J" --overlap-plot "${J%.jsonl}.png"
  python3 -m moebench.megatron flags --results "$J" --overlap | tee -a "$OUT/overlap-ep8-flags.txt"
done
