#!/usr/bin/env bash
# First contact with a real DeepEP on the one-GPU H200 (shared-GPU ranks): build the hybrid-ep
# branch twice (as is, and with get_comm_id's ostringstream replaced), find where HybridEPBuffer's
# constructor dies, and try each build with 2 and 4 ranks on GPU 0. Everything lands under $OUT.
# Usage on the device machine, with .ext/DeepEP (a `git archive` of DeepEP hybrid-ep) carried:
#   bash bench/deepep_bringup.sh
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
t0=$(date +%s); step() { echo "### $1 ($(( $(date +%s) - t0 )) s)"; }
step build; FIX="none commid" bash bench/deepep_build.sh .ext/DeepEP 2>&1 | tail -8
cp /tmp/deepep/none/deepep_build.json "$OUT/deepep-build-none.json" 2>/dev/null
cp /tmp/deepep/commid/deepep_build.json "$OUT/deepep-build-commid.json" 2>/dev/null

step pack   # the builds, for later calls (carried back as .ext/deepep-build)
tar -C /tmp/deepep -cJf /tmp/b.tar.xz --exclude='*.o' --exclude=build --exclude=csrc --exclude=third-party none commid
ls -la /tmp/b.tar.xz; split -b 15M /tmp/b.tar.xz "$OUT/deepep-build.tar.xz."

step "libstdc++ in the process"   # which copy of the stream/locale code hybrid_ep_cpp binds to
SO=$(ls /tmp/deepep/none/hybrid_ep_cpp*.so); C10=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")/lib/libc10.so
ldd "$SO" | grep -E "stdc|gcc_s|c10|torch" ; strings "$SO" | grep -m3 "GCC: ("
echo "libc10 exports (std:: stream/locale):"; nm -DC --defined-only "$C10" | grep -E "ostringstream|locale::|num_put|basic_ios" | head -8
(cd /tmp && PYTHONPATH=/tmp/deepep/none LD_BIND_NOW=1 LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/ldb python3 -c "import torch, deep_ep" >/dev/null 2>&1)
cat /tmp/ldb.* | grep "hybrid_ep_cpp" | grep -E "ostringstream|locale|num_put|ios_base|basic_ios|_M_insert" | head -12

for vn in none:2 commid:2 commid:4; do v=${vn%:*} n=${vn#*:}
  step "probe $v ranks $n"
  PYTHONPATH=/tmp/deepep/$v timeout 160 python3 bench/hybridep_probe.py --ranks $n --permute --legacy-nvml-bypass \
    --timeout 140 $( [ $v = none ] && [ $n = 2 ] && echo --gdb ) > "$OUT/probe-$v-$n.txt" 2>&1
  grep -E "^rank|passed|^#" "$OUT/probe-$v-$n.txt"
done
step done
