#!/usr/bin/env bash
# One device round in one call: the packs unpacked once per machine, then the steps asked, in order, within one
# time budget, and one summary line per step (PASS / FAIL / cut, seconds, files) that a closing note can quote.
#
#   MOEBENCH_GIT_SHA=<sha> bash bench/device_round.sh [--budget SECONDS] STEP[:SECONDS]...   (--list: the steps)
#
# Carry (ignored folders of the checkout): .ext/packs = the pieces of ../shared/packs (NCCL 2.30.7, DeepEP V2,
# the `nccl` Python packages, DeepEP hybrid-ep with NVSHMEM; bench/results/README.md says which step needs which),
# .whl = the megatron-core wheel (mcore-*, megatron); per step also what its line below names. Unpacked into /tmp
# and kept there while the machine stays warm: a later call skips what /tmp already holds.
# Budget (default 540 s, from the script's start; STEP:SECONDS caps one step's share): every command of a step runs
# under `timeout` with what is left of its share (less RESERVE, default 15 s, to bundle); where that ends a command,
# it is stopped with SIGINT (the tools keep every record written so far and say what did not run) and the step is
# `cut`; a step with under 10 s left does not start. A command that fails or outruns its own limit: FAIL.
# Out ($OUT; at most 8 files of 16 MiB come back): summary.txt (the summary lines), round.log (the whole console)
# and results.tgz (every step's files under STEP/, pieces .aa .ab ... past 15 MiB), bundled again after each
# step, so a call cut short still returns what its finished steps wrote; a build step's pack pieces beside them.
# The git sha: MOEBENCH_GIT_SHA (every record carries it: records/provenance.py); the summary's first line too.
# A step is one function step_NAME, one line in ABOUT and its place in ORDER; ROUND_EXTRA=FILE is sourced after them:
# steps for one call (step_NAME, ABOUT[NAME], ORDER+=(NAME)) without editing this script.
set -uo pipefail
declare -A ABOUT=(
  [tier]="the GPU tier: pytest -m gpu, the tests marked alone one at a time, then the rest side by side (-n \
TIER_WORKERS: as many as the GPU's memory holds, at most half the cores), every backend expected"
  [fp8q]="alltoall EP 1 (T 4096 H 7168 E 256 K 8) through the oracle: fp8 with --ops-impl torch, triton, cuda; bf16"
  [ep1]="the EP 1 table (T 4096 H 7168 E 256 K 8), bf16, default SMs: alltoall, mcore-alltoall, ncclep ht (and \
zero_copy=0) and ll, deepep-v2; every view, memory, setup; BASE's alltoall and deepep-v2 beside them; \
bench/glue_bars.py on it"
  [ab]="alltoall and deepep-v2 at EP 1 (T 4096 H 7168 E 256 K 8, bf16, api view) by head and by BASE, alternated \
AB_RUNS (default 3) times; bench/glue_bars.py on the pooled runs"
  [ep1fp8]="the same table in fp8: alltoall, ncclep ht and ll, deepep-v2"
  [chained]="the chained view where EP 1 cannot run the backend: alltoall, deepep, deepep-ll, hybridep at EP 2 on \
ranks sharing the GPU (functional; the EP 1 table times it for the others)"
  [sms]="--knob-sweep num_sms at EP 1 (bench/ep1-sms*.toml): ncclep ht, ncclep ll, deepep-v2"
  [soak]="shared-rank soaks at EP SOAK_EPS (default 2 4; T 64 H 2048 E 16 K 4): deepep-ll, deepep, hybridep, ncclep \
ht, ncclep ll, deepep-v2 (SOAK_BACKENDS, or SOAK_BACKENDS_<EP> for one EP) through the oracle, SOAK calls (default \
2000) each within an equal share of the budget"
  [permute]="python -m moebench.permute (PERMUTE_ARGS; .ext/te-src for the te anchor), an fp8 pass (FP8_IMPLS), \
the fanout_bw probe (SKIP_FANOUT=1 leaves it out)"
  [v1build]="DeepEP hybrid-ep with NVSHMEM from .ext/DeepEP (bench/deepep_build.sh, nvshmem+syslink), packed as \
\$OUT/deepep-nvshmem.tar.xz.* for ../shared/packs"
  [v2build]="DeepEP main (V2) from .ext/DeepEP-main against the NCCL build, stamped, packed as \$OUT/deepep-v2.tar.xz.*"
  [mlm-ep1]="Megatron-LM's pretrain_gpt.py (.ext/Megatron-LM, core_r0.19.0) through megatron validate: aws-p6, EP 1, \
alltoall, ITERS (default 30) iterations"
  [mlm-shared]="the same, dsv3-small, EP 2 on ranks sharing the GPU: alltoall against flex hybridep and deepep, 2 \
repeats interleaved (functional)")
ORDER=(tier fp8q ep1 ab ep1fp8 chained sms soak permute v1build v2build mlm-ep1 mlm-shared)
# shellcheck disable=SC1090
[[ -n ${ROUND_EXTRA:-} ]] && source "$ROUND_EXTRA"

T0=$(date +%s) BUDGET=540 STEPS=()
while (($#)); do case $1 in
  --budget) BUDGET=${2:-}; shift 2 || shift ;;
  --budget=*) BUDGET=${1#--budget=}; shift ;;
  --list) for s in "${ORDER[@]}"; do printf '%-11s %s\n' "$s" "${ABOUT[$s]}"; done; exit 0 ;;
  -h|--help) sed -n '2,20p' "$0" | cut -c3-; exit 0 ;;
  *) STEPS+=("$1"); shift ;;
esac; done
[[ $BUDGET =~ ^[1-9][0-9]*$ ]] || { echo "device_round: --budget wants whole seconds > 0, got '$BUDGET'" >&2; exit 2; }
((${#STEPS[@]})) || { echo "device_round: name at least one step (--list: ${ORDER[*]})" >&2; exit 2; }
for s in "${STEPS[@]}"; do
  [[ -n ${ABOUT[${s%%:*}]+x} ]] || { echo "device_round: unknown step '${s%%:*}' (known: ${ORDER[*]})" >&2; exit 2; }
  [[ $s != *:* || ${s#*:} =~ ^[1-9][0-9]*$ ]] || { echo "device_round: $s: a step's share is whole seconds > 0" >&2; exit 2; }
done

OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
S=$(mktemp -d /tmp/round.XXXXXX)             # each step's files, bundled into $OUT/results.tgz
exec > >(tee -a "$OUT/round.log") 2>&1; TEE=$!
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
source bench/device_env.sh                    # PYTHONPATH, the carried wheels, $GPU, step()
RESERVE=${RESERVE:-15} MIN_LEFT=${MIN_LEFT:-10}; END=$(( T0 + BUDGET - RESERVE )) STEP_END=$(( T0 + BUDGET - RESERVE ))
P=.ext/packs NB=/tmp/nccl-build V2=/tmp/deepep-v2 PYPKG=/tmp/ncclpy V1=/tmp/deepep-builds/nvshmem+syslink
DISPATCH="python3 -m moebench.dispatch --device cuda"
BIG="--num-tokens 4096 --hidden 7168 --num-experts 256 --topk 8"
SMALL="--num-tokens 64 --hidden 2048 --num-experts 16 --topk 4"
SHA=${MOEBENCH_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo "unknown: pass MOEBENCH_GIT_SHA")}
V2ENV="env PYTHONPATH=$V2"                   # DeepEP V2 first on the path (V1 shares its name): set in packs()

t() {   # [--ok "RC..."] MAX_S CMD...: CMD under min(MAX_S, what the step's share leaves); its fate in STATUS / NOTE
  local ok=0 max left rc what
  [[ $1 == --ok ]] && { ok=$2; shift 2; }
  max=$1; shift; left=$(( STEP_END - $(date +%s) ))
  what=$(echo "$*" | sed -E 's/env PYTHONPATH=[^ ]* //; s/python3 -m moebench\.//; s/ --device cuda//' | cut -c1-90)
  if ((left < MIN_LEFT)); then STATUS=cut; NOTE+="not run: $what; "; return 124; fi
  timeout -s INT -k 20 $((max < left ? max : left)) "$@"; rc=$?
  if ((rc == 124 || rc == 137)); then
    if ((max >= left)); then STATUS=cut; NOTE+="its share ended: $what; "
    else [[ $STATUS == cut ]] || STATUS=FAIL; NOTE+="outran its $max s: $what; "; fi
  elif [[ " $ok " != *" $rc "* ]]; then [[ $STATUS == cut ]] || STATUS=FAIL; NOTE+="rc $rc: $what; "; fi
  return $rc
}
stamp() { local s0=$SECONDS l; while IFS= read -r l; do printf '%4d %s\n' $((SECONDS - s0)) "$l"; done; }

# ---- the packs: unpacked once per machine (kept in /tmp while it stays warm), then the environment of every step
packs() {
  [[ -d $NB/lib ]] || ! ls $P/nccl-build.tar.xz.* >/dev/null 2>&1 \
    || t 120 env NCCL_BUILD=$NB NCCL_PIECES="$P/nccl-build.tar.xz.*" bash bench/nccl_build.sh unpack
  [[ -d $V2/deep_ep ]] || ! ls $P/deepep-v2.tar.xz.* >/dev/null 2>&1 || t 120 sh -c "cat $P/deepep-v2.tar.xz.* | tar -xJ -C /tmp"
  [[ -d $PYPKG/nccl ]] || [[ ! -f $P/ncclpy.tar.xz ]] || { mkdir -p $PYPKG && t 60 tar -xJf $P/ncclpy.tar.xz -C $PYPKG; }
  [[ -d $V1 ]] || ! ls $P/deepep-nvshmem.tar.xz.* >/dev/null 2>&1 \
    || { mkdir -p "${V1%/*}" && t 120 sh -c "cat $P/deepep-nvshmem.tar.xz.* | tar -xJ -C ${V1%/*}"; }
  [[ -d $NB/lib ]] && eval "$(NCCL_BUILD=$NB bash bench/nccl_build.sh layout)"    # torch loads NCCL 2.30.7 itself
  [[ -d $PYPKG/nccl ]] && export PYTHONPATH="$PYTHONPATH:$PYPKG"
  [[ -d $V1 ]] && export PYTHONPATH="$PYTHONPATH:$V1"             # V1 + HybridEP last: V2 goes first where asked
  V2ENV="env PYTHONPATH=$V2:$PYTHONPATH"
  if [[ -d $V2/deep_ep ]]; then
    export MOEBENCH_DEEPEP_V2_PATH=$V2
    [[ -f $V2/deepep_build.json ]] || DEEPEP_V2_COMMIT=${DEEPEP_V2_COMMIT:-dd758ca} stamp_v2   # the pack: main dd758ca
  fi
  export TRITON_CACHE_DIR=/tmp/moebench-jit/triton NCCL_EP_JIT_CACHE_DIR=/tmp/moebench-jit/nccl-ep \
    EP_JIT_CACHE_DIR=/tmp/moebench-jit/deepep-v2 TORCHINDUCTOR_CACHE_DIR=/tmp/moebench-jit/inductor
  mkdir -p $TRITON_CACHE_DIR $NCCL_EP_JIT_CACHE_DIR $EP_JIT_CACHE_DIR $TORCHINDUCTOR_CACHE_DIR   # one JIT cache each
  command -v nvidia-smi >/dev/null && $V2ENV python3 -c \
    "import torch; from moebench.env import nccl; print('torch', torch.__version__, 'nccl', nccl.versions())"
}
stamp_v2() {   # the V2 build's provenance beside its package (env/deepep.py build_info reads it)
  V2="$V2" NB="$NB" COMMIT="${DEEPEP_V2_COMMIT:-$(git -C .ext/DeepEP-main rev-parse HEAD 2>/dev/null)}" python3 - <<'PY'
import json, os, re
root = os.environ["V2"]
m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", open(os.path.join(root, "deep_ep", "__init__.py")).read(), re.M)
info = {"tool": "bench/device_round.sh", "version": m.group(1) if m else None, "commit": os.environ["COMMIT"] or None,
        "branch": "main", "nccl_root": os.environ["NB"]}
json.dump(info, open(os.path.join(root, "deepep_build.json"), "w"))
print(json.dumps(info))
PY
}

# ---- the steps: each writes its files under $D (= $S/STEP)
tier_workers() {   # ~5 GiB of GPU memory a worker (its rank processes' CUDA contexts and buffers), 2 cores a worker
  local mib; mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
  local w=$(( ${mib:-0} / 5120 )) c=$(( $(nproc) / 2 ))
  ((w > c)) && w=$c; ((w < 1)) && w=1; echo $w
}
step_tier() {
  local log=$D/gpu-tier-$GPU.log w=${TIER_WORKERS:-$(tier_workers)} g0 b0=$SECONDS
  export MOEBENCH_EXPECT_BACKENDS=${TIER_EXPECT:-$(python3 -c "from moebench.backends import base; print(','.join(base.names()))")}
  export MOEBENCH_FAULT_OUT=$D                 # the fault checks' JSON (every backend, EP 2 on shared ranks) kept
  # the CUDA extension is built first, as an install builds it (setup.py): its JIT build is no test time
  t 300 python3 -c "import moebench.ops as o; print('impl_status', o.impl_status())"
  echo "# moebench._C build: $((SECONDS - b0)) s; expected: $MOEBENCH_EXPECT_BACKENDS; workers: $w" | tee "$log"
  g0=$SECONDS                                  # -v and seconds since the start per line: where the time went
  echo "### alone: pytest -m 'gpu and alone', one at a time" >> "$log"
  t --ok 0 240 python3 -m pytest -v -m "gpu and alone" tests -p no:cacheprovider --durations=15 \
    > >(stamp >> "$log") 2>&1; wait $! 2>/dev/null
  echo "### side by side: pytest -m 'gpu and not alone' -n $w" >> "$log"
  t --ok 0 400 python3 -m pytest -v -m "gpu and not alone" tests -n "$w" --dist load --maxschedchunk 1 \
    -p no:cacheprovider --durations=15 > >(stamp >> "$log") 2>&1; wait $! 2>/dev/null
  echo "# gpu tier: $((SECONDS - g0)) s in all (both parts; the extension build not counted)" | tee -a "$log"
  grep -E "^ *[0-9]+ (=+ .*(passed|failed|error).* in |[0-9.]+s (call|setup) )" "$log"
  du -sh /tmp/moebench-jit/* 2>/dev/null | tr '\n' ' '; echo
}
step_fp8q() {
  local i j=$D/fp8-ep1-$GPU.jsonl
  for i in torch triton cuda; do
    t 120 $DISPATCH --ep 1 --backend alltoall $BIG --dtype fp8 --ops-impl $i --views api --iters 5 --out "$j"
  done
  t 120 $DISPATCH --ep 1 --backend alltoall $BIG --views api --iters 5 --out "$j"
}
as_base() {   # CMD...: run with BASE's moebench/ (.ext/base.tgz, a git archive of an earlier sha's moebench/, its sha in
  # BASE_SHA) swapped in at the same path (the CUDA extension's build is reused), then head's back
  [[ -f ${BASE:-.ext/base.tgz} ]] || return 0
  rm -rf /tmp/base && mkdir -p /tmp/base && tar -xzf "${BASE:-.ext/base.tgz}" -C /tmp/base && mv moebench /tmp/moebench.head \
    && cp -a /tmp/base/moebench moebench && MOEBENCH_GIT_SHA="${BASE_SHA:-base}" "$@"
  [[ -d /tmp/moebench.head ]] && rm -rf moebench && mv /tmp/moebench.head moebench
}
bars() {   # HEAD.jsonl [BASE.jsonl]: bench/glue_bars.py, a failed bar fails the step
  python3 bench/glue_bars.py "$1" $([[ -s ${2:-} ]] && echo "$2") | tee "$D/bars-${3:-ep1}-$GPU.txt"
  ((PIPESTATUS[0] == 0)) || { STATUS=FAIL; NOTE+="a bar of bench/glue_bars.py FAILed (bars-${3:-ep1}-$GPU.txt); "; }
}
step_ep1() {   # alltoall and deepep-v2 by BASE's code too, in this call (as_base)
  local j=$D/ep1-$GPU.jsonl b=$D/ep1-base-$GPU.jsonl
  t 300 $V2ENV $DISPATCH --ep 1 --backend alltoall,mcore-alltoall,ncclep,deepep-v2 --knob mode=ht $BIG --iters 20 --out "$j"
  t 120 $V2ENV $DISPATCH --ep 1 --backend ncclep --knob mode=ht --knob zero_copy=0 $BIG --iters 20 --views api --out "$j"
  t 150 $V2ENV $DISPATCH --ep 1 --backend ncclep --knob mode=ll $BIG --iters 20 --out "$j"
  as_base t 150 $V2ENV $DISPATCH --ep 1 --backend alltoall,deepep-v2 $BIG --iters 20 --views api --out "$b"
  [[ -s $j ]] && python3 -m moebench.report "$j" > "$D/ep1-$GPU.txt" && cat "$D/ep1-$GPU.txt"
  [[ -s $j ]] && bars "$j" "$b"
}
step_ab() {   # head against BASE, alternated AB_RUNS times (fresh processes): alltoall and deepep-v2's api medians
  local i h=$D/ab-head-$GPU.jsonl b=$D/ab-base-$GPU.jsonl
  for ((i = 1; i <= ${AB_RUNS:-3}; i++)); do
    t 100 $V2ENV $DISPATCH --ep 1 --backend alltoall,deepep-v2 $BIG --iters 20 --views api --out "$h"
    as_base t 100 $V2ENV $DISPATCH --ep 1 --backend alltoall,deepep-v2 $BIG --iters 20 --views api --out "$b"
  done
  [[ -s $h ]] && bars "$h" "$b" ab
}
step_ep1fp8() {
  local j=$D/ep1-fp8-$GPU.jsonl
  t 200 $V2ENV $DISPATCH --ep 1 --backend alltoall,ncclep,deepep-v2 --knob mode=ht $BIG --dtype fp8 --iters 20 --out "$j"
  t 150 $V2ENV $DISPATCH --ep 1 --backend ncclep --knob mode=ll $BIG --dtype fp8 --iters 20 --out "$j"
  [[ -s $j ]] && python3 -m moebench.report "$j" > "$D/ep1-fp8-$GPU.txt" && cat "$D/ep1-fp8-$GPU.txt"
}
step_chained() {
  t 240 $DISPATCH --ep 2 --ranks-per-gpu 2 --backend alltoall,deepep,deepep-ll,hybridep $SMALL --iters 10 \
    --views api,chained --out "$D/chained-shared-$GPU.jsonl"
}
step_sms() {
  local m f
  for m in ht ll; do
    f=bench/ep1-sms.toml; [[ $m == ll ]] && f=bench/ep1-sms-ll.toml
    t 250 $V2ENV $DISPATCH --ep 1 --sweep $f --knob-sweep --backend ncclep --knob mode=$m --iters 10 \
      --views "${SMS_VIEWS:-api,cached,kernel}" --out "$D/sms-ncclep-$m-$GPU.jsonl"
  done
  t 250 $V2ENV $DISPATCH --ep 1 --sweep bench/ep1-sms.toml --knob-sweep --backend deepep-v2 --iters 10 \
    --views "${SMS_VIEWS:-api,cached,kernel}" --out "$D/sms-deepep-v2-$GPU.jsonl"
}
step_soak() {   # a soak its budget ended with nothing corrupted exits 3 (BUDGET): a pass, said in the records
  local ep b n=0 ss pre runs=()
  for ep in ${SOAK_EPS:-2 4}; do
    local per="SOAK_BACKENDS_$ep"                    # SOAK_BACKENDS_2=... : one EP's own list
    for b in ${!per:-${SOAK_BACKENDS:-deepep-ll,deepep,hybridep ncclep:ht ncclep:ll deepep-v2}}; do
      runs+=("$ep $b"); n=$(( n + $(tr -cd , <<<"$b" | wc -c) + 1 ))
    done
  done
  # each backend's share of the step after ~30 s of setup each (EP 2 on the H100: 8-33 s)
  ss=${SOAK_SECONDS:-$(( (STEP_END - $(date +%s) - 30 * n) / n ))}; ((ss > 150)) && ss=150; ((ss < 20)) && ss=20
  echo "# $n soaks of ${SOAK:-2000} calls, $ss s each after its setup"
  for r in "${runs[@]}"; do
    ep=${r%% *} b=${r#* } pre=""
    [[ $b == deepep-v2 ]] && pre=$V2ENV                  # V2 first on its path; deepep / hybridep are V1's
    [[ $b == *:* ]] && b="${b%%:*} --knob mode=${b#*:}"   # ncclep:ht -> ncclep --knob mode=ht
    # shellcheck disable=SC2086
    t --ok "0 3" 420 $pre $DISPATCH --ep $ep --ranks-per-gpu $ep --backend $b $SMALL --iters 10 \
      --views "${SOAK_VIEWS:-api,graph}" --soak "${SOAK:-2000}" --soak-seconds "$ss" --timeout 400 \
      --out "$D/soak-$GPU.jsonl"
  done
}
step_permute() {
  [[ -d .ext/te-src ]] && export MOEBENCH_TE_SOURCE=${MOEBENCH_TE_SOURCE:-$PWD/.ext/te-src}
  # shellcheck disable=SC2086
  t 400 python3 -m moebench.permute --out "$D/permute-$GPU.jsonl" --plot "$D/permute-$GPU.png" ${PERMUTE_ARGS:-}
  t 200 python3 -m moebench.permute --dtype fp8 --ops permute --shapes 4096x7168x8x256,16384x7168x8x256 \
    --ops-impl "${FP8_IMPLS:-megatron,triton,cuda}" --iters 30 --out "$D/permute-$GPU-fp8.jsonl"
  [[ ${SKIP_FANOUT:-0} == 1 ]] && return
  t 120 "$(command -v nvcc || echo "$CUDA_HOME/bin/nvcc")" -O3 -arch=sm_90a -std=c++17 moebench/csrc/probes/fanout_bw.cu -o /tmp/fanout_bw || return
  local a
  for a in "--rows 4096 --row-bytes 14336" "--rows 16384 --row-bytes 14336" "--rows 8192 --row-bytes 4096" \
           "--rows 8192 --row-bytes 8192" "--rows 4096 --row-bytes 14336 --fanout 2"; do
    # shellcheck disable=SC2086
    t 60 /tmp/fanout_bw --fanout 8 --iters 20 $a > /tmp/fanout.out && A="$a" python3 -c "
import json, os, sys
from moebench.records import provenance
for line in open('/tmp/fanout.out'):
    print(json.dumps(dict(json.loads(line), tool='moebench/csrc/probes/fanout_bw',
                          command='fanout_bw --fanout 8 --iters 20 ' + os.environ['A'], env=provenance.provenance())))" \
      >> "$D/fanout-$GPU.jsonl"
  done
}
pack() {   # DIR NAME: DIR's folder packed as $OUT/NAME.tar.xz.* (15 MB pieces) for ../shared/packs
  tar -C "$(dirname "$1")" -I 'xz -T0 -3' -cf "/tmp/$2.tar.xz" "$(basename "$1")" && split -b 15M "/tmp/$2.tar.xz" "$OUT/$2.tar.xz."
}
step_v1build() {
  t 400 env BUILD_ROOT="${V1%/*}" FIX=nvshmem+syslink MAX_JOBS="${MAX_JOBS:-16}" bash bench/deepep_build.sh .ext/DeepEP \
    > "$D/deepep-build.log" 2>&1
  grep -h '^{' "$D/deepep-build.log" > "$D/deepep-build-$GPU.json"; tail -3 "$D/deepep-build.log"
  [[ $STATUS == PASS ]] && pack "$V1" deepep-nvshmem
}
step_v2build() {
  [[ -d $NB/lib ]] || { STATUS=FAIL; NOTE+="no NCCL build at $NB (carry .ext/packs/nccl-build.tar.xz.*); "; return; }
  rm -rf $V2 && cp -a .ext/DeepEP-main $V2 || { STATUS=FAIL; NOTE+="no .ext/DeepEP-main; "; return; }
  local nv; nv=$(python3 -c "import nvidia.nvshmem, os; print(os.path.dirname(nvidia.nvshmem.__file__))" 2>/dev/null)
  (cd $V2 && t 400 env EP_NCCL_ROOT_DIR=$NB EP_NVSHMEM_ROOT_DIR="$nv" TORCH_CUDA_ARCH_LIST=9.0 \
     MAX_JOBS="${MAX_JOBS:-16}" CC=gcc CXX=g++ LDSHARED="g++ -shared" python3 setup.py build_ext --inplace) \
    > "$D/deepep-v2-build.log" 2>&1 || { STATUS=FAIL; NOTE+="the V2 build failed (deepep-v2-build.log); "; }
  tail -3 "$D/deepep-v2-build.log"
  [[ $STATUS == PASS ]] && stamp_v2 > "$D/deepep-v2-build.json" && pack "$V2" deepep-v2
}
MLM=$PWD/.ext/Megatron-LM
mlm() {   # LOG_KEY KEPT_LOG megatron validate ARGS...: Megatron-LM's own pretrain_gpt.py per arm
  local key=$1 kept=$2; shift 2
  export MEGATRON_LM_COMMIT=${MEGATRON_LM_COMMIT:-f8837c04ef6cbef6cdefb8de001aad63178aebbf}  # core_r0.19.0 (no .git)
  t 580 python3 -m moebench.megatron validate --megatron-lm "$MLM" --log-dir /tmp/mlm-logs "$@"
  ls -t /tmp/mlm-logs/*"$key"*.log 2>/dev/null | head -1 | xargs -r -I{} cp {} "$D/$kept"
}
step_mlm_ep1() {
  mlm alltoall-r0 megatron-lm-ep1-$GPU.log --dispatcher alltoall --ep 1 --repeats 1 --iters "${ITERS:-30}" \
    --timeout 400 --out "$D/megatron-lm-ep1-$GPU.jsonl"
}
step_mlm_shared() {
  mlm hybridep-r0 megatron-lm-shared-hybridep-$GPU.log --dispatcher hybridep,deepep --ep 2 --ranks-per-gpu 2 \
    --preset dsv3-small --repeats 2 --iters "${ITERS:-30}" --timeout 200 --out "$D/megatron-lm-shared-gpu-$GPU.jsonl"
}

# ---- the round
line() {   # STEP STATUS SECONDS FILES NOTES: one summary line, on the console and in $OUT/summary.txt
  local notes; notes=$(tr ';' '\n' <<<"$5" | sed 's/^ *//; /^$/d' | awk '{n[$0]++; if (n[$0] == 1) o[++k] = $0}
    END {for (i = 1; i <= k; i++) printf "%s%s%s", (i > 1 ? "; " : ""), o[i], (n[o[i]] > 1 ? " (x" n[o[i]] ")" : "")}')
  printf '%-11s %-5s %5s s  %s%s\n' "$1" "$2" "$3" "${4:-no files}" "${notes:+  ($notes)}" | tee -a "$OUT/summary.txt"
}
bundle() {   # every step's files so far as $OUT/results.tgz (or its pieces): what comes back even if the call dies
  rm -f "$OUT"/results.tgz*
  tar -C "$S" -czf "$OUT/results.tgz" . || return
  if (( $(stat -c %s "$OUT/results.tgz") > 15 * 1048576 )); then
    split -b 15M "$OUT/results.tgz" "$OUT/results.tgz." && rm "$OUT/results.tgz"
  fi
}
hdr="# device round at $SHA on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) ($GPU), \
budget $BUDGET s, $(date -u +%FT%TZ): ${STEPS[*]}"
echo "$hdr" > "$OUT/summary.txt"; echo "$hdr"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>/dev/null
STATUS=PASS NOTE="" s0=$(date +%s)
step "setup: the packs (once per machine) and the environment"
packs
line setup "$STATUS" $(( $(date +%s) - s0 )) "" "$NOTE"
for ask in "${STEPS[@]}"; do
  name=${ask%%:*} STATUS=PASS NOTE="" s0=$(date +%s); D=$S/$name; mkdir -p "$D"
  STEP_END=$END; [[ $ask == *:* ]] && ((s0 + ${ask#*:} < END)) && STEP_END=$(( s0 + ${ask#*:} ))
  if ((STEP_END - s0 < MIN_LEFT)); then line "$name" cut 0 "" "not started: the budget was spent"; continue; fi
  step "$name: ${ABOUT[$name]} ($(( STEP_END - s0 )) s for it)"
  "step_${name//-/_}"
  line "$name" "$STATUS" $(( $(date +%s) - s0 )) "$(cd "$S" && find "$name" -type f | sort | xargs)" "$NOTE"
  bundle
done
step done
echo "# out: $(cd "$OUT" && ls | xargs)"
exec >&- 2>&-; wait "$TEE"                   # round.log whole before the call returns
