#!/usr/bin/env bash
# GPU tier + benchmark of moebench.ops in one device call:
#   JIT-build moebench._C, run tests/ops/test_ops_gpu.py -m gpu, then python -m moebench.permute
#   writing $OUT/permute-$GPU.jsonl + .png, an fp8 pass, and the moebench/csrc/probes/fanout_bw access-
#   pattern probe ($OUT/fanout-$GPU.jsonl). Carry .whl (megatron-core wheel) for the baseline, and
#   .ext/te-src (TransformerEngine's transformer_engine/{common,pytorch}/triton/permutation.py and
#   build_tools/VERSION.txt) for the `te` anchor where the image has no Transformer Engine.
# Usage (device): bash bench/permute_gpu.sh [extra args for moebench.permute]
#   env: SKIP_TESTS=1 skips the GPU tier, SKIP_FANOUT=1 the fanout_bw probe; FP8_IMPLS the fp8 pass's
#   --ops-impl (default megatron,triton,cuda)
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
source bench/device_env.sh     # PYTHONPATH, the carried wheels, $GPU (the card's short name that names the files)
if [[ -d .ext/te-src ]]; then export MOEBENCH_TE_SOURCE="${MOEBENCH_TE_SOURCE:-$PWD/.ext/te-src}"; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import moebench.ops as o; print('impl_status', o.impl_status())" 2>&1 | tail -3
echo "# build: $(( $(date +%s) - t0 )) s"
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  timeout 300 python3 -m pytest -q -m gpu tests/ops/test_ops_gpu.py -x -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu-tests.log"
fi
echo "# tests done: $(( $(date +%s) - t0 )) s"
timeout "${PERMUTE_TIMEOUT:-400}" python3 -m moebench.permute --out "$OUT/permute-$GPU.jsonl" --plot "$OUT/permute-$GPU.png" "$@" 2>&1 \
  | tee "$OUT/permute-$GPU.txt"
timeout 200 python3 -m moebench.permute --dtype fp8 --ops permute --shapes 4096x7168x8x256,16384x7168x8x256 \
  --ops-impl "${FP8_IMPLS:-megatron,triton,cuda}" --iters 30 --out "$OUT/permute-$GPU-fp8.jsonl" 2>&1 | tee "$OUT/permute-$GPU-fp8.txt"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [[ "${SKIP_FANOUT:-0}" != 1 ]] && "$NVCC" -O3 -arch=sm_90a -std=c++17 moebench/csrc/probes/fanout_bw.cu -o /tmp/fanout_bw; then
  for a in "--rows 4096 --row-bytes 14336" "--rows 16384 --row-bytes 14336" "--rows 8192 --row-bytes 4096" \
           "--rows 8192 --row-bytes 8192" "--rows 4096 --row-bytes 14336 --fanout 2"; do
    /tmp/fanout_bw --fanout 8 --iters 20 $a | python3 -c "
import json, sys
from moebench.records import provenance
for line in sys.stdin:
    print(json.dumps(dict(json.loads(line), tool='moebench/csrc/probes/fanout_bw', command='fanout_bw --fanout 8 --iters 20 $a',
                          env=provenance.provenance())))"
  done | tee "$OUT/fanout-$GPU.jsonl"
fi
echo "# all done: $(( $(date +%s) - t0 )) s"
