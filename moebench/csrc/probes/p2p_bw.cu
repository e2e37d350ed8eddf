// p2p_bw: peer-access matrix and SM-driven copy bandwidth for every GPU pair, JSON on stdout.
//
// For each ordered pair (src, dst) a kernel on GPU src reads a local buffer and writes a buffer on
// GPU dst through peer access (NVLink or PCIe): the bandwidth one GPU can push to another with its
// SMs, which is how DeepEP/HybridEP move tokens. The diagonal (src == dst) is a local device copy.
// GB/s = bytes copied per second (1e9), one direction; a local copy also reads the same amount.
//
//   p2p_bw [--bytes N] [--iters N] [--warmup N]
// Exit 0 with JSON; exit 2 on bad usage; exit 3 on a CUDA error (message on stderr).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "p2p_bw: %s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(3);                                                                             \
    }                                                                                      \
  } while (0)

__global__ void copy_kernel(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

struct Args {
  size_t bytes = 256ull << 20;
  int iters = 20;
  int warmup = 3;
};

static bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return false;
    long long v = atoll(argv[++i]);
    if (v <= 0) return false;
    if (k == "--bytes") a->bytes = (size_t)v / 16 * 16;
    else if (k == "--iters") a->iters = (int)v;
    else if (k == "--warmup") a->warmup = (int)v;
    else return false;
  }
  return a->bytes >= 16;
}

// Milliseconds per copy of `bytes` from src (on device s) to dst, run on device s.
static double time_copy(int s, const int4* src, int4* dst, const Args& a) {
  CK(cudaSetDevice(s));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, s));
  size_t n = a.bytes / sizeof(int4);
  int blocks = p.multiProcessorCount * 4, threads = 512;
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  for (int i = 0; i < a.warmup; ++i) copy_kernel<<<blocks, threads>>>(src, dst, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(t0));
  for (int i = 0; i < a.iters; ++i) copy_kernel<<<blocks, threads>>>(src, dst, n);
  CK(cudaEventRecord(t1));
  CK(cudaEventSynchronize(t1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, t0, t1));
  CK(cudaEventDestroy(t0));
  CK(cudaEventDestroy(t1));
  return ms / a.iters;
}

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, &a)) {
    fprintf(stderr, "usage: p2p_bw [--bytes N] [--iters N] [--warmup N]\n");
    return 2;
  }
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  std::vector<int4*> src(n), dst(n);
  std::vector<std::string> names(n);
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, d));
    names[d] = p.name;
    CK(cudaSetDevice(d));
    CK(cudaMalloc(&src[d], a.bytes));
    CK(cudaMalloc(&dst[d], a.bytes));
    CK(cudaMemset(src[d], d + 1, a.bytes));
  }
  std::vector<std::vector<int>> access(n, std::vector<int>(n, 0));
  std::vector<std::vector<double>> gbps(n, std::vector<double>(n, -1.0));
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) {
        access[s][d] = 1;
      } else {
        CK(cudaDeviceCanAccessPeer(&access[s][d], s, d));
        if (!access[s][d]) continue;
        CK(cudaSetDevice(s));
        cudaError_t e = cudaDeviceEnablePeerAccess(d, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
        else CK(e);
      }
      double ms = time_copy(s, src[s], dst[d], a);
      gbps[s][d] = (double)a.bytes / (ms * 1e-3) / 1e9;
      if (s != d) {
        CK(cudaSetDevice(s));
        CK(cudaDeviceDisablePeerAccess(d));
      }
    }
  }
  printf("{\"probe\": \"p2p_bw/1\", \"bytes\": %zu, \"iters\": %d, \"devices\": [", a.bytes, a.iters);
  for (int d = 0; d < n; ++d) printf("%s\"%s\"", d ? ", " : "", names[d].c_str());
  printf("], \"can_access\": [");
  for (int s = 0; s < n; ++s) {
    printf("%s[", s ? ", " : "");
    for (int d = 0; d < n; ++d) printf("%s%d", d ? ", " : "", access[s][d]);
    printf("]");
  }
  printf("], \"copy_GBps\": [");
  for (int s = 0; s < n; ++s) {
    printf("%s[", s ? ", " : "");
    for (int d = 0; d < n; ++d) {
      if (gbps[s][d] < 0) printf("%snull", d ? ", " : "");
      else printf("%s%.2f", d ? ", " : "", gbps[s][d]);
    }
    printf("]");
  }
  printf("]}\n");
  for (int d = 0; d < n; ++d) {
    CK(cudaSetDevice(d));
    CK(cudaFree(src[d]));
    CK(cudaFree(dst[d]));
  }
  return 0;
}
