"""The workload: shape, EP degree, payload dtype and routing, validated on construction.

Every rank can regenerate every other rank's tokens and routing from (seed, rank) alone, which
is what lets the oracle (reference.py) and the byte rule (traffic.py) run without gathering
payloads. Routing specs are strings so that they fit on a command line and in a JSONL record:

    uniform            distinct random experts per token
    balanced           every expert gets the same load (benchmark-only forced balance)
    zipf:S             expert popularity ~ 1/rank^S (hot experts)
    group:G:M          DeepSeek group-limited: experts only from the top M of G groups
    trace:FILE         replay topk_idx [N, K] (or [W, T, K]) from a .pt or .npz file
    <base>,masked:P    modifier: a fraction P of top-k slots set to -1
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

FP8_BLOCK = 128
DTYPES = ("bf16", "fp8")


class WorkloadError(ValueError):
    """Bad user input; the CLI prints it as one line and exits 2."""


@dataclass(frozen=True)
class Routing:
    kind: str                  # uniform | balanced | zipf | group | trace
    zipf_s: float = 0.0
    groups: int = 0
    top_groups: int = 0
    trace: str = ""
    masked: float = 0.0

    @staticmethod
    def parse(spec: str) -> "Routing":
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        if not parts:
            raise WorkloadError("--routing is empty (give uniform, balanced, zipf:S, group:G:M or trace:FILE, each "
                                "optionally followed by ,masked:P)")
        fields: dict = {}
        for mod in parts[1:]:
            name, _, val = mod.partition(":")
            if name != "masked":
                raise WorkloadError(f"unknown routing modifier {name!r} (known: masked:P)")
            fields["masked"] = _number(val, mod, float)
            if not 0.0 <= fields["masked"] < 1.0:
                raise WorkloadError(f"masked:P needs 0 <= P < 1, got {val}")
        name, _, rest = parts[0].partition(":")
        args = rest.split(":") if rest else []
        if name in ("uniform", "balanced") and not args:
            return Routing(name, **fields)
        if name == "zipf" and len(args) == 1:
            return Routing("zipf", zipf_s=_number(args[0], parts[0], float), **fields)
        if name == "group" and len(args) == 2:
            g, m = (_number(a, parts[0], int) for a in args)
            return Routing("group", groups=g, top_groups=m, **fields)
        if name == "trace" and rest:
            return Routing("trace", trace=rest, **fields)
        raise WorkloadError(
            f"unknown routing {spec!r} (known: uniform, balanced, zipf:S, group:G:M, trace:FILE, "
            "each optionally followed by ,masked:P)")

    def __str__(self) -> str:
        base = {"zipf": f"zipf:{self.zipf_s:g}", "group": f"group:{self.groups}:{self.top_groups}",
                "trace": f"trace:{self.trace}"}.get(self.kind, self.kind)
        return base + (f",masked:{self.masked:g}" if self.masked else "")


def _number(text: str, spec: str, kind):
    try:
        v = kind(text)
    except ValueError:
        raise WorkloadError(f"bad number {text!r} in routing {spec!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise WorkloadError(f"--routing {spec!r}: {text!r} is not a finite number")
    return v


def _flag(default, flag: str, kind: str, help: str):
    """A Workload field with its command-line flag: every tool that takes the shape reads flag, kind (the
    argument type: count, seed, dtype, str) and help from here (harness/spec.add_workload_args)."""
    return dataclasses.field(default=default, metadata={"flag": flag, "kind": kind, "help": help})


@dataclass(frozen=True)
class Workload:
    """One benchmark case. Fields are per rank; `ep` ranks hold `num_experts // ep` experts each."""
    num_tokens: int = _flag(4096, "--num-tokens", "count", "tokens per rank")
    hidden: int = _flag(7168, "--hidden", "count", "hidden size")
    num_experts: int = _flag(256, "--num-experts", "count", "experts")
    topk: int = _flag(8, "--topk", "count", "experts per token")
    ep: int = _flag(8, "--ep", "count", "expert-parallel ranks")
    dtype: str = _flag("bf16", "--dtype", "dtype", "dispatch payload (combine is bf16)")
    routing: str = _flag("uniform", "--routing", "str",
                         "uniform | balanced | zipf:S | group:G:M | trace:FILE, optionally ,masked:P")
    seed: int = _flag(0, "--seed", "seed", "routing and token seed")
    gpus_per_node: int = _flag(8, "--gpus-per-node", "count",      # ranks r and r' share a node when r // it matches
                               "ranks per NVLink node (byte-rule split)")

    def __post_init__(self):
        for name in ("num_tokens", "hidden", "num_experts", "ep", "gpus_per_node"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.topk <= self.num_experts:
            raise WorkloadError(f"--topk must be in [1, num_experts={self.num_experts}], got {self.topk}")
        if self.num_experts % self.ep:
            raise WorkloadError(f"--num-experts {self.num_experts} is not divisible by --ep {self.ep}")
        if self.dtype not in DTYPES:
            raise WorkloadError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.dtype == "fp8" and self.hidden % FP8_BLOCK:
            raise WorkloadError(f"fp8 needs --hidden divisible by {FP8_BLOCK}, got {self.hidden}")
        r = self.route
        if r.kind == "group":
            if r.groups < 1 or self.num_experts % r.groups or not 1 <= r.top_groups <= r.groups:
                raise WorkloadError(f"group:G:M needs G dividing {self.num_experts} experts and 1 <= M <= G")
            if self.topk > r.top_groups * (self.num_experts // r.groups):
                raise WorkloadError(f"group:{r.groups}:{r.top_groups} leaves fewer than topk={self.topk} experts")
        if r.kind == "zipf" and r.zipf_s < 0:
            raise WorkloadError("zipf:S needs S >= 0")
        if r.kind == "trace":
            load_trace(r.trace, self.topk, self.num_experts)   # fail early and clearly

    @property
    def route(self) -> Routing:
        return Routing.parse(self.routing)

    @property
    def local_experts(self) -> int:
        return self.num_experts // self.ep

    @property
    def bytes_per_token(self) -> int:
        """Payload bytes per token on the wire: bf16 2H; fp8 H + 4 bytes per 128-wide scale."""
        return 2 * self.hidden if self.dtype == "bf16" else self.hidden + 4 * (self.hidden // FP8_BLOCK)

    def replace(self, **kw) -> "Workload":
        return dataclasses.replace(self, **kw)

    def asdict(self) -> dict:
        return dataclasses.asdict(self)


def _generator(w: Workload, rank: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(((w.seed * 1_000_003 + rank) * 7 + stream) % (2**63))


def _fits(nbytes: int, what: str, flags: str) -> None:
    """WorkloadError before a draw larger than this machine's whole memory (an allocator traceback otherwise;
    the tools' preflight refuses far less than this, against the memory that is free)."""
    try:
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return
    if nbytes > have:
        raise WorkloadError(f"{what} would take {nbytes / 2**30:.1f} GiB, more than this machine's "
                            f"{have / 2**30:.1f} GiB of memory: lower {flags}")


def make_tokens(w: Workload, rank: int, device="cpu") -> torch.Tensor:
    """x_TH in bf16, N(0,1), deterministic from (seed, rank); generated on CPU so every device agrees."""
    _fits(4 * w.num_tokens * w.hidden, f"the fp32 tokens [{w.num_tokens}, {w.hidden}]", "--num-tokens or --hidden")
    x = torch.randn(w.num_tokens, w.hidden, generator=_generator(w, rank, 0))
    return x.to(torch.bfloat16).to(device)


def make_routing(w: Workload, rank: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx_TK int64 with -1 for masked slots, topk_w_TK fp32 softmax over the chosen logits)."""
    g = _generator(w, rank, 1)
    r = w.route
    T, E, K = w.num_tokens, w.num_experts, w.topk
    _fits(4 * T * E, f"the fp32 routing scores [{T}, {E}]", "--num-experts or --num-tokens")
    if r.kind == "uniform":
        idx = torch.rand(T, E, generator=g).topk(K, dim=1).indices
    elif r.kind == "balanced":
        idx = _balanced(T, E, K, rank, g)
    elif r.kind == "zipf":
        pop = 1.0 / torch.arange(1, E + 1, dtype=torch.float64) ** r.zipf_s
        pop = pop[torch.randperm(E, generator=torch.Generator().manual_seed(w.seed))]  # same hot set on every rank
        idx = torch.multinomial(pop.expand(T, E).float(), K, replacement=False, generator=g)
    elif r.kind == "group":
        scores = torch.rand(T, E, generator=g)
        per_group = E // r.groups
        group_score = scores.view(T, r.groups, per_group).max(dim=2).values
        keep = group_score.topk(r.top_groups, dim=1).indices
        mask = torch.zeros(T, r.groups, dtype=torch.bool).scatter_(1, keep, True)
        scores = scores.masked_fill(~mask.repeat_interleave(per_group, dim=1), -1.0)
        idx = scores.topk(K, dim=1).indices
    else:
        trace = load_trace(r.trace, K, E)
        rows = (torch.arange(T) + rank * T) % trace.shape[0]
        idx = trace[rows]
    idx = idx.to(torch.int64)
    logits = torch.randn(T, K, generator=g)
    if r.masked:
        masked = torch.rand(T, K, generator=g) < r.masked
        idx = idx.masked_fill(masked, -1)
        logits = logits.masked_fill(masked, float("-inf"))
    weights = torch.softmax(logits, dim=1).nan_to_num(0.0)   # a token with every slot masked gets 0s
    return idx.to(device), weights.to(device)


def _balanced(T: int, E: int, K: int, rank: int, g: torch.Generator) -> torch.Tensor:
    """Token t takes K consecutive experts from (t*K + rank*T*K) mod E: distinct per token (K <= E),
    and every expert gets T*K/E slots per rank whenever E divides T*K (within one otherwise)."""
    start = (torch.arange(T) * K + rank * T * K) % E
    idx = (start[:, None] + torch.arange(K)[None, :]) % E
    return idx[torch.randperm(T, generator=g)]


TRACE_FORMATS = ("a .pt file (torch.save of an integer tensor, or of a dict with key 'topk_idx') or a .npz file "
                 "(key 'topk_idx', else its first array), holding expert ids of shape [N, K] or [W, T, K]")


def _trace_bad(path: str, found: str) -> WorkloadError:
    return WorkloadError(f"routing trace {path}: expected {TRACE_FORMATS}; found {found}")


def _sniff(p: Path, err: Exception) -> str:
    """What a file that torch.load / np.load could not read looks like, in a few words."""
    if isinstance(err, OSError):              # no permission, an I/O error: nothing of it was read
        return f"a file it cannot read ({err.strerror or type(err).__name__})"
    try:
        with open(p, "rb") as f:
            head = f.read(64)
    except OSError as e:
        return f"a file it cannot read ({e.strerror or type(e).__name__})"
    if not head:
        return "an empty file"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):   # a pickle's protocol header
        return "a pickle of objects other than tensors (torch.load(weights_only=True) reads tensors and dicts only)"
    if head[:2] == b"PK":
        return f"a zip archive that {'np.load' if p.suffix == '.npz' else 'torch.load'} cannot read"
    if head.lstrip()[:1] in (b"{", b"["):
        return "text that looks like JSON"
    if all(32 <= c < 127 or c in (9, 10, 13) for c in head):
        return f"a text file ({head[:24].decode(errors='replace').strip()!r}...)"
    return f"binary data that is neither a zip nor a pickle (first bytes {head[:8].hex()})"


def not_a_file(path: str | Path) -> str:
    """'' for a regular file; else what PATH is instead, in a few words (a FIFO is not "no such file")."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return e.strerror or type(e).__name__
    kinds = ((stat.S_ISREG, ""), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe), not a file"),
             (stat.S_ISSOCK, "a socket, not a file"))
    return next((what for test, what in kinds if test(mode)), "a device, not a file")


def _odd_tensor(t: torch.Tensor) -> str:
    """'' for a plain (strided, dense) tensor in memory; else what it is instead: sparse, nested, quantized or
    meta tensors load, but have no values to read as expert ids the way a plain one does."""
    if t.is_nested:
        return "a nested tensor (save t.to_padded_tensor(-1): -1 is a masked slot)"
    if t.layout != torch.strided:
        return f"a sparse tensor ({str(t.layout).removeprefix('torch.')}; save t.to_dense())"
    if t.is_quantized:
        return "a quantized tensor (save t.int_repr())"
    if t.device.type != "cpu":
        return f"a {t.device.type} tensor, which holds no values here"
    return ""


def load_trace(path: str, topk: int, num_experts: int) -> torch.Tensor:
    """Read topk_idx from a trace file (TRACE_FORMATS); one line that says what was expected and what
    was found when it cannot."""
    p = Path(path)
    if not_a_file(p):
        raise _trace_bad(path, not_a_file(p))
    try:
        if p.suffix == ".npz":
            import numpy as np
            with np.load(p) as z:
                if not z.files:
                    raise _trace_bad(path, "an .npz with no arrays")
                t = torch.from_numpy(z["topk_idx"] if "topk_idx" in z else z[z.files[0]])
        else:
            with warnings.catch_warnings():          # torch's notes on odd tensors: the line below says more
                warnings.simplefilter("ignore")
                t = torch.load(p, map_location="cpu", weights_only=True)
            if isinstance(t, dict):
                if "topk_idx" not in t:
                    raise _trace_bad(path, f"a dict with keys {sorted(map(str, t))[:8]} and no 'topk_idx'")
                t = t["topk_idx"]
    except WorkloadError:
        raise
    except Exception as e:  # noqa: BLE001 - any read failure is one clear line
        raise _trace_bad(path, _sniff(p, e)) from None
    if not isinstance(t, torch.Tensor):
        raise _trace_bad(path, f"a {type(t).__name__}, not a tensor")
    if odd := _odd_tensor(t):
        raise _trace_bad(path, odd)
    if t.dim() not in (2, 3) or t.shape[-1] != topk:
        raise _trace_bad(path, f"a tensor of shape {list(t.shape)} (K = --topk {topk})")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise _trace_bad(path, f"a {t.dtype} tensor (expert ids must be integers)")
    t = t.reshape(-1, topk).to(torch.int64)
    if t.numel() == 0 or t.max() >= num_experts or t.min() < -1:
        raise WorkloadError(f"trace {path}: expert ids must lie in [-1, {num_experts})")
    srt = t.sort(dim=1).values
    if ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any():
        raise WorkloadError(f"trace {path}: a token lists the same expert twice")
    return t


def rank_inputs(w: Workload, rank: int, device="cpu"):
    """(x_TH bf16, topk_idx_TK, topk_w_TK, x_fp8, scales) for a rank; fp8 fields None for bf16.

    Everything is made on the host and then moved, so that every device holds the bytes the oracle
    (core/reference.py, which builds on the host) expects: CUDA divides by a scalar as a multiply by its
    reciprocal, so fp8 scales quantized on the GPU differed from the host's in the last bit (59% of them at
    T 4096, H 7168) and every fp8 dispatch failed the oracle there."""
    x = make_tokens(w, rank)
    idx, wt = make_routing(w, rank, device)
    q, s = fp8_quantize(x) if w.dtype == "fp8" else (None, None)
    move = lambda t: t.to(device) if t is not None else None       # noqa: E731
    return move(x), idx, wt, move(q), move(s)


def fp8_quantize(x_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, per-128-column blocks: scale = amax/448, returns (x_fp8 e4m3 [T,H], scales fp32 [T,H/128])."""
    T, H = x_TH.shape
    blocks = x_TH.float().view(T, H // FP8_BLOCK, FP8_BLOCK)
    scales = blocks.abs().amax(dim=2).clamp(min=1e-4) / 448.0
    q = (blocks / scales[..., None]).to(torch.float8_e4m3fn).view(T, H)
    return q, scales


def fp8_dequantize(q_TH: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    T, H = q_TH.shape
    return (q_TH.float().view(T, H // FP8_BLOCK, FP8_BLOCK) * scales[..., None]).view(T, H)


def describe(w: dict, tokens: bool = True) -> str:
    """One line naming a workload record (``Workload.asdict()``) for tables and plots; without
    tokens it names the shape family a token sweep runs over."""
    s = f"H={w['hidden']} E={w['num_experts']} K={w['topk']} EP={w['ep']} {w['dtype']} {w['routing']}"
    if w["ep"] > w.get("gpus_per_node", 8):
        s += f" {w['gpus_per_node']}/node"
    return f"T={w['num_tokens']} {s}" if tokens else s
