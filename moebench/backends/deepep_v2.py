"""`deepep-v2`: DeepEP V2's `deep_ep.ElasticBuffer` (DeepEP main 2.1 / branch epv2-release 2.0: NCCL's Gin and LSA
windows instead of NVSHMEM for its own kernels, which it compiles at run time with nvcc). No Megatron-Core release
has a path to it (`deepepv2` exists only on Megatron-LM's dev branch).

dispatch(x, topk_idx, topk_weights, num_experts, num_max_tokens_per_rank): each token reaches a rank once, rows
ordered by source rank, with local expert ids (-1 elsewhere) and the received top-k weights; moebench groups them by
local expert with ops.permute, each row with its weight, which the experts apply (Megatron's dispatch_postprocess),
and sums each received token's expert rows, unweighted, before combine, which is a plain sum (as `deepep`). Knob
`expand=1` instead lets DeepEP expand in its kernel (`do_expand`: one row per (token, local expert), grouped per
expert, with its weight), as its test's "expanded dispatch"; the experts' rows then go to combine as they are; with
alignment 1, since DeepEP returns only the padded per-expert counts and the oracle needs the true ones. fp8 travels as (e4m3 [T,H], fp32 scales
[T,H/128]), the scale form its tests use, so the oracle checks rows and scales bit for bit.

Timing, as tests/elastic/test_ep.py: it times kernels only (bench_kineto: the L2 flushed and the ranks met with
buffer.barrier() behind a ~10 ms sleep kernel before each call; dispatch = `dispatch_impl`, combine =
`combine_impl`, the copy and reduce epilogues reported apart): the `kernel` view, timed so (`kernel_view`). Combine
passes the received top-k weights, as its test does (DeepEP carries them back beside the rows: they are part of its
combine bytes; it does not apply them). `cached`: dispatch with the checked dispatch's handle (no CPU
sync) and the SMs that dispatch used, as its "cached dispatch" (DeepEP refuses a cached expanded dispatch). Byte
rule of its test (`traffic.deepep_v2_row_bytes`, checked against native_bytes): received (token, rank) rows, local
included, x their payload plus scales plus the top-k ids (int64) and weights (fp32) it sends along. Knobs are what
its test sets per run: num_sms (0: DeepEP's get_theoretical_num_sms), num_qps (0: get_theoretical_num_qps; a count
above the allocated QPs asserts, so the buffer allocates what is asked, as its test does), allow_hybrid_mode,
allow_multiple_reduction, prefer_overlap_with_compute, deterministic. The SMs and QPs each call used are recorded.
Shared-GPU ranks run without NCCL GIN (EP_DISABLE_GIN=1, a named bypass): NCCL has no GIN between ranks of one GPU.
Compiled kernels are cached in EP_JIT_CACHE_DIR (DeepEP's default $HOME/.deep_ep), recorded in the knobs.

Legend: T tokens, H hidden, K top-k, L local experts, N received tokens, R grouped rows.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..core import traffic
from ..core.reference import counts
from ..core.workload import WorkloadError
from ..env.toolkit import dist_version, installed, package_file
from .base import OPS_IMPL, SWITCH, Dispatched, Knob, Unavailable
from .deepep_family import Grouped, group_by_local_expert, unpermuted_rows
from .nccl_family import GIN_ENV, GIN_NOTE, NcclFamily, native_output

INSTALL = ("install DeepEP V2 (deepseek-ai/DeepEP main, or branch epv2-release) in its own environment: it needs NCCL "
           ">= 2.30.4 at build and run time (EP_NCCL_ROOT_DIR) and shares the package name deep_ep with V1")
SWITCHES = {"allow_hybrid_mode": True, "allow_multiple_reduction": True, "prefer_overlap_with_compute": False,
         "deterministic": False}           # ElasticBuffer's switches; prefer_overlap... as its test (False)


@dataclass
class _Handle:
    native: object
    grouped: Grouped | None        # None when DeepEP expanded the rows itself
    recv_idx_NK: torch.Tensor | None
    recv_w: torch.Tensor           # [N, K] received top-k weights, or [R] per expanded row
    rows: int                      # received (token, rank) rows, or expanded rows
    row_bytes: int = 0             # what one received row carries (x, scales, top-k ids and weights): test_ep's count


class DeepEPV2Backend(NcclFamily):
    name = "deepep-v2"
    dedup = True
    supports_fp8 = True
    KNOBS = {"num_sms": Knob(low=0), "num_qps": Knob(low=0), "expand": SWITCH, "ops_impl": OPS_IMPL,
             **{k: SWITCH for k in SWITCHES}}
    comm_kernels = ("dispatch_impl", "combine_impl")        # test_ep.py's bench_kineto names
    kernel_view = "bench_kineto"                              # its kernel view times each call as test_ep.py does
    shared_gpu_bypasses = {GIN_ENV: GIN_NOTE}
    no_cached_view = "DeepEP V2 refuses a cached dispatch of expanded rows (expand=1)"
    no_graph_view = "DeepEP V2 claims no CUDA-graph support and has no graph test (not captured here)"

    @classmethod
    def available(cls):
        """deep_ep installed and V2 (its package holds buffers/elastic.py), read from the files: never imported here."""
        if not installed("deep_ep"):
            return False, f"deep_ep not installed; {INSTALL}"
        if package_file("deep_ep", "buffers/elastic.py") is None:
            return False, (f"deep_ep here is V1 ({dist_version('deep_ep', 'deep-ep') or 'no version'}, no "
                           f"deep_ep/buffers/elastic.py: no ElasticBuffer); {INSTALL}")
        return True, ""

    @classmethod
    def version(cls):
        return dist_version("deep_ep", "deep-ep") or ""

    @classmethod
    def cpu_problem(cls, knob_values):
        return "DeepEP V2 runs on CUDA GPUs only (its kernels are compiled for the GPU at run time)"

    @classmethod
    def buffer_bytes(cls, w):
        return w.ep * w.num_tokens * (w.bytes_per_token + 2 * w.hidden + 12 * w.topk)

    def validate(self, w, world):
        super().validate(w, world)
        row = w.hidden * (1 if w.dtype == "fp8" else 2)
        if row % 16:
            raise WorkloadError(f"deepep-v2 moves rows in 16-byte words: {w.dtype} rows of --hidden {w.hidden} are "
                                f"{row} bytes")

    def setup(self, group, w, device):
        super().setup(group, w, device)
        self.nccl_setup("deepep-v2 (DeepEP V2)")
        self.deep_ep = _import_v2()
        self.impl = self.knob_values.get("ops_impl", "auto")
        self.expand = bool(self.knob_values.get("expand", 0))
        self.sms, self.qps = int(self.knob_values.get("num_sms", 0)), int(self.knob_values.get("num_qps", 0))
        flags = {k: bool(self.knob_values.get(k, v)) for k, v in SWITCHES.items()}
        with native_output("deepep-v2: ElasticBuffer (NCCL communicator, buffers)"):
            self.buffer = self.deep_ep.ElasticBuffer(group, num_max_tokens_per_rank=w.num_tokens, hidden=w.hidden,
                                                     num_topk=w.topk, use_fp8_dispatch=w.dtype == "fp8",
                                                     num_allocated_qps=self.qps, explicitly_destroy=True, **flags)
        self.flags, self.used_sms = flags, None

    def sms_used(self):
        return self.used_sms

    def knobs(self):
        buf = getattr(self, "buffer", None)
        auto = buf.get_theoretical_num_qps(self.used_sms) if buf is not None and self.used_sms else None
        qps = {"num_qps_used": self.qps or auto, "num_allocated_qps": getattr(buf, "num_allocated_qps", None)}
        return {**super().knobs(), "expand": getattr(self, "expand", None), **qps,
                **getattr(self, "flags", {}), "libnccl": getattr(self, "nccl", None),
                "jit_cache_dir": os.environ.get("EP_JIT_CACHE_DIR", os.path.expanduser("~/.deep_ep")),
                "deep_ep_version": getattr(getattr(self, "deep_ep", None), "__version__", None)}

    def _payload(self, x_TH, scales_TS):
        return (x_TH, scales_TS) if scales_TS is not None else x_TH

    def dispatch(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS=None):
        w = self.w
        with self.first_call("dispatch"):
            recv, recv_idx, recv_w, native, _ = self.buffer.dispatch(
                self._payload(x_TH, scales_TS), topk_idx=topk_idx_TK.to(self.deep_ep.topk_idx_t),
                topk_weights=topk_w_TK.float(), num_experts=w.num_experts, num_max_tokens_per_rank=w.num_tokens,
                expert_alignment=1 if self.expand else None, num_sms=self.sms, num_qps=self.qps,
                do_expand=self.expand)
        self.used_sms = getattr(native, "num_sms", None)
        recv_x, recv_s = recv if isinstance(recv, tuple) else (recv, None)
        if self.expand:                     # grouped per local expert by DeepEP
            counts = list(native.num_recv_tokens_per_expert_list)
            return Dispatched(recv_x, counts, _Handle(native, None, None, recv_w, recv_x.shape[0]), recv_s, recv_w)
        g = group_by_local_expert(recv_x, recv_idx, recv_w, w.local_experts, recv_s, impl=self.impl)
        row_bytes = sum(t.element_size() * t.shape[1] for t in (recv_x, recv_s, recv_idx, recv_w) if t is not None)
        return Dispatched(g.x_RH, g.tokens_per_expert, _Handle(native, g, recv_idx, recv_w, recv_x.shape[0], row_bytes),
                          g.scales_RS, g.probs_R)

    def combine(self, y_RH, handle: _Handle):
        with self.first_call("combine"):
            out = self._combine(y_RH, handle)
        self.first = False
        return out

    def _combine(self, y_RH, h: _Handle):
        # expanded rows go back as the experts wrote them (DeepEP sums them per token); else each received token's
        # expert rows summed first (Megatron's combine_preprocess unpermute)
        rows = y_RH[: h.rows] if h.grouped is None else unpermuted_rows(y_RH, h.grouped, self.impl)
        # the received weights travel back beside the rows, as test_ep.py's combine passes them (not applied there)
        return self.buffer.combine(rows, h.native, topk_weights=h.recv_w)[0]

    def cached_phases(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """test_ep.py's cached dispatch, dispatch(x, handle=) (no CPU sync), then the same grouping with the row count
        known; combine is the api call. DeepEP refuses a cached expanded dispatch."""
        h: _Handle = d.handle
        if h.grouped is None:
            return {}
        rows = sum(counts(d.tokens_per_expert))

        def dispatch():             # the handle's SMs: with num_sms=0 DeepEP would size them from num_experts=None
            recv = self.buffer.dispatch(self._payload(x_TH, scales_TS), handle=h.native, num_sms=h.native.num_sms,
                                        num_qps=self.qps)[0]
            recv_x, recv_s = recv if isinstance(recv, tuple) else (recv, None)
            g = group_by_local_expert(recv_x, h.recv_idx_NK, h.recv_w, self.w.local_experts, recv_s, num_rows=rows,
                                      impl=self.impl)
            return Dispatched(g.x_RH, d.tokens_per_expert, h, g.scales_RS, g.probs_R)
        return {"dispatch": dispatch, "combine": lambda: self._combine(y_RH, h)}

    def chained_plan(self, x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH):
        """test_ep.py's cached pair (the handle reused: no CPU sync in the dispatch, the grouping's row count known),
        queued free-running; none for expanded rows (DeepEP refuses their cached dispatch)."""
        calls = self.cached_phases(x_TH, topk_idx_TK, topk_w_TK, scales_TS, d, y_RH)
        return self.cached_graph("cached handle (no CPU sync), not captured", calls) if calls else self.no_cached_view

    def barrier(self):
        self.buffer.barrier()          # what test_ep.py's bench_kineto passes as its barrier

    def native_bytes(self, d):
        """test_ep.py's dispatch bytes, count_bytes(recv_x, recv_topk_idx, recv_topk_weights) over the received rows,
        from the real call's output (checked against traffic.deepep_v2_row_bytes: native_rule)."""
        h: _Handle = d.handle
        if h.grouped is None:
            return None                      # expanded: its rule counts the unexpanded rows
        return h.rows * h.row_bytes

    def native_rule(self, w):
        return traffic.deepep_v2_row_bytes(w, "dispatch"), "deepep_v2 (test_ep.py: payload + top-k ids + weights)"

    def teardown(self):
        if getattr(self, "buffer", None) is not None:
            self.buffer.destroy()
        self.buffer = None


def _import_v2():
    """deep_ep, when it is DeepEP V2; Unavailable (WAIVED) with the reason otherwise: its import-time NCCL check
    failed (found and needed named by DeepEP), or deep_ep here is V1 (the same package name)."""
    try:
        import deep_ep
    except AssertionError as e:          # deep_ep/__init__.py's check_nccl_so: the loaded libnccl is not its own
        raise Unavailable(f"import deep_ep (V2) refused the NCCL this process loaded: {e}; point EP_NCCL_ROOT_DIR "
                          "at the NCCL >= 2.30.4 that the ranks load (LD_PRELOAD)") from e
    except Exception as e:  # noqa: BLE001 - any import failure: this run cannot use it
        raise Unavailable(f"import deep_ep failed: {type(e).__name__}: {e}; {INSTALL}") from e
    if not hasattr(deep_ep, "ElasticBuffer"):
        raise Unavailable(f"deep_ep here is V1 ({dist_version('deep_ep', 'deep-ep') or 'no version'}: legacy Buffer"
                          f"{', HybridEPBuffer' if hasattr(deep_ep, 'HybridEPBuffer') else ''}, no ElasticBuffer); "
                          f"{INSTALL}")
    return deep_ep
