"""The alltoall backend against the oracle over gloo, EP 2 and 4, several shapes, every routing."""
import pytest
import torch

from moebench.backends import get
from moebench.core import workload
from moebench.core.workload import Workload
from moebench.harness.launch import run_ranks
from moebench.harness.oracle import check

ROUTINGS = ["uniform", "balanced", "zipf:1.2", "group:4:2", "uniform,masked:0.3", "TRACE"]
SHAPES = [(32, 64, 8, 2), (17, 96, 16, 4), (1, 128, 8, 8)]      # T, H, E, K


def check_many(ctx, workloads):
    errors = []
    for w in workloads:
        b = get("alltoall")(knob_values={"ops_impl": "torch"})
        b.setup(ctx.group, w, ctx.device)
        x, idx, wt, q, s = workload.rank_inputs(w, ctx.rank)
        err = check(b, w, ctx.rank, q if q is not None else x, idx, wt, s, ctx.device)[0]
        if err:
            errors.append(f"{w}: {err}")
    return errors


def workloads(ep, trace):
    out = []
    for T, H, E, K in SHAPES:
        for r in ROUTINGS:
            r = f"trace:{trace}{K}.pt" if r == "TRACE" else r
            if r.startswith("group") and K > E // 4 * 2:
                continue
            out.append(Workload(num_tokens=T, hidden=H, num_experts=E, topk=K, ep=ep, routing=r, seed=T))
    out.append(Workload(num_tokens=24, hidden=256, num_experts=8, topk=2, ep=ep, dtype="fp8"))
    return out


@pytest.mark.parametrize("ep", [1, 2, 4])
@pytest.mark.slow
def test_alltoall_matches_oracle_over_gloo(ep, tmp_path):
    for K in {k for *_, k in SHAPES}:   # distinct ids < 8 fit every shape's E
        torch.save(torch.rand(50, 8).argsort(dim=1)[:, :K], tmp_path / f"trace{K}.pt")
    ws = workloads(ep, tmp_path / "trace")
    results = run_ranks(check_many, ep, "cpu", timeout_s=240, args=(ws,))
    assert all(r == [] for r in results), results


def test_alltoall_wire_is_per_slot():
    assert get("alltoall").dedup is False and get("alltoall").supports_fp8
