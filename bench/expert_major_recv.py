"""Design probe for issue 16 item 5: receive the alltoall path's rows straight into expert-major order.

Today (moebench/backends/alltoall.py, as Megatron): all_to_all_single delivers the received rows in
(source rank, local expert) order, then a chunk sort copies every received byte once more into
(local expert, source rank) order. The alternative here: one grouped NCCL send/recv per (peer,
local expert) chunk (torch.distributed.batch_isend_irecv), each receive landing at its final
expert-major offset, which the receiver knows from the recv counts the dispatch already brings to
the host. The sender's permuted buffer is already (destination rank, local expert) ordered, so its
chunks are contiguous. Cost: W x L sends and receives per rank (256 at EP 8, E 256) instead of one
collective plus one full pass over the received bytes. Combine is the mirror image.

This script times both on identical data and checks they give the same rows:
    torchrun --nproc-per-node 8 bench/expert_major_recv.py --tokens 4096 --hidden 7168 --experts 256 --topk 8
    (one GPU per rank, NCCL; the measurement that decides). On CPU: `--cpu` with torchrun (gloo),
    functional only. Needs EP > 1; no result of it is committed yet (no multi-GPU machine was lent).
"""
import argparse
import os

import torch
import torch.distributed as dist

from moebench import ops
from moebench.core.workload import Workload, make_routing, rank_inputs
from moebench.harness.timing import Timer


def counts_of(idx, w, dev):
    send = torch.bincount(idx[idx >= 0].flatten(), minlength=w.num_experts).view(w.ep, -1).to(dev)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return send.cpu(), recv.cpu()          # [W, L]: rows to / from each rank per local expert


def today(x_S, send, recv, L, order, dev):
    out = x_S.new_empty((int(recv.sum()), x_S.shape[1]))
    dist.all_to_all_single(out, x_S, recv.sum(1).tolist(), send.sum(1).tolist())
    return ops.sort_chunks_by_idxs(out, recv.view(-1).to(dev), order)


def grouped(x_S, send, recv, L):
    W, me = send.shape[0], dist.get_rank()
    out = x_S.new_empty((int(recv.sum()), x_S.shape[1]))
    src_off = torch.cat([torch.zeros(1, dtype=torch.long), send.view(-1).cumsum(0)])       # (rank, expert) order
    dst_off = torch.cat([torch.zeros(1, dtype=torch.long), recv.t().reshape(-1).cumsum(0)])  # (expert, rank) order
    p2p = []
    for s in range(W):
        for j in range(L):
            n_out, n_in = int(send[s, j]), int(recv[s, j])
            if s == me:                         # the local chunk: a copy, no send to oneself
                a, b = int(src_off[s * L + j]), int(dst_off[j * W + s])
                out[b:b + n_in].copy_(x_S[a:a + n_out])
                continue
            if n_out:
                a = int(src_off[s * L + j])
                p2p.append(dist.P2POp(dist.isend, x_S[a:a + n_out], s))
            if n_in:
                b = int(dst_off[j * W + s])
                p2p.append(dist.P2POp(dist.irecv, out[b:b + n_in], s))
    for req in dist.batch_isend_irecv(p2p) if p2p else []:
        req.wait()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    dist.init_process_group("gloo" if a.cpu else "nccl")
    r, W = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cpu") if a.cpu else torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if not a.cpu:
        torch.cuda.set_device(dev)
    w = Workload(num_tokens=a.tokens, hidden=a.hidden, num_experts=a.experts, topk=a.topk, ep=W)
    x, idx, _, _, _ = rank_inputs(w, r, dev)
    p = ops.permute(x, idx, w.num_experts)
    send, recv = counts_of(make_routing(w, r)[0].to(dev), w, dev)
    L = w.local_experts
    order = torch.tensor([s * L + j for j in range(L) for s in range(W)], device=dev)
    x_S = p.x_RH[: int(send.sum())]
    same = torch.equal(today(x_S, send, recv, L, order, dev), grouped(x_S, send, recv, L))
    timer = Timer(dev, dist.group.WORLD)
    t0 = timer.run(lambda: today(x_S, send, recv, L, order, dev), a.iters, 200)
    t1 = timer.run(lambda: grouped(x_S, send, recv, L), a.iters, 200)
    if r == 0:
        print(f"EP {W}: rows identical: {same}; a2a + chunk sort {t0.median_us:.1f} us, grouped send/recv into "
              f"expert-major offsets {t1.median_us:.1f} us ({t0.timer})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
