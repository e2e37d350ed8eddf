# Sourced by the bench/*.sh device scripts: the environment every GPU run shares. Puts this
# checkout on PYTHONPATH, installs carried .whl wheels into /tmp/site once per machine (appended to
# PYTHONPATH), keeps NVLink multicast off, and defines `step NAME` (a timestamped section header).
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0
export MOEBENCH_EXT_DIR="${MOEBENCH_EXT_DIR:-/tmp/moebench-ext}"
if ls .whl/*.whl >/dev/null 2>&1; then   # installed once per machine: again only when the carried wheels change
  if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$(stat -c '%n %s' .whl/*.whl)" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl && stat -c '%n %s' .whl/*.whl > /tmp/site/.wheels
  fi
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
# GPU: the card's short name (h200, h100, ...) that names the files a run writes, since a call may get either
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oE '[ABH][0-9]{2,3}' | head -1 \
  | tr 'A-Z' 'a-z'); GPU=${GPU:-gpu}
t0=$(date +%s); step() { echo "### $1 ($(( $(date +%s) - t0 )) s)"; }
