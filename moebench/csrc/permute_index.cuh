// permute_index: the permute's index work (route_rank, route_scan, or both in one launch), included by
// moe_permute.cu inside its anonymous namespace (it uses kThreads, kWarps, kFull, warp_inclusive_sum).
// Each slot's rank among its rank block's slots of its expert, the blocks' first rows per expert, the
// expert starts padded to `pad`, tokens per expert and the row count (to mapped host memory too, so the
// host learns R while the copy runs). Host side: launch_index in moe_permute.cu.

// Programmatic dependent launch (sm_90+; variant bit 15): the next kernel in the stream may start once
// every CTA of this one has triggered, and waits for this one's completion (and its memory) where it
// calls pdl_wait. Both are no-ops for a kernel launched the ordinary way, or with no such neighbour.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ------------------------------------------------------------------ route_rank
__device__ __forceinline__ int pad_up(int c, int pad) { return pad > 1 ? (c + pad - 1) / pad * pad : c; }

// route_rank's arguments; those after `done` only for the one-launch index (variant bit 12).
struct RouteArgs {
  const void* idx;
  int64_t n;
  int E, pad;
  bool idx64;
  int32_t* lrank;   // [n]: each slot's rank among its block's slots of its expert
  int32_t* counts;  // [NB, E]: each block's count per expert; one launch: then its first row per expert
  unsigned* done;   // route_scan's arrival counter (reset here); one launch: a ring word left at 0 (barrier_word)
  int32_t *estart, *ecount, *total, *tpe, *host_total, *host_tpe;
};

constexpr int kColumnKeep = 32;  // block counts per expert loaded at once by the one-launch scan

// One launch (variant bit 12): the last block to finish ranking turns the blocks' counts into each
// block's first row per expert (thread per expert, its column loaded 32 blocks at a time), then scans the
// padded expert totals: what route_scan does, without its launch, in the kernel that made the counts.
// sm: the block's kWarps * E ints of shared memory, free once the ranks are written.
__device__ __forceinline__ void scan_in_last_block(const RouteArgs& a, int32_t* sm) {
  __shared__ bool last;
  __shared__ int32_t wsum[kWarps];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicInc(a.done, gridDim.x - 1) == gridDim.x - 1;  // wraps the word to 0
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int NB = gridDim.x, E = a.E;
  for (int e = threadIdx.x; e < E; e += kThreads) {
    int run = 0;
    for (int b0 = 0; b0 < NB; b0 += kColumnKeep) {
      int c[kColumnKeep];
#pragma unroll
      for (int q = 0; q < kColumnKeep; ++q) c[q] = b0 + q < NB ? __ldcg(a.counts + (int64_t)(b0 + q) * E + e) : 0;
#pragma unroll
      for (int q = 0; q < kColumnKeep; ++q)
        if (b0 + q < NB) { a.counts[(int64_t)(b0 + q) * E + e] = run; run += c[q]; }
    }
    a.ecount[e] = run;
    sm[e] = pad_up(run, a.pad);
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int per = (E + kThreads - 1) / kThreads, i0 = min(E, (int)threadIdx.x * per), i1 = min(E, i0 + per);
  int local = 0;
  for (int i = i0; i < i1; ++i) local += sm[i];
  const int incl = warp_inclusive_sum(local, lane);
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  int run = incl - local, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) run += wsum[w];
    total += wsum[w];
  }
  for (int i = i0; i < i1; ++i) {
    const int p = sm[i];
    a.tpe[i] = p;
    if (a.host_tpe) a.host_tpe[i] = p;
    a.estart[i] = run;
    run += p;
  }
  if (threadIdx.x == 0) a.total[0] = total;
  if (!a.host_total) return;
  if (a.host_tpe) __threadfence_system();  // the host's counts before its row count, which it polls
  __syncthreads();
  if (threadIdx.x == 0) {
    *(volatile int32_t*)a.host_total = total;
    __threadfence_system();
  }
}

template <int ITEMS, bool ONE>
__global__ void __launch_bounds__(kThreads) route_rank_kernel(const RouteArgs a) {
  extern __shared__ int32_t cnt[];  // [kWarps][E]: running count, then exclusive warp prefix
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, E = a.E;
  pdl_trigger();                    // the next kernel (PDL) may be scheduled now; it waits for this one's end
  if (!ONE && blockIdx.x == 0 && threadIdx.x == 0) *a.done = 0;  // route_scan's arrival counter
  for (int i = threadIdx.x; i < kWarps * E; i += kThreads) cnt[i] = 0;
  const int64_t wbase = (int64_t)blockIdx.x * kThreads * ITEMS + (int64_t)warp * 32 * ITEMS;
  int ex[ITEMS], rk[ITEMS];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const int64_t s = wbase + j * 32 + lane;
    const long long e = s < a.n ? (a.idx64 ? __ldg(static_cast<const long long*>(a.idx) + s)  // read-only path,
                                            : __ldg(static_cast<const int*>(a.idx) + s)) : -1;  // as __restrict__ gave
    ex[j] = (e >= 0 && e < E) ? (int)e : -1;
  }
  __syncthreads();
  int32_t* wc = cnt + warp * E;
  const unsigned lt = (1u << lane) - 1u;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const unsigned peers = __match_any_sync(kFull, ex[j]);
    const int prior = ex[j] >= 0 ? wc[ex[j]] : 0;
    rk[j] = prior + __popc(peers & lt);
    __syncwarp();
    if (ex[j] >= 0 && (peers & lt) == 0) wc[ex[j]] = prior + __popc(peers);
    __syncwarp();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kThreads) {
    int run = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int c = cnt[w * E + e];
      cnt[w * E + e] = run;
      run += c;
    }
    a.counts[(int64_t)blockIdx.x * E + e] = run;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < ITEMS; ++j)
    if (ex[j] >= 0) a.lrank[wbase + j * 32 + lane] = rk[j] + wc[ex[j]];
  if constexpr (ONE) scan_in_last_block(a, cnt);
}

// ------------------------------------------------------------------ route_scan

// blockDim (32, 32), one block per tile of 32 experts: lane = expert, g = one of 32 contiguous
// groups of blocks. counts [NB, E] in: per-block counts; out: each block's first row per expert,
// relative to the expert's start; ecount = totals. The last tile block to arrive scans the padded
// totals over all experts: estart, tokens per expert and the row count, also written to mapped
// pinned host memory so the host can learn R while the copy runs. (Not one block for all experts:
// that makes the scan a sizeable share of the permute at large E; see docs/decisions.md.)
constexpr int kScanKeep = 8;  // per-thread block counts kept in registers between the two passes
__global__ void __launch_bounds__(1024) route_scan_kernel(int32_t* __restrict__ counts, int NB,
                                                          int E, int pad, int32_t* __restrict__ tpe,
                                                          int32_t* __restrict__ estart_out,
                                                          int32_t* __restrict__ ecount_out,
                                                          int32_t* __restrict__ total_dev,
                                                          int32_t* total_host,
                                                          int32_t* tpe_host,
                                                          unsigned* __restrict__ done) {
  __shared__ int32_t red[32][33];
  __shared__ int32_t wsum[32];
  __shared__ int32_t total_sh;
  __shared__ bool last;
  const int lane = threadIdx.x, g = threadIdx.y, tid = g * 32 + lane;
  pdl_wait();                       // launched as a dependent of route_rank: its counts are complete
  pdl_trigger();                    // the rows kernel (PDL) may start its first loads now
  const int e = blockIdx.x * 32 + lane;
  const int nbg = (NB + 31) / 32, b0 = min(NB, g * nbg), b1 = min(NB, b0 + nbg);
  int c[kScanKeep], sum = 0;
#pragma unroll
  for (int q = 0; q < kScanKeep; ++q) {
    c[q] = (e < E && b0 + q < b1) ? counts[(int64_t)(b0 + q) * E + e] : 0;
    sum += c[q];
  }
  for (int b = b0 + kScanKeep; b < b1; ++b)
    if (e < E) sum += counts[(int64_t)b * E + e];
  red[g][lane] = sum;
  __syncthreads();
  int r = 0;  // exclusive prefix over the groups before g
  for (int i = 0; i < g; ++i) r += red[i][lane];
  if (g == 31 && e < E) ecount_out[e] = r + sum;
  if (e < E) {
#pragma unroll
    for (int q = 0; q < kScanKeep; ++q)
      if (b0 + q < b1) { counts[(int64_t)(b0 + q) * E + e] = r; r += c[q]; }
    for (int b = b0 + kScanKeep; b < b1; ++b) {
      const int64_t o = (int64_t)b * E + e;
      const int cc = counts[o];
      counts[o] = r;
      r += cc;
    }
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // exclusive scan of padded totals over experts: each thread owns `per` consecutive experts
  const int per = (E + 1023) / 1024, i0 = min(E, tid * per), i1 = min(E, i0 + per);
  int local = 0;
  for (int i = i0; i < i1; ++i) local += pad_up(__ldcg(ecount_out + i), pad);
  const int incl = warp_inclusive_sum(local, lane);
  if (lane == 31) wsum[g] = incl;
  __syncthreads();
  if (g == 0) {
    const int v = wsum[lane], x = warp_inclusive_sum(v, lane);
    wsum[lane] = x - v;  // exclusive
    if (lane == 31) {
      total_dev[0] = x;
      total_sh = x;
    }
  }
  __syncthreads();
  int run = wsum[g] + incl - local;
  for (int i = i0; i < i1; ++i) {
    const int p = pad_up(__ldcg(ecount_out + i), pad);
    tpe[i] = p;
    if (tpe_host) tpe_host[i] = p;
    estart_out[i] = run;
    run += p;
  }
  if (!total_host) return;
  // the host copy of the row count last, after every thread's tokens per expert: a host that polls the
  // row count (PDL, no event between this kernel and the copy) then reads complete counts
  if (tpe_host) __threadfence_system();
  __syncthreads();
  if (tid == 0) {
    *(volatile int32_t*)total_host = total_sh;
    __threadfence_system();
  }
}
