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
