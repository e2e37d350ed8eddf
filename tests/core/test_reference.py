"""Oracle identities, and that the checks catch what they exist to catch."""
import torch

from moebench.core import reference, workload
from moebench.core.workload import Workload, make_routing


def wl(**kw):
    return Workload(**{**dict(num_tokens=64, hidden=128, num_experts=8, topk=2, ep=4), **kw})


def test_every_valid_slot_lands_once():
    w = wl(routing="uniform,masked:0.2")
    total = sum(int((make_routing(w, r)[0] >= 0).sum()) for r in range(w.ep))
    got = sum(rows.shape[0] for r in range(w.ep) for rows in reference.expected_dispatch(w, r)[0])
    assert got == total


def test_expected_rows_are_the_routed_tokens_in_megatron_order():
    w = wl()
    rows, _ = reference.expected_dispatch(w, 1)
    x0, idx0, *_ = workload.rank_inputs(w, 0)
    x1, idx1, *_ = workload.rank_inputs(w, 1)
    e = 1 * w.local_experts + 0          # rank 1's first expert
    want = torch.cat([x0[(idx0 == e).any(1)], x1[(idx1 == e).any(1)]])
    assert torch.equal(rows[0][: want.shape[0]], want)


def test_combine_oracle_is_x_times_weighted_expert_factor():
    w = wl()
    x, idx, wt, _, _ = workload.rank_inputs(w, 0)
    out = reference.expected_combine(x, idx, wt, w)
    factor = (wt * (idx + 1)).sum(1)
    torch.testing.assert_close(out.float(), x.float() * factor[:, None], rtol=2e-2, atol=2e-2)


def test_apply_experts_uses_global_expert_ids():
    w = wl()
    x = torch.ones(5, 128, dtype=torch.bfloat16)
    y = reference.apply_experts(x, [2, 3], rank=2, w=w)
    assert y[:2].unique().tolist() == [5.0] and y[2:].unique().tolist() == [6.0]


def test_check_dispatch_accepts_permuted_rows_and_rejects_corruption():
    w = wl()
    rows, _ = reference.expected_dispatch(w, 2)
    shuffled = [r[torch.randperm(r.shape[0])] for r in rows]
    assert reference.check_dispatch(shuffled, None, rows, None, 2, w) == ""
    dropped = [rows[0][1:], *rows[1:]]
    assert "received" in reference.check_dispatch(dropped, None, rows, None, 2, w)
    dup = [torch.cat([rows[0][:1], rows[0][:-1]]), *rows[1:]]
    assert "differ" in reference.check_dispatch(dup, None, rows, None, 2, w)
    swapped = [rows[1], rows[0]] if rows[0].shape == rows[1].shape else [rows[0] * 2, rows[1]]
    assert reference.check_dispatch(swapped, None, rows, None, 2, w) != ""


def test_check_dispatch_compares_fp8_scales():
    w = wl(dtype="fp8")
    rows, scales = reference.expected_dispatch(w, 0)
    assert reference.check_dispatch(rows, scales, rows, scales, 0, w) == ""
    bad = [s.clone() for s in scales]
    bad[0][0, 0] *= 2
    assert "differ" in reference.check_dispatch(rows, bad, rows, scales, 0, w)


def test_check_combine_catches_a_lost_slot_and_a_wrong_weight():
    w = wl()
    x, idx, wt, _, _ = workload.rank_inputs(w, 0)
    good = reference.expected_combine(x, idx, wt, w)
    assert reference.check_combine(good, good) == ""
    lost = idx.clone()
    lost[5, 0] = -1
    assert "token 5" in reference.check_combine(reference.expected_combine(x, lost, wt, w), good)
    wrong = wt.clone()
    wrong[9] = wrong[9].flip(0)
    assert "token 9" in reference.check_combine(reference.expected_combine(x, idx, wrong, w), good)


def test_bad_rows_are_counted_per_expert_in_one_pass():
    w = wl(routing="uniform")
    rows, _ = reference.expected_dispatch(w, 1)
    assert reference.dispatch_bad_rows(rows, None, rows, None, 1, w) == []
    got = [r.clone() for r in rows]
    got[0][:2] += 1                                   # two corrupted rows of the rank's first expert
    got[1] = got[1][1:]                               # one missing row of its second
    got[1] = torch.cat([got[1], rows[0][:1]])         # and a row that belongs to another expert in its place
    first = 1 * w.local_experts
    assert reference.dispatch_bad_rows(got, None, rows, None, 1, w) == [(first, 2), (first + 1, 1)]
    assert "differ" in reference.check_dispatch(got, None, rows, None, 1, w)
    flips = [r.clone() for r in rows]
    flips[1][0, 3], flips[1][0, 7] = -flips[1][0, 3], -flips[1][0, 7]   # two sign bits (a 64-bit form misses them)
    assert reference.dispatch_bad_rows(flips, None, rows, None, 1, w) == [(first + 1, 1)]
    assert "expert %d:" % (first + 1) in reference.check_dispatch(flips, None, rows, None, 1, w)


def test_bad_rows_count_scales_and_rows_of_another_width():
    w = wl(dtype="fp8")
    rows, scales = reference.expected_dispatch(w, 0)
    bad = [s.clone() for s in scales]
    bad[1][0, 0] *= 2
    assert reference.dispatch_bad_rows(rows, bad, rows, scales, 0, w) == [(1, 1)]
    narrow = [r[:, :64] for r in rows]
    assert reference.dispatch_bad_rows(narrow, scales, rows, scales, 0, w) == [
        (j, r.shape[0]) for j, r in enumerate(rows) if r.shape[0]]


def test_a_hash_collision_cannot_hide_a_wrong_row_from_the_single_check(monkeypatch):
    """Every row hashing alike (the worst collision): the soak's count sees nothing, the check's byte compare
    still names the rank."""
    w = wl()
    rows, _ = reference.expected_dispatch(w, 0)
    got = [r.clone() for r in rows]
    got[0][0, 0] += 1
    monkeypatch.setattr(reference, "_row_hashes", lambda x, s: torch.zeros(x.shape[0], dtype=torch.int64))
    assert reference.dispatch_bad_rows(got, None, rows, None, 0, w) == []
    assert reference.check_dispatch(got, None, rows, None, 0, w).startswith("rank 0: received rows differ")
    assert reference.check_dispatch(rows, None, rows, None, 0, w) == ""
