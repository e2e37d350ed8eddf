"""Issue 13, item 14: the sweep's time left follows the work of the cases still to run (tokens x
hidden x top-k), not their count."""
from moebench import dispatch
from moebench.core.workload import Workload
from moebench.harness import sweep


def test_time_left_follows_the_work_of_the_remaining_cases():
    # six token counts x seven backends, as a dsv3 sweep: a 6 s launch plus time in proportion to the work
    wls = [Workload(num_tokens=t, hidden=7168, num_experts=256, topk=8, ep=8) for t in (512, 1024, 2048, 4096, 8192, 16384)]
    works = [sweep.case_work(w) for w in wls for _ in range(7)]
    seconds = [6.0 + 2e-8 * x for x in works]
    done = 35                                             # at case 36 of 42
    truth = sum(seconds[done:])
    left = sweep.time_left(list(zip(works[:done], seconds[:done])), works[done:])
    by_count = sum(seconds[:done]) / done * (len(works) - done)
    assert abs(left - truth) / truth < 0.05, (left, truth)
    assert truth / by_count > 2                           # what counting cases said: far too little
    assert sweep.time_left([], works) is None
    same = sweep.time_left([(100, 2.0), (100, 4.0)], [100, 300])
    assert same == 3.0 / 100 * 400                        # one work so far: in proportion


def test_sweep_prints_time_left_by_work(tmp_path, capsys):
    sw = tmp_path / "s.toml"
    sw.write_text("num_experts = 8\ntopk = 2\nhidden = 64\nnum_tokens = [16, 32]\n")
    assert dispatch.main(["--sweep", str(sw), "--device", "cpu", "--ep", "2", "--backend", "alltoall", "--iters", "1",
                          "--out", str(tmp_path / "r.jsonl")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert "min left" not in lines[0] and "min left, by work)" in lines[1], lines
