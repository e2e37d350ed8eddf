#!/usr/bin/env bash
# Build DeepEP's hybrid-ep branch (deep_ep_cpp + hybrid_ep_cpp) intra-node for sm_90 with
# `setup.py build_ext --inplace`, once per FIX variant, each in its own copy of the source.
# Runs on the GPU machine (no network). DeepEP's source is never edited: patches go to the copies.
#
# Usage:  [FIX="syslink nvshmem+syslink"] [BUILD_ROOT=/tmp/deepep] bash bench/deepep_build.sh [SRC_DIR=.ext/DeepEP]
#   FIX   space/comma list of variants, each built into $BUILD_ROOT/<variant>; a variant is one word or
#         words joined by '+':
#           none     DeepEP as is, without NVSHMEM (nvidia.nvshmem hidden from setup.py)
#           nvshmem  with NVSHMEM: setup.py finds the image's nvidia-nvshmem-cu13 wheel (nvidia.nvshmem) and
#                    builds the internode and low-latency kernels (deepep-ll, Megatron's flex/deepep path)
#           commid   get_comm_id() (csrc/hybrid_ep/hybrid_ep.cu) builds its rank string with std::to_string
#                    instead of std::ostringstream (the SIGSEGV is in that stream)
#           syslink  compiled and linked by the system g++ (CC=gcc CXX=g++ LDSHARED="g++ -shared"), so the
#                    modules link the shared libstdc++.so.6. The image's Python builds extensions with
#                    /opt/gcc/bin/g++ (sysconfig CXX), which links libstdc++ statically: each module then
#                    carries and exports its own std::locale, and HybridEP's `ostringstream << int` mixes that
#                    copy with the process' libstdc++.so.6 (torch's) and dies with SIGSEGV in get_comm_id.
#         Each extension is built once per setting that shapes it (deep_ep_cpp: nvshmem, syslink;
#         hybrid_ep_cpp: commid, syslink; HybridEP uses no NVSHMEM), all builds at the same time, and the
#         variants are put together from them.
#   DEEPEP_COMMIT  recorded in provenance when SRC_DIR has no .git (default: the pinned hybrid-ep head)
# Prints one `PYTHONPATH=...` line per variant; provenance in $BUILD_ROOT/<variant>/deepep_build.json
# (moebench's records read it: version, commit, NVSHMEM version and path, build kind).
set -euo pipefail
SRC=$(cd "${1:-.ext/DeepEP}" && pwd)
ROOT=${BUILD_ROOT:-/tmp/deepep}
read -r -a VARIANTS <<<"$(echo "${FIX:-syslink nvshmem+syslink}" | tr ',' ' ')"
PY=${PYTHON:-python3}
: "${CUDA_HOME:=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}"
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"

# Build environment (the one that built the working legacy Buffer and the NVSHMEM build).
export TORCH_CUDA_ARCH_LIST=9.0                      # sm_90 only (setup.py defaults hybrid-ep to 10.0)
export CPATH="$CUDA_HOME/include/cccl${CPATH:+:$CPATH}"   # CUDA 13 moved cub/thrust/libcu++ here
export MAX_JOBS=${MAX_JOBS:-16}
export DISABLE_AGGRESSIVE_PTX_INSTRS=${DISABLE_AGGRESSIVE_PTX_INSTRS:-1}   # setup.py's own default
export HYBRID_EP_MULTINODE=0 USE_NIXL=0              # intranode only: no DOCA/NCCL submodule build
unset NVSHMEM_DIR                                    # NVSHMEM comes from the nvidia.nvshmem wheel, or not at all
# setup.py finds NVSHMEM with importlib.util.find_spec("nvidia.nvshmem"); a None entry in sys.modules makes
# find_spec return None -> AttributeError -> DISABLE_NVSHMEM.
HIDE='import sys; sys.modules["nvidia.nvshmem"] = None'
EXT='import sys; sys.path.insert(0, "."); sys.argv = ["setup.py", "build_ext", "--inplace"]; import setuptools
from torch.utils.cpp_extension import BuildExtension
import setup
setuptools.setup(name="deep_ep", ext_modules=[getattr(setup, "get_extension_" + sys.argv0_ext)()],
                 cmdclass={"build_ext": BuildExtension})'

has() { [[ "+$1+" == *"+$2+"* ]]; }        # has VARIANT WORD
dkey() { echo "dep-$(has "$1" nvshmem && echo nvshmem || echo no-nvshmem)-$(has "$1" syslink && echo syslink || echo optgcc)"; }
hkey() { echo "hyb-$(has "$1" commid && echo commid || echo asis)-$(has "$1" syslink && echo syslink || echo optgcc)"; }

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

build_part() {  # $1 = part key (dep-* | hyb-*); the part's tree in $ROOT/.parts/$1, its log build.log
  local D="$ROOT/.parts/$1" ext pre=""
  rm -rf "$D"; cp -a "$SRC" "$D"; rm -rf "$D/build" "$D"/*.so
  if [[ $1 == dep-* ]]; then ext=deep_ep_cpp; [[ $1 == *-no-nvshmem-* ]] && pre="$HIDE; "
  else ext=hybrid_ep_cpp; pre="$HIDE; "; [[ $1 == *-commid-* ]] && patch_commid "$D"; fi
  local tool=()
  [[ $1 == *-syslink ]] && tool=(env CC=gcc CXX=g++ LDSHARED="g++ -shared")
  (cd "$D" && date +%s >.t0 && "${tool[@]}" $PY -c "${pre}import sys; sys.argv0_ext = '$ext'; ${EXT}" >build.log 2>&1) \
    || { echo "### build of $1 failed:"; tail -30 "$D/build.log"; return 1; }
  if [[ $1 == *-no-nvshmem-* ]]; then grep -q -- "-DDISABLE_NVSHMEM" "$D/build.log" || { echo "$1: NVSHMEM was not disabled"; return 1; }; fi
  if [[ $1 == dep-nvshmem-* ]]; then grep -q -- "-DDISABLE_NVSHMEM" "$D/build.log" && { echo "$1: built without NVSHMEM"; return 1; }; fi
  return 0
}

for v in "${VARIANTS[@]}"; do
  for w in ${v//+/ }; do case "$w" in none|nvshmem|commid|syslink) ;; *) echo "unknown FIX word: $w (in $v)" >&2; exit 2 ;; esac; done
done
mkdir -p "$ROOT/.parts"
mapfile -t PARTS < <(for v in "${VARIANTS[@]}"; do dkey "$v"; hkey "$v"; done | sort -u)
t0=$(date +%s); pids=()
for k in "${PARTS[@]}"; do build_part "$k" & pids+=($!); done
fail=0; for p in "${pids[@]}"; do wait "$p" || fail=1; done     # never leave a build running behind us
[ "$fail" = 0 ] || exit 1
SECS=$(( $(date +%s) - t0 ))

COMMIT=${DEEPEP_COMMIT:-94a9f8f6b146c07d97ec58f67cd6d303296d6098}   # .ext/DeepEP is an export, no .git
[ -e "$SRC/.git" ] && COMMIT=$(git -C "$SRC" rev-parse HEAD)   # (git -C alone would find moebench's repo)
for v in "${VARIANTS[@]}"; do   # each variant: the source's Python files, its two extensions, provenance
  D="$ROOT/$v" DP="$ROOT/.parts/$(dkey "$v")" HP="$ROOT/.parts/$(hkey "$v")"
  rm -rf "$D"; mkdir -p "$D"; cp -a "$HP/deep_ep" "$SRC/setup.py" "$D/"   # the hybrid build put backend/ in
                                                                         # deep_ep/: HybridEP's JIT compiles from it
  cp -a "$DP"/deep_ep_cpp*.so "$HP"/hybrid_ep_cpp*.so "$D/"
  ok=$(cd /tmp && PYTHONPATH="$D" $PY -c "import torch, deep_ep_cpp, hybrid_ep_cpp, deep_ep; print('ok')" 2>&1 | tail -1 || true)
  so=$(ls "$D"/hybrid_ep_cpp*.so)
  if readelf -d "$so" | grep -q "NEEDED.*libstdc++"; then cxx="shared libstdc++.so.6 (NEEDED)"
  else cxx="static libstdc++ copy inside the module ($(nm -D --defined-only "$so" | grep -c _ZNSt6locale) std::locale symbols exported)"; fi
  V="$v" D="$D" DP="$DP" COMMIT="$COMMIT" OK="$ok" CXXRT="$cxx" SECS="$SECS" $PY - <<'EOF'
import importlib.metadata, json, os, re, subprocess, sys
import torch
sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
d, v = os.environ["D"], os.environ["V"]
words = set(v.split("+"))
ver = re.search(r"version='([^']+)'", open(os.path.join(d, "setup.py")).read())
nv = {"used": "nvshmem" in words}
if nv["used"]:
    import importlib.util
    spec = importlib.util.find_spec("nvidia.nvshmem")
    nv.update(version=importlib.metadata.version("nvidia-nvshmem-cu13"),
              path=list(spec.submodule_search_locations)[0] if spec else None,
              linked=sh(f"readelf -d {d}/deep_ep_cpp*.so | grep -o 'libnvshmem[^]]*'").split())
rec = {
    "commit": os.environ["COMMIT"], "branch": "hybrid-ep", "version": ver.group(1) if ver else None,
    "build_kind": "intranode, " + ("NVSHMEM (internode + low-latency kernels)" if nv["used"] else "no NVSHMEM")
                  + ", sm_90, setup.py build_ext --inplace", "fix": v, "nvshmem": nv,
    "flags": {k: os.environ.get(k) for k in ("TORCH_CUDA_ARCH_LIST", "CPATH", "MAX_JOBS",
              "DISABLE_AGGRESSIVE_PTX_INSTRS", "HYBRID_EP_MULTINODE", "USE_NIXL", "CUDA_HOME")},
    "nvcc": sh("nvcc --version | grep release"), "gcc": sh("gcc --version | head -1"),
    "python_cxx": sh(sys.executable + " -c \"import sysconfig; print(sysconfig.get_config_var('CXX'))\""),
    "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "import_check": os.environ["OK"], "hybrid_ep_cpp_libstdcxx": os.environ["CXXRT"],
    "linker": sh("grep -m1 -o '^[^ ]*g++ [^ ]*' " + os.path.join(os.environ["DP"], "build.log")),
    "all_builds_s": int(os.environ["SECS"]), "dir": d,
}
json.dump(rec, open(os.path.join(d, "deepep_build.json"), "w"), indent=1)
print(json.dumps(rec))
EOF
done
echo "# HybridEP JIT-compiles its kernels at run time with \$CUDA_HOME/bin/nvcc: keep CUDA_HOME=$CUDA_HOME set"
for v in "${VARIANTS[@]}"; do echo "PYTHONPATH=$ROOT/$v   # FIX=$v"; done
