"""moebench's `cached` and `kernel` views beside DeepEP's and HybridEP's own test figures (bench/upstream_compare.sh).

Which figure each view is set beside (same shape, same SMs; the routings are drawn alike, uniform
distinct experts, but not identical, so bytes agree in expectation only):
  deepep   cached dispatch (bf16, fp8)   test_intranode.py "[tuning] SMs N, NVL chunk default" before
                                         "Best dispatch (BF16|FP8)" (the Config moebench uses)
  deepep   cached combine                its "NVL chunk default" before "Best combine"
  hybridep cached, mode permute          test_hybrid_ep.py Torch API "dispatch+permute (D)", "combine+unpermute"
  hybridep cached, mode plain            its "dispatch (D)", "combine" (its plain dispatch waits on the host,
                                         moebench's cached one passes num_dispatched_tokens: expect moebench lower)
  hybridep kernel                        its Kernel Benchmark "dispatch kernel (D)", "combine kernel"
Upstream aggregation: DeepEP prints rank 0's mean; HybridEP the mean over ranks. moebench: rank 0.
Its combines also carry probs back (with_probs); moebench's do not.

  python3 bench/upstream_compare.py --intranode LOG --hybrid-ep LOG --records JSONL [--tolerance 0.05]
Exit 0 when every figure found is within the tolerance, 1 otherwise or when none was compared.
"""
from __future__ import annotations

import argparse
import json
import re
import sys

DEFAULT = re.compile(r"\[tuning\] SMs \d+, NVL chunk default: [\d.]+ GB/s \(NVL\), ([\d.]+) us")
BEST_DISPATCH = re.compile(r"\[tuning\] Best dispatch \((\w+)\)")
SECTION = re.compile(r"=== (Torch API|Kernel) Benchmark \((\w+),")
API = re.compile(r"^(\S.*?):\s+[\d.]+ GB/s \(NVL\), t: ([\d.]+) us")
KERNEL = re.compile(r"^(\S.*?)\(NVL\):\s+[\d.]+ GB/s, avg_t=([\d.]+) us")


def parse_intranode(text: str) -> dict:
    """{("dispatch", "BF16"|"FP8"|...): us, ("combine", None): us} from test_intranode's rank-0 output."""
    out, last = {}, None
    for line in text.splitlines():
        m = DEFAULT.search(line)
        if m:
            last = float(m.group(1))
        elif (b := BEST_DISPATCH.search(line)) and last is not None:
            out[("dispatch", b.group(1))] = last
        elif "[tuning] Best combine" in line and last is not None:
            out[("combine", None)] = last
    return out


def parse_hybrid_ep(text: str) -> dict:
    """{(section, dtype, label): us} from test_hybrid_ep's rank-0 output (NVL lines)."""
    out, section = {}, None
    for line in text.splitlines():
        if m := SECTION.search(line):
            section = (m.group(1), m.group(2))
        elif section and (m := (KERNEL if section[0] == "Kernel" else API).match(line.strip())):
            out[(*section, m.group(1).strip())] = float(m.group(2))
    return out


def upstream_key(name: str, mode: str | None, dtype: str, phase: str, view: str):
    """Which upstream figure a record's view is set beside: (source, key) or None."""
    if name == "deepep" and view == "cached":
        return ("intranode", ("dispatch", dtype) if phase == "dispatch" else ("combine", None))
    if name != "hybridep":
        return None
    if view == "kernel":
        return ("hybrid", ("Kernel", dtype, f"dispatch kernel ({dtype})" if phase == "dispatch" else "combine kernel"))
    if mode == "plain":
        return ("hybrid", ("Torch API", dtype, f"dispatch ({dtype})" if phase == "dispatch" else "combine"))
    return ("hybrid", ("Torch API", dtype, f"dispatch+permute ({dtype})" if phase == "dispatch" else "combine+unpermute"))


def view_us(v: dict) -> float | None:
    return v.get("mean_us", v.get("us")) if v and "none" not in v else None


def compare(records: list[dict], intranode: dict, hybrid: dict, tol: float) -> list[dict]:
    """One row per (backend, mode, dtype, phase, view) that has an upstream figure (the last record wins)."""
    rows = {}
    for r in records:
        if r.get("check", {}).get("status") != "PASS" or r.get("phase") not in ("dispatch", "combine"):
            continue
        name, dtype = r["backend"]["name"], r["workload"]["dtype"].upper()
        mode = (r["backend"].get("knobs") or {}).get("mode")
        for view in ("cached", "kernel"):
            key = upstream_key(name, mode, dtype, r["phase"], view)
            ours = view_us((r.get("views") or {}).get(view))
            if key is None or ours is None:
                continue
            theirs = (intranode if key[0] == "intranode" else hybrid).get(key[1])
            row = {"backend": name + (f"/{mode}" if mode else ""), "dtype": dtype, "phase": r["phase"], "view": view,
                   "moebench_us": ours, "upstream_us": theirs, "upstream": " ".join(str(k) for k in key[1] if k)}
            if theirs:
                row["ratio"] = ours / theirs
                row["within"] = abs(row["ratio"] - 1) <= tol
            rows[(row["backend"], dtype, r["phase"], view)] = row
    return list(rows.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intranode", required=True, help="test_intranode.py output")
    p.add_argument("--hybrid-ep", required=True, help="test_hybrid_ep.py output")
    p.add_argument("--records", required=True, help="moebench.dispatch JSONL at the same shape")
    p.add_argument("--tolerance", type=float, default=0.05)
    a = p.parse_args(argv)
    read = lambda f: open(f, errors="replace").read()   # noqa: E731
    records = [json.loads(line) for line in read(a.records).splitlines() if line.strip()]
    rows = compare(records, parse_intranode(read(a.intranode)), parse_hybrid_ep(read(a.hybrid_ep)), a.tolerance)
    for r in rows:
        verdict = ("missing upstream figure" if r["upstream_us"] is None else
                   f"{r['ratio']:.3f}  {'within' if r['within'] else 'OUTSIDE'} {a.tolerance:.0%}")
        print(f"{r['backend']:17s} {r['dtype']:4s} {r['phase']:8s} {r['view']:6s} moebench {r['moebench_us']:9.1f} us  "
              f"upstream {r['upstream_us'] or float('nan'):9.1f} us ({r['upstream']})  {verdict}")
    compared = [r for r in rows if "within" in r]
    ok = bool(compared) and all(r["within"] for r in compared)
    print(f"# {sum(r['within'] for r in compared)}/{len(compared)} figures within {a.tolerance:.0%}"
          + ("" if compared else ": nothing compared"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
