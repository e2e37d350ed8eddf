"""The real `nccl.ep` facade (nccl-extensions 0.1.0) called directly on CPU/gloo ranks, over the fake native layer
(tests/fakes/nccl_ep_native): a wrong argument fails here as the library fails it on a GPU (its error code, its
stderr line, its assert), and the two HT receive modes (eager: outputs sized from recv_total_counter; a fixed
budget: outputs of the whole budget) move the same rows."""
import pytest
import torch

from conftest import FAKES
from moebench.backends.nccl_family import NativeFailure, native_output
from moebench.core import workload
from moebench.core.workload import Workload
from moebench.env.toolkit import installed
from moebench.harness.launch import run_ranks

pytestmark = pytest.mark.skipif(not installed("nccl.ep"), reason="nccl.ep is not installed: pip install "
                                "nccl-extensions==0.1.0 nccl4py==0.6.0 cuda-bindings==13.5.0 (README's test line)")
W = Workload(num_tokens=16, hidden=512, num_experts=8, topk=3, ep=2, seed=3, routing="uniform,masked:0.2", dtype="fp8")


def attempt(fn) -> str:
    """'ok', or the failure with the native lines it wrote (as ncclep reports a first call)."""
    try:
        with native_output("call"):
            fn()
    except NativeFailure as e:
        return str(e)
    return "ok"


def probes(ctx):
    import nccl_ep_native
    nccl_ep_native.install()
    import nccl.ep as ep
    from nccl.ep.interop.torch import get_nccl_comm_from_group
    from nccl_ep_native.registry import CALLS
    w = W.replace(ep=ctx.world)
    x, idx, wt, q, s = workload.rank_inputs(w, ctx.rank)
    T, H, K, L, t = w.num_tokens, w.hidden, w.topk, w.local_experts, ep.Tensor
    budget = ctx.world * T * K                                        # ncclep's: the expert-major worst case
    comm = get_nccl_comm_from_group(ctx.group)

    def group(**kw):
        return ep.Group.create(comm, ep.GroupConfig(algorithm=ep.Algorithm.HIGH_THROUGHPUT, num_experts=w.num_experts,
                                                    max_dispatch_tokens_per_rank=T, **{"num_topk": K, **kw}))

    def handle(g, **info):
        return g.create_handle(ep.Layout.EXPERT_MAJOR, t(idx), layout_info=ep.LayoutInfo(**info), stream=None)

    out = {"unaligned max_token_bytes": attempt(lambda: group(max_token_bytes=2 * H + 4)),
           "a torch tensor for an nccl.ep.Tensor": attempt(lambda: ep.DispatchInputs(tokens=x)),
           "eager without num_topk": attempt(lambda: handle(group(max_token_bytes=2 * H, num_topk=0)))}
    rows = {}
    for mode, recv in (("eager", 0), ("fixed", budget)):             # bf16 rows: eager and fixed budgets agree
        g = group(max_token_bytes=2 * H, max_recv_tokens_per_rank=recv)
        total = torch.zeros(1, dtype=torch.int64)
        h = handle(g, recv_total_counter=t(total))
        n = int(total) if mode == "eager" else budget

        def bf16(m):
            rows[mode] = torch.empty(m, H, dtype=torch.bfloat16), torch.empty(m)
            h.dispatch(ep.DispatchInputs(tokens=t(x), topk_weights=t(wt)),
                       ep.DispatchOutputs(tokens=t(rows[mode][0]), topk_weights=t(rows[mode][1])), stream=None)
        out[f"{mode}: outputs one row short"] = attempt(lambda: bf16(n - 1))
        out[f"{mode}: outputs of {'recv_total_counter' if mode == 'eager' else 'the budget'}"] = \
            attempt(lambda: bf16(n))
        rows[mode] = [r[:int(total)] for r in rows[mode]]
        h.destroy(), g.destroy()
    out["eager rows == fixed-budget rows"] = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                                                 for a, b in zip(rows["eager"], rows["fixed"]))
    old = H + H // 128 * 4                                  # ncclep's fp8 max_token_bytes before: the row and scales
    for name, mtb in (("old", old), ("new", -(-max(old, 2 * H) // 16) * 16)):
        g = group(max_token_bytes=mtb, max_recv_tokens_per_rank=budget)
        h = handle(g, expert_counters=t(torch.zeros(L, dtype=torch.int64)))
        fwd = ep.DispatchConfig(quantization_recipe=ep.DispatchQuantizationRecipe.FWD)
        ins = ep.DispatchInputs(tokens=t(q), topk_weights=t(wt), scales=t(s))

        def fp8(weights):
            h.dispatch(ins, ep.DispatchOutputs(tokens=t(torch.empty(budget, H, dtype=q.dtype)), topk_weights=t(weights),
                                               scales=t(torch.empty(budget, s.shape[1]))), config=fwd, stream=None)
        out[f"{name}: 2-D outputs.topk_weights"] = attempt(lambda: fp8(torch.empty(budget, K)))
        out[f"{name}: fp8 dispatch"] = attempt(lambda: fp8(torch.empty(budget)))
        out[f"{name}: combine"] = attempt(lambda: h.combine(
            ep.CombineInputs(tokens=t(torch.zeros(budget, H, dtype=torch.bfloat16))),
            ep.CombineOutputs(tokens=t(torch.empty(T, H, dtype=torch.bfloat16))), stream=None))
        h.destroy(), g.destroy()
    comm.destroy()
    return out, list(CALLS)


@pytest.mark.slow
def test_wrong_arguments_fail_on_cpu_as_the_library_fails_them(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.delenv("FAKE_NCCL_EP_JIT_FAIL", raising=False)
    for out, calls in run_ranks(probes, 2, "cpu", 120):
        assert "NCCLEpError: NCCL EP error code 4; its last lines: NCCL EP: HT max_token_bytes (1028) must be a " \
               "multiple of 16 bytes" in out["unaligned max_token_bytes"], out
        assert "TypeError: an integer is required" in out["a torch tensor for an nccl.ep.Tensor"], out
        assert "error code 5; its last lines: NCCL EP: eager mode (max_recv_tokens_per_rank = NCCL_EP_AUTO) requires " \
               "ncclEpGroupConfig_t::num_topk" in out["eager without num_topk"], out
        assert "error code 4; its last lines: NCCL EP: eager dispatch recv buffer too small" in \
               out["eager: outputs one row short"], out
        assert out["fixed: outputs one row short"].endswith("NCCLEpError: NCCL EP error code 4"), out
        assert out["eager: outputs of recv_total_counter"] == out["fixed: outputs of the budget"] == "ok", out
        assert out["eager rows == fixed-budget rows"], out
        for name in ("old", "new"):
            assert "Assertion `recv_topk_weights->ndim == 1 && \"HT EM recv_topk_weights must be 1D [num_recv_tokens]" \
                   in out[f"{name}: 2-D outputs.topk_weights"], out
            assert out[f"{name}: fp8 dispatch"] == "ok", out
        assert "combine rows of 1024 bytes (512 x torch.bfloat16) exceed the group's max_token_bytes 528" in \
               out["old: combine"], out
        assert out["new: combine"] == "ok", out
        assert calls[-3:] == ["handle_destroy", "group_destroy", "comm_destroy"], calls
