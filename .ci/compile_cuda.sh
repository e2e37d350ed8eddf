#!/usr/bin/env bash
# Compile check of moebench/csrc/ for sm_90a with CMake (kernels, self-test, probes). Needs no GPU.
# Exits 0 with "skipped: no nvcc" where nvcc is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC="$(command -v nvcc || true)"
if [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$NVCC" ]]; then echo "skipped: no nvcc"; exit 0; fi
if ! command -v cmake >/dev/null; then echo "skipped: no cmake"; exit 0; fi
BUILD="${MOEBENCH_CMAKE_BUILD:-$(mktemp -d)}"
cmake -S . -B "$BUILD" -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90a >"$BUILD/configure.log" 2>&1 \
  || { cat "$BUILD/configure.log"; exit 1; }
rc=0
cmake --build "$BUILD" -j "$(nproc)" >"$BUILD/build.log" 2>&1 || rc=$?
grep -vE "^ptxas info|^    [0-9]+ bytes stack" "$BUILD/build.log" || true
if [[ $rc -ne 0 ]]; then echo "CUDA compile failed (rc $rc)"; exit "$rc"; fi
echo "compiled moebench/csrc for sm_90a: $(ls "$BUILD" | grep -vE '\.(cmake|log|txt)$|CMakeFiles|Makefile' | tr '\n' ' ')"
