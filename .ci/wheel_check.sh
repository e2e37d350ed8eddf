#!/usr/bin/env bash
# The way containers install: build a wheel, install it into a fresh target outside the checkout, and
# run from there a CPU dispatch of the named sweep dsv3 (one case), then check that the CUDA sources
# the JIT build and the probes need are found inside the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MOEBENCH_BUILD_EXT=0 python -m pip wheel -q --no-deps -w "$tmp/dist" .
python -m pip install -q --no-deps --target "$tmp/site" "$tmp"/dist/moebench-*.whl
cd "$tmp"          # nothing of the checkout on sys.path from here on
PYTHONPATH="$tmp/site" python -m moebench.dispatch --device cpu --sweep dsv3 --max-cases 1 --ep 2 \
  --backend alltoall --iters 1 --out "$tmp/wheel.jsonl"
PYTHONPATH="$tmp/site" python - "$tmp/site" <<'PY'
import json, sys
from pathlib import Path
import moebench
from moebench.env.toolkit import CSRC_DIR, SWEEPS_DIR
site = Path(sys.argv[1]).resolve()
assert Path(moebench.__file__).resolve().is_relative_to(site), moebench.__file__
from moebench.ops.cuda_impl import HEADERS, SOURCES
for f in (*SOURCES, *HEADERS, "probes/p2p_bw.cu"):
    assert (CSRC_DIR / f).is_file(), f"CUDA source {CSRC_DIR / f} missing from the wheel"
assert CSRC_DIR.resolve().is_relative_to(site) and (SWEEPS_DIR / "dsv3.toml").is_file()
recs = [json.loads(line) for line in open("wheel.jsonl")]
assert recs and {r["check"]["status"] for r in recs} == {"PASS"}, [r["check"] for r in recs]
print(f"wheel: installed in {site}, CUDA sources at {CSRC_DIR}, {len(recs)} records of sweep dsv3 PASS")
PY
