"""The sub-shapes of a moebench.dispatch record, one dataclass each: timing (the api view's statistics),
a timing view, traffic (the byte rule's figures), the check, shared-GPU ranks, overlap. A record field is a
dataclass field here; the record is written as their dicts (`asdict`), readers get plain dicts back.
Units live in key names."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields


def quantile(sorted_values: list[float], p: float) -> float:
    """The p-quantile by nearest rank (the p10 / p90 of every timing)."""
    t = sorted_values
    return t[min(len(t) - 1, max(0, math.ceil(p * len(t)) - 1))]


def _compact(obj, optional: tuple[str, ...]) -> dict:
    return {k: v for k, v in asdict(obj).items() if not (k in optional and v in (None, "", {}, []))}


# CollectiveX's samples per cell: 256 trials x 8 iterations, p50 to p99 of the per-iteration max over ranks
# (SemiAnalysisAI/InferenceX experimental/CollectiveX; ../shared/notes/peers-2026-12.md section 5); --tails times
# at least this many iterations
TAIL_ITERS = 2048
TAIL_QUANTILES = (("p99_us", 0.99), ("p999_us", 0.999))


@dataclass
class Tails:
    """The tail and the straggler of a timed loop, from every rank's per-iteration times (NCCL EP's ep_bench names
    its min and max rank; CollectiveX keeps p99 of the cross-rank max). A quantile p is given only where a sample
    lies beyond it, n >= 1 / (1 - p) (p99 from 100 samples, p999 from 1000): the top one of 20 is their max, not
    a p99; `tails_note` says why one is missing. The slowest rank is the one that was slowest in the most
    iterations (the lowest rank on a tie), `slowest_rank_share` the fraction of them; `per_rank_us` each rank's
    median, in rank order."""
    p99_us: float | None = None
    p999_us: float | None = None
    tails_note: str = ""
    slowest_rank: int | None = None
    slowest_rank_share: float | None = None
    per_rank_us: list[float] | None = None

    @classmethod
    def of(cls, per_rank_us: list[list[float]]) -> Tails:
        """From [rank][iteration] microseconds (every rank the same number of iterations)."""
        if not per_rank_us or not per_rank_us[0]:
            return cls()
        per_iter = [max(col) for col in zip(*per_rank_us)]
        n, t = len(per_iter), sorted(per_iter)
        out, missing = cls(), []
        for key, p in TAIL_QUANTILES:
            need = round(1 / (1 - p))
            if n >= need:
                setattr(out, key, t[min(n - 1, max(0, math.ceil(p * n) - 1))])
            else:
                missing.append(f"{key.removesuffix('_us')} needs >= {need} samples")
        if missing:
            out.tails_note = f"{n} samples: {', '.join(missing)} (--tails times {TAIL_ITERS})"
        wins = [0] * len(per_rank_us)
        for col in zip(*per_rank_us):
            wins[col.index(max(col))] += 1
        out.slowest_rank = wins.index(max(wins))
        out.slowest_rank_share = wins[out.slowest_rank] / n
        out.per_rank_us = [round(statistics.median(r), 3) for r in per_rank_us]
        return out

    def asdict(self) -> dict:
        return _compact(self, tuple(f.name for f in fields(self)))


@dataclass
class Timing:
    """A phase's api-view statistics over iterations (each the max over ranks of that iteration)."""
    timer: str
    iters: int
    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    samples_us: list[float]
    launch: str = ""                 # where the host's launch of the call sits against the timed span
    rank_agg: str = "max over ranks per iteration"
    kernel_sum_us: float | None = None       # CUDA: the sum of the phase's kernels per call
    kernel_busy_us: float | None = None      # CUDA: the GPU time they cover (less than the sum where they overlap)
    library_us: float | None = None          # CUDA: of the kernel sum, the backend library's own kernels
    moebench_us: float | None = None         # ... moebench's kernels (its permute / unpermute)
    torch_us: float | None = None            # ... torch's kernels and runtime copies (glue, whoever queued it)
    host_us: float | None = None             # what the median holds beyond that (None: within noise, host_note)
    host_note: str = ""
    api_minus_graph_us: float | None = None  # the host overhead a step pays without CUDA graphs
    p99_us: float | None = None              # Tails: the tail (None: too few samples, tails_note says why)
    p999_us: float | None = None
    tails_note: str = ""
    slowest_rank: int | None = None          # the rank slowest in the most iterations, and in what share of them
    slowest_rank_share: float | None = None
    per_rank_us: list[float] | None = None   # each rank's median

    @classmethod
    def of(cls, times_s: list[float], timer: str, per_rank_s: list[list[float]] | None = None) -> Timing:
        """From the per-iteration max over ranks (seconds); per_rank_s, every rank's own times, gives the Tails."""
        samples = [x * 1e6 for x in times_s]
        t = sorted(samples)
        tails = Tails.of([[x * 1e6 for x in r] for r in per_rank_s]) if per_rank_s else Tails()
        return cls(timer, len(t), statistics.median(t), quantile(t, 0.10), quantile(t, 0.90), t[0], samples,
                   **asdict(tails))

    def asdict(self) -> dict:
        d = _compact(self, ("launch", "kernel_sum_us", "kernel_busy_us", "library_us", "moebench_us", "torch_us",
                            "host_us", "host_note", "api_minus_graph_us", *field_names(Tails)))
        d["samples_us"] = [round(x, 3) for x in self.samples_us]
        return d


@dataclass
class View:
    """One timing view of a phase (harness/views): its figure `us`, the max over ranks, how it was taken,
    per-iteration samples for the views that keep them, and what else that view records (`extra`, flat)."""
    us: float
    max_over_ranks_us: float
    aggregation: str
    samples_us: list[float] | None = None
    extra: dict = field(default_factory=dict)

    def asdict(self) -> dict:
        d = {"us": self.us, "max_over_ranks_us": self.max_over_ranks_us, "aggregation": self.aggregation}
        if self.samples_us is not None:
            d["samples_us"] = [round(x, 3) for x in self.samples_us]
        return {**d, **self.extra}


def view_none(why: str) -> dict:
    """A view the backend cannot give (the record says why)."""
    return {"none": why}


def view_fail(why: str) -> dict:
    """A view that gave wrong data or hung: the backend's check is FAIL."""
    return {"fail": why}


@dataclass
class Traffic:
    """The byte rule's figures of a phase (core/traffic.py), mean over ranks, with GB/s and ceilings once timed."""
    pairs: float | None = None
    bytes: float | None = None
    bus_bytes: float | None = None
    nvlink_bytes: float | None = None
    net_bytes: float | None = None
    wire_bytes: float | None = None
    upstream: dict | None = None             # every upstream / peer byte rule (core/traffic.py, peer_rules.py)
    algbw_GBps: float | None = None
    busbw_GBps: float | None = None
    nvlink_GBps: float | None = None
    net_GBps: float | None = None
    wirebw_GBps: float | None = None
    ceiling_GBps: float | None = None
    ceiling_source: str | None = None
    frac_of_ceiling: float | None = None
    measured_ceiling_GBps: float | None = None
    frac_of_measured: float | None = None
    note: str | None = None                  # a phase that moves no payload

    def asdict(self) -> dict:
        timed = self.algbw_GBps is not None
        keep = {"ceiling_GBps", "ceiling_source"} if timed else set()
        return {k: v for k, v in asdict(self).items() if v is not None or k in keep}


@dataclass
class Check:
    status: str                              # PASS | FAIL | WAIVED
    error: str | None = None
    crash: str | None = None                 # the signal that killed a rank, or "hang"
    native_bytes: dict | None = None         # the backend's own byte count beside moebench/1's (dispatch)

    def asdict(self) -> dict:
        return _compact(self, ("crash", "native_bytes"))


@dataclass
class Repeat:
    """One of a case's --repeats N runs, each backend in fresh rank processes, the backend order rotated by one
    every repeat (AWS's fair EP comparison: process starts, not iterations, are the independent samples)."""
    index: int                               # 0 .. of - 1
    of: int
    order: list[str]                         # the backends in the order this repeat ran them
    run: str                                 # the repeated run's id (its start time and pid): pairs are (run, index)

    def asdict(self) -> dict:
        return asdict(self)


@dataclass
class SharedGpu:
    ranks_per_gpu: int
    bypassed: list[str]
    note: str

    def asdict(self) -> dict:
        return asdict(self)


@dataclass
class Overlap:
    """A phase under a concurrent GEMM (harness/overlap.py)."""
    gemm: str
    comm_alone_us: float
    gemm_alone_us: float
    gemm_alone_p90_us: float
    overlapped_us: float
    overlapped_p10_us: float
    overlapped_p90_us: float
    gemm_overlapped_us: float
    exposed_us: float
    gemm_slowdown: float
    order: str = "GEMM alone and overlapped alternate per iteration"

    def asdict(self) -> dict:
        return asdict(self)


def field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def binomial_upper(k: int, n: int, conf: float = 0.95) -> float:
    """One-sided upper confidence bound of a rate seen k times in n trials (Clopper-Pearson): the p at which
    seeing k or fewer has probability 1 - conf (k = 0: 1 - (1 - conf)^(1/n), 3/n for large n)."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        (lo, hi) = (mid, hi) if _binom_cdf(k, n, mid) > 1 - conf else (lo, mid)
    return hi


def _binom_cdf(k: int, n: int, p: float) -> float:
    import math
    if p <= 0:
        return 1.0
    if p >= 1:
        return 0.0 if k < n else 1.0
    lp, lq = math.log(p), math.log1p(-p)
    log_choose = lambda i: math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)  # noqa: E731
    return min(1.0, sum(math.exp(log_choose(i) + i * lp + (n - i) * lq) for i in range(k + 1)))


@dataclass
class Soak:
    """N calls, each on freshly drawn routing and tokens, every output checked against the oracle (and, where
    the backend has a graph-safe call, N replays of its graph, each checked): the rate of silent corruption."""
    calls: int                               # calls made (fewer than asked when the run stopped)
    asked: int
    corrupted_calls: int                     # calls with a wrong row or token on any rank
    corrupted_rows: int                      # dispatched rows not the oracle's, summed over ranks and calls
    corrupted_tokens: int                    # combined tokens off the oracle, summed over ranks and calls
    first_bad_call: int | None
    bad: list[dict]                          # the first bad calls: call, rank, experts and rows, tokens, error
    upper_95: float                          # one-sided 95% upper bound of the corrupted-call rate
    summary: str                             # "0 of 2000: < 0.15% at 95%" / "3 of 2000 (0.15%): FAIL"
    graph: dict | None = None                # {replays, corrupted, first} or {none: why}
    stopped: dict | None = None              # {call, how}: the call a crash or hang stopped the soak at
    budget: dict | None = None               # {by: --soak-seconds | --timeout, calls}: its time ran out first
    stage_ms: dict | None = None             # ms per checked call by stage, the slowest rank's (harness/soak.py)
    checked_on: str | None = None            # cpu | cuda: where the oracle ran (the host when ranks share a GPU)
    rebuilt: dict | None = None              # --soak-recreate: {every, count, median_ms, max_ms} (slowest rank each)

    def asdict(self) -> dict:
        return _compact(self, ("graph", "stopped", "budget", "stage_ms", "checked_on", "rebuilt"))


MEMORY_KEYS = ("buffers_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "footprint_bytes")


@dataclass
class Memory:
    """What the backend holds per rank at this shape (harness/memory.py says how each figure is read):
    buffers outside torch (driver after setup minus before, less torch's own growth), torch's peaks while
    the api view times the phases, footprint = buffers + peak reserved; `max` over ranks. On CPU: `none` with why, and
    host RSS per rank."""
    per_rank: list[dict]
    max: dict | None = None                  # MEMORY_KEYS -> the largest over ranks
    source: str | None = None                # nvml (this process) | device (the whole GPU: other ranks too)
    none: str | None = None                  # why there is no device figure
    note: str | None = None

    @classmethod
    def of(cls, per_rank: list[dict], shared: bool) -> Memory | None:
        if not per_rank:
            return None
        whys = [r["none"] for r in per_rank if r.get("none")]
        if whys:
            return cls(per_rank, none=whys[0])
        sources = sorted({r["source"] for r in per_rank})
        note = None
        if shared:
            note = "ranks share GPUs: per-rank figures of a functional run"
            if "device" in sources:
                note += "; the device-wide reading also counts the other ranks' setup on that GPU"
        return cls(per_rank, {k: max(r[k] for r in per_rank) for k in MEMORY_KEYS}, "+".join(sources), note=note)

    def asdict(self) -> dict:
        return _compact(self, ("max", "source", "none", "note"))


@dataclass
class Fault:
    """An injected fault (--inject, harness/fault.py): what was done to which rank, what every rank then did
    (`ranks`: rank, pid, ended: error | signal | done | watchdog | killed | stalled..., after_s since the fault, seen:
    the first line of its error), the verdict (detects in X s | watchdog only | rides out in X s | hangs | not
    injected) and its seconds (the last survivor's end, or the watchdog's firing)."""
    injected: str                            # kill:RANK@CALL | stall:RANK@CALL:SECONDS
    what: str
    verdict: str
    after_s: float | None
    ranks: list[dict]
    watchdog_s: float | None = None          # moebench's watchdog: --timeout after the fault
    left: list[int] = field(default_factory=list)   # ranks still alive after moebench's SIGKILL (hangs)
    note: str | None = None

    def asdict(self) -> dict:
        return _compact(self, ("watchdog_s", "note"))


SETUP_KEYS = ("group_ms", "build_ms", "first_call_ms", "destroy_ms", "recreate_ms", "recreate_first_call_ms")


@dataclass
class Setup:
    """What a backend costs before its first useful call, per rank, in ms (harness/setupcost.py says how each is
    taken): `group_ms` init_process_group (it waits for the last rank to join), `build_ms` the backend's
    construction and setup (buffers, handles, their IPC exchange, an NCCL EP group), `first_call_ms` the first
    dispatch + combine (JIT compiles, lazy allocations and registrations; `first_dispatch_ms`, `first_combine_ms`),
    and with --recreate `destroy_ms` (teardown), `recreate_ms` (construction + setup again) and
    `recreate_first_call_ms`. `max`: each the largest over ranks; `setup_ms`: the largest build + first call, the
    table's `setup ms`."""
    per_rank: list[dict]
    max: dict
    setup_ms: float | None
    note: str | None = None

    @classmethod
    def of(cls, per_rank: list[dict], note: str | None = None) -> Setup | None:
        if not per_rank:
            return None
        top = {k: max(r[k] for r in per_rank if r.get(k) is not None) for k in SETUP_KEYS
               if any(r.get(k) is not None for r in per_rank)}
        both = [r["build_ms"] + r["first_call_ms"] for r in per_rank
                if r.get("build_ms") is not None and r.get("first_call_ms") is not None]
        return cls(per_rank, top, round(max(both), 3) if both else None, note)

    def asdict(self) -> dict:
        return _compact(self, ("note",))
