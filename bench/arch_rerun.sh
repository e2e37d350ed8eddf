#!/usr/bin/env bash
# Issue 15's acceptance re-run on the H200: after the architecture change (RunSpec, record.py, one
# timer), moebench.permute and dispatch --ep 1 must reproduce bench/results/permute-h200.jsonl and
# h200-dispatch.jsonl within noise. Carry .whl (megatron-core 0.19.2). On the device machine:
#   MOEBENCH_GIT_SHA=<sha> bash bench/arch_rerun.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee -a "$OUT/${LOG_NAME:-arch-rerun-h200.txt}") 2>&1
source bench/device_env.sh
step build; python3 -c "import moebench.ops as o; print(o.impl_status())" 2>&1 | tail -2
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "gpu tests (ops, timing)"; timeout 150 python3 -m pytest -q -m gpu -x -p no:cacheprovider tests/test_ops_gpu.py tests/test_timing.py 2>&1 | tail -4
fi
step permute; timeout 240 python3 -m moebench.permute --out "$OUT/permute-h200-arch.jsonl" ${PERMUTE_ARGS:-} 2>&1 | grep -v "^# running"
step "dispatch --ep 1"; D="timeout 120 python3 -m moebench.dispatch --ep 1 --device cuda --out $OUT/h200-dispatch-arch.jsonl"
$D --backend alltoall,mcore-alltoall | grep -v "^# running"; $D --backend alltoall --dtype fp8 | grep -v "^# running"
step done
