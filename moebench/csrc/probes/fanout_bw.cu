// fanout_bw: HBM bandwidth of the access patterns around a MoE permute, JSON on stdout.
//
// One warp per source row, 16-byte vectors, 4 in flight per lane (the permute's warp copy).
// T rows of R bytes are read once and written to F destination rows each:
//   copy          F = 1, destination = source index (a plain row copy)
//   scatter       F = 1, destinations a random permutation of the rows
//   fanout        F rows each, destinations t*F + k (contiguous)
//   fanout_rand   F rows each, destinations a random permutation of the T*F rows (the permute)
//   write_rand    as fanout_rand, but no source read (zeros are stored)
//   write_seq     as fanout, no source read
// Every iteration is preceded by a read-only L2 flush; median of --iters.
// GB/s counts bytes read + written, as moebench.permute does.
//
//   fanout_bw [--rows T] [--row-bytes R] [--fanout F] [--iters N]
// Exit 0 with JSON; exit 2 on bad usage; exit 3 on a CUDA error (message on stderr).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "fanout_bw: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(3);                                                                                 \
    }                                                                                          \
  } while (0)

template <bool READ>
__global__ void __launch_bounds__(256) fanout_kernel(const uint4* __restrict__ src,
                                                     uint4* __restrict__ dst,
                                                     const int* __restrict__ dest, int64_t T,
                                                     int F, int64_t nv) {
  const int lane = threadIdx.x & 31;
  const int64_t t = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
  if (t >= T) return;
  const int my = lane < F ? dest[t * F + lane] : 0;
  for (int64_t v0 = 0; v0 < nv; v0 += 128) {
    uint4 buf[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t v = v0 + u * 32 + lane;
      buf[u] = make_uint4(0, 0, 0, 0);
      if (READ && v < nv) buf[u] = __ldg(src + t * nv + v);
    }
    for (int k = 0; k < F; ++k) {
      const int64_t r = __shfl_sync(0xffffffffu, my, k);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t v = v0 + u * 32 + lane;
        if (v < nv) dst[r * nv + v] = buf[u];
      }
    }
  }
}

__global__ void flush_kernel(const float4* __restrict__ p, size_t n, float* sink) {
  float acc = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    acc += p[i].x;
  if (acc == 12345.f) *sink = acc;  // never true: keeps the loads
}

int main(int argc, char** argv) {
  int64_t T = 4096, R = 14336;
  int F = 8, iters = 20;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) { fprintf(stderr, "fanout_bw: %s needs a value\n", k.c_str()); return 2; }
    const long long v = atoll(argv[++i]);
    if (k == "--rows") T = v;
    else if (k == "--row-bytes") R = v;
    else if (k == "--fanout") F = (int)v;
    else if (k == "--iters") iters = (int)v;
    else { fprintf(stderr, "fanout_bw: unknown option %s\n", k.c_str()); return 2; }
  }
  if (T < 1 || R < 16 || R % 16 || F < 1 || F > 32 || iters < 1) {
    fprintf(stderr, "fanout_bw: need rows >= 1, row-bytes a multiple of 16, 1 <= fanout <= 32\n");
    return 2;
  }
  const int64_t nv = R / 16, n_out = T * F;
  uint4 *src, *dst;
  int *dest;
  float4* flush;
  float* sink;
  const size_t flush_n = (512ull << 20) / sizeof(float4);
  CK(cudaMalloc(&src, T * R));
  CK(cudaMalloc(&dst, n_out * R));
  CK(cudaMalloc(&dest, n_out * sizeof(int)));
  CK(cudaMalloc(&flush, flush_n * sizeof(float4)));
  CK(cudaMalloc(&sink, sizeof(float)));
  CK(cudaMemset(src, 1, T * R));
  CK(cudaMemset(flush, 0, flush_n * sizeof(float4)));
  std::vector<int> seq(n_out), rnd(n_out);
  for (int64_t i = 0; i < n_out; ++i) seq[i] = rnd[i] = (int)i;
  std::shuffle(rnd.begin(), rnd.end(), std::mt19937(1));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  struct Mode { const char* name; int f; bool rand, read; };
  const Mode modes[] = {{"copy", 1, false, true},        {"scatter", 1, true, true},
                        {"fanout", F, false, true},      {"fanout_rand", F, true, true},
                        {"write_rand", F, true, false},  {"write_seq", F, false, false}};
  printf("{\"rows\": %lld, \"row_bytes\": %lld, \"fanout\": %d, \"iters\": %d, \"modes\": {",
         (long long)T, (long long)R, F, iters);
  double copy_gbps = 0;
  for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); ++m) {
    const Mode& md = modes[m];
    const int64_t rows = md.f == 1 ? n_out : T;  // F = 1 modes copy as many bytes as the fanout writes
    std::vector<int> d(rows * md.f);
    for (int64_t i = 0; i < rows * md.f; ++i) d[i] = (md.rand ? rnd : seq)[i];
    CK(cudaMemcpy(dest, d.data(), d.size() * sizeof(int), cudaMemcpyHostToDevice));
    uint4* s = src;
    uint4* src_big = nullptr;  // F = 1 modes read T*F source rows
    if (md.f == 1) { CK(cudaMalloc(&src_big, rows * R)); CK(cudaMemset(src_big, 1, rows * R)); s = src_big; }
    std::vector<float> ms;
    for (int it = 0; it < iters + 2; ++it) {
      flush_kernel<<<1056, 256>>>(flush, flush_n, sink);
      CK(cudaEventRecord(e0));
      const unsigned grid = (unsigned)((rows + 7) / 8);
      if (md.read) fanout_kernel<true><<<grid, 256>>>(s, dst, dest, rows, md.f, nv);
      else fanout_kernel<false><<<grid, 256>>>(s, dst, dest, rows, md.f, nv);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (it >= 2) ms.push_back(t);
    }
    if (src_big) CK(cudaFree(src_big));
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2] * 1e-3;
    const double bytes = (double)rows * md.f * R + (md.read ? (double)rows * R : 0.0);
    const double gbps = bytes / med / 1e9;
    if (m == 0) copy_gbps = gbps;
    printf("%s\"%s\": {\"us\": %.1f, \"GBps\": %.0f, \"frac_of_copy\": %.3f}", m ? ", " : "", md.name,
           med * 1e6, gbps, gbps / copy_gbps);
  }
  printf("}}\n");
  return 0;
}
