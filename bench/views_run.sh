#!/usr/bin/env bash
# On the one-GPU H200: (1) EP 1 alltoall, api view and host split, plus its host profile per function;
# (2) DeepEP hybrid-ep built with the system g++ (bench/deepep_build.sh FIX=syslink); (3) with shared-GPU
# ranks (functional only): deepep and hybridep in all three timing views, the byte-rule assertion
# against DeepEP's own recv_x count, and deepep under --overlap gemm at two SM settings.
# Carry .ext/DeepEP (source, `git archive hybrid-ep`) and .whl (megatron-core 0.19.2 cp312).
#   MOEBENCH_GIT_SHA=<sha> bash bench/views_run.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/views-h200.txt") 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
source bench/device_env.sh
BASE=$PYTHONPATH
step "EP 1 alltoall (api view, host split)"
for i in 1 2; do
  timeout 150 python3 -m moebench.dispatch --ep 1 --device cuda --backend alltoall --out "$OUT/ep1-views-h200.jsonl" \
    2>&1 | grep -E "^(alltoall|backend)"
done
step "EP 1 alltoall host profile"; timeout 120 python3 bench/alltoall_host.py 2>&1 | grep -v "^$" | head -60
step "build DeepEP (syslink)"
FIX=syslink bash bench/deepep_build.sh .ext/DeepEP > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
export PYTHONPATH="$BASE:/tmp/deepep/syslink"; cat /tmp/deepep/syslink/deepep_build.json; echo
J=$OUT/views-shared-gpu-h200.jsonl
D="timeout 200 python3 -m moebench.dispatch --num-tokens 512 --hidden 2048 --num-experts 32 --topk 4 --iters 5 --timeout 180 --out $J"
step "deepep EP 2 bf16/fp8; hybridep EP 2 permute/plain (shared GPU)"
$D --backend deepep --ep 2 --ranks-per-gpu 2 --num-sms 16 | grep -v "^# running"
$D --backend deepep --ep 2 --ranks-per-gpu 2 --num-sms 16 --dtype fp8 | grep -v "^# running"
for m in permute plain; do $D --backend hybridep --ep 2 --ranks-per-gpu 2 --knob mode=$m | grep -v "^# running"; done
step "deepep --overlap gemm at 8 and 24 SMs (shared GPU)"
for s in 8 24; do $D --backend deepep --ep 2 --ranks-per-gpu 2 --num-sms $s --overlap gemm --out "$OUT/overlap-shared-gpu-h200.jsonl" | grep -v "^# running"; done
python3 -m moebench.report "$OUT/overlap-shared-gpu-h200.jsonl" --overlap-plot "$OUT/overlap-shared-gpu-h200.png" | tail -1
step "views and byte assertion in the records"
python3 - "$J" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); v = r.get("views") or {}
    if r["phase"] in ("dispatch", "combine"):
        print(r["backend"]["name"], r["workload"]["ep"], r["workload"]["dtype"], r["phase"], r["check"]["status"],
              "native", (r["check"].get("native_bytes") or {}), {k: (x.get("none") or round(x.get("mean_us", x.get("us", x.get("median_us", 0))), 1)) for k, x in v.items()})
PY
step "gpu tests"; timeout 200 python3 -m pytest -q -m gpu tests 2>&1 | tail -4
step done
