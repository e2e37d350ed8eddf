// permute_rows: the permute's default copy, many whole rows in flight per SM; included by
// moe_permute.cu inside its anonymous namespace (it uses CopyArgs, slot_row, write_row, load_idx,
// pad_up, pdl_wait, the PTX wrappers, warp_inclusive_sum, smem_u32, aligned, cdiv, blocks_per_sm, fail,
// kFull).
//
// Why: a standalone probe with exactly the permute's traffic (FACTS.md, "Copy-kernel structure")
// reached 0.894 of a D2D copy when each one-warp CTA bulk-loads C = 8 whole rows into shared
// memory, then issues the C x K bulk stores and waits only until they have read shared memory
// before loading the next C rows (2 CTAs per SM at 14 KB rows), against 0.869 for one row in three
// buffers (permute_bulk) and 0.828 for the register copy: more whole rows in flight per SM is what
// moved it. This kernel is that structure:
//   - a persistent grid of one-warp CTAs; CTA c owns tokens [c*T/G, (c+1)*T/G) and walks them in
//     groups of C (the last one shorter). Lane 0 loads a group's rows with cp.async.bulk (one
//     mbarrier, one phase per group); every lane then bulk-stores the slots it holds (slot
//     q = 32 i + lane of the group), commits, and waits for the stores' reads of shared memory
//     (cp.async.bulk.wait_group.read) before lane 0 loads the next group. The next group's rows
//     are worked out while the stores run.
//   - FUSED (variant 0; slower on the H200 than after the index kernels: 147 vs 140 us at T 4096, H 7168,
//     so Python picks variant 16384): no index kernels. Each CTA ranks its own slots (stable per
//     expert, __match_any_sync as route_rank; histogram in shared memory over the tail of the row
//     buffer, whose rows are loaded once the count is done) and writes its counts [G, E]; grid
//     barrier; CTA c scans expert columns c, c + G, ... over the CTAs (counts -> each CTA's first
//     row per expert; expert totals); grid barrier; every CTA scans the padded totals into the
//     expert starts (held in registers, 32 experts per lane at most). The group's first rows were
//     requested before any of this, so the index work overlaps their loads. CTA 0 publishes
//     estart, tokens per expert and the row count (mapped host memory too: the host polls it, as
//     the copy runs in the same kernel). Needs a cooperative launch (all CTAs resident for the
//     barriers) and E <= kFusedMaxE; else the rows kernel runs after route_rank / route_scan.

constexpr int kRowsMaxC = 16;                      // rows per CTA (variant bits 16-20; 0 = auto)
constexpr int kRowsLaneSlots = 16;                 // C*K <= 16*32 slots per group: 16 per lane
constexpr int64_t kRowsAutoBytes = 112 * 1024;     // auto C: the probe's best, 8 rows of 14 KB
constexpr int kRowsMaxPerSm = 8;
constexpr int kFusedMaxE = 1024;                   // expert starts in registers: 32 per lane
constexpr int kFusedMaxCtas = 1024;                // column scan: 32 CTAs per lane
constexpr int kCountBatch = 4;                     // 32-slot chunks whose experts load at once

struct RowsArgs {
  const uint8_t* x; const uint8_t* sx; const void* idx; uint8_t* out; uint8_t* sout;
  int32_t* row_map; const float* probs; float* out_probs;
  int32_t* lrank;      // slot ranks: in its CTA (fused) or its rank block (route_rank)
  int32_t* base;       // fused: counts [G, E] -> first row per (CTA, expert); else route_scan's [NB, E]
  int32_t *estart, *ecount, *tpe, *total, *host_total, *host_tpe;   // the last five: fused only
  unsigned* bar;       // fused: grid-barrier word
  int64_t T, rb, sb;   // tokens, payload and scale row bytes
  int K, E, C, SB, pad;
  uint32_t hist_off;   // fused: byte offset of the [E] histogram in shared memory
  bool idx64;
};

// Grid barrier of a cooperative launch (cooperative_groups' scheme): CTA 0 adds 2^31 - (G - 1),
// the others 1, so bit 31 flips once all G have arrived and the low bits return to 0: the word
// needs no reset between barriers or launches (a ring of them per device, see barrier_word).
__device__ __forceinline__ void grid_sync(unsigned* bar, int lane) {
  __syncwarp();
  if (lane == 0) {
    const unsigned inc = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    __threadfence();
    const unsigned old = atomicAdd(bar, inc);
    unsigned cur;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(cur) : "l"(bar) : "memory");
    } while (((old ^ cur) & 0x80000000u) == 0);
    __threadfence();
  }
  __syncwarp();
}

// ---------------------------------------------------------------- fused index work
// Ranks of slots [s0, s1) per expert in slot order (lrank), the CTA's counts to base[blockIdx.x].
__device__ __forceinline__ void count_slots(const RowsArgs& a, int32_t* hist, int64_t s0, int64_t s1, int lane) {
  for (int e = lane; e < a.E; e += 32) hist[e] = 0;
  __syncwarp();
  const unsigned lt = (1u << lane) - 1u;
  for (int64_t b = s0; b < s1; b += 32 * kCountBatch) {
    int ex[kCountBatch];
#pragma unroll
    for (int j = 0; j < kCountBatch; ++j) {
      const int64_t s = b + j * 32 + lane;
      const long long e = s < s1 ? load_idx(a.idx, a.idx64, s) : -1;
      ex[j] = (e >= 0 && e < a.E) ? (int)e : -1;
    }
#pragma unroll
    for (int j = 0; j < kCountBatch; ++j) {
      const unsigned peers = __match_any_sync(kFull, ex[j]);
      const int prior = ex[j] >= 0 ? hist[ex[j]] : 0;
      if (ex[j] >= 0) a.lrank[b + j * 32 + lane] = prior + __popc(peers & lt);
      __syncwarp();
      if (ex[j] >= 0 && (peers & lt) == 0) hist[ex[j]] = prior + __popc(peers);
      __syncwarp();
    }
  }
  for (int e = lane; e < a.E; e += 32) a.base[(int64_t)blockIdx.x * a.E + e] = hist[e];
}

// Expert columns blockIdx.x, + G, ...: counts over the CTAs -> exclusive prefix (each CTA's first
// row of the expert, from the expert's start) and the expert's total (ecount). Lane l holds CTAs
// [l*per, (l+1)*per), loaded at once.
__device__ __forceinline__ void column_scan(const RowsArgs& a, int lane) {
  const int G = gridDim.x, per = (G + 31) / 32;
  const int c0 = min(G, lane * per), nc = min(G, c0 + per) - c0;
  for (int e = blockIdx.x; e < a.E; e += G) {
    int v[32], sum = 0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      v[j] = j < nc ? __ldcg(a.base + (int64_t)(c0 + j) * a.E + e) : 0;
      sum += v[j];
    }
    const int incl = warp_inclusive_sum(sum, lane);
    int run = incl - sum;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      if (j < nc) { a.base[(int64_t)(c0 + j) * a.E + e] = run; run += v[j]; }
    if (lane == 31) a.ecount[e] = incl;
  }
}

// Padded expert starts, lane l holding experts [l*per, (l+1)*per) in est[0, per); returns per.
// CTA 0 publishes estart, tokens per expert and the row count; the host copies of the counts go
// out before the row count, which is what the host polls for.
__device__ __forceinline__ int expert_starts(const RowsArgs& a, int lane, int (&est)[32]) {
  const int per = (a.E + 31) / 32, e0 = min(a.E, lane * per), ne = min(a.E, e0 + per) - e0;
  int local = 0;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    est[j] = j < ne ? pad_up(__ldcg(a.ecount + e0 + j), a.pad) : 0;
    local += est[j];
  }
  const int incl = warp_inclusive_sum(local, lane);
  const bool pub = blockIdx.x == 0;
  int run = incl - local;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int cnt = est[j];
    if (pub && j < ne) {
      a.estart[e0 + j] = run;
      a.tpe[e0 + j] = cnt;
      if (a.host_tpe) a.host_tpe[e0 + j] = cnt;
    }
    est[j] = run;
    run += cnt;
  }
  if (pub) {
    const int total = __shfl_sync(kFull, incl, 31);
    if (a.host_tpe) __threadfence_system();
    __syncwarp();
    if (lane == 0) {
      a.total[0] = total;
      if (a.host_total) {
        *(volatile int32_t*)a.host_total = total;
        __threadfence_system();
      }
    }
  }
  return per;
}

// est of expert e (any lane's), by shuffles from its owner lane; every lane must call (e = -1: 0).
__device__ __forceinline__ int expert_start(const int (&est)[32], int per, int e) {
  const int owner = e >= 0 ? e / per : 0, j = e >= 0 ? e - owner * per : -1;
  int r = 0;
#pragma unroll
  for (int q = 0; q < 32; ++q) {
    if (q >= per) break;  // warp-uniform
    const int v = __shfl_sync(kFull, est[q], owner);
    if (q == j) r = v;
  }
  return r;
}

// ---------------------------------------------------------------- per group
// Output rows of the slots of tokens [g0, g0 + n): lane l's rows[i] is slot q = 32 i + l (-1:
// masked or past the group); writes row_map and the routing weights when asked. The loads are
// issued pass by pass (experts and ranks, then bases) so that their latencies overlap.
template <bool FUSED>
__device__ __forceinline__ void group_rows(const RowsArgs& a, int64_t g0, int n, const int (&est)[32],
                                           int per, int lane, int (&rows)[kRowsLaneSlots]) {
  const int nq = n * a.K;
  const int64_t s0 = g0 * a.K;
  int ex[kRowsLaneSlots], lr[kRowsLaneSlots];
#pragma unroll
  for (int i = 0; i < kRowsLaneSlots; ++i) {
    const int q = i * 32 + lane;
    ex[i] = -1;
    lr[i] = 0;
    if (q < nq) {
      const long long e = load_idx(a.idx, a.idx64, s0 + q);
      if (e >= 0 && e < a.E) ex[i] = (int)e;
      lr[i] = a.lrank[s0 + q];
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsLaneSlots; ++i) {
    if (i * 32 >= nq) break;  // warp-uniform: the shuffles below see every lane
    const int q = i * 32 + lane;
    const int64_t s = s0 + q;
    int row = -1;
    if (FUSED) {
      const int st = expert_start(est, per, ex[i]);
      if (ex[i] >= 0) row = st + __ldcg(a.base + (int64_t)blockIdx.x * a.E + ex[i]) + lr[i];
    } else if (ex[i] >= 0) {
      row = a.estart[ex[i]] + a.base[(s / a.SB) * a.E + ex[i]] + lr[i];
    }
    rows[i] = row;
    if (q < nq) write_row(a.row_map, a.probs, a.out_probs, s, row);
  }
}

template <bool EF>
__device__ __forceinline__ void load_rows(const RowsArgs& a, const uint8_t* sbuf, int64_t t, int j0, int j1,
                                          uint32_t mb, uint64_t pol) {
  for (int j = j0; j < j1; ++j)
    bulk_load<EF>(smem_u32(sbuf + j * a.rb), a.x + (t + j) * a.rb, (uint32_t)a.rb, mb, pol);
}

// The group's K stores per row, each lane those of its slots, as one bulk group per lane.
template <bool EF>
__device__ __forceinline__ void store_group(const RowsArgs& a, const uint8_t* sbuf, int n,
                                            const int (&rows)[kRowsLaneSlots], int lane, uint64_t pol) {
  const int nq = n * a.K;
#pragma unroll
  for (int i = 0; i < kRowsLaneSlots; ++i) {
    const int q = i * 32 + lane;
    if (q < nq && rows[i] >= 0)
      bulk_store<EF>(a.out + (int64_t)rows[i] * a.rb, smem_u32(sbuf + (q / a.K) * a.rb), (uint32_t)a.rb, pol);
  }
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// fp8 scales: each lane copies the scale rows of its slots (16- or 4-byte words when aligned).
__device__ __forceinline__ void group_scales(const RowsArgs& a, int64_t g0, int n,
                                             const int (&rows)[kRowsLaneSlots], int lane) {
  const int nq = n * a.K;
#pragma unroll
  for (int i = 0; i < kRowsLaneSlots; ++i) {  // unrolled: rows[] stays in registers
    const int q = i * 32 + lane;
    if (q >= nq || rows[i] < 0) continue;
    const uint8_t* s = a.sx + (g0 + q / a.K) * a.sb;
    uint8_t* d = a.sout + (int64_t)rows[i] * a.sb;
    const uintptr_t al = reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) | (uintptr_t)a.sb;
    if ((al & 15) == 0)
      for (int64_t w = 0; w < a.sb / 16; ++w)
        reinterpret_cast<uint4*>(d)[w] = reinterpret_cast<const uint4*>(s)[w];
    else if ((al & 3) == 0)
      for (int64_t w = 0; w < a.sb / 4; ++w)
        reinterpret_cast<uint32_t*>(d)[w] = reinterpret_cast<const uint32_t*>(s)[w];
    else
      for (int64_t w = 0; w < a.sb; ++w) d[w] = s[w];
  }
}

// ---------------------------------------------------------------- the kernel
// __launch_bounds__(32, kRowsMaxPerSm): ptxas may use up to 255 registers (8 one-warp CTAs per SM
// still fit); given the thread count alone it aims at more resident warps and spills.
template <bool FUSED, bool EF>
__global__ void __launch_bounds__(32, kRowsMaxPerSm) permute_rows_kernel(const __grid_constant__ RowsArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t sbuf[];
  __shared__ __align__(8) uint64_t bar;
  const int lane = threadIdx.x;
  const int64_t t0 = a.T * blockIdx.x / gridDim.x, t1 = a.T * (blockIdx.x + 1) / gridDim.x;
  const uint64_t pol = EF ? evict_first_policy() : 0;
  const uint32_t mb = smem_u32(&bar);
  if (lane == 0) mbar_init(mb);
  __syncwarp();
  int n = (int)min((int64_t)a.C, t1 - t0);
  // the first group's rows go out before the index work; fused, those over the histogram after it
  const int early = FUSED ? min(n, (int)(a.hist_off / a.rb)) : n;
  if (lane == 0 && n > 0) {
    mbar_expect(mb, (uint32_t)(n * a.rb));
    load_rows<EF>(a, sbuf, t0, 0, early, mb, pol);
  }
  int est[32], per = 1;
  if constexpr (!FUSED) pdl_wait();  // a dependent launch (variant bit 15): the index kernels' outputs from here
  if constexpr (FUSED) {
    count_slots(a, reinterpret_cast<int32_t*>(sbuf + a.hist_off), t0 * a.K, t1 * a.K, lane);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // histogram accesses before the loads over it
    __syncwarp();
    if (lane == 0 && n > early) load_rows<EF>(a, sbuf, t0, early, n, mb, pol);
    grid_sync(a.bar, lane);
    column_scan(a, lane);
    grid_sync(a.bar, lane);
    per = expert_starts(a, lane, est);
  }
  int rows[kRowsLaneSlots];
  if (n > 0) group_rows<FUSED>(a, t0, n, est, per, lane, rows);
  uint32_t parity = 0;
  for (int64_t g0 = t0; n > 0; parity ^= 1u) {
    mbar_wait(mb, parity);  // every lane: its stores read what the loads wrote
    store_group<EF>(a, sbuf, n, rows, lane, pol);
    if (a.sb > 0) group_scales(a, g0, n, rows, lane);
    const int64_t g1 = g0 + n;
    const int n1 = (int)min((int64_t)a.C, t1 - g1);
    if (n1 > 0) group_rows<FUSED>(a, g1, n1, est, per, lane, rows);  // while the stores run
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    __syncwarp();  // every lane's stores have read the buffer: refill it
    if (lane == 0 && n1 > 0) {
      mbar_expect(mb, (uint32_t)(n1 * a.rb));
      load_rows<EF>(a, sbuf, g1, 0, n1, mb, pol);
    }
    g0 = g1;
    n = n1;
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

// ---------------------------------------------------------------- host side
// Grid-barrier words, zeroed once per device and left at 0 by every completed launch (grid_sync);
// a ring so that launches in flight on different streams do not share one.
constexpr int kBarSlots = 256;
unsigned* barrier_word(int dev, cudaStream_t st) {
  static unsigned* words[64] = {};
  static std::mutex mu;
  static std::atomic<unsigned> next{0};
  if (dev < 0 || dev >= 64) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!words[dev]) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return nullptr;
    unsigned* w = nullptr;
    if (cudaMalloc(&w, kBarSlots * sizeof(unsigned)) != cudaSuccess) return nullptr;
    if (cudaMemset(w, 0, kBarSlots * sizeof(unsigned)) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
      cudaFree(w);
      return nullptr;
    }
    words[dev] = w;
  }
  return words[dev] + next.fetch_add(1) % kBarSlots;
}

int device_attr(cudaDeviceAttr attr, int dev) {
  int v = 0;
  cudaDeviceGetAttribute(&v, attr, dev);
  return v;
}

// Rows per CTA: variant bits 16-20, else as many rows as kRowsAutoBytes holds (1 to kRowsMaxC).
int rows_per_cta(int variant, int64_t rb) {
  const int c = (variant >> 16) & 31;
  return c ? c : (int)std::max<int64_t>(1, std::min<int64_t>(kRowsMaxC, kRowsAutoBytes / rb));
}

// The launch attribute of a programmatic dependent launch, when pdl; none otherwise.
void pdl_attr(cudaLaunchConfig_t& cfg, cudaLaunchAttribute* attr, bool pdl) {
  if (!pdl) return;
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
}

template <bool FUSED, bool EF>
int launch_rows(RowsArgs ra, bool pdl, int dev, cudaStream_t st) {
  auto kern = permute_rows_kernel<FUSED, EF>;
  const int64_t need = std::max<int64_t>(ra.C * ra.rb, FUSED ? 4 * (int64_t)ra.E : 0);
  const int smem = (int)cdiv(need, 16) * 16;
  ra.hist_off = (uint32_t)(FUSED ? smem - 4 * ra.E : smem);
  const int per_sm = std::min(blocks_per_sm(reinterpret_cast<const void*>(kern), 32, smem, dev), kRowsMaxPerSm);
  if (per_sm < 1) return 1;  // the rows do not fit in shared memory: another copy takes them
  const int64_t sms = device_attr(cudaDevAttrMultiProcessorCount, dev);
  int64_t grid = std::min<int64_t>(sms * per_sm, cdiv(ra.T, ra.C));
  if (FUSED) grid = std::min<int64_t>(grid, kFusedMaxCtas);
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(32);
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = st;
  if (FUSED) {
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  } else {
    pdl_attr(cfg, attr, pdl);
  }
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, ra);
  if (e == cudaSuccess) return 0;
  if (!FUSED) return fail("permute_rows_kernel", e);
  cudaGetLastError();  // a refused cooperative launch is not sticky: the unfused path runs instead
  return 1;
}

RowsArgs rows_args(const CopyArgs& a, int C) {
  RowsArgs r = {};
  r.x = static_cast<const uint8_t*>(a.x);
  r.sx = static_cast<const uint8_t*>(a.sx);
  r.idx = a.idx;
  r.out = static_cast<uint8_t*>(a.out);
  r.sout = static_cast<uint8_t*>(a.sout);
  r.row_map = a.row_map;
  r.probs = a.probs;
  r.out_probs = a.out_probs;
  r.lrank = const_cast<int32_t*>(a.lrank);
  r.base = const_cast<int32_t*>(a.base);
  r.estart = const_cast<int32_t*>(a.estart);
  r.T = a.T, r.rb = a.rb, r.sb = a.sb;
  r.K = a.K, r.E = a.E, r.C = C, r.SB = a.SB;
  r.idx64 = a.idx64;
  return r;
}

// The rows kernel's applicability: sm_90+, 16-byte rows at 16-byte aligned addresses, C*K slots
// per group within the lanes' registers. 0: C, else not applicable.
int rows_applicable(const CopyArgs& a, int variant, int dev) {
  if (device_attr(cudaDevAttrComputeCapabilityMajor, dev) < 9) return 0;
  if (a.rb % 16 != 0 || !aligned<uint4>(a.x) || !aligned<uint4>(a.out)) return 0;
  const int C = rows_per_cta(variant, a.rb);
  return (C > kRowsMaxC || C * a.K > 32 * kRowsLaneSlots) ? 0 : C;
}

// After route_rank / route_scan (variant bit 14, or where the fused kernel cannot run); pdl: as a
// programmatic dependent launch after route_scan (variant bit 15).
int rows_copy(const CopyArgs& a, int variant, bool pdl, int dev, cudaStream_t st) {
  const int C = rows_applicable(a, variant, dev);
  if (C == 0) return 1;
  const RowsArgs r = rows_args(a, C);
  return (variant & 1) ? launch_rows<false, false>(r, pdl, dev, st) : launch_rows<false, true>(r, pdl, dev, st);
}

// What only the fused kernel writes (route_scan's outputs) and where its counts go.
struct FusedOut {
  int pad; int32_t *ecount, *tpe, *total, *host_total, *host_tpe, *counts;
};

// The fused kernel, index work included: 0 launched, 1 not applicable (then the index kernels
// and rows_copy run), < 0 error.
int rows_fused(const CopyArgs& a, const FusedOut& f, int variant, int dev, cudaStream_t st) {
  if (a.E > kFusedMaxE || !device_attr(cudaDevAttrCooperativeLaunch, dev)) return 1;
  const int C = rows_applicable(a, variant, dev);
  if (C == 0) return 1;
  RowsArgs r = rows_args(a, C);
  r.base = f.counts;
  r.ecount = f.ecount, r.tpe = f.tpe, r.total = f.total, r.host_total = f.host_total, r.host_tpe = f.host_tpe;
  r.pad = f.pad;
  r.bar = barrier_word(dev, st);
  if (!r.bar) return 1;
  return (variant & 1) ? launch_rows<true, false>(r, false, dev, st) : launch_rows<true, true>(r, false, dev, st);
}

// The host's wait for the row count where no event marks the end of the index work (the fused
// kernel: the copy runs in the same kernel; PDL: an event would order the copy after the index
// kernels again): poll the mapped host word, asking the stream now and then whether it failed or
// ended without writing it.
int64_t poll_row_count(const int32_t* host_total, cudaStream_t st) {
  for (unsigned spin = 1;; ++spin) {
    const int32_t v = *(volatile const int32_t*)host_total;
    if (v >= 0) {
      std::atomic_thread_fence(std::memory_order_acquire);  // the host counts, written before it (weakly ordered hosts)
      return v;
    }
    if ((spin & 4095) != 0) continue;
    const cudaError_t q = cudaStreamQuery(st);
    if (q == cudaErrorNotReady) continue;
    const int32_t w = *(volatile const int32_t*)host_total;
    if (q == cudaSuccess && w >= 0) return w;
    return q == cudaSuccess ? fail("moe_permute: the index work ended without a row count")
                            : fail("moe_permute: waiting for the row count", q);
  }
}
