#!/usr/bin/env bash
# On an 8-GPU H200 machine (run kind nvidia-h200-x8): DeepEP's own tests/test_intranode.py and HybridEP's
# tests/test_hybrid_ep.py beside `python -m moebench.dispatch --backend deepep,hybridep` at one shape
# (T 4096 tokens per rank, H 7168, E 256 = 32 per rank, top-8, EP 8, 24 SMs: test_intranode's defaults
# and SM count), then bench/upstream_compare.py: are moebench's `cached` and `kernel` views within 5% of
# the upstream figures? DeepEP is built (bench/deepep_build.sh, FIX=syslink: the build whose
# HybridEPBuffer constructs) from the ignored folder .ext/DeepEP, which is carried, never committed:
#   mkdir -p .ext/DeepEP && git -C <DeepEP clone> archive hybrid-ep | tar -x -C .ext/DeepEP   (94a9f8f)
# Carry .ext/DeepEP; then on the device machine:
#   MOEBENCH_GIT_SHA=<sha> bash bench/upstream_compare.sh
# Outputs in $OUT: upstream-intranode.txt, upstream-hybrid-ep.txt, upstream-compare.jsonl, upstream-compare.txt.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; exec > >(tee "$OUT/upstream-compare.txt") 2>&1
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
source bench/device_env.sh
T=4096 H=7168 E=256 K=8 EP=8 SMS=24
nvidia-smi -L | head -8
[ "$(nvidia-smi -L | wc -l)" -ge $EP ] || { echo "needs $EP GPUs"; exit 1; }

step "build DeepEP hybrid-ep from .ext/DeepEP (FIX=syslink)"
FIX=nvshmem+syslink bash bench/deepep_build.sh .ext/DeepEP > /tmp/build.log 2>&1 || { tail -20 /tmp/build.log; exit 1; }
DEEPEP=/tmp/deepep/syslink
export PYTHONPATH="$PYTHONPATH:$DEEPEP"; cat "$DEEPEP/deepep_build.json"; echo

step "DeepEP tests/test_intranode.py (cached-handle dispatch/combine, SMs 24: its 'NVL chunk default' lines)"
(cd "$DEEPEP/tests" && timeout 1200 python3 test_intranode.py --num-processes $EP --num-tokens $T --hidden $H \
  --num-topk $K --num-experts $E) > "$OUT/upstream-intranode.txt" 2>&1
grep -E "default|Best" "$OUT/upstream-intranode.txt"

step "HybridEP tests/test_hybrid_ep.py (same shape; PAD_MULTIPLE=1 = no padding, as moebench)"
(cd "$DEEPEP/tests" && HIDDEN_DIM=$H MAX_NUM_OF_TOKENS_PER_RANK=$T NUM_TOKENS_PER_RANK=$T NUM_LOCAL_EXPERTS=$((E / EP)) \
  TOPK=$K PAD_MULTIPLE=1 NUM_SMS_DISPATCH=$SMS NUM_SMS_COMBINE=$SMS timeout 1200 python3 test_hybrid_ep.py \
  --num-processes $EP) > "$OUT/upstream-hybrid-ep.txt" 2>&1
grep -E "GB/s|===" "$OUT/upstream-hybrid-ep.txt"

step "moebench at the same shape: deepep + hybridep (permute), bf16 and fp8; hybridep plain, bf16 and fp8"
J=$OUT/upstream-compare.jsonl
M="timeout 900 python3 -m moebench.dispatch --device cuda --ep $EP --num-tokens $T --hidden $H --num-experts $E --topk $K \
  --num-sms $SMS --iters 50 --timeout 800 --out $J"
for dt in bf16 fp8; do
  $M --backend deepep,hybridep --dtype $dt | grep -v "^# running"
  $M --backend hybridep --knob mode=plain --dtype $dt | grep -v "^# running"
done

step "compare (within 5%)"
python3 bench/upstream_compare.py --intranode "$OUT/upstream-intranode.txt" --hybrid-ep "$OUT/upstream-hybrid-ep.txt" \
  --records "$J" --tolerance 0.05
step done
