#!/usr/bin/env bash
# Side by side on the H200: dispatch --ep 1 at de9a45a (before issue 15's refactor; a `git archive`
# carried as .ext/old) and at this checkout, interleaved twice; then the shared-GPU mcore-deepep
# and megatron check against DeepEP builds without NVSHMEM (.ext/deepep-build). Carry .whl too.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/ab-refactor-h200.txt") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
NEW=$PWD; SHA=${MOEBENCH_GIT_SHA:-unknown}
for i in 1 2; do for t in old new; do
  d=$NEW; s=$SHA; [ $t = old ] && d=$NEW/.ext/old s=de9a45a
  echo "### $t run $i"
  (cd "$d" && PYTHONPATH="$d:/tmp/site" MOEBENCH_EXT_DIR=/tmp/ext-$t MOEBENCH_GIT_SHA=$s timeout 90 python3 -m moebench.dispatch \
     --ep 1 --device cuda --backend alltoall,mcore-alltoall --out "$OUT/ab-refactor-h200.jsonl" 2>&1 | grep -E "^(alltoall|mcore)")
done; done
mkdir -p /tmp/deepep && cat .ext/deepep-build/deepep-build.tar.xz.* | tar -xJ -C /tmp/deepep
export PYTHONPATH="$NEW:/tmp/site:/tmp/deepep/commid"
echo "### mcore-deepep, shared GPU, build without NVSHMEM"
timeout 120 python3 -m moebench.dispatch --backend mcore-deepep --ep 2 --ranks-per-gpu 2 --num-tokens 512 --hidden 2048 \
  --num-experts 32 --topk 4 --iters 3 --out "$OUT/ab-refactor-h200.jsonl" 2>&1 | grep -E "^mcore|FAIL|WAIVED"
echo "### check -t megatron"; timeout 120 python3 -m moebench.check -t megatron --out "$OUT/check-megatron-h200.json" 2>&1 | grep -v warn
