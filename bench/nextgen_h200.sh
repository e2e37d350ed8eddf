#!/usr/bin/env bash
# NCCL EP (`ncclep`) and DeepEP V2 (`deepep-v2`) on one H200 or H100 (files named after the card, $GPU), from the
# prebuilt packs of ../shared/packs carried as .ext/packs (never rebuilt here): NCCL 2.30.7, DeepEP main dd758ca
# (V2), the `nccl` Python packages (nccl4py + nccl-extensions), and for V1 / HybridEP DeepEP hybrid-ep with
# NVSHMEM; the megatron-core wheel as .whl (mcore-alltoall). Steps, in the order given:
#   v2build  (instead of the deepep-v2 pack) DeepEP main from .ext/DeepEP-main (a checkout or `git archive`)
#            built against the NCCL build ($NB, kept in its rpath) into $V2: NVSHMEM from the image's wheel, sm_90,
#            the system g++ (the image's Python links libstdc++ statically otherwise); the `env` step then stamps it
#   env      unpack the packs into /tmp (kept while the machine is warm; the V2 pack unless v2build made $V2), lay
#            out the NCCL build for torch to load (bench/nccl_build.sh layout: one libnccl in the process), stamp
#            the V2 build's provenance ($V2/deepep_build.json: version, commit $DEEPEP_V2_COMMIT or the source's
#            HEAD, nccl_root: every record names the build), export what the other steps and the GPU tier use
#   ep1      the EP 1 table, T 4096 H 7168 E 256 K 8, bf16 then fp8: alltoall, mcore-alltoall (bf16), ncclep ht and
#            ll, deepep-v2 at their default SMs (V2 on the path). DeepEP V1 and HybridEP do not run at EP 1 (the
#            legacy intranode Buffer takes 2, 4 or 8 ranks; HybridEPBuffer segfaults at world size 1: refused)
#   sms      --knob-sweep num_sms at EP 1 (bench/ep1-sms*.toml): ncclep ht, ncclep ll, deepep-v2, each's best
#   shared   EP 2 and EP 4 (SHARED_EPS) on one GPU (ranks sharing it, functional; T 64 H 2048 E 16 K 4): ncclep ht, ll and
#            deepep-v2 through the oracle with memory rows, each soaked with $SOAK (default 2000) calls within
#            $SOAK_SECONDS (default 60) after its setup
#   gputier  the GPU tier (bench/dispatch_h200.sh gputier) with ncclep and deepep-v2 expected to run
# Usage on the device: MOEBENCH_GIT_SHA=<sha> bash bench/nextgen_h200.sh env ep1 shared
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
source bench/device_env.sh
exec > >(tee -a "$OUT/nextgen-$GPU.txt") 2>&1
P=.ext/packs NB=/tmp/nccl-build V2=/tmp/deepep-v2 PYPKG=/tmp/ncclpy
export DEEPEP_PIECES="$P/deepep-nvshmem.tar.xz.*"              # the V1 / HybridEP build (device_env.sh)
D="python3 -m moebench.dispatch --device cuda"
BIG="--num-tokens 4096 --hidden 7168 --num-experts 256 --topk 8"
SMALL="--num-tokens 64 --hidden 2048 --num-experts 16 --topk 4"
v2() { PYTHONPATH="$V2:$PYTHONPATH" "$@"; }                   # DeepEP V2 first on the path (V1 shares its name)
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
stamp_v2() {   # the V2 build's provenance beside its package (env/deepep.py build_info reads it)
  V2="$V2" NB="$NB" COMMIT="${DEEPEP_V2_COMMIT:-$(git -C .ext/DeepEP-main rev-parse HEAD 2>/dev/null)}" python3 - <<'PY' \
    | tee "$OUT/deepep-v2-build.json"
import json, os, re
root = os.environ["V2"]
m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", open(os.path.join(root, "deep_ep", "__init__.py")).read(), re.M)
info = {"tool": "bench/nextgen_h200.sh", "version": m.group(1) if m else None, "commit": os.environ["COMMIT"] or None,
        "branch": "main", "nccl_root": os.environ["NB"]}
json.dump(info, open(os.path.join(root, "deepep_build.json"), "w"))
print(json.dumps(info))
PY
}
for s in "$@"; do case $s in
v2build)
  step "build DeepEP main (V2) against NCCL at $NB"
  [ -d $NB/lib ] || NCCL_BUILD=$NB NCCL_PIECES="$P/nccl-build.tar.xz.*" bash bench/nccl_build.sh unpack
  rm -rf $V2 && cp -a .ext/DeepEP-main $V2 || exit 1
  NVSHMEM=$(python3 -c "import nvidia.nvshmem, os; print(os.path.dirname(nvidia.nvshmem.__file__))" 2>/dev/null)
  (cd $V2 && EP_NCCL_ROOT_DIR=$NB EP_NVSHMEM_ROOT_DIR="$NVSHMEM" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16} \
     CC=gcc CXX=g++ LDSHARED="g++ -shared" python3 setup.py build_ext --inplace) > /tmp/deepep-v2-build.log 2>&1
  rc=$?; echo "deepep-v2 build rc=$rc"; tail -3 /tmp/deepep-v2-build.log; [ $rc = 0 ] && stamp_v2 ;;
env)
  step "unpack the packs, lay out NCCL 2.30.7 for torch, stamp DeepEP V2"
  [ -d $NB/lib ] || NCCL_BUILD=$NB NCCL_PIECES="$P/nccl-build.tar.xz.*" bash bench/nccl_build.sh unpack
  [ -d $V2/deep_ep ] || cat $P/deepep-v2.tar.xz.* | tar -xJ -C /tmp
  [ -d $PYPKG/nccl ] || { mkdir -p $PYPKG && tar -xJf $P/ncclpy.tar.xz -C $PYPKG; }
  eval "$(NCCL_BUILD=$NB bash bench/nccl_build.sh layout)"
  [ -f $V2/deepep_build.json ] || DEEPEP_V2_COMMIT=${DEEPEP_V2_COMMIT:-dd758ca} stamp_v2   # the pack: main dd758ca
  export PYTHONPATH="$PYTHONPATH:$PYPKG" MOEBENCH_DEEPEP_V2_PATH=$V2 MOEBENCH_EXPECT_BACKENDS=ncclep,deepep-v2
  v2 python3 -c "import torch, deep_ep; from moebench.env import nccl; print('nccl', nccl.versions()); \
    import nccl.ep as ep; print('nccl.ep', ep.get_lib_version(), 'deep_ep', deep_ep.__version__)" 2>&1 | tail -3 ;;
ep1)
  step "EP 1 table, bf16: alltoall, mcore-alltoall, ncclep ht and ll, deepep-v2 (default SMs)"
  J="$OUT/nextgen-ep1-$GPU.jsonl"
  v2 timeout 280 $D --ep 1 --backend alltoall,mcore-alltoall,ncclep,deepep-v2 --knob mode=ht $BIG --iters 20 --out "$J"
  v2 timeout 150 $D --ep 1 --backend ncclep --knob mode=ll $BIG --iters 20 --out "$J"
  step "EP 1 table, fp8: alltoall, ncclep ht and ll, deepep-v2"
  v2 timeout 200 $D --ep 1 --backend alltoall,ncclep,deepep-v2 --knob mode=ht $BIG --dtype fp8 --iters 20 --out "$J"
  v2 timeout 150 $D --ep 1 --backend ncclep --knob mode=ll $BIG --dtype fp8 --iters 20 --out "$J"
  python3 -m moebench.report "$J" ;;
sms)
  step "--knob-sweep num_sms at EP 1: ncclep ht, ncclep ll, deepep-v2"
  for m in ht ll; do
    f=bench/ep1-sms.toml; [ $m = ll ] && f=bench/ep1-sms-ll.toml
    v2 timeout 250 $D --ep 1 --sweep $f --knob-sweep --backend ncclep --knob mode=$m --iters 10 \
      --views api,cached,kernel --out "$OUT/nextgen-sms-ncclep-$m-$GPU.jsonl"
  done
  v2 timeout 250 $D --ep 1 --sweep bench/ep1-sms.toml --knob-sweep --backend deepep-v2 --iters 10 \
    --views api,cached,kernel --out "$OUT/nextgen-sms-deepep-v2-$GPU.jsonl" ;;
shared)
  for ep in ${SHARED_EPS:-2 4}; do
    step "EP $ep on one GPU: ncclep ht, ll, deepep-v2 through the oracle, soaked (${SOAK_SECONDS:-60} s each)"
    for b in ${SHARED_BACKENDS:-"ncclep --knob mode=ht" "ncclep --knob mode=ll" "deepep-v2"}; do
      v2 timeout 300 $D --ep $ep --ranks-per-gpu $ep --backend $b $SMALL --iters 10 --views api,cached \
        --soak ${SOAK:-2000} --soak-seconds ${SOAK_SECONDS:-60} --timeout 200 --out "$OUT/nextgen-shared-$GPU.jsonl"
      echo "rc=$? (3: the soak ran out of its budget with nothing corrupted)"
    done
  done ;;
gputier)
  bash bench/dispatch_h200.sh gputier ;;
*) echo "unknown step $s" ;;
esac; done
step done
