#!/usr/bin/env bash
# moebench against a real DeepEP / HybridEP on the one-GPU H200, with shared-GPU ranks (functional
# only: the ranks time-slice one GPU). Produces bench/results/shared-gpu-h200*.
# Usage on the device machine, with the builds of bench/deepep_build.sh unpacked under /tmp/deepep
# (FIX variant in DEEPEP_BUILD, default commid) and .whl (megatron-core 0.19.2) carried:
#   MOEBENCH_GIT_SHA=<sha> bash bench/shared_gpu_run.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
B=/tmp/deepep/${DEEPEP_BUILD:-commid}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$B${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
t0=$(date +%s); step() { echo "### $1 ($(( $(date +%s) - t0 )) s)"; }
J=$OUT/shared-gpu-h200.jsonl
D="python3 -m moebench.dispatch --num-tokens 512 --hidden 2048 --num-experts 32 --topk 4 --iters 3 --warmup-ms 0 --timeout 240 --out $J"
step "deepep EP 2 / 4, bf16 + fp8, --num-sms 16"
for ep in 2 4; do for dt in bf16 fp8; do
  $D --backend deepep --ep $ep --ranks-per-gpu $ep --dtype $dt --num-sms 16 2>&1 | grep -v "^#"
done; done
step "hybridep EP 2 (permute, plain), alltoall, mcore-*"
$D --backend hybridep --ep 2 --ranks-per-gpu 2 --knob mode=permute 2>&1 | grep -v "^#"
$D --backend hybridep --ep 2 --ranks-per-gpu 2 --knob mode=plain 2>&1 | grep -v "^#"
$D --backend alltoall,mcore-alltoall,mcore-deepep,mcore-hybridep --ep 2 --ranks-per-gpu 2 2>&1 | grep -v "^#"
step done
