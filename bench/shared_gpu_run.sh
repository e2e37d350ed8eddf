#!/usr/bin/env bash
# moebench against a real DeepEP / HybridEP on the one-GPU H200, with shared-GPU ranks (functional
# only: the ranks time-slice one GPU). Produces bench/results/shared-gpu-h200*.
# Carry .ext/DeepEP (source), .ext/deepep-build (the none/commid builds packed by
# bench/deepep_bringup.sh) and .whl (megatron-core 0.19.2). On the device machine:
#   MOEBENCH_GIT_SHA=<sha> bash bench/shared_gpu_run.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee -a "$OUT/${LOG_NAME:-shared-gpu-h200.txt}") 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
source bench/device_env.sh
BASE=$PYTHONPATH
mkdir -p /tmp/deepep && cat .ext/deepep-build/deepep-build.tar.xz.* | tar -xJ -C /tmp/deepep
FIX=syslink bash bench/deepep_build.sh .ext/DeepEP > /tmp/build-syslink.log 2>&1 & BUILD=$!
use() { export PYTHONPATH="$BASE:/tmp/deepep/$1"; }   # which DeepEP build the next commands see

use commid
J=$OUT/shared-gpu-h200.jsonl
D="timeout 200 python3 -m moebench.dispatch --num-tokens 512 --hidden 2048 --num-experts 32 --topk 4 --iters 3 --timeout 180 --out $J"
step "deepep EP 2 / 4, bf16 + fp8, --num-sms 16 (commid build)"
for ep in 2 4; do for dt in bf16 fp8; do
  $D --backend deepep --ep $ep --ranks-per-gpu $ep --dtype $dt --num-sms 16 | grep -v "^# running"
done; done
step "hybridep EP 2, permute and plain; alltoall and mcore-* EP 2"
for m in permute plain; do
  $D --backend hybridep --ep 2 --ranks-per-gpu 2 --knob mode=$m | grep -v "^# running"
done
$D --backend alltoall,mcore-alltoall,mcore-deepep,mcore-hybridep --ep 2 --ranks-per-gpu 2 | grep -v "^# running"

step "syslink build"; wait $BUILD; tail -4 /tmp/build-syslink.log | cut -c1-400; cat /tmp/deepep/syslink/deepep_build.json; echo
for v in none commid; do python3 - "$v" <<'PY'
import json, subprocess, sys; d = f"/tmp/deepep/{sys.argv[1]}"; b = json.load(open(f"{d}/deepep_build.json"))
print(sys.argv[1], b["fix"], subprocess.run(f"readelf -d {d}/hybrid_ep_cpp*.so | grep -c 'NEEDED.*libstdc'", shell=True,
      capture_output=True, text=True).stdout.strip(), "NEEDED libstdc++ entries")
PY
done
use syslink; step "probe syslink"
timeout 100 python3 bench/hybridep_probe.py --ranks 2 --permute --timeout 90 > /tmp/probe.txt 2>&1; grep -E "^rank|passed" /tmp/probe.txt
W=syslink; grep -q "^2 passed" /tmp/probe.txt || W=commid
C="timeout 280 python3 -m moebench.check --iters 3 --timeout 120"
step "check: broken build (none)"; use none
$C -t env -p deepep -p hybridep --out "$OUT/check-broken-h200.json" --junit "$OUT/check-broken-h200.xml"
step "check: working build ($W)"; use $W
$C -t env -p deepep -p hybridep -t megatron --out "$OUT/check-working-h200.json" --junit "$OUT/check-working-h200.xml"
step done
