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
#   unpack  the carried pieces into $NCCL_BUILD (skipped while this machine still has the build)
# Then run the ranks with LD_PRELOAD=$NCCL_BUILD/lib/libnccl.so.2 (torch maps it instead of its own; NCCL EP and
# DeepEP V2 call the one mapped), EP_NCCL_ROOT_DIR=$NCCL_BUILD (DeepEP V2's check and JIT headers) and
# NCCL_HOME=$NCCL_BUILD (NCCL EP's JIT headers). Records name the libnccl each rank loaded (env/nccl.py).
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
  [ -d "$B/lib" ] || { mkdir -p "$(dirname "$B")" && cat .ext/nccl-pack/nccl-build.tar.xz.* | tar -xJ -C "$(dirname "$B")"; } ;;
*) echo "unknown step $s" ;;
esac; done
