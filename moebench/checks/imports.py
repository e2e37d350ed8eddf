"""Contained import probes for deep_ep / hybrid_ep_cpp and megatron.core, shared by the `env` row
and the EP checks: each import runs once per report in a child (child.py) with `--timeout`, so an
install that segfaults, aborts or hangs on import is found and named, and a package whose import
failed is never shown with a version.
"""
from __future__ import annotations

import importlib

from ..core.megatron_map import BACKENDS
from . import child
from .registry import Context


def deep_ep_probe() -> dict:
    """Child side: import deep_ep (and hybrid_ep_cpp) and say what they export."""
    try:
        import deep_ep
    except Exception as e:  # noqa: BLE001 - reported as the exact error
        return {"import_error": f"{type(e).__name__}: {e}"}
    out = {"file": getattr(deep_ep, "__file__", None), "version": getattr(deep_ep, "__version__", None),
           "Buffer": hasattr(deep_ep, "Buffer"), "HybridEPBuffer": hasattr(deep_ep, "HybridEPBuffer"),
           "ElasticBuffer": hasattr(deep_ep, "ElasticBuffer"), "megatron_api_error": None}
    try:
        from deep_ep.utils import EventHandle, EventOverlap  # noqa: F401 - Megatron's fused_a2a import
    except Exception as e:  # noqa: BLE001
        out["megatron_api_error"] = f"{type(e).__name__}: {e}"
    if out["HybridEPBuffer"]:
        try:
            import hybrid_ep_cpp
            out["hybrid_ep_cpp"] = getattr(hybrid_ep_cpp, "__file__", None)
        except Exception as e:  # noqa: BLE001
            out["hybrid_ep_cpp_error"] = f"{type(e).__name__}: {e}"
    return out


def megatron_probe() -> dict:
    """Child side: import megatron.core and read what its fused_a2a found, per flex backend."""
    try:
        import megatron.core as mc
        from megatron.core.transformer.moe import fused_a2a
    except Exception as e:  # noqa: BLE001
        return {"import_error": f"{type(e).__name__}: {e}"}
    out = {"version": getattr(mc, "__version__", None)}
    for b in BACKENDS.values():
        if not b.have_flag:
            continue
        out[b.have_flag] = getattr(fused_a2a, b.have_flag, None)
        try:
            for module, name in b.probe:       # the same imports fused_a2a tries
                getattr(importlib.import_module(module), name)
        except Exception as e:  # noqa: BLE001
            out[f"{b.name}_error"] = f"{type(e).__name__}: {e}"
    if out.get("HAVE_DEEP_EP"):
        from ..env.deepep import rdma_size_problem
        try:
            out["deepep_build_problem"] = rdma_size_problem()
        except Exception as e:  # noqa: BLE001 - reported, not raised
            out["deepep_build_problem"] = f"get_rdma_buffer_size_hint raised {type(e).__name__}: {e}"
    return out


def probe(ctx: Context, name: str) -> child.ChildResult:
    """The cached child result of `deep_ep_probe` or `megatron_probe`, run with --timeout."""
    return ctx.cached(name, lambda: child.run_function(f"moebench.checks.imports:{name}", {}, ctx.options.timeout))


def import_failure(r: child.ChildResult) -> str | None:
    """Why the probed import failed ('killed by SIGSEGV; ...', 'ImportError: ...'), else None."""
    if not r.ok:
        return r.failure()
    return r.value.get("import_error")


def shown_version(r: child.ChildResult, dist_version: str | None) -> str:
    """What the env row prints for a probed package: its version only when it imported."""
    bad = import_failure(r)
    if bad:
        return f"import failed ({bad.split(';')[0]})"
    return r.value.get("version") or dist_version or "?"
