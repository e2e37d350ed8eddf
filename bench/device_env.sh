# Sourced by the bench/*.sh device scripts: the environment every H200 run shares. Puts this
# checkout on PYTHONPATH, installs carried .whl wheels into /tmp/site (appended to PYTHONPATH),
# keeps NVLink multicast off, and defines `step NAME` (a timestamped section header).
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
export MOEBENCH_EXT_DIR="${MOEBENCH_EXT_DIR:-/tmp/moebench-ext}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
# GPU: the card's short name (h200, h100, ...) that names the files a run writes, since a call may get either
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE '[ABH][0-9]{2,3}' | head -1 \
  | tr 'A-Z' 'a-z'); GPU=${GPU:-gpu}
t0=$(date +%s); step() { echo "### $1 ($(( $(date +%s) - t0 )) s)"; }
# The NVSHMEM DeepEP build (README's recipe) from the carried source .ext/DeepEP (hybrid-ep 94a9f8f), packed
# as xz pieces under $OUT for a later call to carry back as .ext/deepep-pack, and put on PYTHONPATH: unpacked
# from those pieces unless this machine still has it.
DEEPEP_BUILD=$PWD/.ext/deepep-builds/nvshmem+syslink
build_deepep() {   # [MAX_JOBS]: the build's log in /tmp/deepep-build.log, its provenance in $OUT
  step "build DeepEP hybrid-ep with NVSHMEM (nvshmem+syslink)"
  BUILD_ROOT=$(dirname "$DEEPEP_BUILD") FIX=nvshmem+syslink MAX_JOBS=${MAX_JOBS:-16} timeout 400 \
    bash bench/deepep_build.sh .ext/DeepEP > /tmp/deepep-build.log 2>&1
  echo "build rc=$?"; grep -h '^{' /tmp/deepep-build.log > "$OUT/deepep-build-$GPU.json"
  grep -E "failed|PYTHONPATH" /tmp/deepep-build.log
}
pack_deepep() {
  step "pack the DeepEP build for a later call (carry the pieces back as .ext/deepep-pack)"
  tar -C "$(dirname "$DEEPEP_BUILD")" -I 'xz -T0 -3' -cf /tmp/b.tar.xz "$(basename "$DEEPEP_BUILD")" \
    && ls -la /tmp/b.tar.xz && split -b 15M /tmp/b.tar.xz "$OUT/deepep-nvshmem.tar.xz."
}
use_deepep_build() {
  if [ ! -d "$DEEPEP_BUILD" ]; then
    step "unpack the carried DeepEP build"
    mkdir -p "$(dirname "$DEEPEP_BUILD")" && cat ${DEEPEP_PIECES:-.ext/deepep-pack/deepep-nvshmem.tar.xz.*} | tar -xJ -C "$(dirname "$DEEPEP_BUILD")"
  fi
  export PYTHONPATH="$PYTHONPATH:$DEEPEP_BUILD"
}
