"""One rank of a Megatron-LM arm: runs PATH/pretrain_gpt.py in this process and reports what ran.

    python -m moebench.megatron.lm.rank --meta META.json -- PATH/pretrain_gpt.py ARGS...

torchrun or srun starts one such process per rank (the local validation does it through torchrun;
`megatron arm` does the same work in-process under the user's own launcher). Before pretrain_gpt.py
runs, each rank (1) prepares shared-GPU ranks where asked (megatron/patches.py), (2) hooks Megatron-
Core's token dispatchers to count the calls each dispatcher class (and flex comm manager) serves, and
(3) copies what Megatron prints into its training log (iteration lines, memory reports, the argument
dump) while it still goes to stdout. After training, every rank reports to rank 0: the dispatchers that
ran and the comm buffer built (proof the dispatcher ran, on every rank), its parsed arguments, its
memory (torch's peaks and the driver's view: DeepEP/HybridEP buffers live outside torch's allocator)
and its log lines. Rank 0 writes the reports as JSON. A rank whose training raises prints the traceback
and exits 1 at once, so that the launcher ends the arm instead of waiting on the other ranks.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import runpy
import socket
import sys
import traceback
from dataclasses import asdict, dataclass

from . import log as lm_log

RANK_KEYS = ("rank", "local_rank", "world_size")     # arguments that differ between ranks by design
ARG_FIELDS = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_flex_dispatcher_num_sms",
              "moe_deepep_num_sms", "moe_hybridep_num_sms", "expert_model_parallel_size",
              "tensor_model_parallel_size", "pipeline_model_parallel_size", "world_size", "distributed_backend",
              "transformer_impl", "num_experts", "moe_router_topk", "seq_length", "micro_batch_size",
              "global_batch_size", "train_iters", "seed", "moe_router_force_load_balancing", "fp8",
              "overlap_moe_expert_parallel_comm")
MAX_LINES = 20000


@dataclass
class RankMeta:
    """What the launching side tells every rank."""
    dispatcher: str
    ranks_per_gpu: int = 1
    result: str | None = None        # rank 0 writes the ranks' reports here (JSON)
    hidden: int | None = None        # the model's hidden size: DeepEP's buffer-size gate


class Capture(io.TextIOBase):
    """stdout that keeps the lines log.py reads (iteration lines, memory reports, the argument dump)."""

    def __init__(self, stream):
        self._s, self._part, self.lines, self._in_args = stream, "", [], False

    def write(self, text):
        self._s.write(text)
        self._part += text
        *done, self._part = self._part.split("\n")
        for line in done:
            self._keep(line)
        return len(text)

    def _keep(self, line):
        if lm_log.ARGS_BEGIN.search(line) and not lm_log.ARGS_END.search(line):
            self._in_args = True
        interesting = self._in_args or lm_log.ITERATION.search(line) or lm_log.MEMORY.search(line)
        if lm_log.ARGS_END.search(line):
            self._in_args = False
        if interesting and len(self.lines) < MAX_LINES:
            self.lines.append(line)

    def flush(self):
        self._s.flush()

    def fileno(self):
        return self._s.fileno()

    @property
    def encoding(self):
        return getattr(self._s, "encoding", "utf-8")


class Evidence:
    """Counts token_dispatch calls per (dispatcher class, flex comm manager class) on this rank."""

    def __init__(self):
        self.calls: dict[tuple[str, str | None], int] = {}
        self.error = ""

    def install(self) -> None:
        try:
            from megatron.core.transformer.moe import token_dispatcher as td
        except Exception as e:  # noqa: BLE001 - reported: no evidence then
            self.error = f"cannot import Megatron-Core's token dispatchers: {type(e).__name__}: {e}"
            return
        for cls in vars(td).values():
            if isinstance(cls, type) and issubclass(cls, td.MoETokenDispatcher) and "token_dispatch" in vars(cls):
                cls.token_dispatch = self._wrap(cls.__dict__["token_dispatch"])

    def _wrap(self, orig):
        def token_dispatch(dispatcher, *args, **kwargs):
            mgr = getattr(dispatcher, "_comm_manager", None)
            key = (type(dispatcher).__name__, type(mgr).__name__ if mgr is not None else None)
            self.calls[key] = self.calls.get(key, 0) + 1
            return orig(dispatcher, *args, **kwargs)
        return token_dispatch

    def report(self) -> dict:
        return {"dispatchers": [{"class": c, "manager": m, "calls": n} for (c, m), n in sorted(self.calls.items(),
                                                                                               key=str)],
                "buffer": comm_buffer(), "error": self.error}


def comm_buffer() -> dict | None:
    """The DeepEP / HybridEP buffer Megatron built (fused_a2a's globals): its class and sizes."""
    try:
        from megatron.core.transformer.moe import fused_a2a as fa
    except Exception:  # noqa: BLE001
        return None
    for attr in ("_buffer", "_hybrid_ep_buffer"):
        b = getattr(fa, attr, None)
        if b is not None:
            info = {"class": f"{type(b).__module__}.{type(b).__name__}", "megatron_global": attr}
            info.update({k: v for k, v in vars(b).items() if isinstance(v, (int, bool, str)) and not k.startswith("_")
                         and len(info) < 24})
            return info
    return None


def megatron_args() -> tuple[dict, str | None]:
    """(the dispatcher-relevant arguments Megatron parsed on this rank, a digest of all of them but the
    rank's own): every rank must have parsed the same command."""
    try:
        from megatron.training import get_args
        args = vars(get_args())
    except Exception:  # noqa: BLE001 - a Megatron without megatron.training, or not initialised
        return {}, None
    plain = {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in args.items()}
    digest = hashlib.sha256(json.dumps({k: v for k, v in plain.items() if k not in RANK_KEYS}, sort_keys=True,
                                       default=str).encode()).hexdigest()[:16]
    return {k: plain.get(k) for k in ARG_FIELDS if k in plain}, digest


def memory(ranks_per_gpu: int) -> dict:
    try:
        import torch
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return {"device": "cpu"}
        from ...env.gpumem import snapshot
        dev = torch.cuda.current_device()
        return {"device": f"cuda:{dev}", "ranks_sharing_gpu": ranks_per_gpu, **snapshot(dev)}
    except Exception as e:  # noqa: BLE001 - memory is a report, never a failure
        return {"error": f"{type(e).__name__}: {e}"}


def prepare(meta: RankMeta) -> list[str]:
    """Before pretrain_gpt.py: shared-GPU ranks, the flex backends' own setup. Returns what was changed."""
    changed = []
    if meta.ranks_per_gpu > 1:
        from ..patches import share_gpus
        changed += share_gpus(meta.ranks_per_gpu)
    if meta.dispatcher == "deepep":
        from ...backends.deepep_family import deepep_flex_setup
        world = int(os.environ.get("WORLD_SIZE", "1"))
        changed += deepep_flex_setup(world, meta.hidden or 0, meta.ranks_per_gpu)
    elif meta.dispatcher == "hybridep":
        from ...backends.deepep_family import cuda_home
        changed.append(f"CUDA_HOME={cuda_home()} (HybridEP's kernel JIT)")
    return changed


def train(pretrain: str, args: list[str]) -> None:
    """pretrain_gpt.py as `python pretrain_gpt.py ARGS`, run as __main__ (its folder is already first on
    sys.path). SystemExit 0 is a normal end; another code raises RuntimeError."""
    sys.argv = [pretrain, *args]
    try:
        runpy.run_path(pretrain, run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise RuntimeError(f"pretrain_gpt.py exited with {e.code}") from None


def run(meta: RankMeta, pretrain: str, args: list[str]) -> list[dict] | None:
    """Train on this rank, then gather every rank's report: the list on rank 0, None elsewhere. A rank
    whose training fails prints why and ends the process with exit 1."""
    out = Capture(sys.stdout)
    sys.stdout = out
    # the checkout's own megatron/ first, as `python pretrain_gpt.py` has it, before anything imports Megatron:
    # the hooks and patches must reach the modules pretrain_gpt.py runs
    sys.path.insert(0, os.path.dirname(os.path.abspath(pretrain)))
    try:
        changed = prepare(meta)
        ev = Evidence()
        ev.install()
        train(pretrain, args)
    except BaseException:  # noqa: BLE001 - the launcher must end the arm now, not after a collective timeout
        sys.stdout = out._s
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout = out._s
    arg_fields, digest = megatron_args()
    report = {"rank": int(os.environ.get("RANK", "0")), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
              "host": socket.gethostname(), "pid": os.getpid(), "setup": changed, "evidence": ev.report(),
              "args": arg_fields, "args_digest": digest, "memory": memory(meta.ranks_per_gpu), "lines": out.lines}
    return gather(report)


def gather(report: dict) -> list[dict] | None:
    import torch.distributed as dist
    if not dist.is_initialized():
        return [report]
    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(report, everyone, dst=0)
    return everyone


def finish(code: int) -> None:
    """End the process without the libraries' exit handlers (NVSHMEM's finalize or a DeepEP buffer's
    destructor can hang once training is done); output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        sys.exit("usage: python -m moebench.megatron.lm.rank --meta META.json -- PATH/pretrain_gpt.py ARGS...")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m moebench.megatron.lm.rank")
    p.add_argument("--meta", required=True, help="JSON of RankMeta")
    with open(p.parse_args(argv[:cut]).meta) as f:
        meta = RankMeta(**json.load(f))
    reports = run(meta, argv[cut + 1], argv[cut + 2:])
    if reports is not None and meta.result:
        tmp = meta.result + ".part"
        with open(tmp, "w") as f:
            json.dump({"meta": asdict(meta), "ranks": reports}, f, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, meta.result)
    finish(0)


if __name__ == "__main__":
    main()
