"""How DeepEP / HybridEP were built, read from the installed files without importing them.

HybridEP has no Python flag for its build kind. An intra-node-only build of `hybrid_ep_cpp*.so`
carries the messages of its `#else` branches ("Please rebuild with HYBRID_EP_MULTINODE flag",
"Multi-node support is not enabled in this build") and links no RDMA library; a multi-node build
NEEDs libibverbs/libmlx5 (DOCA) or libnixl (NIXL). The DT_NEEDED list is read by a small ELF
reader below (no readelf/pyelftools: the GPU machines may lack binutils).
"""
from __future__ import annotations

import importlib.util
import mmap
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

INTRANODE_MARKERS = (b"Please rebuild with HYBRID_EP_MULTINODE", b"Multi-node support is not enabled in this build")
MULTINODE_LIBS = {"libibverbs": "DOCA/ibverbs", "libmlx5": "DOCA/mlx5", "libnixl": "NIXL"}
PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 1, 5, 15, 29


class ELFError(ValueError):
    pass


def _header(data: bytes):
    if data[:4] != b"\x7fELF":
        raise ELFError("not an ELF file")
    bits = {1: 32, 2: 64}.get(data[4])
    end = {1: "<", 2: ">"}.get(data[5])
    if bits is None or end is None:
        raise ELFError("unknown ELF class or byte order")
    if bits == 64:
        phoff, = struct.unpack_from(end + "Q", data, 0x20)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36)
    else:
        phoff, = struct.unpack_from(end + "I", data, 0x1C)
        phentsize, phnum = struct.unpack_from(end + "HH", data, 0x2A)
    return bits, end, phoff, phentsize, phnum


def _segments(data: bytes):
    """[(p_type, p_offset, p_vaddr, p_filesz)] from the program headers."""
    bits, end, phoff, phentsize, phnum = _header(data)
    segs = []
    for i in range(phnum):
        o = phoff + i * phentsize
        if bits == 64:
            p_type, _flags, off, vaddr, _paddr, filesz = struct.unpack_from(end + "IIQQQQ", data, o)
        else:
            p_type, off, vaddr, _paddr, filesz = struct.unpack_from(end + "IIIII", data, o)
        segs.append((p_type, off, vaddr, filesz))
    return bits, end, segs


def _vaddr_to_offset(segs, vaddr: int) -> int:
    for p_type, off, va, size in segs:
        if p_type == PT_LOAD and va <= vaddr < va + size:
            return off + (vaddr - va)
    raise ELFError(f"address {vaddr:#x} is in no PT_LOAD segment")


def elf_needed(path: str | Path) -> list[str]:
    """The DT_NEEDED entries (shared libraries a binary links) of an ELF file, in order."""
    return _dynamic_strings(path, (DT_NEEDED,))


def elf_runpath(path: str | Path) -> list[str]:
    """The directories of an ELF file's DT_RUNPATH / DT_RPATH (where it looks for what it links), in order."""
    return [d for entry in _dynamic_strings(path, (DT_RUNPATH, DT_RPATH)) for d in entry.split(":") if d]


def _dynamic_strings(path: str | Path, tags: tuple[int, ...]) -> list[str]:
    """The string values of the dynamic entries with these tags, in order."""
    data = Path(path).read_bytes()
    bits, end, segs = _segments(data)
    dyn = next(((off, size) for t, off, _va, size in segs if t == PT_DYNAMIC), None)
    if dyn is None:
        return []                              # static binary or object: links nothing
    fmt = end + ("qQ" if bits == 64 else "iI")
    step = struct.calcsize(fmt)
    offs, strtab = [], None
    for o in range(dyn[0], dyn[0] + dyn[1], step):
        tag, val = struct.unpack_from(fmt, data, o)
        if tag == DT_NULL:
            break
        if tag in tags:
            offs.append(val)
        elif tag == DT_STRTAB:
            strtab = val
    if offs and strtab is None:
        raise ELFError("dynamic string entries without DT_STRTAB")
    base = _vaddr_to_offset(segs, strtab) if offs else 0
    return [data[base + n: data.index(b"\0", base + n)].decode(errors="replace") for n in offs]


def contains(path: str | Path, needles: tuple[bytes, ...]) -> list[bytes]:
    """Which of `needles` occur in the file's bytes (mmap: extensions are tens of MB)."""
    with open(path, "rb") as f:
        if Path(path).stat().st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return [n for n in needles if m.find(n) >= 0]


@dataclass
class BuildKind:
    kind: str                      # intranode | multinode | unknown
    path: str
    evidence: str
    needed: list[str] = field(default_factory=list)
    transport: str | None = None   # DOCA/ibverbs, DOCA/mlx5, NIXL for multinode builds

    def asdict(self) -> dict:
        return asdict(self)


def hybridep_build_kind(so_path: str | Path) -> BuildKind:
    """Classify a hybrid_ep_cpp extension as an intra-node-only or a multi-node build."""
    needed = elf_needed(so_path)
    rdma = [(n, t) for n in needed for lib, t in MULTINODE_LIBS.items() if n.startswith(lib)]
    markers = contains(so_path, INTRANODE_MARKERS)
    if markers and not rdma:
        return BuildKind("intranode", str(so_path), f"contains {markers[0].decode()!r}, links no RDMA library", needed)
    if rdma and not markers:
        libs = ", ".join(n for n, _ in rdma)
        return BuildKind("multinode", str(so_path), f"links {libs}", needed, rdma[0][1])
    if rdma and markers:
        return BuildKind("unknown", str(so_path), "conflicting: links RDMA libraries but carries the "
                         "intra-node-only message", needed)
    return BuildKind("unknown", str(so_path), "neither the intra-node-only message nor an RDMA library", needed)


def extension_path(module: str) -> str | None:
    """File of an installed top-level extension module, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None


def deep_ep_layout() -> dict:
    """Which DeepEP line is installed, from its files: legacy V1, hybrid-ep branch, or V2."""
    try:
        spec = importlib.util.find_spec("deep_ep")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {"installed": False}
    root = Path(list(spec.submodule_search_locations)[0])
    has = {"legacy_buffer": (root / "buffer.py").exists() or (root / "buffers" / "legacy.py").exists(),
           "hybrid_ep": (root / "hybrid_ep_buffer.py").exists(),
           "elastic_v2": (root / "buffers" / "elastic.py").exists()}
    line = "v2 (ElasticBuffer)" if has["elastic_v2"] else "hybrid-ep branch" if has["hybrid_ep"] else "v1 (legacy Buffer)"
    out = {"installed": True, "path": str(root), "line": line, **has}
    so = extension_path("hybrid_ep_cpp")
    if so:
        try:
            out["hybridep_build"] = hybridep_build_kind(so).kind
        except (OSError, ELFError) as e:
            out["hybridep_build"] = f"unreadable ({e})"
    return out
