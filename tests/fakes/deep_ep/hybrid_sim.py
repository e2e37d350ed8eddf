"""A working stand-in for HybridEP's HybridEPBuffer on CPU ranks (gloo), selected with FAKE_DEEP_EP_CTOR=sim.

It follows the hybrid-ep branch's deep_ep/hybrid_ep_buffer.py: the NVLink domain is the env override,
else the detected same-host ranks (FAKE_HYBRID_EP_DETECTED, default the whole group); SMs default as
its Configurer does (24 in one domain, 8 across); `dispatch` without num_dispatched_tokens and a
blocking metadata pass wait on the host (counted in `host_syncs`); a cached `dispatch_with_permute`
needs num_permuted_tokens; plain dispatch returns probs [N, L x ranks per domain] (this domain's
experts) and combines are unweighted sums. The handle's first slot holds the gathered routing maps
(opaque to callers). `calls` lists the API calls made.
"""
import os

import torch

from .sim import _gather


class _Config:
    def __init__(self, sms_dispatch, sms_combine):
        self.num_of_blocks_dispatch_api, self.num_of_blocks_combine_api = sms_dispatch, sms_combine


class _Configurer:
    def __init__(self, buffer_config):
        self.buffer_config = buffer_config


class HybridEPBuffer:
    def __init__(self, group, hidden_dim, max_num_of_tokens_per_rank, num_local_experts, use_fp8=False,
                 num_sms_dispatch_api=None, num_sms_combine_api=None, num_sms_preprocessing_api=None,
                 num_blocks_permute=None, num_blocks_unpermute=None, **experimental):
        self.group, self.rank, self.group_size = group, group.rank(), group.size()
        detected = int(os.environ.get("FAKE_HYBRID_EP_DETECTED", self.group_size))
        env = os.getenv("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")
        self.num_of_hybrid_ep_ranks_per_nvlink_domain = rpd = int(env) if env is not None else detected
        assert self.group_size % rpd == 0
        self.local_rank, self.node_rank, self.num_of_nodes = self.rank % rpd, self.rank // rpd, self.group_size // rpd
        default = 24 if self.num_of_nodes == 1 else 8
        self.configurer = _Configurer(_Config(num_sms_dispatch_api or default, num_sms_combine_api or default))
        self.L, self.calls, self.host_syncs = num_local_experts, [], 0
        self.experimental = experimental            # load_cached_kernels, use_shared_buffer, ...: as given

    def _plan(self, gmap, d, permute):
        """Rank d's received rows as (source rank, token ids, expert or None), in d's row order."""
        experts = range(d * self.L, (d + 1) * self.L)
        if permute:
            return [(s, torch.nonzero(gmap[s][:, e]).flatten(), e) for e in experts for s in range(self.group_size)]
        return [(s, torch.nonzero(gmap[s][:, experts.start:experts.stop].any(1)).flatten(), None)
                for s in range(self.group_size)]

    def _metadata(self, routing_map, permute, non_blocking=False):
        self.calls.append("metadata_preprocessing")
        if not non_blocking:
            self.host_syncs += 1
        gmap = _gather(self.group, routing_map)
        plan = self._plan(gmap, self.rank, permute=False)
        n = sum(t.numel() for _, t, _ in plan)
        lmap = torch.zeros(self.group_size * routing_map.shape[0], self.L, dtype=torch.bool)
        lo = self.rank * self.L
        lmap[:n] = torch.cat([gmap[s][t, lo:lo + self.L] for s, t, _ in plan])
        tpe = torch.stack([m[:, lo:lo + self.L].sum(0) for m in gmap]).sum(0).int()
        return gmap, torch.tensor([n], dtype=torch.int32), lmap, tpe

    def _rows(self, handle, tensors, permute):
        """This rank's received rows of each gathered per-rank tensor (None stays None)."""
        sent = _gather(self.group, tensors)
        plan = self._plan(handle[0], self.rank, permute)
        out = []
        for i, t in enumerate(tensors):
            if t is None:
                out.append(None)
            elif i == 1 and permute:          # probs: the row's own expert
                out.append(torch.cat([sent[s][1][toks, e] for s, toks, e in plan]))
            elif i == 1:                      # probs: this NVLink domain's experts
                lo = self.node_rank * self.num_of_hybrid_ep_ranks_per_nvlink_domain * self.L
                hi = lo + self.num_of_hybrid_ep_ranks_per_nvlink_domain * self.L
                out.append(torch.cat([sent[s][1][toks, lo:hi] for s, toks, _ in plan]))
            else:
                out.append(torch.cat([sent[s][i][toks] for s, toks, _ in plan]))
        return out

    def _combine(self, hidden, handle, permute, num_tokens):
        res = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32)
        for d, rows in enumerate(_gather(self.group, hidden)):
            at = 0
            for s, toks, _ in self._plan(handle[0], d, permute):
                if s == self.rank:
                    res.index_add_(0, toks, rows[at:at + toks.numel()].float())
                at += toks.numel()
        return res.to(hidden.dtype)

    def dispatch(self, hidden, scaling_factor=None, topk_idx=None, topk_weights=None, num_of_experts=None, probs=None,
                 routing_map=None, num_dispatched_tokens_tensor=None, num_dispatched_tokens=None, handle=None):
        self.calls.append("dispatch(handle)" if handle is not None else "dispatch")
        if routing_map is None:
            assert num_of_experts is not None, "The number of experts should be provided on index-based routing."
        assert handle is not None or routing_map is not None
        if handle is None:
            gmap, n, lmap, _ = self._metadata(routing_map, permute=False)
            handle = (gmap, None, None, n, lmap, hidden.shape[0], None)
        if num_dispatched_tokens is None:
            self.host_syncs += 1
        tokens, p, sf = self._rows(handle, (hidden, probs, scaling_factor), permute=False)
        return tokens, p, sf, handle

    def combine(self, hidden, probs=None, handle=None):
        self.calls.append("combine")
        assert handle is not None and probs is None, "the fake combines hidden rows only"
        return self._combine(hidden, handle, False, handle[5]), None

    def dispatch_with_permute(self, *, hidden, topk_idx=None, topk_weights=None, num_of_experts_per_rank=None,
                              num_of_experts=None, use_fp8=None, routing_map=None, probs=None, scaling_factor=None,
                              num_permuted_tokens=None, pad_multiple=None, handle=None, non_blocking=False,
                              fuse_permute_dispatch=False):
        self.calls.append("dispatch_with_permute(handle)" if handle is not None else "dispatch_with_permute")
        assert not pad_multiple, "the fake does not pad"
        if non_blocking:
            assert num_permuted_tokens is not None, "The num_permuted_tokens is required for non-blocking mode."
        if handle is None:
            gmap, n, lmap, tpe = self._metadata(routing_map, permute=True, non_blocking=non_blocking)
            handle = (gmap, None, None, n, lmap, None, None, tpe, hidden.shape[0], None, None)
        elif num_permuted_tokens is None:     # pybind refuses None for HandleImpl.num_permuted_tokens
            raise TypeError("num_permuted_tokens: incompatible function arguments (None for int64)")
        tokens, p, sf = self._rows(handle, (hidden, probs, scaling_factor), permute=True)
        if num_permuted_tokens is not None:
            assert num_permuted_tokens == tokens.shape[0]
        return tokens, p, sf, handle[7].long(), handle

    def combine_with_unpermute(self, *, hidden, probs=None, handle=None, pad_multiple=None,
                               fuse_unpermute_combine=False):
        self.calls.append("combine_with_unpermute")
        assert handle is not None and probs is None, "the fake combines hidden rows only"
        return self._combine(hidden, handle, True, handle[8]), None
