#!/usr/bin/env bash
# DeepEP V2 (deepseek-ai/DeepEP main: ElasticBuffer + the legacy Buffer in one deep_ep._C) built on the GPU machine
# against an NCCL >= 2.30.4 (bench/nccl_build.sh), and the provenance moebench's records read beside it.
# DeepEP's source is never edited; it is copied and built in the copy.
# Steps, in the order given:
#   build  SRC (default .ext/DeepEP-main, a DeepEP main checkout or `git archive`) copied to $V2_BUILD (default
#          /tmp/deepep-v2) and built in place: EP_NCCL_ROOT_DIR=$NCCL_BUILD (default /tmp/nccl-build; its rpath
#          keeps that root), NVSHMEM from the image's nvidia-nvshmem wheel, sm_90, the system g++ (the image's
#          Python links libstdc++ statically otherwise), $MAX_JOBS jobs; then `stamp`
#   stamp  $V2_BUILD/deepep_build.json: version (deep_ep/__init__.py), commit ($DEEPEP_V2_COMMIT, else the
#          source's git HEAD), branch main, nccl_root, so every record names the build (env/deepep.py build_info);
#          also for a prebuilt tree such as ../shared/packs' deepep-v2 (main dd758ca: DEEPEP_V2_COMMIT=dd758ca)
# Then put $V2_BUILD first on PYTHONPATH (it shares the package name deep_ep with V1: one per process) with the
# NCCL layout's line (bench/nccl_build.sh layout).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
V2=${V2_BUILD:-/tmp/deepep-v2} NB=${NCCL_BUILD:-/tmp/nccl-build} SRC=${1:-.ext/DeepEP-main}
: "${CUDA_HOME:=/usr/local/cuda}"
for s in "${@:2}"; do case $s in
build)
  t0=$(date +%s); rm -rf "$V2" && cp -a "$SRC" "$V2" || exit 1
  NVSHMEM=$(python3 -c "import nvidia.nvshmem, os; print(os.path.dirname(nvidia.nvshmem.__file__))" 2>/dev/null)
  (cd "$V2" && EP_NCCL_ROOT_DIR="$NB" EP_NVSHMEM_ROOT_DIR="$NVSHMEM" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-16} \
     CC=gcc CXX=g++ LDSHARED="g++ -shared" python3 setup.py build_ext --inplace) > /tmp/deepep-v2-build.log 2>&1
  rc=$?; echo "deepep-v2 build rc=$rc in $(( $(date +%s) - t0 )) s"; [ $rc = 0 ] || { tail -30 /tmp/deepep-v2-build.log; exit 1; }
  ;&
stamp)
  commit=${DEEPEP_V2_COMMIT:-$(git -C "$SRC" rev-parse HEAD 2>/dev/null)}
  V2="$V2" NB="$NB" COMMIT="$commit" python3 - <<'PY' | tee "$OUT/deepep-v2-build.json"
import json, os, re
root = os.environ["V2"]
text = open(os.path.join(root, "deep_ep", "__init__.py")).read()
m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
info = {"tool": "bench/deepep_v2_build.sh", "version": m.group(1) if m else None, "commit": os.environ["COMMIT"] or None,
        "branch": "main", "nccl_root": os.environ["NB"]}
json.dump(info, open(os.path.join(root, "deepep_build.json"), "w"))
print(json.dumps(info))
PY
  ;;
*) echo "unknown step $s" ;;
esac; done
