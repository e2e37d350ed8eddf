"""ncclep and deepep-v2 against the oracle on CPU/gloo ranks: ncclep through the REAL `nccl.ep` facade of the
nccl-extensions wheel over a fake native layer (tests/fakes/nccl_ep_native: the Cython bindings' functions
replaced in each rank), deepep-v2 over its stand-in (tests/fakes/deep_ep_v2). Both modes, bf16 and fp8, the cached
view's calls, teardown, the group ncclep configures, the byte rules, the NCCL gate and the last lines of a failed
kernel compile (wrong arguments to the facade: test_nccl_ep_facade.py). Without the wheel (README's test line
installs it) the ncclep cases are left out."""
import contextlib

import pytest

from conftest import FAKES, TorchOps
from moebench import ops
from moebench.backends import Unavailable, get
from moebench.backends.nccl_family import NativeFailure
from moebench.core import reference, traffic, workload
from moebench.core.workload import Workload
from moebench.env.toolkit import installed
from moebench.harness.launch import run_ranks
from moebench.harness.oracle import check, combine_error, dispatch_error, expert_outputs, grouped

NCCL_2307 = {"path": "/opt/nccl/lib/libnccl.so.2", "version": "2.30.7"}
HAVE_NCCL_EP = installed("nccl.ep")         # without it the ncclep cases are left out (test_nccl_ep_facade.py skips)


@pytest.fixture
def fakes(monkeypatch):
    """The stand-ins on the ranks' path (they take their launch's sys.path and environment)."""
    monkeypatch.syspath_prepend(str(FAKES))                  # the fake native layer (and DeepEP V1's, hidden by:)
    monkeypatch.syspath_prepend(str(FAKES / "deep_ep_v2"))
    for var in ("FAKE_NCCL_EP_JIT_FAIL", "FAKE_DEEP_EP_V2_JIT_FAIL", "FAKE_DEEP_EP_V2_NCCL", "NCCL_MULTI_RANK_GPU_ENABLE"):
        monkeypatch.delenv(var, raising=False)


def with_nccl(found: dict):
    """This rank 'loaded' `found` (CPU torch maps no libnccl): what env/nccl.py would read."""
    from moebench.env import nccl
    nccl.loaded = lambda: dict(found)


def native_layer(cases):
    """The fake native layer under the real nccl.ep in this rank, when a case needs it: its call record."""
    if not any(name == "ncclep" for _, name, _ in cases):
        return None
    import nccl_ep_native
    from nccl_ep_native import registry
    nccl_ep_native.install()
    return registry


def recorder(b, name: str) -> TorchOps:
    """What the timed calls run through torch, the library's calls and moebench's own ops each one op."""
    rec = TorchOps().opaque(ops, "permute", "unpermute", "sort_chunks_by_idxs", label="moebench.")
    if name == "ncclep":
        from nccl._extensions.bindings import nccl_ep
        return rec.opaque(nccl_ep, "dispatch", "combine", "update_handle", "create_handle", label="nccl_ep.")
    return rec.opaque(b.buffer, "dispatch", "combine", label="deep_ep.")


def timed_calls(b, name, native, payload, idx, wt, s, d, y):
    """The api and cached calls (as the views time them) after the check: {call: (torch glue, host reads)}."""
    rec, out = recorder(b, name), {}
    calls = {"api dispatch": lambda: b.dispatch(payload, idx, wt, s), "api combine": lambda: b.combine(y, d.handle)}
    calls.update({f"cached {p}": fn for p, fn in b.cached_phases(payload, idx, wt, s, d, y).items()})
    for call, fn in calls.items():
        reads = [0]
        with native.host_reads() if native is not None else contextlib.nullcontext([0]) as reads:
            _, seen = rec.run(fn)
        out[call] = (TorchOps.glue(seen), reads[0])
    return out


def chained_pair(b, w, ctx, payload, idx, wt, s, d, y) -> str:
    """The chained view's pair (chained_plan) run twice as the view runs it, the last through the oracle: '' when
    right, `none: why` where the backend has none, else what was wrong."""
    plan = b.chained_plan(payload, idx, wt, s, d, y)
    if isinstance(plan, str):
        return f"none: {plan}"
    for _ in range(2):
        dg = plan.dispatch()
        if plan.between:
            plan.between(dg)
        out = plan.combine(dg)
    return dispatch_error(dg, w, ctx.rank, ctx.device) or combine_error(out, payload, idx, wt, w, s)


def round_trips(ctx, cases, found=NCCL_2307):
    with_nccl(found)
    native = native_layer(cases)
    out = []
    for w, name, knobs in cases:
        b = get(name)(knob_values={"ops_impl": "torch", **knobs}, ranks_per_gpu=2)
        b.validate(w, ctx.world)
        try:
            b.setup(ctx.group, w, ctx.device)
        except Unavailable as e:
            out.append({"waived": str(e)})
            continue
        x, idx, wt, q, s = workload.rank_inputs(w, ctx.rank)
        payload = q if q is not None else x
        err, d, y = check(b, w, ctx.rank, payload, idx, wt, s, ctx.device)
        views = b.cached_phases(payload, idx, wt, s, d, y)
        calls = native.CALLS if name == "ncclep" else b.buffer.calls
        before = len(calls)
        reads = [0]
        if views and name == "ncclep":
            with native.host_reads() as reads:
                again = views["dispatch"]()
        else:
            again = views["dispatch"]() if views else d
        again_error = dispatch_error(again, w, ctx.rank, ctx.device)    # the same rows (a multiset: arrival order)
        if views:       # as a step runs: the experts on this dispatch's rows (where its buffer is combine's, they
            expert_outputs(b, again, ctx.rank, w)       # must: a row's place may follow arrival order), then combine
        comb = views["combine"]() if views else None
        r = {"check": err, "rows_equal": again_error == "",
             "combine": reference.check_combine(comb, reference.expected_combine(payload, idx, wt, w, s))
             if comb is not None else "", "cached_calls": calls[before:], "cached_host_reads": reads[0],
             "views": sorted(views), "native": b.native_bytes(d), "knobs": b.knobs(), "bypassed": list(b.bypassed),
             "slots": d.slots, "probs_carried": d.probs_R is not None}
        r["timed"] = timed_calls(b, name, native if name == "ncclep" else None, payload, idx, wt, s, d, y)
        r["chained"] = chained_pair(b, w, ctx, payload, idx, wt, s, d, y)
        before = len(calls)
        b.teardown()
        r["teardown_calls"] = calls[before:]
        r["knobs_after"] = b.knobs()            # what the runner records: the knobs read after the teardown
        r["group_config"] = native.GROUP_CONFIGS[-1] if name == "ncclep" else None
        out.append(r)
    return out


def small(**kw):
    return Workload(**{**dict(num_tokens=16, hidden=512, num_experts=8, topk=3, ep=2, seed=3,
                              routing="uniform,masked:0.2"), **kw})


NCCLEP = [(small(), "ncclep", {"mode": "ht"}), (small(dtype="fp8"), "ncclep", {"mode": "ht"}),
          (small(), "ncclep", {"mode": "ht", "zero_copy": 0}),
          (small(), "ncclep", {"mode": "ll"}), (small(dtype="fp8"), "ncclep", {"mode": "ll"})]
DEEPEP_V2 = [(small(), "deepep-v2", {}), (small(dtype="fp8"), "deepep-v2", {}), (small(), "deepep-v2", {"expand": 1}),
             (small(), "deepep-v2", {"num_qps": 200})]      # above the automatic 129 QPs: allocated as asked
CASES = (NCCLEP if HAVE_NCCL_EP else []) + DEEPEP_V2


@pytest.mark.slow
@pytest.mark.parametrize("ep", [2, 4])
def test_both_pass_the_oracle_in_every_mode_and_dtype(fakes, ep):
    cases = [(w.replace(ep=ep), name, knobs) for w, name, knobs in CASES]
    results = run_ranks(round_trips, ep, "cpu", 300, args=(cases,))
    for rank, per_rank in enumerate(results):
        for (w, name, knobs), r in zip(cases, per_rank):
            label = f"{name} {knobs} {w.dtype} EP {ep} rank {rank}"
            assert r.get("check") == "" and r["combine"] == "" and r["rows_equal"], (label, r)
            assert r["knobs"]["libnccl"] == NCCL_2307 and "NCCL_MULTI_RANK_GPU_ENABLE=1" in r["bypassed"][0], label
            no_glue_timed(r, name, knobs, label)
            fp8_ll, expand = knobs.get("mode") == "ll" and w.dtype == "fp8", knobs.get("expand")
            assert r["chained"] == "" or ((fp8_ll or expand) and r["chained"].startswith("none: ")), (label, r["chained"])
            if name == "ncclep":
                ncclep_calls_and_config(r, w, knobs, label)
            elif knobs.get("expand"):  # DeepEP refuses a cached expanded dispatch
                assert r["views"] == [] and r["native"] is None, label
            else:                      # test_ep.py's rule: received rows x (payload + ids + weights)
                t = traffic.traffic_of([workload.make_routing(w, s)[0] for s in range(ep)], w)
                pairs = int(t.per_rank()["pairs"][rank])
                assert r["native"] == pairs * (w.bytes_per_token + 12 * w.topk), label
                assert r["cached_calls"] == ["dispatch(handle)", "combine"], (label, r["cached_calls"])


def no_glue_timed(r, name, knobs, label):
    """Every timed call is the library's and moebench's own ops: no torch multiply, gather, scatter or copy (Megatron
    runs none), but ncclep's zero_copy=0 combine, whose one copy is Megatron's re-expansion without zero copy; the
    probs go to the experts, except in ncclep's ll, whose combine weighs in its kernel; ll hands over its slots."""
    zc_off = knobs.get("zero_copy") == 0
    for call, (glue, reads) in r["timed"].items():
        want = ["copy"] if zc_off and call.endswith("combine") else []
        assert glue == want, (label, call, glue)
        if name == "ncclep" and not (zc_off and call == "api dispatch"):
            assert reads == 0, (label, call, "read values on the host")
    ll = knobs.get("mode") == "ll"
    assert r["slots"] == ll and r["probs_carried"] == (not ll), (label, r["slots"], r["probs_carried"])


def ncclep_calls_and_config(r, w, knobs, label):
    """ep_bench's timed loop (the handle keeps its routing: no update; ht without a host wait), a teardown that
    frees what setup made (ht with zero copy: its three windows, fp8 scales among them), the group ep_bench
    configures (ht: a fixed budget of the expert-major worst case) and, with zero copy, NCCL EP's ON."""
    mode, zc = knobs["mode"], knobs["mode"] == "ht" and knobs.get("zero_copy", 1)
    assert r["cached_calls"] == ["dispatch", "combine"] and r["knobs"]["nccl_ep_lib"] == "0.2.0", (label, r)
    windows = ["comm_window_deregister"] * ((3 if w.dtype == "fp8" else 2) if zc else 0)
    assert r["teardown_calls"] == ["handle_destroy", "group_destroy", *windows, "comm_destroy"], (label, r)
    c = r["group_config"]
    assert c["num_topk"] == w.topk and c["max_token_bytes"] >= max(w.bytes_per_token, 2 * w.hidden), (label, c)
    assert c["zero_copy"] == (2 if zc else 0), (label, c)
    if mode == "ht":
        assert r["cached_host_reads"] == 0, (label, "the cached ht dispatch read values on the host")
        assert c["max_recv_tokens_per_rank"] == w.ep * w.num_tokens * w.topk, (label, c)
        assert r["knobs_after"]["zero_copy"] == int(zc) and r["knobs_after"]["library_zero_copy"] == (
            "ON: dispatch output and combine input are NCCL windows (the library's token staging elided)" if zc
            else None), (label, r["knobs"])


@pytest.mark.slow
def test_an_old_nccl_is_waived_with_found_and_needed_and_a_failed_compile_names_its_lines(fakes, monkeypatch):
    old = {"path": "/torch/lib/libnccl.so.2", "version": "2.28.9"}
    first = [c for c in (NCCLEP[0], DEEPEP_V2[0]) if c in CASES]
    for r in sum(run_ranks(round_trips, 2, "cpu", 120, args=(first, old)), []):
        assert "needs libnccl >= 2.30.4; this process loaded 2.28.9 from /torch/lib/libnccl.so.2" in r["waived"]
    monkeypatch.setenv("FAKE_NCCL_EP_JIT_FAIL", "1")
    monkeypatch.setenv("FAKE_DEEP_EP_V2_JIT_FAIL", "1")
    for case in first:
        errors = run_ranks(first_call_error, 2, "cpu", 120, args=(case,))
        assert all("NativeFailure" in e and "compil" in e.lower() and "its last lines:" in e for e in errors), errors


def first_call_error(ctx, case):
    with_nccl(NCCL_2307)
    native_layer([case])
    w, name, knobs = case
    b = get(name)(knob_values={"ops_impl": "torch", **knobs})
    b.setup(ctx.group, w, ctx.device)
    x, idx, wt, *_ = workload.rank_inputs(w, ctx.rank)
    try:
        b.dispatch(x, idx, wt)
    except NativeFailure as e:
        return f"NativeFailure: {e}"
    return "no error"
