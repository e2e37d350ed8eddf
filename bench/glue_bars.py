"""Issue 53's bars on an EP 1 table (device_round.sh ep1): what moebench's own glue costs beside each library.

    python bench/glue_bars.py EP1.jsonl [BASE.jsonl]

Per ncclep (ht with its default zero copy, ll) and deepep-v2 phase record of the table (api view, the kernels the
record keeps, each named by owner: library / moebench / torch):
- glue: no torch kernel (elementwise, gather, index_copy, copies) above 50 us per call;
- moebench's kernels only where Megatron runs the same step: none in ncclep's phases; deepep-v2's permute in its
  dispatch and unpermute in its combine (Megatron's dispatch_postprocess / combine_preprocess);
- ncclep ht's combine api within 1.3x of the library's kernel time (timing.library_us).
With BASE (the same runs of alltoall and deepep-v2 by the code before, on the same machine in the same call):
alltoall's and deepep-v2's api medians no slower than there (within 5%), each side the median of its runs' medians
(device_round.sh ab alternates the two codes AB_RUNS times: one run of each moved 7% at 565af70 with the kernels'
busy time the same to 0.1 us), the kernels' busy time beside it.
One line per bar, PASS or FAIL with the figures; exit 1 when any FAILs, 2 on a file it cannot read.
"""
from __future__ import annotations

import json
import statistics
import sys

from moebench.harness.views.profile import owner

GLUE_US, HT_COMBINE_X, SLOWER = 50.0, 1.3, 1.05
NO_SLOWER = ("alltoall", "deepep-v2")
# moebench's kernels a phase may hold: deepep-v2's dispatch the permute's (its index and copy kernels), its combine the
# unpermute; every other phase none
ALLOWED = {("deepep-v2", "dispatch"): lambda k: "unpermute" not in k and "sort_chunks" not in k,
           ("deepep-v2", "combine"): lambda k: "unpermute" in k}


def records(path: str) -> list[dict]:
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except ValueError:
                sys.exit(f"glue_bars: {path}:{n}: not JSON")
            if r.get("phase") in ("dispatch", "combine") and (r.get("check") or {}).get("status") == "PASS" \
                    and not r.get("sweep"):                     # the table's rows, not a knob sweep's
                out.append(r)
    return out


def label(r: dict) -> str:
    k = r["backend"].get("knobs") or {}
    mode = f" {k['mode']}" if k.get("mode") else ""
    zc = " zero_copy=0" if k.get("zero_copy") == 0 else ""
    return f"{r['backend']['name']}{mode}{zc} {r['workload']['dtype']} {r['phase']}"


def bars(recs: list[dict], base: list[dict]) -> list[tuple[str, bool, str]]:
    out = []
    for r in recs:
        name, k, t = r["backend"]["name"], r["backend"].get("knobs") or {}, r.get("timing") or {}
        if name not in ("ncclep", "deepep-v2") or k.get("zero_copy") == 0:
            continue
        rows = [{**x, "owner": x.get("owner") or owner(x["kernel"])} for x in r.get("kernels") or []]
        at = f"{label(r)} @{(r.get('env') or {}).get('git_sha', '?')}"        # a file may hold several runs
        glue = [f"{x['kernel'][:60]} {x['us_per_iter']:.0f} us" for x in rows
                if x.get("owner") == "torch" and x["us_per_iter"] > GLUE_US]
        out.append((f"glue {at}", not glue, "; ".join(glue) or f"torch {t.get('torch_us', 0):.1f} us in all"))
        allowed = ALLOWED.get((name, r["phase"]), lambda k: False)
        ours = [x["kernel"][:60] for x in rows if x.get("owner") == "moebench" and not allowed(x["kernel"])]
        out.append((f"moebench kernels {at}", not ours, "; ".join(ours) or
                    f"moebench {t.get('moebench_us', 0):.1f} us, where Megatron runs the same step"))
        if name == "ncclep" and k.get("mode") == "ht" and r["phase"] == "combine":
            lib = t.get("library_us") or sum(x["us_per_iter"] for x in rows if x["owner"] == "library")
            x = t["median_us"] / lib if lib else float("inf")
            out.append((f"ht combine api / library {at}", x <= HT_COMBINE_X,
                        f"{t['median_us']:.1f} / {lib:.1f} us = {x:.2f} (<= {HT_COMBINE_X})"))
    pooled = lambda rs: {lab: [r["timing"] for r in rs if label(r) == lab]      # noqa: E731
                         for lab in dict.fromkeys(label(r) for r in rs if r["backend"]["name"] in NO_SLOWER)}
    now, before = pooled(recs), pooled(base)
    for lab, ts in now.items():
        if before.get(lab):
            a, b = (statistics.median(t["median_us"] for t in x) for x in (ts, before[lab]))
            busy = [statistics.median(t.get("kernel_busy_us") or 0 for t in x) for x in (ts, before[lab])]
            out.append((f"no slower {lab}", a <= b * SLOWER, f"{a:.1f} us now, {b:.1f} before ({a / b:.3f}x, <= "
                        f"{SLOWER}; median of {len(ts)} / {len(before[lab])} runs' medians); kernels busy "
                        f"{busy[0]:.1f} / {busy[1]:.1f} us"))
    return out


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    found = bars(records(argv[0]), records(argv[1]) if len(argv) == 2 else [])
    for what, ok, detail in found:
        print(f"BAR {'PASS' if ok else 'FAIL'} {what}: {detail}")
    if not found:
        print("BAR FAIL: no ncclep or deepep-v2 record passed in " + argv[0])
    return 0 if found and all(ok for _, ok, _ in found) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
