#!/usr/bin/env bash
# Megatron-LM's own pretrain_gpt.py through `moebench.megatron validate` on the one-GPU H200, and the DeepEP
# build its flex arms need. Carry .ext/Megatron-LM (a `git archive` of Megatron-LM core_r0.19.0: pretrain_gpt.py,
# gpt_builders.py, model_provider.py, megatron/training, megatron/core) and .ext/DeepEP (hybrid-ep 94a9f8f);
# a later call carries the packed build back as .ext/deepep-pack. Steps, in the order given:
#   ep1     the aws-p6 preset at EP 1 on alltoall, 30 iterations (one GPU, one rank: a real figure)
#   build   DeepEP hybrid-ep with NVSHMEM, system g++ (README's recipe) into .ext/deepep-builds
#   pack    that build as xz pieces under $OUT (carried back as .ext/deepep-pack by a later call)
#   unpack  the carried pieces into .ext/deepep-builds (skipped while the machine still has the build)
#   shared  EP 2 with 2 ranks sharing the GPU: control alltoall against flex hybridep and flex deepep,
#           the dsv3-small preset, 30 iterations, 2 repeats interleaved: the verdict, labelled functional
# Usage on the device: MOEBENCH_GIT_SHA=<sha> bash bench/megatron_lm_h200.sh ep1 build pack
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee -a "$OUT/${LOG_NAME:-megatron-lm-h200.txt}") 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
source bench/device_env.sh
MLM=$PWD/.ext/Megatron-LM
export MEGATRON_LM_COMMIT=${MEGATRON_LM_COMMIT:-f8837c04ef6cbef6cdefb8de001aad63178aebbf}   # core_r0.19.0 (export, no .git)
V="python3 -m moebench.megatron validate --megatron-lm $MLM --log-dir /tmp/mlm-logs"
keep_log() { ls -t /tmp/mlm-logs/*"$1"*.log 2>/dev/null | head -1 | xargs -r -I{} cp {} "$OUT/$2"; }
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
for s in "$@"; do case $s in
ep1)
  step "megatron validate: aws-p6 preset, EP 1, alltoall only, 30 iterations (Megatron-LM pretrain_gpt.py)"
  timeout 420 $V --dispatcher alltoall --ep 1 --repeats 1 --iters ${ITERS:-30} --timeout 400 \
    --out "$OUT/megatron-lm-ep1-h200.jsonl" 2>&1 | grep -v -i "warn"
  keep_log alltoall-r0 megatron-lm-ep1-h200.log ;;
build)
  build_deepep ;;
pack)
  pack_deepep ;;
unpack)
  use_deepep_build ;;
shared)
  use_deepep_build
  step "megatron validate: dsv3-small, EP 2, 2 ranks on one GPU, alltoall vs hybridep and deepep, 2 repeats"
  timeout 580 $V --dispatcher hybridep,deepep --ep 2 --ranks-per-gpu 2 --preset dsv3-small --repeats 2 \
    --iters ${ITERS:-30} --timeout 200 --out "$OUT/megatron-lm-shared-gpu-h200.jsonl" 2>&1 | grep -v -i "warn"
  keep_log hybridep-r0 megatron-lm-shared-hybridep-h200.log ;;
*) echo "unknown step $s" ;;
esac; done
step done
