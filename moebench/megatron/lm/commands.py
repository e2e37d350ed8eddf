"""`megatron validate` / `arm` / `compare` with Megatron-LM's own pretrain_gpt.py.

validate  on this machine: plans the arms (the alltoall control and each candidate, lm_plan.py), then
          launches them interleaved and repeated (A B A B ...), one torchrun per launch, writes one
          record per launch as it ends, and the verdict per candidate (verdict.py).
arm       one arm as one rank of the user's own torchrun/srun job across nodes (rank 0 writes the record);
compare   joins the arm records of such launches and gives the verdict.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from ... import cli
from ...core.megatron_map import CONTROL
from ...records import provenance, reader, tables, writer
from ...records.megatron import ARM_SCHEMA
from . import arm as lm_arm, log as lm_log, plan as lm_plan, rank as lm_rank
from .args import LmError, dispatcher_diff, flag_value
from .verdict import judge, vet

GIB = 2 ** 30
ARM_IDENTITY = ("validation", "dispatcher", "repeat", "order", "start_utc", "end_utc")    # one launch
TABLE = ("#", "dispatcher", "rep", "ms/iter", "TFLOP/s", "lm loss 1st->last", "nan/skip", "reserved GiB",
         "device GiB", "ran on every rank", "status")


def log_dir(args) -> Path:
    d = Path(args.log_dir) if args.log_dir else Path(args.out).with_suffix("").parent / (Path(args.out).stem + "-logs")
    d.mkdir(parents=True, exist_ok=True)
    return d


def header(plan, args) -> list[str]:
    ck, la = plan.checkout, plan.launch
    out = [f"# engine: Megatron-LM pretrain_gpt.py at {ck.path} (Megatron-LM {ck.version or '?'}, commit "
           f"{(ck.commit or '?')[:12]}; megatron-core used: {ck.core_used or '?'})",
           f"# model: {'preset ' + args.preset if args.preset != 'none' else 'the user arguments'}"
           f"{' + ' + args.megatron_args if args.megatron_args else ''}; {args.iters} iterations, steady window = "
           f"the last {args.window}, {args.repeats} repeat(s) interleaved; validation {plan.validation}",
           f"# launch: {la.nnodes} node(s) x {la.nproc_per_node} ranks, EP {la.ep}, {la.device}"
           + (f", {la.ranks_per_gpu} ranks per GPU (shared-GPU ranks: functional only)" if la.ranks_per_gpu > 1 else "")
           + (" (CPU: functional only)" if la.device == "cpu" else "")]
    if plan.no_te:
        out.append(f"# Transformer Engine is not installed: added {' '.join(plan.no_te)}")
    if args.iters < 50:
        out.append("# a final run needs >= 50 iterations (--iters 50); this one is shorter")
    out += [f"# note: {n}" for n in plan.notes]
    ctl = plan.arms[0]
    if len(plan.arms) == 1:
        out.append("# control only (no candidate): its records, no verdict")
    for arm in plan.arms[1:]:
        only_ctl, only_arm = dispatcher_diff(ctl.megatron_argv, arm.megatron_argv)
        env = " ".join(f"{k}={v}" for k, v in arm.env.items() if ctl.env.get(k) != v)
        out.append(f"# {arm.dispatcher} differs from the control only in: {' '.join(only_arm)}"
                   f"{' ; env ' + env if env else ''} (control: {' '.join(only_ctl)})")
    out += [f"# {a.role} {a.dispatcher}: {' '.join(a.megatron_argv)}" for a in plan.arms]
    return tables.fit(out)          # each arm's whole command, wrapped at its flags


def progress(tag: str, iters: int):
    step = max(1, iters // 5)

    def on_line(line: str):
        it = lm_log.parse_iteration(line)
        if it and (it.iteration in (1, iters) or it.iteration % step == 0):
            loss = f", lm loss {it.lm_loss:.3f}" if it.lm_loss is not None else ""
            print(f"#   {tag} iteration {it.iteration}/{it.train_iters}: {it.elapsed_ms} ms{loss}", file=sys.stderr,
                  flush=True)
    return on_line


def launch_arm(plan, arm, repeat: int, order: int, args, logs: Path) -> dict:
    stem = f"{plan.validation}-{order:02d}-{arm.dispatcher}-r{repeat}"
    meta = lm_rank.RankMeta(arm.dispatcher, plan.launch.ranks_per_gpu, str(logs / f"{stem}.ranks.json"),
                            int(flag_value(arm.megatron_argv, "--hidden-size") or 0))
    meta_path = logs / f"{stem}.meta.json"
    meta_path.write_text(json.dumps(meta.__dict__))
    cmd = lm_arm.torchrun_command(plan.launch, str(meta_path), arm.megatron_argv)
    t0, start = time.monotonic(), provenance.utc_now()
    tag = f"[{order}: {arm.dispatcher} r{repeat}]"
    print(f"# {tag} launching {plan.launch.world} ranks ...", file=sys.stderr, flush=True)
    rc, hung = lm_arm.run_local(cmd, arm.env, str(logs / f"{stem}.log"), args.timeout, progress(tag, args.iters))
    res = lm_arm.LaunchResult(rc, time.monotonic() - t0, str(logs / f"{stem}.log"), cmd, hung)
    if os.path.isfile(meta.result):
        res.ranks = json.loads(Path(meta.result).read_text())["ranks"]
        os.remove(meta.result)
    return lm_arm.make_record(arm, plan.context(start), repeat, order, res, args.window, args.iters).asdict()


def cmd_validate(args, dispatchers: list[str]) -> int:
    plan = lm_plan.plan(args, dispatchers)
    print("\n".join(header(plan, args)), flush=True)
    logs = log_dir(args)
    recs, order = [], 0
    schedule = [(rep, arm) for rep in range(args.repeats) for arm in plan.arms]
    for rep, arm in schedule:
        try:
            rec = launch_arm(plan, arm, rep, order, args, logs)
        except KeyboardInterrupt as e:
            left = len(schedule) - order
            raise cli.Interrupted.after(e, f"{len(recs)} arm record(s) kept in {args.out}; not run: {left} "
                                           "launch(es) from this one on") from None
        writer.write_jsonl(args.out, [rec])
        recs.append(rec)
        order += 1
        status = rec["status"] + (f": {'; '.join(rec['errors'])}" if rec["errors"] else "")
        print(f"# {order}/{len(schedule)} {arm.dispatcher} repeat {rep}: {status}", flush=True)
    return report(recs, args)


def report(recs: list[dict], args) -> int:
    from tabulate import tabulate
    print(tabulate([row(r) for r in recs], headers=TABLE, tablefmt="simple", disable_numparse=True))
    for r in recs:
        if r["status"] != "PASS" and r.get("error_lines"):
            print(f"# {r['dispatcher']} repeat {r['repeat']}: Megatron's last error lines:\n#   "
                  + "\n#   ".join(r["error_lines"]), file=sys.stderr)
    verdicts = judge(recs, args.min_gain, args.loss_rtol)     # live records: iteration_problems vetted each time
    for v in verdicts:
        print(verdict_line(v))
    if args.out and verdicts:
        writer.write_jsonl(args.out, [v.asdict() for v in verdicts])
    print(f"# {len(recs)} arm record(s) and {len(verdicts)} verdict(s) appended to {args.out}")
    bad = any(r["status"] != "PASS" for r in recs) or any(v.verdict in ("FAIL", "REFUSED") for v in verdicts)
    return 1 if bad else 0


def row(r: dict) -> list[str]:
    st, its = r.get("steady") or {}, r.get("iterations") or []
    losses = [i["lm_loss"] for i in its if i.get("lm_loss") is not None]
    ranks = (r.get("memory") or {}).get("ranks") or []
    res = [m.get("max_reserved_bytes") for m in ranks if isinstance(m.get("max_reserved_bytes"), int)] or \
        [int(m["max_reserved_MB"] * 2**20) for m in (r.get("memory") or {}).get("megatron") or []
         if isinstance(m.get("max_reserved_MB"), (int, float))]
    dev = [m.get("process_bytes") or m.get("device_used_bytes") for m in ranks]
    dev = [d for d in dev if isinstance(d, int)]
    ran = {(d["class"], d["manager"]) for e in r.get("evidence") or [] for d in e.get("dispatchers") or []}
    ran_s = ", ".join(c.replace("TokenDispatcher", "") + (f"/{m}" if m else "") for c, m in sorted(ran, key=str)) or "-"
    nan = sum(i.get("nan", 0) for i in its)
    skip = sum(i.get("skipped", 0) for i in its)
    return [str(r["order"]), r["dispatcher"], str(r["repeat"]),
            f"{st['mean_ms']:.1f}" if st else "-",
            f"{st['tflops_per_gpu_mean']:.1f}" if st and st.get("tflops_per_gpu_mean") is not None else "-",
            f"{losses[0]:.3f}->{losses[-1]:.3f}" if losses else "-", f"{nan}/{skip}",
            f"{max(res) / GIB:.1f}" if res else "-", f"{max(dev) / GIB:.1f}" if dev else "-", ran_s[:40],
            r["status"] + (" [functional]" if r.get("functional") else "")]


def verdict_line(v) -> str:
    ci = f" ratio {v.ratio:.3f} [{v.ci95[0]:.3f}, {v.ci95[1]:.3f}]" if v.ratio is not None else ""
    lines = [f"# {v.candidate} vs {v.control}: {v.verdict}{ci} - {v.reason}"]
    lines += [f"#   {x}" for x in v.labels + v.notes]
    if v.loss.get("max_rel_diff") is not None:
        lines.append(f"#   loss curve: max relative difference {100 * v.loss['max_rel_diff']:.3f}% "
                     f"(tolerance {100 * v.loss['rtol']:.1f}%)")
    for m in v.memory:
        parts = []
        for k, what in (("max_reserved_bytes", "max reserved"), ("process_bytes", "process on GPU"),
                        ("device_used_bytes", "device in use")):
            a, b = m.get(f"control_{k}"), m.get(f"candidate_{k}")
            if a is not None and b is not None:
                parts.append(f"{what} {a / GIB:.2f} -> {b / GIB:.2f} GiB ({(b - a) / GIB:+.2f})")
        if parts:
            lines.append(f"#   memory rank {m['rank']}: " + ", ".join(parts))
    return "\n".join(tables.fit(lines))


def cmd_arm(args) -> int:
    """One arm as a rank of the user's launcher job."""
    joined = lm_plan.launcher_shape()
    if joined is None:
        raise LmError("`megatron arm` runs as one rank of a torchrun or srun job (one launch per arm); on one "
                      "machine use `megatron validate --megatron-lm PATH`")
    disp = args.dispatcher
    plan = lm_plan.plan(args, [] if disp == CONTROL else [disp], joined)
    arm = plan.arms[-1]
    os.environ.update(arm.env)
    meta = lm_rank.RankMeta(disp, args.ranks_per_gpu, None, int(flag_value(arm.megatron_argv, "--hidden-size") or 0))
    t0, start = time.monotonic(), provenance.utc_now()
    ranks = lm_rank.run(meta, arm.megatron_argv[0], arm.megatron_argv[1:])
    if ranks is not None:
        res = lm_arm.LaunchResult(0, time.monotonic() - t0, None, [f"({joined[2]})", "python", "-m", "moebench.megatron",
                                                                   *sys.argv[1:]], ranks=ranks)
        rec = lm_arm.make_record(arm, plan.context(start), args.repeat, args.repeat, res, args.window,
                                 args.iters).asdict()
        writer.write_jsonl(args.out, [rec])
        print(f"# {disp} arm (validation {plan.validation}, repeat {args.repeat}): {rec['status']} "
              f"{'; '.join(rec['errors'])} -> {args.out}", flush=True)
    lm_rank.finish(0)
    return 0


def cmd_compare(args) -> int:
    """Verdicts from the arm records of several launches (`megatron arm`), grouped by validation."""
    twice = cli.repeated_input(args.files)
    if twice:
        raise LmError(twice)
    recs, held = [], []
    for path in args.files:
        objs = reader.read_objects(path, "moebench.megatron compare", verdict=True)
        recs += [{**r, "_file": path} for r in objs if r.get("schema") == ARM_SCHEMA]
        held += objs
    if not recs:
        raise LmError(f"no Megatron-LM arm records in {', '.join(args.files)} (it holds {reader.holdings(held)}; "
                      "write them with `megatron arm` or `megatron validate`)")
    vet(recs)
    twice = repeated_arm(recs)
    if twice:
        raise LmError(twice)
    groups: dict[str, list[dict]] = {}
    for r in recs:
        groups.setdefault(r["validation"], []).append(r)
    rc = 0
    for val, arms in groups.items():
        print(f"# validation {val}: {len(arms)} arm record(s)")
        rc = max(rc, report_only(arms, args))
    return rc


def repeated_arm(recs: list[dict]) -> str:
    """'' or one line naming an arm record given twice (one validation, dispatcher, repeat, launch order and
    start and end time: one launch), in two files or in one: it would count as two launches."""
    seen: dict[str, dict] = {}
    for r in recs:
        first = seen.setdefault(json.dumps([r.get(k) for k in ARM_IDENTITY], default=str), r)
        if first is not r:
            return (f"{r['_file']}:{r['_line']}: the same arm record as {first['_file']}:{first['_line']} "
                    f"({r['dispatcher']} repeat {r['repeat']}, launch {r['order']} of validation {r['validation']}): "
                    "it would count twice")
    return ""


def report_only(arms: list[dict], args) -> int:
    from tabulate import tabulate
    print(tabulate([row(r) for r in arms], headers=TABLE, tablefmt="simple", disable_numparse=True))
    verdicts = judge(arms, args.min_gain, args.loss_rtol)
    for v in verdicts:
        print(verdict_line(v))
    if args.out and verdicts:
        writer.write_jsonl(args.out, [v.asdict() for v in verdicts])
    return 1 if any(a.get("status") != "PASS" for a in arms) or any(v.verdict in ("FAIL", "REFUSED")
                                                                      for v in verdicts) else 0
