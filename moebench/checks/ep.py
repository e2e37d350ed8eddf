"""DeepEP / HybridEP / Megatron acceptance: import, build kind, NVLink-domain fit, round trip.

Every import of deep_ep, hybrid_ep_cpp and megatron.core happens in a child process (child.py): an
install that segfaults or aborts on import is a FAIL row with the signal, and the import is tried
even on a machine without GPUs. The round trips run `moebench.harness.runner.run_case` (the same path as
`python -m moebench.dispatch`) in a child, so a build that segfaults, aborts or hangs when its buffer
is constructed is a FAIL row with the signal. With fewer GPUs than ranks they run as shared-GPU
ranks (2 ranks on GPU 0), and with no GPU the construction is still tried on CPU ranks: a crash is
FAIL, a clean "needs CUDA" error is WAIVED.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..core.megatron_map import BACKENDS
from ..env import buildkind
from ..env.deepep import HINT as DEEPEP_HINT
from ..env.deepep import build_info
from ..env.toolkit import find_nvcc, installed
from . import child, imports
from .baseline import rows_from_records
from .comm import gpu_count
from .registry import FAIL, WAIVED, Context, failed, passed, register, waived
from .system import nvlink_domain

DEEPEP_RANKS = (2, 4, 8)
DOMAIN_ENV = BACKENDS["hybridep"].domain_env
FLEX_CHECKED = [b for b in BACKENDS.values() if b.have_flag]   # flex backends whose import fused_a2a reports


def _probe(ctx: Context):
    return imports.probe(ctx, "deep_ep_probe")


def _deepep_unusable(ctx: Context):
    """WAIVED when deep_ep is not installed, FAIL when importing it crashed or raised, else None."""
    if not installed("deep_ep"):
        return waived(f"deep_ep not installed; {DEEPEP_HINT}")
    return _import_failure(ctx)


def _import_failure(ctx: Context):
    """A FAIL outcome when importing deep_ep crashed or raised, else None."""
    r = _probe(ctx)
    if not r.ok:
        return failed(f"import deep_ep {r.failure()}", stderr=r.stderr_tail())
    if r.value.get("import_error"):
        return failed(f"import deep_ep raised {r.value['import_error']}")
    return None


@register("deepep.import", "deep_ep imports (in a child) and exports the legacy Buffer and EventOverlap Megatron uses")
def check_deepep_import(ctx: Context):
    bad = _deepep_unusable(ctx)
    if bad:
        return bad
    v = _probe(ctx).value
    ver = v.get("version") or (build_info() or {}).get("summary") or "?"      # deep_ep has no __version__
    if not v["Buffer"]:
        return failed(f"deep_ep {ver} imports but has no legacy deep_ep.Buffer (DeepEP main 2.x still has it): the "
                      f"deepep backend and Megatron's flex dispatcher cannot use it; {DEEPEP_HINT}", probe=v)
    if v["megatron_api_error"]:
        return failed(f"`from deep_ep.utils import EventHandle, EventOverlap` fails ({v['megatron_api_error']}): "
                      f"Megatron-Core silently reports DeepEP as not installed (moebench's deepep and deepep-ll "
                      f"can still use its deep_ep.Buffer); {DEEPEP_HINT}", probe=v)
    return passed(f"deep_ep {ver} imports from {v['file']}; legacy Buffer yes, HybridEPBuffer "
                  f"{'yes' if v['HybridEPBuffer'] else 'no'}", probe=v, files=buildkind.deep_ep_layout())


def roundtrip_child(argv: list[str]) -> list[dict]:
    """Child side: the dispatch + combine check against the oracle, then a short timing, via run_case
    (argv: a RunSpec's to_argv(), so the records' repro command is that exact run)."""
    from ..harness.runner import run_case
    from ..harness.spec import RunSpec
    run = RunSpec.from_argv(argv).replace(measure_ceiling=False).check()
    return run_case(run, progress=lambda *_: None)


def roundtrip_spec(backend: str, where, num_tokens: int, o, knobs: dict):
    """The run one round trip makes (`where`: placement.for_roundtrip), short timing, the check's shape."""
    from ..core.workload import Workload
    from ..harness.spec import RunSpec
    w = Workload(num_tokens=num_tokens, hidden=o.hidden, num_experts=o.num_experts, topk=o.topk, ep=where.ranks,
                 gpus_per_node=where.ranks)
    return RunSpec(workload=w, backends=(backend,), explicit=True, device=where.device, iters=o.iters, warmup_ms=100.0,
                   timeout_s=o.timeout, knobs={"ops_impl": "auto", **knobs}, out=os.devnull,
                   ranks_per_gpu=where.ranks_per_gpu, soak=getattr(o, "soak", 0))


def roundtrip(ctx: Context, backend: str, variants: list[dict], num_tokens: int | None = None, sizes=None):
    """The backend's round trip once per knob variant (placement.for_roundtrip says where); one outcome.
    A rank that crashes or hangs is FAIL with the signal and the line that says why."""
    from ..harness.placement import for_roundtrip
    o = ctx.options
    at = for_roundtrip(gpu_count(), sizes)
    device = at.device
    where = f"EP {at.ranks}" + (f" ({at.note})" if at.note else "")
    recs = []
    for knobs in variants:
        run = roundtrip_spec(backend, at, num_tokens or o.num_tokens, o, knobs)
        r = child.run_function("moebench.checks.ep:roundtrip_child", {"argv": run.to_argv()}, o.timeout + 60,
                               env={"PYTHONFAULTHANDLER": "1"})
        label = f"{backend} {knobs or ''} {where}".replace("  ", " ")
        if not r.ok:
            return failed(f"{label}: round trip {r.failure()}", stderr=r.stderr_tail())
        bad = [rec for rec in r.value if rec["check"]["status"] == FAIL]
        if bad:
            err = bad[0]["check"].get("error") or "FAIL"
            if device == "cpu" and not bad[0]["check"].get("crash"):
                return waived(f"{label}: no GPU visible, so no round trip; the buffer construction ran and "
                              f"raised (no crash): {err}", errors=[err])
            crash = bad[0]["check"].get("crash")
            if crash:   # the first rank's death, then the line that says why (all ranks are in `errors`)
                hint = child.error_line(r.stderr)
                err = err.split("; ")[0] + (f"; {hint}" if hint else "")
            return failed(f"{label}: {err}", errors=[bad[0]["check"].get("error")], stderr=r.stderr_tail())
        recs += r.value
    return judge_roundtrip(recs, backend, where)


def judge_roundtrip(recs: list[dict], backend: str, where: str):
    status = {rec["check"]["status"] for rec in recs}
    errors = sorted({rec["check"]["error"] for rec in recs if rec["check"].get("error")})
    if status == {WAIVED}:
        return waived(f"{backend}: {errors[0] if errors else 'WAIVED'}", errors=errors)
    rows = rows_from_records(recs)
    figures = ", ".join(f"{r_['backend']} {r_['phase']} {r_['GBps']:.3g}" for r_ in rows)
    soaks = [rec["soak"] for rec in recs if rec.get("soak")]
    soaked = "".join(f"; soak {s['summary']}" + (f", graph {s['graph']['replays']} replays right"
                                                  if (s.get("graph") or {}).get("replays") else "") for s in soaks)
    return passed(f"{where}, T {recs[0]['workload']['num_tokens']}: oracle PASS; algbw GB/s: {figures}{soaked}"
                  + (" (functional only)" if any(r_.get("functional") for r_ in recs) else ""),
                  rows=rows, records=[{k: rec.get(k) for k in ("backend", "phase", "timing", "traffic", "check",
                                                               "functional", "shared_gpu", "soak")} for rec in recs])


@register("deepep.roundtrip", "deepep (legacy Buffer, normal mode) dispatch + combine against the oracle: "
          "one rank per GPU on 2/4/8 GPUs, else 2 ranks sharing one GPU")
def check_deepep_roundtrip(ctx: Context):
    if not installed("deep_ep"):
        return waived(f"deep_ep not installed; {DEEPEP_HINT}")
    return _import_failure(ctx) or roundtrip(ctx, "deepep", [{}], sizes=DEEPEP_RANKS)


@register("deepep.ll-roundtrip", "deepep-ll (low-latency mode, NVSHMEM) dispatch + combine against the oracle: "
          "one rank per GPU on 2+ GPUs, else 2 ranks sharing one GPU")
def check_deepep_ll_roundtrip(ctx: Context):
    if not installed("deep_ep"):
        return waived(f"deep_ep not installed; {DEEPEP_HINT}")
    build = build_info() or {}
    if build.get("nvshmem") is False:
        return waived(f"this DeepEP build has no NVSHMEM ({build.get('summary')}: deep_ep_cpp links no libnvshmem_host "
                      "and carries DeepEP's 'NVSHMEM is disabled' assertion), and low-latency mode needs it; rebuild "
                      "with NVSHMEM (bench/deepep_build.sh FIX=nvshmem uses the nvidia-nvshmem wheel)", build=build)
    return _import_failure(ctx) or roundtrip(ctx, "deepep-ll", [{}], num_tokens=ctx.options.ll_num_tokens)


def _hybridep_missing(ctx: Context):
    """WAIVED/FAIL outcome when HybridEP is not there or does not import; None when it does."""
    bad = _deepep_unusable(ctx)
    if bad:
        return bad
    v = _probe(ctx).value
    if not v["HybridEPBuffer"]:
        return waived(f"deep_ep {v.get('version') or '?'} has no HybridEPBuffer (not built from branch hybrid-ep)")
    if v.get("hybrid_ep_cpp_error"):
        return failed(f"import hybrid_ep_cpp raised {v['hybrid_ep_cpp_error']}", probe=v)
    return None


@register("hybridep.import", "deep_ep.HybridEPBuffer imports (in a child); $CUDA_HOME/bin/nvcc exists for its JIT")
def check_hybridep_import(ctx: Context):
    bad = _hybridep_missing(ctx)
    if bad:
        return bad
    home = os.environ.get("CUDA_HOME")
    if not home or not (Path(home) / "bin" / "nvcc").exists():
        found = find_nvcc()
        hint = f"export CUDA_HOME={Path(found).parent.parent}" if found else "install the CUDA toolkit (nvcc)"
        return failed(f"HybridEP JIT-compiles its kernels with $CUDA_HOME/bin/nvcc at first use, but CUDA_HOME is "
                      f"{'unset' if not home else repr(home) + ' without bin/nvcc'}; {hint}")
    return passed(f"HybridEPBuffer imports ({_probe(ctx).value.get('hybrid_ep_cpp')}); JIT nvcc {home}/bin/nvcc")


def _build(ctx: Context):
    so = buildkind.extension_path("hybrid_ep_cpp")
    return buildkind.hybridep_build_kind(so) if so else None


@register("hybridep.build", "HybridEP build kind: intra-node-only or multinode (extension strings and linked libraries)")
def check_hybridep_build(ctx: Context):
    if not installed("hybrid_ep_cpp"):
        return waived("hybrid_ep_cpp extension not installed (deep_ep not built from branch hybrid-ep)")
    b = _build(ctx)
    if b.kind == "unknown":
        return waived(f"cannot tell the HybridEP build kind: {b.evidence}", build=b.asdict())
    how = f" via {b.transport}" if b.transport else ""
    return passed(f"HybridEP {b.kind}{how}: {b.evidence}", build=b.asdict())


def judge_domain(env_value: str | None, domain: int, ep: int, tp: int, build: str | None) -> tuple[list[str], list[str]]:
    """(problems, notes) for HybridEP's NVLink-domain setting and the EP x TP span."""
    problems, notes = [], []
    if env_value is not None:
        if not env_value.strip().isdigit() or int(env_value) < 1:
            return [f"{DOMAIN_ENV}={env_value!r} is not a positive integer"], notes
        n = int(env_value)
        if n > domain:
            problems.append(f"{DOMAIN_ENV}={n} > detected NVLink domain of {domain} GPU(s): HybridEP would use "
                            "CUDA IPC between GPUs that share no NVLink")
        elif ep % n:
            problems.append(f"{DOMAIN_ENV}={n} does not divide EP {ep}")
        elif n < domain:
            notes.append(f"{DOMAIN_ENV}={n} < detected domain {domain}: more traffic goes over the network")
    span = ep * tp
    if span > domain:
        if build == "intranode":
            problems.append(f"EP x TP = {ep} x {tp} = {span} leaves the NVLink domain of {domain} GPU(s), and this "
                            "HybridEP build is intra-node-only: it aborts across nodes (rebuild with HYBRID_EP_MULTINODE=1)")
        else:
            notes.append(f"EP x TP = {span} spans {-(-span // domain)} NVLink domains: inter-domain traffic uses the NICs")
    return problems, notes


@register("hybridep.domain", f"{DOMAIN_ENV} against the detected NVLink domain; whether EP x TP leaves it")
def check_hybridep_domain(ctx: Context):
    if not installed("hybrid_ep_cpp"):
        return waived("hybrid_ep_cpp extension not installed (deep_ep not built from branch hybrid-ep)")
    domain, how = nvlink_domain()
    if domain is None:
        return waived(f"cannot detect the NVLink domain: {how}")
    o = ctx.options
    ep = o.ep or max(1, gpu_count())
    b = _build(ctx)
    problems, notes = judge_domain(os.environ.get(DOMAIN_ENV), domain, ep, o.tp, b.kind if b else None)
    d = {"domain_size": domain, "domain_source": how, "ep": ep, "tp": o.tp, "env": os.environ.get(DOMAIN_ENV),
         "build": b.kind if b else None}
    if problems:
        return failed("; ".join(problems), notes=notes, **d)
    return passed(f"NVLink domain {domain} ({how}); EP {ep} x TP {o.tp} fits" if ep * o.tp <= domain
                  else "; ".join(notes), notes=notes, **d)


@register("hybridep.roundtrip", "hybridep dispatch + combine (with-permute and plain) against the oracle: "
          "one rank per GPU on 2+ GPUs, else 2 ranks sharing one GPU")
def check_hybridep_roundtrip(ctx: Context):
    bad = _hybridep_missing(ctx)
    if bad:
        return bad
    return roundtrip(ctx, "hybridep", [{"mode": "permute"}, {"mode": "plain"}])


def judge_megatron(v: dict, present: set[str]) -> list[str]:
    """Problems: a flex backend whose package is installed (`present`: names) but that Megatron's
    fused_a2a did not import, so its flex path would fall back silently; a DeepEP build that
    Megatron imports but cannot size a buffer with."""
    out = [f"{b.package} is installed but Megatron's fused_a2a has {b.have_flag}={v.get(b.have_flag)} "
           f"({v.get(f'{b.name}_error', 'import succeeded here')}): flex/{b.name} would fall back silently"
           for b in FLEX_CHECKED if b.name in present and not v.get(b.have_flag)]
    if v.get("deepep_build_problem"):
        out.append(v["deepep_build_problem"])
    return out


@register("megatron", "megatron-core imports and its fused_a2a really sees DeepEP/HybridEP (no silent fallback)")
def check_megatron(ctx: Context):
    if not installed("megatron"):
        return waived("megatron-core not installed")
    r = imports.probe(ctx, "megatron_probe")
    if not r.ok:
        return failed(f"import megatron.core {r.failure()}", stderr=r.stderr_tail())
    v = r.value
    if v.get("import_error"):
        return failed(f"import megatron.core / fused_a2a raised {v['import_error']}")
    present = {b.name for b in FLEX_CHECKED if installed(b.package)}
    problems = judge_megatron(v, present)
    if problems:
        return failed("; ".join(problems), probe=v)
    if not present:
        return waived(f"megatron-core {v['version']} imports; none of {', '.join(b.package for b in FLEX_CHECKED)} "
                      "is installed, so there is nothing for its flex dispatcher to see", probe=v)
    seen = [b.name for b in FLEX_CHECKED if v.get(b.have_flag)]
    return passed(f"megatron-core {v['version']}: fused_a2a sees {', '.join(seen)}", probe=v)
