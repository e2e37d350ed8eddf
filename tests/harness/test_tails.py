"""Tails and the straggler (issue 54 part 3): p99 / p999 of the per-iteration max over ranks where the samples
allow (else '-' with why), the rank slowest most often and each rank's median in every record, --tails timing
at least CollectiveX's samples per cell, the table's `p99 us` with --wide."""
import time

import torch

from moebench.harness.launch import run_ranks
from moebench.harness.spec import RunSpec
from moebench.harness.timing import Timer
from moebench.records import tables
from moebench.records.shapes import TAIL_ITERS, Tails, Timing


def test_p99_and_p999_only_where_a_sample_lies_beyond_them():
    few = Tails.of([[float(i) for i in range(1, 51)]])
    assert few.p99_us is None and few.p999_us is None
    assert few.tails_note == f"50 samples: p99 needs >= 100 samples, p999 needs >= 1000 samples (--tails times {TAIL_ITERS})"
    some = Tails.of([[float(i) for i in range(1, 201)]])
    assert some.p99_us == 198.0 and some.p999_us is None and "p999 needs >= 1000" in some.tails_note
    many = Tails.of([[float(i) for i in range(1, TAIL_ITERS + 1)]])
    assert (many.p99_us, many.p999_us, many.tails_note) == (2028.0, 2046.0, "")


def test_the_straggler_is_the_rank_slowest_in_most_iterations_and_each_rank_has_its_median():
    # rank 2 is slowest in 3 of 4 iterations; rank 0 once, with the largest single time
    t = Tails.of([[1.0, 1.0, 9.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0]])
    assert (t.slowest_rank, t.slowest_rank_share, t.per_rank_us) == (2, 0.75, [1.0, 2.0, 3.0])
    d = Timing.of([3e-6, 3e-6, 9e-6, 3e-6], "x", [[x * 1e-6 for x in r] for r in ([1, 1, 9, 1], [2] * 4, [3] * 4)]).asdict()
    assert d["slowest_rank"] == 2 and d["per_rank_us"] == [1.0, 2.0, 3.0] and "p999_us" not in d
    assert "4 samples" in d["tails_note"]
    assert "slowest_rank" not in Timing.of([1e-6, 2e-6], "x").asdict()      # no ranks given: nothing claimed


def _timed_with_a_slow_rank(ctx):
    slow = ctx.rank == 1
    return Timer(ctx.device, ctx.group).run(lambda: time.sleep(0.004 if slow else 0.0005), iters=6, warmup_ms=0.0)


def test_every_rank_gets_the_straggler_from_one_gather():
    outs = run_ranks(_timed_with_a_slow_rank, 2, "cpu", timeout_s=60)
    assert outs[0].asdict() == outs[1].asdict()
    st = outs[0]
    assert st.slowest_rank == 1 and st.slowest_rank_share == 1.0
    assert st.per_rank_us[1] > 3000 > st.per_rank_us[0]
    assert st.median_us >= st.per_rank_us[1] * 0.9          # the per-iteration max is the slow rank's


def test_tails_times_at_least_collectivex_samples_and_round_trips():
    base = ["--device", "cpu", "--ep", "2", "--num-tokens", "8", "--hidden", "64", "--num-experts", "8", "--topk", "2"]
    run = RunSpec.from_argv(base + ["--tails"])
    assert run.tails and run.iters == TAIL_ITERS
    assert RunSpec.from_argv(base + ["--tails", "--iters", "5000"]).iters == 5000
    assert RunSpec.from_argv(run.to_argv()) == run and "--tails" in run.to_argv()
    assert RunSpec.from_argv(base).iters == 5


def test_the_wide_table_has_p99():
    rec = {"backend": {"name": "alltoall"}, "phase": "dispatch", "check": {"status": "PASS"},
           "timing": {"median_us": 10.0, "p90_us": 12.0, "p99_us": 31.5}, "traffic": {}}
    wide = tables.format_table([rec], ("api",), wide=True).splitlines()
    assert "p99 us" in wide[0] and "31.5" in wide[2]
    assert "p99 us" not in tables.format_table([rec], ("api",)).splitlines()[0]


def test_a_dispatch_run_records_tails_and_the_straggler_in_every_sampled_view(tmp_path):
    from moebench.dispatch import main
    out = tmp_path / "r.jsonl"
    assert main(["--device", "cpu", "--ep", "2", "--num-tokens", "8", "--hidden", "64", "--num-experts", "8",
                 "--topk", "2", "--iters", "100", "--backend", "alltoall", "--views", "api,cached",
                 "--out", str(out)]) == 0
    import json
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    for r in recs:
        for where in (r["timing"], r["views"]["api"], r["views"]["cached"]):
            assert where["p99_us"] >= where.get("p90_us", 0) and where["slowest_rank"] in (0, 1)
            assert len(where["per_rank_us"]) == 2 and "p999 needs >= 1000" in where["tails_note"]
    assert torch.tensor(recs[0]["timing"]["samples_us"]).max().item() >= recs[0]["timing"]["p99_us"]
