#!/usr/bin/env bash
# Build NCCL (tag v2.30.7-1, the version nccl-extensions pins and DeepEP V2 accepts) for one GPU architecture on
# the GPU machine, timed, and pack it for later calls like the DeepEP build. The H200 image's torch carries NCCL
# 2.28.9; NCCL EP and DeepEP V2 need >= 2.30.4, and the 2.30+ pip wheel (199 MB of libnccl for every
# architecture) cannot travel to the device. Carry the source as .ext/nccl:
#   git -C <NVIDIA/nccl mirror> archive v2.30.7-1 | tar -x -C .ext/nccl
# Steps, in the order given:
#   build   make src.build for $NCCL_ARCH (default 90) into $NCCL_BUILD (default .ext/nccl-build), $MAX_JOBS jobs;
#           writes $OUT/nccl-build.json (version the library reports, seconds, size, flags)
#   pack    that build's lib/ and include/ as xz pieces under $OUT (carry them back as .ext/nccl-pack)
#   unpack  the carried pieces ($NCCL_PIECES, default .ext/nccl-pack/nccl-build.tar.xz.*) into $NCCL_BUILD's folder
#           (skipped while this machine still has the build)
#   layout  $NCCL_LAYOUT (default $NCCL_BUILD-layout)/nvidia/nccl/{lib/libnccl.so.2,include} pointing at the build,
#           and the line that makes a process use it, printed (stdout) for `eval`:
#             export PYTHONPATH=<layout>:... NCCL_HOME=<build> EP_NCCL_ROOT_DIR=<build>
# Why a layout and not LD_PRELOAD: torch (2.11) loads nvidia/nccl/lib/libnccl.so.2 from sys.path by absolute path
# at import, so a preloaded build leaves two libnccl mapped (DeepEP V2's import stops: "Duplicate NCCL runtime
# found"; moebench refuses the run naming both). With the layout first on PYTHONPATH torch itself loads the build,
# as it loads a pip-installed nvidia-nccl-cu13 >= 2.30.4 (the user's route). NCCL_HOME is NCCL EP's JIT headers,
# EP_NCCL_ROOT_DIR DeepEP V2's check and JIT headers. Records name the libnccl each rank loaded (env/nccl.py).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
SRC=${NCCL_SRC:-.ext/nccl} B=${NCCL_BUILD:-$PWD/.ext/nccl-build} ARCH=${NCCL_ARCH:-90}
: "${CUDA_HOME:=/usr/local/cuda}"
for s in "$@"; do case $s in
build)
  t0=$(date +%s)
  make -C "$SRC" -j"${MAX_JOBS:-16}" src.build CUDA_HOME="$CUDA_HOME" BUILDDIR="$B" \
    NVCC_GENCODE="-gencode=arch=compute_$ARCH,code=sm_$ARCH" > /tmp/nccl-build.log 2>&1
  rc=$?; secs=$(( $(date +%s) - t0 ))
  echo "nccl build rc=$rc in $secs s"; [ $rc = 0 ] || { tail -30 /tmp/nccl-build.log; exit 1; }
  B="$B" SECS="$secs" ARCH="$ARCH" python3 - <<'EOF' | tee "$OUT/nccl-build.json"
import json, os
from moebench.env import nccl
lib = os.path.join(os.environ["B"], "lib", "libnccl.so.2")
v = nccl.version_of(lib)
print(json.dumps({"tool": "bench/nccl_build.sh", "tag": "v2.30.7-1", "lib": lib,
                  "version": ".".join(map(str, v)) if v else None, "seconds": int(os.environ["SECS"]),
                  "bytes": os.path.getsize(os.path.realpath(lib)), "gencode": f"sm_{os.environ['ARCH']}"}))
EOF
  ;;
pack)
  tar -C "$(dirname "$B")" -I 'xz -T0 -3' -cf /tmp/nccl.tar.xz "$(basename "$B")/lib" "$(basename "$B")/include" \
    && ls -la /tmp/nccl.tar.xz && split -b 15M /tmp/nccl.tar.xz "$OUT/nccl-build.tar.xz." ;;
unpack)
  [ -d "$B/lib" ] || { mkdir -p "$(dirname "$B")" && cat ${NCCL_PIECES:-.ext/nccl-pack/nccl-build.tar.xz.*} \
    | tar -xJ -C "$(dirname "$B")"; } ;;
layout)
  L=${NCCL_LAYOUT:-$B-layout}
  mkdir -p "$L/nvidia/nccl/lib" && ln -sfn "$B/lib/libnccl.so.2" "$L/nvidia/nccl/lib/libnccl.so.2" \
    && ln -sfn "$B/include" "$L/nvidia/nccl/include" || exit 1
  echo "export PYTHONPATH=$L\${PYTHONPATH:+:\$PYTHONPATH} NCCL_HOME=$B EP_NCCL_ROOT_DIR=$B" ;;
*) echo "unknown step $s" ;;
esac; done
