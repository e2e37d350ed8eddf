#!/usr/bin/env bash
# Build DeepEP's hybrid-ep branch (deep_ep_cpp + hybrid_ep_cpp) intranode-only for sm_90, without
# NVSHMEM, with `setup.py build_ext --inplace`, once per FIX variant, each in its own copy of the source.
# Runs on the GPU machine (no network). DeepEP's source is never edited: patches go to the copies.
#
# Usage:  [FIX="none commid"] [BUILD_ROOT=/tmp/deepep] bash bench/deepep_build.sh [SRC_DIR=.ext/DeepEP]
#   FIX         space/comma list of variants, each built into $BUILD_ROOT/<variant>:
#                 none    DeepEP as is
#                 commid  get_comm_id() (csrc/hybrid_ep/hybrid_ep.cu) builds its rank string with
#                         std::to_string instead of std::ostringstream (the SIGSEGV is in that stream)
#                 syslink DeepEP as is, compiled and linked by the system g++ (CC=gcc CXX=g++
#                         LDSHARED="g++ -shared"), so the modules link the shared libstdc++.so.6.
#                         The image's Python builds extensions with /opt/gcc/bin/g++ (sysconfig CXX),
#                         which links libstdc++ statically: each module then carries and exports its
#                         own std::locale, and HybridEP's `ostringstream << int` mixes that copy with the
#                         process' libstdc++.so.6 (torch's) and dies with SIGSEGV in get_comm_id.
#               The first variant builds both extensions; the others (built at the same time) rebuild
#               hybrid_ep_cpp only and copy deep_ep_cpp from the first: the patches touch hybrid_ep only.
#   DEEPEP_COMMIT  recorded in provenance when SRC_DIR has no .git (default: the pinned hybrid-ep head)
# Prints one `PYTHONPATH=...` line per variant; provenance in $BUILD_ROOT/<variant>/deepep_build.json.
set -euo pipefail
SRC=$(cd "${1:-.ext/DeepEP}" && pwd)
ROOT=${BUILD_ROOT:-/tmp/deepep}
read -r -a VARIANTS <<<"$(echo "${FIX:-none commid}" | tr ',' ' ')"
PY=${PYTHON:-python3}
: "${CUDA_HOME:=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}"
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"

# Build environment (the one that built the working legacy Buffer).
export TORCH_CUDA_ARCH_LIST=9.0                      # sm_90 only (setup.py defaults hybrid-ep to 10.0)
export CPATH="$CUDA_HOME/include/cccl${CPATH:+:$CPATH}"   # CUDA 13 moved cub/thrust/libcu++ here
export MAX_JOBS=${MAX_JOBS:-16}
export DISABLE_AGGRESSIVE_PTX_INSTRS=${DISABLE_AGGRESSIVE_PTX_INSTRS:-1}   # setup.py's own default
export HYBRID_EP_MULTINODE=0 USE_NIXL=0              # intranode only: no DOCA/NCCL submodule build
unset NVSHMEM_DIR                                    # if set, setup.py builds the NVSHMEM kernels
# setup.py finds NVSHMEM with importlib.util.find_spec("nvidia.nvshmem") (torch 2.11 depends on that
# wheel); a None entry in sys.modules makes find_spec return None -> AttributeError -> DISABLE_NVSHMEM.
PRE='import sys, runpy; sys.modules["nvidia.nvshmem"] = None; sys.argv = ["setup.py", "build_ext", "--inplace"]'
BOTH="$PRE; runpy.run_path('setup.py', run_name='__main__')"
HYB="$PRE; sys.path.insert(0, '.'); import setuptools; from torch.utils.cpp_extension import BuildExtension
from setup import get_extension_hybrid_ep_cpp
setuptools.setup(name='deep_ep', ext_modules=[get_extension_hybrid_ep_cpp()], cmdclass={'build_ext': BuildExtension})"

patch_commid() {  # $1 = tree: replace the ostringstream loop in get_comm_id by string concatenation.
  "$PY" - "$1/csrc/hybrid_ep/hybrid_ep.cu" <<'EOF'
import re, sys
p = sys.argv[1]; s = open(p).read()
new = ("std::string ranks_str;\n  for (size_t i = 0; i < global_ranks.size(); ++i) {\n"
       "    if (i) ranks_str += \",\";\n    ranks_str += std::to_string(global_ranks[i]);\n  }\n\n"
       "  // Hash the string to get the comm id\n  auto hashed = std::hash<std::string>{}(ranks_str")
s, n = re.subn(r"std::ostringstream ranks_ss;.*?ranks_ss\.str\(\)", new, s, flags=re.S)
assert n == 1, "get_comm_id pattern not found: DeepEP source changed"
open(p, "w").write(s)
EOF
}

build() {  # $1 = variant, $2 = BOTH|HYB; output in $ROOT/$1/build.log
  local D="$ROOT/$1"
  rm -rf "$D"; cp -a "$SRC" "$D"; rm -rf "$D/build" "$D"/*.so
  [ "$1" = commid ] && patch_commid "$D"
  local tool=()
  [ "$1" = syslink ] && tool=(env CC=gcc CXX=g++ LDSHARED="g++ -shared")
  (cd "$D" && date +%s >.t0 && "${tool[@]}" $PY -c "${!2}" >build.log 2>&1) || { tail -30 "$D/build.log"; return 1; }
}

for v in "${VARIANTS[@]}"; do case "$v" in none|commid|syslink) ;; *) echo "unknown FIX variant: $v" >&2; exit 2 ;; esac; done
mkdir -p "$ROOT"; first=${VARIANTS[0]}; pids=()
for v in "${VARIANTS[@]:1}"; do build "$v" HYB & pids+=($!); done   # hybrid-only variants, concurrently
fail=0; build "$first" BOTH || fail=1
for p in "${pids[@]}"; do wait "$p" || fail=1; done   # never leave a build running behind us
[ "$fail" = 0 ] || exit 1
grep -q -- "-DDISABLE_NVSHMEM" "$ROOT/$first/build.log" || { echo "NVSHMEM was not disabled" >&2; exit 1; }
for v in "${VARIANTS[@]:1}"; do cp -a "$ROOT/$first"/deep_ep_cpp*.so "$ROOT/$v/"; done

COMMIT=${DEEPEP_COMMIT:-94a9f8f6b146c07d97ec58f67cd6d303296d6098}   # .ext/DeepEP is an export, no .git
[ -e "$SRC/.git" ] && COMMIT=$(git -C "$SRC" rev-parse HEAD)   # (git -C alone would find moebench's repo)
for v in "${VARIANTS[@]}"; do   # provenance beside each build
  D="$ROOT/$v"
  ok=$(cd /tmp && PYTHONPATH="$D" $PY -c "import torch, deep_ep_cpp, hybrid_ep_cpp, deep_ep; print('ok')" 2>&1 | tail -1 || true)
  so=$(ls "$D"/hybrid_ep_cpp*.so)
  if readelf -d "$so" | grep -q "NEEDED.*libstdc++"; then cxx="shared libstdc++.so.6 (NEEDED)"
  else cxx="static libstdc++ copy inside the module ($(nm -D --defined-only "$so" | grep -c _ZNSt6locale) std::locale symbols exported)"; fi
  V="$v" D="$D" COMMIT="$COMMIT" OK="$ok" CXXRT="$cxx" FIRST="$first" SECS=$(( $(date +%s) - $(cat "$D/.t0") )) $PY - <<'EOF'
import json, os, re, subprocess, sys
import torch
sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
d, v = os.environ["D"], os.environ["V"]
ver = re.search(r"version='([^']+)'", open(os.path.join(d, "setup.py")).read())
rec = {
    "commit": os.environ["COMMIT"], "branch": "hybrid-ep", "version": ver.group(1) if ver else None,
    "build_kind": "intranode, no NVSHMEM, sm_90, setup.py build_ext --inplace", "fix": v,
    "deep_ep_cpp": "built here" if v == os.environ["FIRST"] else f"copied from {os.environ['FIRST']}",
    "flags": {k: os.environ.get(k) for k in ("TORCH_CUDA_ARCH_LIST", "CPATH", "MAX_JOBS",
              "DISABLE_AGGRESSIVE_PTX_INSTRS", "HYBRID_EP_MULTINODE", "USE_NIXL", "CUDA_HOME")},
    "nvshmem": "disabled (NVSHMEM_DIR unset, nvidia.nvshmem hidden from setup.py)",
    "nvcc": sh("nvcc --version | grep release"), "gcc": sh("gcc --version | head -1"),
    "python_cxx": sh(sys.executable + " -c \"import sysconfig; print(sysconfig.get_config_var('CXX'))\""),
    "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "import_check": os.environ["OK"], "hybrid_ep_cpp_libstdcxx": os.environ["CXXRT"],
    "linker": sh("grep -m1 -o '^[^ ]*g++ [^ ]*' " + os.path.join(d, "build.log")), "elapsed_s": int(os.environ["SECS"]), "dir": d,
}
json.dump(rec, open(os.path.join(d, "deepep_build.json"), "w"), indent=1)
print(json.dumps(rec))
EOF
done
echo "# HybridEP JIT-compiles its kernels at run time with \$CUDA_HOME/bin/nvcc: keep CUDA_HOME=$CUDA_HOME set"
for v in "${VARIANTS[@]}"; do echo "PYTHONPATH=$ROOT/$v   # FIX=$v"; done
