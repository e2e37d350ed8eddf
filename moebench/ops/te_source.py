"""Transformer Engine's fused permute, the anchor moebench's permute is measured against (the path Megatron
users get with `--moe-permute-fusion`): TE's Triton mask-map kernels (`make_row_id_map`,
`permute_with_mask_map`, `unpermute_with_mask_map`) from an installed transformer_engine, else from TE's
sources where $MOEBENCH_TE_SOURCE names a TransformerEngine checkout: those kernels are pure Triton, so
they need no TE build (the H200 image has no TE).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

FILES = {"transformer_engine.common.triton.permutation": "transformer_engine/common/triton/permutation.py",
         "transformer_engine.pytorch.triton.permutation": "transformer_engine/pytorch/triton/permutation.py"}
_loaded: tuple | None = None


def load() -> tuple[types.ModuleType, str]:
    """(TE's pytorch-side Triton permutation module, where it came from); ImportError with what to do."""
    global _loaded
    if _loaded is None:
        try:
            import transformer_engine
            from transformer_engine.pytorch.triton import permutation
            _loaded = permutation, f"transformer_engine {getattr(transformer_engine, '__version__', '?')}"
        except ImportError:
            _loaded = _from_source(os.environ.get("MOEBENCH_TE_SOURCE"))
    return _loaded


def _from_source(root: str | None) -> tuple[types.ModuleType, str]:
    if not root:
        raise ImportError("transformer_engine is not installed; set MOEBENCH_TE_SOURCE to a TransformerEngine "
                          "checkout to time its Triton permute from source")
    paths = {name: Path(root) / rel for name, rel in FILES.items()}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise ImportError(f"MOEBENCH_TE_SOURCE={root} is no TransformerEngine checkout: {missing[0]} is missing")
    # The pytorch side imports the common side by its package name: stand-in packages for the load only,
    # removed after, so nothing else in this process takes them for an installed Transformer Engine.
    added = [n for n in ("transformer_engine", "transformer_engine.common", "transformer_engine.common.triton",
                         "transformer_engine.pytorch", "transformer_engine.pytorch.triton") if n not in sys.modules]
    for n in added:
        sys.modules[n] = types.ModuleType(n)
        sys.modules[n].__path__ = []
    try:
        for name, path in paths.items():
            spec = importlib.util.spec_from_file_location(name, path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        module = sys.modules[next(reversed(FILES))]
    finally:
        for n in [*added, *FILES]:
            sys.modules.pop(n, None)
    version = Path(root) / "build_tools" / "VERSION.txt"
    return module, f"TransformerEngine {version.read_text().strip() if version.is_file() else '?'} from source"
