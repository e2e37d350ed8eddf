// moebench permute / unpermute / sort-chunks CUDA kernels (see moe_permute.h for the contract).
//
// Permute = one fused launch (permute_rows) or two or three, no host round trip before the copy:
//   route_rank  : (csrc/permute_index.cuh, as route_scan) slots in blocks of 256*ITEMS; each warp
//                 ranks its slots stably per expert with __match_any_sync; per-warp counts are
//                 scanned in shared memory; writes each slot's rank inside its block and the
//                 block's per-expert counts [NB, E].
//   route_scan  : one 32x32 block per 32 experts turns counts into each block's first row per
//                 expert; the last block to finish scans the expert totals (expert starts padded
//                 to `pad`): tokens per expert and the row count, also written to mapped pinned
//                 host memory so the host can learn R while the copy runs. Variant bit 12: both in
//                 one launch (route_rank's last block scans); bit 15: as programmatic dependent launches.
//   permute_rows: (sm_90+, 16-byte rows; csrc/permute_rows.cuh) one-warp CTAs each bulk-load C
//                 whole rows into shared memory, then bulk-store the C x K rows; after route_rank
//                 and route_scan (variant 16384, Python's default: faster on the H200) or with the
//                 rank/scan work fused in (variant 0: one cooperative launch, no route_* kernels);
//                 writes row_map (and, when asked, each row's routing weight).
//   permute_bulk: (variant bit 13, the previous default) lane 0 of a one-warp block bulk-loads a
//                 row chunk into one of 3 buffers and bulk-stores it to its K rows.
//   permute_copy: (fallback, or variant bit 4) one warp per token reads its row once (16-byte
//                 vectors, UNROLL in flight) and stores it to its K rows. fp8 scales ride along.
// Unpermute: one warp per token, all K rows' vectors loaded before use (KMAX compile-time), fp32
// accumulation in k order with round-to-nearest mul and add (bitwise equal to the torch oracle).
#include "moe_permute.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace {

thread_local char g_err[512] = "";

int fail(const char* what, cudaError_t e = cudaSuccess) {
  snprintf(g_err, sizeof(g_err), "%s%s%s", what, e == cudaSuccess ? "" : ": ",
           e == cudaSuccess ? "" : cudaGetErrorString(e));
  return -1;
}

#define MOE_CHECK_LAUNCH(what)                     \
  do {                                             \
    cudaError_t e_ = cudaGetLastError();           \
    if (e_ != cudaSuccess) return fail(what, e_);  \
  } while (0)

constexpr int kWarps = 8;        // warps per block in every kernel
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFull = 0xffffffffu;

// ------------------------------------------------------------------ vector load/store helpers
template <typename V, bool STREAM>
__device__ __forceinline__ V ld(const V* p) {
  if constexpr (STREAM) return __ldcs(p); else return __ldg(p);
}
template <typename V, bool STREAM>
__device__ __forceinline__ void st(V* p, const V& v) {
  if constexpr (STREAM) __stcs(p, v); else *p = v;
}
// __ldcs/__stcs/__ldg have no overloads for 8/16-bit scalars; route those through plain access.
template <> __device__ __forceinline__ uint8_t ld<uint8_t, true>(const uint8_t* p) { return *p; }
template <> __device__ __forceinline__ uint8_t ld<uint8_t, false>(const uint8_t* p) { return *p; }
template <> __device__ __forceinline__ void st<uint8_t, true>(uint8_t* p, const uint8_t& v) { *p = v; }
template <> __device__ __forceinline__ uint16_t ld<uint16_t, true>(const uint16_t* p) { return *p; }
template <> __device__ __forceinline__ uint16_t ld<uint16_t, false>(const uint16_t* p) { return *p; }
template <> __device__ __forceinline__ void st<uint16_t, true>(uint16_t* p, const uint16_t& v) { *p = v; }

// One row of nv vectors copied by a warp, UNROLL read-only-cache loads in flight per lane, then the
// stores (streaming when STREAM). sort_chunks and the destination-order gather both copy rows so.
template <typename V, int UNROLL, bool STREAM>
__device__ __forceinline__ void warp_copy_row(const V* __restrict__ src, V* __restrict__ dst, int64_t nv,
                                              int lane) {
  for (int64_t v0 = 0; v0 < nv; v0 += 32 * UNROLL) {
    V buf[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t v = v0 + u * 32 + lane;
      if (v < nv) buf[u] = __ldg(src + v);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t v = v0 + u * 32 + lane;
      if (v < nv) st<V, STREAM>(dst + v, buf[u]);
    }
  }
}

// Inclusive prefix sum of v across the 32 lanes of a full warp.
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T u = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += u;
  }
  return v;
}

__device__ __forceinline__ long long load_idx(const void* idx, bool idx64, int64_t s) {
  return idx64 ? static_cast<const long long*>(idx)[s] : static_cast<const int*>(idx)[s];
}

#include "permute_index.cuh"

// ------------------------------------------------------------------ permute_copy
// Output row of slot s (expert e): expert start + the slot block's base + rank in the block.
__device__ __forceinline__ int slot_row(const void* idx, bool idx64, int64_t s, int E, int SB,
                                        const int32_t* estart, const int32_t* base,
                                        const int32_t* lrank) {
  const long long e = load_idx(idx, idx64, s);
  return (e >= 0 && e < E) ? estart[e] + base[(s / SB) * E + e] + lrank[s] : -1;
}

// Token t's scale row to its K rows (lane k < K holds row k): 4-byte words when aligned, else
// bytes. The whole warp iterates, so the shuffles stay converged.
__device__ void copy_scales(const uint8_t* sx, int64_t s_bytes, int64_t t, int K, int row,
                            uint8_t* sout, int lane) {
  const bool w4 = (s_bytes & 3) == 0;
  const int64_t n = w4 ? s_bytes / 4 : s_bytes;
  for (int64_t i0 = 0; i0 < n; i0 += 32) {
    const int64_t i = i0 + lane;
    uint32_t v4 = 0;
    uint8_t v1 = 0;
    if (i < n) {
      if (w4) v4 = reinterpret_cast<const uint32_t*>(sx + t * s_bytes)[i];
      else v1 = sx[t * s_bytes + i];
    }
    for (int k = 0; k < K; ++k) {
      const int r = __shfl_sync(kFull, row, k);
      if (r < 0 || i >= n) continue;
      if (w4) reinterpret_cast<uint32_t*>(sout + (int64_t)r * s_bytes)[i] = v4;
      else sout[(int64_t)r * s_bytes + i] = v1;
    }
  }
}

// slot s goes to output row `row` (-1: skipped): row_map, and the slot's routing weight when asked
__device__ __forceinline__ void write_row(int32_t* row_map, const float* probs, float* out_probs,
                                          int64_t s, int row) {
  row_map[s] = row;
  if (probs != nullptr && row >= 0) out_probs[row] = probs[s];
}

template <typename V, int UNROLL, bool STREAM>
__global__ void __launch_bounds__(kThreads) permute_copy_kernel(
    const V* __restrict__ x, int64_t nv, const uint8_t* __restrict__ sx, int64_t s_bytes,
    const void* __restrict__ idx, bool idx64, int64_t T, int K, int E, int SB,
    const int32_t* __restrict__ lrank, const int32_t* __restrict__ base,
    const int32_t* __restrict__ estart, V* __restrict__ out, uint8_t* __restrict__ sout,
    int32_t* __restrict__ row_map, const float* __restrict__ probs, float* __restrict__ out_probs,
    int parts) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int64_t t = gw / parts;    // `parts` warps share a token, striding over its row
  const int part = (int)(gw % parts);
  if (t >= T) return;
  int row = -1;  // lane k < K holds slot k's output row (K <= 32)
  if (lane < K) {
    row = slot_row(idx, idx64, t * K + lane, E, SB, estart, base, lrank);
    if (part == 0) write_row(row_map, probs, out_probs, t * K + lane, row);
  }
  const V* src = x + t * nv;
  for (int64_t v0 = (int64_t)part * 32 * UNROLL; v0 < nv; v0 += (int64_t)parts * 32 * UNROLL) {
    V buf[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t v = v0 + u * 32 + lane;
      if (v < nv) buf[u] = ld<V, STREAM>(src + v);
    }
    for (int k = 0; k < K; ++k) {
      const int r = __shfl_sync(kFull, row, k);
      if (r < 0) continue;
      V* dst = out + (int64_t)r * nv;
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int64_t v = v0 + u * 32 + lane;
        if (v < nv) st<V, STREAM>(dst + v, buf[u]);
      }
    }
  }
  if (s_bytes > 0 && part == 0) copy_scales(sx, s_bytes, t, K, row, sout, lane);
}

// ------------------------------------------------------------------ bulk-copy PTX (sm_90+)
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// PTX wrappers of the bulk copies (permute_bulk here, permute_rows in permute_rows.cuh); EF: with an L2
// cache hint (pol, an evict-first policy from evict_first_policy).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ void mbar_init(uint32_t mb) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mb) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t mb, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(mb), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t mb, uint32_t parity) {
  uint32_t ready = 0;
  while (!ready)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(ready) : "r"(mb), "r"(parity) : "memory");
}
template <bool EF>
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t n, uint32_t mb, uint64_t pol) {
  if (EF)
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 :: "r"(dst), "l"(src), "r"(n), "r"(mb), "l"(pol) : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(dst), "l"(src), "r"(n), "r"(mb) : "memory");
}
template <bool EF>
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t n, uint64_t pol) {
  if (EF)
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;"
                 :: "l"(dst), "r"(src), "r"(n), "l"(pol) : "memory");
  else
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 :: "l"(dst), "r"(src), "r"(n) : "memory");
}

// ------------------------------------------------------------------ permute_bulk (sm_90+)
// One-row bulk-copy (TMA) path (variant bit 13): one warp per block, NBUF shared-memory buffers of
// one row chunk each.
// Lane 0 loads a chunk with cp.async.bulk (completion on an mbarrier) and stores it to its K
// rows with K cp.async.bulk shared->global copies; the other lanes only work out the rows.
// Blocks stride over (token, chunk) items; a buffer is refilled once its stores have read it.
template <int NBUF, bool EVICT_FIRST>
__global__ void __launch_bounds__(32) permute_bulk_kernel(
    const uint8_t* __restrict__ x, int64_t rb, int64_t chunk, int64_t nchunk,
    const uint8_t* __restrict__ sx, int64_t s_bytes, const void* __restrict__ idx, bool idx64,
    int64_t T, int K, int E, int SB, const int32_t* __restrict__ lrank,
    const int32_t* __restrict__ base, const int32_t* __restrict__ estart,
    uint8_t* __restrict__ out, uint8_t* __restrict__ sout, int32_t* __restrict__ row_map,
    const float* __restrict__ probs, float* __restrict__ out_probs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t sbuf[];
  __shared__ __align__(8) uint64_t bar[NBUF];
  const int lane = threadIdx.x;
  const int64_t n_items = T * nchunk;
  const uint64_t policy = EVICT_FIRST ? evict_first_policy() : 0;
  auto load = [&](int64_t item, int b) {  // lane 0 only
    const int64_t t = item / nchunk, c = item - t * nchunk;
    const uint32_t n = (uint32_t)min(chunk, rb - c * chunk);
    const uint32_t mb = smem_u32(&bar[b]);
    mbar_expect(mb, n);
    bulk_load<EVICT_FIRST>(smem_u32(sbuf + b * chunk), x + t * rb + c * chunk, n, mb, policy);
  };
  if (lane == 0) {
    for (int b = 0; b < NBUF; ++b) mbar_init(smem_u32(&bar[b]));
    for (int b = 0; b < NBUF; ++b) {
      const int64_t item = blockIdx.x + (int64_t)b * gridDim.x;
      if (item < n_items) load(item, b);
    }
  }
  for (int64_t j = 0;; ++j) {
    const int64_t item = blockIdx.x + j * gridDim.x;
    if (item >= n_items) break;
    const int b = (int)(j % NBUF);
    const int64_t t = item / nchunk, c = item - t * nchunk;
    const uint32_t n = (uint32_t)min(chunk, rb - c * chunk);
    int row = -1;
    if (lane < K) {
      row = slot_row(idx, idx64, t * K + lane, E, SB, estart, base, lrank);
      if (c == 0) write_row(row_map, probs, out_probs, t * K + lane, row);
    }
    if (lane == 0) mbar_wait(smem_u32(&bar[b]), (uint32_t)((j / NBUF) & 1));
    const uint32_t src = smem_u32(sbuf + b * chunk);
    for (int k = 0; k < K; ++k) {
      const int r = __shfl_sync(kFull, row, k);
      if (lane != 0 || r < 0) continue;
      bulk_store<EVICT_FIRST>(out + (int64_t)r * rb + c * chunk, src, n, policy);
    }
    if (lane == 0) asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    if (c == 0 && s_bytes > 0) copy_scales(sx, s_bytes, t, K, row, sout, lane);
    if (lane == 0 && j >= 1) {  // refill the previous item's buffer once its stores have read it
      const int64_t next = blockIdx.x + (j - 1 + NBUF) * gridDim.x;
      if (next < n_items) {
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        load(next, (int)((j - 1) % NBUF));
      }
    }
  }
  if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

// zero the padding rows of expert blockIdx.x: rows [start + count, start + padded), contiguous
__device__ void zero_bytes(uint8_t* p, int64_t n) {
  if (n <= 0) return;
  if ((reinterpret_cast<uintptr_t>(p) & 15) == 0 && (n & 15) == 0) {
    uint4* q = reinterpret_cast<uint4*>(p);
    for (int64_t i = threadIdx.x; i < n / 16; i += kThreads) q[i] = make_uint4(0, 0, 0, 0);
  } else {
    for (int64_t i = threadIdx.x; i < n; i += kThreads) p[i] = 0;
  }
}

__global__ void __launch_bounds__(kThreads) zero_pad_kernel(uint8_t* __restrict__ out,
                                                            int64_t row_bytes,
                                                            uint8_t* __restrict__ sout,
                                                            int64_t s_bytes,
                                                            const int32_t* __restrict__ estart,
                                                            const int32_t* __restrict__ ecount,
                                                            const int32_t* __restrict__ tpe,
                                                            float* __restrict__ out_probs) {
  const int e = blockIdx.x;
  const int64_t r0 = (int64_t)estart[e] + ecount[e], r1 = (int64_t)estart[e] + tpe[e];
  zero_bytes(out + r0 * row_bytes, (r1 - r0) * row_bytes);
  if (sout) zero_bytes(sout + r0 * s_bytes, (r1 - r0) * s_bytes);
  if (out_probs)
    for (int64_t r = r0 + threadIdx.x; r < r1; r += kThreads) out_probs[r] = 0.f;
}

// ------------------------------------------------------------------ unpermute
template <typename T> struct Elem;
template <> struct Elem<float> {
  static __device__ __forceinline__ float to(float v) { return v; }
  static __device__ __forceinline__ float from(float v) { return v; }
};
template <> struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
template <> struct Elem<__half> {
  static __device__ __forceinline__ float to(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from(float v) { return __float2half_rn(v); }
};

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack { T v[VEC]; };

template <typename P>
__device__ __forceinline__ P ldg_pack(const P* p) {
  P r;
  if constexpr (sizeof(P) == 16) *reinterpret_cast<uint4*>(&r) = __ldg(reinterpret_cast<const uint4*>(p));
  else if constexpr (sizeof(P) == 8) *reinterpret_cast<uint2*>(&r) = __ldg(reinterpret_cast<const uint2*>(p));
  else if constexpr (sizeof(P) == 4) *reinterpret_cast<unsigned*>(&r) = __ldg(reinterpret_cast<const unsigned*>(p));
  else if constexpr (sizeof(P) == 2) *reinterpret_cast<unsigned short*>(&r) = __ldg(reinterpret_cast<const unsigned short*>(p));
  else r = *p;
  return r;
}

__device__ __forceinline__ float load_w(const void* w, int dt, int64_t i) {
  if (dt == MOE_F32) return static_cast<const float*>(w)[i];
  if (dt == MOE_BF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(w)[i]);
  return __half2float(static_cast<const __half*>(w)[i]);
}

// One warp per token, 8 warps per block; rows and weights of the K slots held in registers.
// (A variant with 4-warp blocks and per-chunk shuffles, 96 registers, is slower on Hopper:
// docs/decisions.md, "The permute and unpermute defaults".)
template <typename T, int VEC, int KMAX, int UNROLL>
__global__ void __launch_bounds__(kThreads) unpermute_kernel(const T* __restrict__ y,
                                                             const int32_t* __restrict__ row_map,
                                                             const void* __restrict__ w, int w_dt,
                                                             T* __restrict__ out, int64_t Tn,
                                                             int K, int64_t nv) {
  using P = Pack<T, VEC>;
  const int lane = threadIdx.x & 31;
  const int64_t t = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (t >= Tn) return;
  int row = -1;
  float wk = 0.f;
  if (lane < K) {
    row = row_map[t * K + lane];
    if (row >= 0) wk = load_w(w, w_dt, t * K + lane);
  }
  int rows[KMAX];
  float ws[KMAX];
#pragma unroll
  for (int k = 0; k < KMAX; ++k) {
    rows[k] = __shfl_sync(kFull, row, k);
    ws[k] = __shfl_sync(kFull, wk, k);
    if (k >= K) rows[k] = -1;
  }
  const P* yp = reinterpret_cast<const P*>(y);
  P* op = reinterpret_cast<P*>(out) + t * nv;
  for (int64_t v0 = 0; v0 < nv; v0 += 32 * UNROLL) {
    P buf[KMAX][UNROLL];
#pragma unroll
    for (int k = 0; k < KMAX; ++k)
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int64_t v = v0 + u * 32 + lane;
        if (rows[k] >= 0 && v < nv) buf[k][u] = ldg_pack(yp + (int64_t)rows[k] * nv + v);
      }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t v = v0 + u * 32 + lane;
      if (v >= nv) continue;
      float acc[VEC];
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] = 0.f;
#pragma unroll
      for (int k = 0; k < KMAX; ++k) {
        if (rows[k] < 0) continue;
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          acc[i] = __fadd_rn(acc[i], __fmul_rn(ws[k], Elem<T>::to(buf[k][u].v[i])));
      }
      P o;
#pragma unroll
      for (int i = 0; i < VEC; ++i) o.v[i] = Elem<T>::from(acc[i]);
      op[v] = o;
    }
  }
}

// ------------------------------------------------------------------ sort_chunks
// Exclusive scan in place over a[0, n) in shared memory by the whole block (kThreads threads).
__device__ void block_exclusive_scan(int64_t* a, int n, int64_t* wsum) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (n + kThreads - 1) / kThreads, i0 = min(n, tid * per), i1 = min(n, i0 + per);
  int64_t local = 0;
  for (int i = i0; i < i1; ++i) local += a[i];
  const int64_t incl = warp_inclusive_sum(local, lane);
  if (lane == 31) wsum[warp] = incl;
  __syncthreads();
  if (tid == 0) {
    int64_t r = 0;
    for (int w = 0; w < kWarps; ++w) { const int64_t v = wsum[w]; wsum[w] = r; r += v; }
  }
  __syncthreads();
  int64_t run = wsum[warp] + incl - local;
  for (int i = i0; i < i1; ++i) { const int64_t v = a[i]; a[i] = run; run += v; }
  __syncthreads();
}

template <typename V, int UNROLL>
__global__ void __launch_bounds__(kThreads) sort_chunks_kernel(const V* __restrict__ x,
                                                               V* __restrict__ out, int64_t nv,
                                                               int64_t R,
                                                               const int64_t* __restrict__ sizes,
                                                               const int64_t* __restrict__ idxs,
                                                               int C) {
  extern __shared__ int64_t sm[];  // in_start[C], out_start[C], src_start[C]
  __shared__ int64_t wsum[kWarps];
  int64_t *in_start = sm, *out_start = sm + C, *src_start = sm + 2 * C;
  for (int c = threadIdx.x; c < C; c += kThreads) {
    in_start[c] = sizes[c];
    out_start[c] = sizes[idxs[c]];
  }
  __syncthreads();
  block_exclusive_scan(in_start, C, wsum);
  block_exclusive_scan(out_start, C, wsum);
  for (int c = threadIdx.x; c < C; c += kThreads) src_start[c] = in_start[idxs[c]];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  for (int64_t r = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5); r < R;
       r += (int64_t)gridDim.x * kWarps) {
    int lo = 0, hi = C - 1;  // last chunk j with out_start[j] <= r
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (out_start[mid] <= r) lo = mid; else hi = mid - 1;
    }
    warp_copy_row<V, UNROLL, false>(x + (src_start[lo] + r - out_start[lo]) * nv, out + r * nv, nv, lane);
  }
}

// ------------------------------------------------------------------ host helpers
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// slots per rank block = 256 * items; aim for <= blocks blocks: 128 for route_scan's wide grid, 32 for the
// one-launch index, whose last block loads each expert's column of counts 32 blocks at a time
int slot_items(int64_t n, int blocks = 128) {
  int items = 1;
  while (items < 16 && (int64_t)kThreads * items * blocks < n) items *= 2;
  return items;
}

// mapped pinned slots for the row count, plus one event each, reused round-robin per device
struct HostSlots {
  int32_t* host = nullptr;
  cudaEvent_t ev[64];
  bool ok = false;
};
constexpr int kSlots = 64;
HostSlots g_slots[64];
std::mutex g_slots_mu;
std::atomic<unsigned> g_slot_next{0};

HostSlots* host_slots(int dev) {
  if (dev < 0 || dev >= 64) return nullptr;
  std::lock_guard<std::mutex> lock(g_slots_mu);
  HostSlots& hs = g_slots[dev];
  if (!hs.ok) {
    if (cudaHostAlloc(&hs.host, kSlots * sizeof(int32_t), cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess)
      return nullptr;
    for (int i = 0; i < kSlots; ++i)
      if (cudaEventCreateWithFlags(&hs.ev[i], cudaEventDisableTiming) != cudaSuccess) return nullptr;
    hs.ok = true;
  }
  return &hs;
}

template <typename V>
bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(V) == 0; }

// Arguments every copy kernel takes.
struct CopyArgs {
  const void* x; int64_t rb; const void* sx; int64_t sb; const void* idx; bool idx64;
  int64_t T; int K, E, SB; const int32_t *lrank, *base, *estart; void *out, *sout;
  int32_t* row_map;
  const float* probs; float* out_probs;   // routing weights [T*K] -> [R], both null when not asked
};

template <typename V, bool STREAM, int U>
void launch_copy(const CopyArgs& a, int parts, cudaStream_t st) {
  const dim3 grid((unsigned)cdiv(a.T * parts, kWarps));
  permute_copy_kernel<V, U, STREAM><<<grid, kThreads, 0, st>>>(
      static_cast<const V*>(a.x), a.rb / (int64_t)sizeof(V), static_cast<const uint8_t*>(a.sx),
      a.sb, a.idx, a.idx64, a.T, a.K, a.E, a.SB, a.lrank, a.base, a.estart,
      static_cast<V*>(a.out), static_cast<uint8_t*>(a.sout), a.row_map, a.probs, a.out_probs, parts);
}

// Warp copy; variant bit 0: streaming (evict-first) loads/stores; bit 1: 8 vectors in flight per
// lane, not 4; bits 2-3: 1, 2, 4 or 8 warps per token (each takes every parts-th stripe).
template <bool STREAM, bool DEEP>
void dispatch_copy(const CopyArgs& a, int parts, cudaStream_t st) {
  const int64_t rb = a.rb;
  if (rb % 16 == 0 && aligned<uint4>(a.x) && aligned<uint4>(a.out)) launch_copy<uint4, STREAM, DEEP ? 8 : 4>(a, parts, st);
  else if (rb % 8 == 0 && aligned<uint2>(a.x) && aligned<uint2>(a.out)) launch_copy<uint2, STREAM, 8>(a, parts, st);
  else if (rb % 4 == 0 && aligned<uint32_t>(a.x) && aligned<uint32_t>(a.out)) launch_copy<uint32_t, STREAM, 8>(a, parts, st);
  else if (rb % 2 == 0 && aligned<uint16_t>(a.x) && aligned<uint16_t>(a.out)) launch_copy<uint16_t, STREAM, 16>(a, parts, st);
  else launch_copy<uint8_t, STREAM, 16>(a, parts, st);
}

int warp_copy(const CopyArgs& a, int variant, cudaStream_t st) {
  const int parts = 1 << ((variant >> 2) & 3);
  switch (variant & 3) {
    case 0: dispatch_copy<false, false>(a, parts, st); break;
    case 1: dispatch_copy<true, false>(a, parts, st); break;
    case 2: dispatch_copy<false, true>(a, parts, st); break;
    default: dispatch_copy<true, true>(a, parts, st); break;
  }
  MOE_CHECK_LAUNCH("permute_copy_kernel");
  return 0;
}

// Blocks per SM of kern with `smem` bytes of dynamic shared memory (0 when they do not fit), asked
// once per (kernel, threads, smem, device): the attribute and occupancy calls cost host time on every
// permute otherwise. The kernel's dynamic shared-memory limit is raised once to all the device
// allows (not to `smem`: a later call with more would find a stale, lower limit). -1: a CUDA error
// (cleared, so that a fallback launch does not report it).
int blocks_per_sm(const void* kern, int threads, int smem, int dev) {
  struct Entry { const void* k; int threads, smem, dev, per_sm; };
  static Entry cache[128];
  static int n = 0;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < n; ++i)
    if (cache[i].k == kern && cache[i].threads == threads && cache[i].smem == smem && cache[i].dev == dev)
      return cache[i].per_sm;
  cudaFuncAttributes fa;
  int optin = 0, per_sm = 0;
  if (cudaFuncGetAttributes(&fa, kern) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  const int limit = optin - (int)fa.sharedSizeBytes;
  if (smem <= limit) {
    if ((fa.maxDynamicSharedSizeBytes < limit &&
         cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, limit) != cudaSuccess) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, threads, smem) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
  }
  if (n < 128) cache[n++] = Entry{kern, threads, smem, dev, per_sm};
  return per_sm;
}

template <int NBUF, bool EF>
int launch_bulk(const CopyArgs& a, int64_t chunk, int64_t nchunk, int dev, cudaStream_t st) {
  auto kern = permute_bulk_kernel<NBUF, EF>;
  const int smem = (int)(NBUF * chunk);
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kern), 32, smem, dev);
  if (per_sm < 1) return fail("permute_bulk_kernel: no occupancy for its shared memory");
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const unsigned grid = (unsigned)std::min<int64_t>(a.T * nchunk, (int64_t)sms * per_sm);
  kern<<<grid, 32, smem, st>>>(static_cast<const uint8_t*>(a.x), a.rb, chunk, nchunk,
                               static_cast<const uint8_t*>(a.sx), a.sb, a.idx, a.idx64, a.T, a.K,
                               a.E, a.SB, a.lrank, a.base, a.estart, static_cast<uint8_t*>(a.out),
                               static_cast<uint8_t*>(a.sout), a.row_map, a.probs, a.out_probs);
  MOE_CHECK_LAUNCH("permute_bulk_kernel");
  return 0;
}

template <int NBUF>
int bulk_hints(const CopyArgs& a, int64_t chunk, int64_t nchunk, int variant, int dev, cudaStream_t st) {
  return (variant & 1) ? launch_bulk<NBUF, false>(a, chunk, nchunk, dev, st)
                       : launch_bulk<NBUF, true>(a, chunk, nchunk, dev, st);
}

// Bulk-copy path (variant bit 13, the previous default; also rows the rows kernel cannot hold in
// shared memory), when the GPU has it (sm_90+) and rows are 16-byte multiples at 16-byte aligned
// addresses; returns 1 when it does not apply. variant bit 0: no L2 evict-first hints on the
// loads and stores; bits 5-6: buffers per block 3 (0), 2, 3 or 4; bit 7: chunks of <= 4 KB,
// not <= 16 KB.
int bulk_copy(const CopyArgs& a, int variant, int dev, cudaStream_t st) {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (major < 9 || a.rb % 16 != 0 || !aligned<uint4>(a.x) || !aligned<uint4>(a.out)) return 1;
  const int64_t cap = (variant & 128) ? 4096 : 16384;
  const int64_t nchunk = cdiv(a.rb, cap), chunk = cdiv(cdiv(a.rb, nchunk), 16) * 16;
  const int nb = (variant >> 5) & 3;
  if (nb == 1) return bulk_hints<2>(a, chunk, nchunk, variant, dev, st);
  if (nb == 3) return bulk_hints<4>(a, chunk, nchunk, variant, dev, st);
  return bulk_hints<3>(a, chunk, nchunk, variant, dev, st);
}

#include "permute_gather.cuh"
#include "permute_rows.cuh"

// variant bit 1: 2 vectors per row in flight for K <= 8 (more registers, fewer warps)
template <typename T, int VEC>
int launch_unpermute(const void* y, const int32_t* row_map, const void* w, int w_dt, void* out,
                     int64_t Tn, int K, int64_t H, int variant, cudaStream_t st) {
  const dim3 grid((unsigned)cdiv(Tn, kWarps));
  const int64_t nv = H / VEC;
  const T* yp = static_cast<const T*>(y);
  T* op = static_cast<T*>(out);
#define MOE_UNP(KM, U) unpermute_kernel<T, VEC, KM, U><<<grid, kThreads, 0, st>>>(yp, row_map, w, w_dt, op, Tn, K, nv)
  if (K <= 4) MOE_UNP(4, 2);
  else if (K <= 8 && (variant & 2)) MOE_UNP(8, 2);
  else if (K <= 8) MOE_UNP(8, 1);
  else if (K <= 16) MOE_UNP(16, 1);
  else MOE_UNP(32, 1);
#undef MOE_UNP
  MOE_CHECK_LAUNCH("unpermute_kernel");
  return 0;
}

template <typename T>
int dispatch_unpermute(const void* y, const int32_t* row_map, const void* w, int w_dt, void* out,
                       int64_t Tn, int K, int64_t H, int variant, cudaStream_t st) {
  constexpr int VEC = 16 / sizeof(T);
  if (H % VEC == 0 && aligned<uint4>(y) && aligned<uint4>(out))
    return launch_unpermute<T, VEC>(y, row_map, w, w_dt, out, Tn, K, H, variant, st);
  return launch_unpermute<T, 1>(y, row_map, w, w_dt, out, Tn, K, H, variant, st);
}

template <typename V>
int launch_sort_chunks(const void* x, int64_t rb, int64_t R, const int64_t* sizes,
                       const int64_t* idxs, int C, void* out, cudaStream_t st) {
  constexpr int U = sizeof(V) >= 16 ? 4 : 8;
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const unsigned grid = (unsigned)std::min<int64_t>(cdiv(R, kWarps), (int64_t)sms * 8);
  const size_t smem = 3 * (size_t)C * sizeof(int64_t);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(sort_chunks_kernel<V, U>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return fail("sort_chunks: too many chunks for shared memory", e);
  }
  sort_chunks_kernel<V, U><<<grid, kThreads, smem, st>>>(static_cast<const V*>(x),
                                                         static_cast<V*>(out),
                                                         rb / (int64_t)sizeof(V), R, sizes, idxs, C);
  MOE_CHECK_LAUNCH("sort_chunks_kernel");
  return 0;
}

// ------------------------------------------------------------------ permute: index work and copy choice
constexpr int kNotRows = 16 | 256 | 8192;  // variant bits that pick another copy than permute_rows
constexpr int kUnfused = 16384;            // permute_rows after route_rank / route_scan
constexpr int kPdl = 32768;                // route_scan and permute_rows as programmatic dependent launches
constexpr int kOneIndex = 4096;            // route_rank and route_scan in one launch (scan_in_last_block)

int64_t fused_count_words(int64_t n, int E) {
  return E <= kFusedMaxE ? std::min<int64_t>(std::max<int64_t>(n, 1), kFusedMaxCtas) * E : 0;
}

// moe_permute's workspace (sizes in moe_permute_workspace_bytes): lrank [n] | base [NB, E] | estart
// [E] | ecount [E] | total | scan arrivals | gather's inv [n + E*(pad-1)] | fused counts.
struct Workspace {
  int items, SB, NB;
  int32_t *lrank, *base, *estart, *ecount, *total, *inv, *fused;
  unsigned* done;
};

Workspace workspace_layout(void* ws, int64_t n, int E, int pad, bool one_index) {
  Workspace w;
  w.items = one_index ? slot_items(n, kColumnKeep) : slot_items(n);  // never more blocks than the default
  w.SB = kThreads * w.items;
  w.NB = (int)cdiv(std::max<int64_t>(n, 1), w.SB);
  w.lrank = static_cast<int32_t*>(ws);
  w.base = w.lrank + n;
  w.estart = w.base + (int64_t)w.NB * E;
  w.ecount = w.estart + E;
  w.total = w.ecount + E;
  w.done = reinterpret_cast<unsigned*>(w.total + 1);
  w.inv = w.total + 2;
  w.fused = w.inv + n + (int64_t)E * std::max(pad - 1, 0);
  return w;
}

// route_rank + route_scan: each slot's rank in its block, block bases, expert starts, tokens per
// expert and the row count (to host_total / host_tpe too when given). one: in one launch where a zeroed
// arrival word can be had (not during a first capture); pdl: route_scan as a dependent launch.
int launch_index(const Workspace& w, const void* idx, bool idx64, int64_t n, int E, int pad, int32_t* tpe,
                 int32_t* host_total, int32_t* host_tpe, bool one, bool pdl, int dev, cudaStream_t stream) {
  RouteArgs r{idx, n, E, pad, idx64, w.lrank, w.base, w.done, w.estart, w.ecount, w.total, tpe, host_total, host_tpe};
  unsigned* word = one ? barrier_word(dev, stream) : nullptr;
  if (word) r.done = word;
  const size_t smem_rank = sizeof(int32_t) * kWarps * (size_t)E;
#define MOE_RANK(I, ONE)                                                                              \
  case I:                                                                                             \
    if (smem_rank + 1024 > 48 * 1024 && /* room for the static part: the one launch has 128 bytes */  \
        cudaFuncSetAttribute(route_rank_kernel<I, ONE>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                             (int)smem_rank) != cudaSuccess)                                          \
      return fail("route_rank_kernel: too many experts for shared memory");                           \
    route_rank_kernel<I, ONE><<<w.NB, kThreads, smem_rank, stream>>>(r);                              \
    break;
  if (word) {
    switch (w.items) { MOE_RANK(1, true) MOE_RANK(2, true) MOE_RANK(4, true) MOE_RANK(8, true) MOE_RANK(16, true) }
    MOE_CHECK_LAUNCH("route_rank_kernel (one launch)");
    return 0;
  }
  switch (w.items) { MOE_RANK(1, false) MOE_RANK(2, false) MOE_RANK(4, false) MOE_RANK(8, false) MOE_RANK(16, false) }
#undef MOE_RANK
  MOE_CHECK_LAUNCH("route_rank_kernel");
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  cfg.gridDim = dim3((unsigned)cdiv(E, 32));
  cfg.blockDim = dim3(32, 32);
  cfg.stream = stream;
  pdl_attr(cfg, attr, pdl);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, route_scan_kernel, w.base, w.NB, E, pad, tpe, w.estart, w.ecount,
                                           w.total, host_total, host_tpe, w.done);
  return e == cudaSuccess ? 0 : fail("route_scan_kernel", e);
}

// The copy after the index kernels: the destination-order gather (bit 8), the rows kernel
// (default), the one-row bulk kernel (bit 13, or rows that do not fit shared memory), the warp copy
// (bit 4, or rows the bulk copies cannot move); each returns 1 when it does not apply.
int copy_after_index(const CopyArgs& a, const Workspace& w, int variant, bool pdl, int dev, cudaStream_t st) {
  int rc = (variant & 256) ? gather_copy(a, w.NB, w.ecount, w.inv, variant, dev, st) : 1;
  if (rc == 1 && !(variant & kNotRows)) rc = rows_copy(a, variant, pdl, dev, st);
  if (rc == 1 && !(variant & 16)) rc = bulk_copy(a, variant, dev, st);
  if (rc == 1) rc = warp_copy(a, variant, st);
  return rc < 0 ? -1 : 0;
}

}  // namespace

// ================================================================== C API
extern "C" {

const char* moe_last_error(void) { return g_err; }

size_t moe_permute_workspace_bytes(int64_t n_slots, int E, int pad) {
  const int64_t sb = (int64_t)kThreads * slot_items(n_slots);
  const int64_t nb = cdiv(std::max<int64_t>(n_slots, 1), sb);
  // lrank [n] + counts/base [nb*E] + estart [E] + ecount [E] + total [1] + scan arrivals [1]
  // + the gather's row -> slot map, indexed by output row: [n + E*(pad-1)] rows with padding
  // + the fused rows kernel's per-CTA counts
  const int64_t rows = n_slots + (int64_t)E * std::max(pad - 1, 0);
  return sizeof(int32_t) * (size_t)(n_slots + rows + nb * E + 2 * (int64_t)E + 2 + fused_count_words(n_slots, E));
}

int64_t moe_permute(const void* x, int64_t x_row_bytes, const void* scales, int64_t s_row_bytes,
                    const void* idx, int idx_bytes, int64_t T, int K, int E, int pad, void* out,
                    void* out_scales, int32_t* row_map, int32_t* tpe, const float* probs,
                    float* out_probs, void* workspace, int wait, int32_t* host_tpe, int variant,
                    cudaStream_t stream) {
  if (K < 1 || K > 32) return fail("moe_permute: need 1 <= K <= 32");
  if (E < 1 || E > 4096) return fail("moe_permute: need 1 <= E <= 4096");
  if (idx_bytes != 4 && idx_bytes != 8) return fail("moe_permute: idx must be int32 or int64");
  const int64_t n = T * K;
  const Workspace w = workspace_layout(workspace, n, E, pad, variant & kOneIndex);
  int dev = 0;
  cudaGetDevice(&dev);
  HostSlots* hs = wait ? host_slots(dev) : nullptr;
  if (wait && !hs) return fail("moe_permute: cannot allocate mapped host memory");
  const unsigned slot = wait ? g_slot_next.fetch_add(1) % kSlots : 0;
  int32_t* host_total = wait ? hs->host + slot : nullptr;
  if (host_total) *(volatile int32_t*)host_total = -1;
  host_tpe = wait ? host_tpe : nullptr;
  const CopyArgs a{x, x_row_bytes, scales, scales ? s_row_bytes : 0, idx, idx_bytes == 8, T, K, E, w.SB,
                   w.lrank, w.base, w.estart, out, out_scales, row_map, probs, probs ? out_probs : nullptr};
  int fused = 1;  // 0: the fused rows kernel did the index work and the copy
  if (T > 0 && !(variant & (kNotRows | kUnfused))) {
    fused = rows_fused(a, FusedOut{pad, w.ecount, tpe, w.total, host_total, host_tpe, w.fused}, variant, dev, stream);
    if (fused < 0) return -1;
  }
  // PDL: no event between the index kernels and the copy (it would order them again); the host polls the
  // row count that the index work writes to mapped memory, as it does for the fused kernel
  const bool pdl = (variant & kPdl) && device_attr(cudaDevAttrComputeCapabilityMajor, dev) >= 9;
  if (fused) {
    if (launch_index(w, idx, idx_bytes == 8, n, E, pad, tpe, host_total, host_tpe, variant & kOneIndex, pdl, dev,
                     stream) < 0)
      return -1;
    if (wait && !pdl) {
      cudaError_t e = cudaEventRecord(hs->ev[slot], stream);
      if (e != cudaSuccess) return fail("moe_permute: event record", e);
    }
    if (T > 0 && copy_after_index(a, w, variant, pdl, dev, stream) < 0) return -1;
  }
  if (pad > 1) {
    zero_pad_kernel<<<E, kThreads, 0, stream>>>(static_cast<uint8_t*>(out), x_row_bytes,
                                                static_cast<uint8_t*>(out_scales),
                                                scales ? s_row_bytes : 0, w.estart, w.ecount, tpe,
                                                probs ? out_probs : nullptr);
    MOE_CHECK_LAUNCH("zero_pad_kernel");
  }
  if (!wait) return 0;
  if (!fused || pdl) return poll_row_count(host_total, stream);
  cudaError_t e = cudaEventSynchronize(hs->ev[slot]);
  if (e != cudaSuccess) return fail("moe_permute: waiting for the row count", e);
  return *(volatile int32_t*)host_total;
}

int moe_unpermute(const void* y, int y_dtype, const int32_t* row_map, const void* w, int w_dtype,
                  void* out, int64_t T, int K, int64_t H, int variant, cudaStream_t stream) {
  if (K < 1 || K > 32) return fail("moe_unpermute: need 1 <= K <= 32");
  if (T == 0 || H == 0) return 0;
  switch (y_dtype) {
    case MOE_F32: return dispatch_unpermute<float>(y, row_map, w, w_dtype, out, T, K, H, variant, stream);
    case MOE_BF16: return dispatch_unpermute<__nv_bfloat16>(y, row_map, w, w_dtype, out, T, K, H, variant, stream);
    case MOE_F16: return dispatch_unpermute<__half>(y, row_map, w, w_dtype, out, T, K, H, variant, stream);
  }
  return fail("moe_unpermute: y must be float32, bfloat16 or float16");
}

int moe_sort_chunks(const void* x, int64_t rb, int64_t R, const int64_t* sizes,
                    const int64_t* idxs, int C, void* out, cudaStream_t stream) {
  if (R == 0 || rb == 0) return 0;
  if (C < 1) return fail("moe_sort_chunks: need at least one chunk");
  if (rb % 16 == 0 && aligned<uint4>(x) && aligned<uint4>(out))
    return launch_sort_chunks<uint4>(x, rb, R, sizes, idxs, C, out, stream);
  if (rb % 4 == 0 && aligned<uint32_t>(x) && aligned<uint32_t>(out))
    return launch_sort_chunks<uint32_t>(x, rb, R, sizes, idxs, C, out, stream);
  return launch_sort_chunks<uint8_t>(x, rb, R, sizes, idxs, C, out, stream);
}

}  // extern "C"
