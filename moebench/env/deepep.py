"""The DeepEP build installed here, read from its files and package metadata without importing it
(a crashing build is imported only in contained child processes): the install hint, the message a
build without NVSHMEM gives, and what identifies the build in every record and check report
(build_info: version, source commit, extensions, NVSHMEM and its version, HybridEP's build kind,
how hybrid_ep_cpp links libstdc++).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
from pathlib import Path

from .buildkind import ELFError, contains, elf_needed, elf_runpath, extension_path, hybridep_build_kind
from .toolkit import dist_version

HINT = ("install DeepEP from branch hybrid-ep (legacy Buffer + HybridEPBuffer) or tag v1.2.1; DeepEP main "
        "(2.x) also serves deepep and deepep-ll (its deep_ep.Buffer is the legacy API, same signature) but has "
        "no HybridEPBuffer, and its deep_ep.utils lacks the EventOverlap that Megatron-Core's fused_a2a imports, "
        "so Megatron's flex/deepep path (mcore-deepep) finds no DeepEP there")
NO_NVSHMEM = "NVSHMEM is disable"   # DeepEP says "disabled" in deep_ep.cpp, "disable" in config.hpp
NVSHMEM_DISTS = ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12")
STATIC_LIBSTDCXX = ("static: the module carries its own copy of libstdc++, and HybridEPBuffer dies with SIGSEGV in "
                    "get_comm_id next to torch's shared one (rebuild with the system g++, bench/deepep_build.sh "
                    "FIX=syslink)")


def _beside(root: Path) -> dict:
    """bench/deepep_build.sh's deepep_build.json beside the package of a source build, else {}."""
    try:
        return json.loads((root / "deepep_build.json").read_text())
    except (OSError, ValueError):
        return {}


def _setup_version(root: Path) -> str | None:
    """The version of a source tree beside the package (setup.py build_ext --inplace): setup.py's literal, or
    deep_ep/__init__.py's __version__ (DeepEP main reads it from there)."""
    for f, pattern in (("setup.py", r"version=['\"]([^'\"]+)['\"]"),
                       ("deep_ep/__init__.py", r"^__version__\s*=\s*['\"]([^'\"]+)['\"]")):
        try:
            text = (root / f).read_text()
        except OSError:
            continue
        m = re.search(pattern, text, re.MULTILINE) if "deep_ep" in text or f != "setup.py" else None
        if m:
            return m.group(1)
    return None


def _git_head(root: Path) -> str | None:
    """The commit of a DeepEP source checkout the package sits in (its own .git, never moebench's)."""
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha if len(sha) == 40 else None


@functools.lru_cache(maxsize=1)
def build_info() -> dict | None:
    """What identifies the installed DeepEP build, read from its files; None when deep_ep is not installed.
    {version, commit, package, extensions: {module: path | None}, nvshmem (True / False / None: cannot
    tell), nvshmem_version, hybridep_build (intranode | multinode | unknown), hybridep_libstdcxx, summary}."""
    try:
        spec = importlib.util.find_spec("deep_ep")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return None
    pkg = Path(spec.origin).parent
    meta, dist = _beside(pkg.parent), dist_version("deep_ep", "deep-ep")
    info = {"version": dist or meta.get("version") or _setup_version(pkg.parent) or "unknown",
            "commit": (dist.split("+", 1)[1] if dist and "+" in dist else None) or meta.get("commit")
            or _git_head(pkg.parent), "package": str(pkg),
            "extensions": {m: extension_path(m) for m in ("deep_ep_cpp", "hybrid_ep_cpp")},
            "nvshmem": None, "nvshmem_version": None, "hybridep_build": None, "hybridep_libstdcxx": None}
    if meta.get("fix") or meta.get("nccl_root"):
        info["build_script"] = {k: meta.get(k) for k in ("fix", "build_kind", "nvshmem", "branch", "nccl_root")
                                if meta.get(k) is not None}
    if (pkg / "buffers" / "elastic.py").exists():
        _v2(info, pkg, meta)
    try:
        so = info["extensions"]["deep_ep_cpp"]
        if so:
            linked = any(n.startswith("libnvshmem") for n in elf_needed(so))
            info["nvshmem"] = linked or (False if contains(so, (NO_NVSHMEM.encode(),)) else None)
            info["nvshmem_version"] = dist_version(*NVSHMEM_DISTS) if linked else None
        hy = info["extensions"]["hybrid_ep_cpp"]
        if hy:
            info["hybridep_build"] = hybridep_build_kind(hy).kind
            shared = any(n.startswith("libstdc++") for n in elf_needed(hy))
            info["hybridep_libstdcxx"] = "shared libstdc++.so.6" if shared else STATIC_LIBSTDCXX
    except (OSError, ELFError) as e:
        info["unreadable"] = f"{type(e).__name__}: {e}"
    info["summary"] = summary(info)
    return info


def _v2(info: dict, pkg: Path, meta: dict) -> None:
    """DeepEP V2 (main, ElasticBuffer): one extension deep_ep/_C*.so (legacy Buffer inside it), built against an
    NCCL >= 2.30 whose root it keeps in its RUNPATH (the build's EP_NCCL_ROOT_DIR) unless deepep_build.json names
    it; at run time DeepEP checks the mapped libnccl against EP_NCCL_ROOT_DIR."""
    so = next(iter(sorted(pkg.glob("_C*.so"))), None)
    info["line"] = "v2 (ElasticBuffer)"
    info["extensions"]["deep_ep._C"] = str(so) if so else None
    root = meta.get("nccl_root")
    if root is None and so is not None:
        try:
            root = next((str(Path(d).parent) for d in elf_runpath(so) if "nccl" in d), None)
        except (OSError, ELFError):
            root = None
    info["nccl_root"] = root


def summary(info: dict) -> str:
    """One line: '1.2.1 @94a9f8f6b1, NVSHMEM 3.4.5, HybridEP intranode, hybrid_ep_cpp libstdc++ shared', or for V2
    '2.1.0 @dd758ca, V2 (ElasticBuffer), NCCL root /tmp/nccl-build'."""
    parts = [info["version"] + (f" @{info['commit'][:10]}" if info.get("commit") else "")]
    if info.get("line"):
        return ", ".join([*parts, "V2 (ElasticBuffer)", f"NCCL root {info.get('nccl_root') or 'unknown'}"]
                         + ([] if info["extensions"].get("deep_ep._C") else ["no deep_ep._C"]))
    nv = info.get("nvshmem")
    parts.append(f"NVSHMEM {info.get('nvshmem_version') or 'yes'}" if nv else "no NVSHMEM" if nv is False
                 else "NVSHMEM unknown")
    if not info["extensions"].get("deep_ep_cpp"):
        parts.append("no deep_ep_cpp")
    if info["extensions"].get("hybrid_ep_cpp"):
        parts.append(f"HybridEP {info.get('hybridep_build')}")
        parts.append("hybrid_ep_cpp libstdc++ " + ("shared" if str(info.get("hybridep_libstdcxx")).startswith("shared")
                                                   else "static"))
    else:
        parts.append("no HybridEP")
    return ", ".join(parts)


def build_version() -> str:
    """deep_ep's build for the record (build_info's summary), '' when deep_ep is not installed."""
    info = build_info()
    return info["summary"] if info else ""


def rdma_size_problem(ranks: int = 2, hidden_bytes: int = 2 * 1024) -> str | None:
    """Why Megatron's fused_a2a cannot size its DeepEP buffer with this build, else None.
    fused_a2a.get_buffer asks get_rdma_buffer_size_hint even within one node, and a DeepEP built
    without NVSHMEM asserts there (csrc/config.hpp), so Megatron's flex/deepep path dies on its
    first dispatch. Host-only: needs no GPU."""
    from deep_ep import Buffer
    try:
        Buffer.get_dispatch_config(ranks).get_rdma_buffer_size_hint(hidden_bytes, ranks)
    except RuntimeError as e:
        if NO_NVSHMEM in str(e):
            return ("this DeepEP was built without NVSHMEM, and megatron-core's fused_a2a asks it for an RDMA "
                    "buffer size (get_rdma_buffer_size_hint) even within a node, which it refuses: Megatron's "
                    "flex/deepep path fails on its first dispatch; rebuild DeepEP with NVSHMEM")
        raise
    return None
