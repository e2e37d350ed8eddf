# Sourced by the bench/*.sh device scripts: the environment every H200 run shares. Puts this
# checkout on PYTHONPATH, installs carried .whl wheels into /tmp/site (appended to PYTHONPATH),
# keeps NVLink multicast off, and defines `step NAME` (a timestamped section header).
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
export MOEBENCH_EXT_DIR="${MOEBENCH_EXT_DIR:-/tmp/moebench-ext}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
t0=$(date +%s); step() { echo "### $1 ($(( $(date +%s) - t0 )) s)"; }
# The NVSHMEM DeepEP build (bench/megatron_lm_h200.sh build + pack) on PYTHONPATH: unpacked from the
# carried .ext/deepep-pack pieces unless this machine still has it.
DEEPEP_BUILD=$PWD/.ext/deepep-builds/nvshmem+syslink
use_deepep_build() {
  if [ ! -d "$DEEPEP_BUILD" ]; then
    step "unpack the carried DeepEP build"
    mkdir -p "$(dirname "$DEEPEP_BUILD")" && cat .ext/deepep-pack/deepep-nvshmem.tar.xz.* | tar -xJ -C "$(dirname "$DEEPEP_BUILD")"
  fi
  export PYTHONPATH="$PYTHONPATH:$DEEPEP_BUILD"
}
