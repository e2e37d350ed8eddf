// Standalone check of moe_permute / moe_unpermute against a CPU reference (needs a GPU to run;
// CI only compiles it). Usage: permute_selftest [T H K E]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_bf16.h>

#include "moe_permute.h"

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? atoll(argv[1]) : 1000;
  const int64_t H = argc > 2 ? atoll(argv[2]) : 520;
  const int K = argc > 3 ? atoi(argv[3]) : 8;
  const int E = argc > 4 ? atoi(argv[4]) : 64;
  std::mt19937 rng(1);
  std::vector<int64_t> idx(T * K);
  for (auto& v : idx) v = (int64_t)(rng() % (E + 1)) - 1;  // some -1
  std::vector<uint16_t> x(T * H);
  for (auto& v : x) v = (uint16_t)(rng() & 0x3fff);
  // CPU reference rows: by expert, then slot order
  std::vector<int64_t> cnt(E, 0), start(E, 0), ref_map(T * K, -1);
  for (auto v : idx) if (v >= 0) cnt[v]++;
  for (int e = 1; e < E; ++e) start[e] = start[e - 1] + cnt[e - 1];
  const int64_t R = start[E - 1] + cnt[E - 1];
  std::vector<int64_t> fill = start;
  for (int e = 0; e < E; ++e)
    for (int64_t s = 0; s < T * K; ++s) if (idx[s] == e) ref_map[s] = fill[e]++;

  void *dx, *didx, *dout, *dws, *dw, *dun, *dp, *dpo;
  int32_t *dmap, *dtpe;
  const size_t ws = moe_permute_workspace_bytes(T * K, E, 0);
  CK(cudaMalloc(&dx, T * H * 2));
  CK(cudaMalloc(&didx, T * K * 8));
  CK(cudaMalloc(&dout, T * K * H * 2 + 16));
  CK(cudaMalloc(&dws, ws));
  CK(cudaMalloc(&dmap, T * K * 4));
  CK(cudaMalloc(&dtpe, E * 4));
  CK(cudaMalloc(&dw, T * K * 4));
  CK(cudaMalloc(&dun, T * H * 2));
  CK(cudaMalloc(&dp, T * K * 4));
  CK(cudaMalloc(&dpo, T * K * 4));
  std::vector<float> p(T * K);
  for (int64_t s = 0; s < T * K; ++s) p[s] = (float)s;
  CK(cudaMemcpy(dp, p.data(), T * K * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, x.data(), T * H * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(didx, idx.data(), T * K * 8, cudaMemcpyHostToDevice));
  int32_t* htpe;
  CK(cudaHostAlloc(&htpe, E * 4, cudaHostAllocMapped));
  const int64_t got = moe_permute(dx, H * 2, nullptr, 0, didx, 8, T, K, E, 0, dout, nullptr, dmap,
                                  dtpe, static_cast<const float*>(dp), static_cast<float*>(dpo), dws,
                                  1, htpe, 0, 0);
  if (got < 0) { fprintf(stderr, "moe_permute: %s\n", moe_last_error()); return 1; }
  CK(cudaDeviceSynchronize());
  std::vector<int32_t> map(T * K);
  std::vector<uint16_t> out(R * H);
  CK(cudaMemcpy(map.data(), dmap, T * K * 4, cudaMemcpyDeviceToHost));
  std::vector<float> po(R);
  CK(cudaMemcpy(out.data(), dout, R * H * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(po.data(), dpo, R * 4, cudaMemcpyDeviceToHost));
  int64_t bad = got != R;
  for (int e = 0; e < E; ++e) bad += htpe[e] != cnt[e];   // written by the scan into host memory
  for (int64_t s = 0; s < T * K; ++s) {
    bad += map[s] != ref_map[s];
    if (ref_map[s] >= 0) bad += po[ref_map[s]] != p[s];
    if (ref_map[s] >= 0) bad += memcmp(&out[ref_map[s] * H], &x[(s / K) * H], H * 2) != 0;
  }
  std::vector<float> w(T * K, 0.5f);
  CK(cudaMemcpy(dw, w.data(), T * K * 4, cudaMemcpyHostToDevice));
  if (moe_unpermute(dout, MOE_BF16, dmap, dw, MOE_F32, dun, T, K, H, 0, 0) < 0) {
    fprintf(stderr, "moe_unpermute: %s\n", moe_last_error());
    return 1;
  }
  std::vector<uint16_t> un(T * H);
  CK(cudaMemcpy(un.data(), dun, T * H * 2, cudaMemcpyDeviceToHost));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k)
        if (map[t * K + k] >= 0) {
          uint32_t b = (uint32_t)x[t * H + h] << 16;
          float f;
          memcpy(&f, &b, 4);
          acc += 0.5f * f;
        }
      const float g = __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&un[t * H + h]));
      bad += fabsf(g - acc) > 1e-2f * fabsf(acc) + 1e-6f;
    }
  printf("permute_selftest T=%lld H=%lld K=%d E=%d rows=%lld: %s (%lld mismatches)\n",
         (long long)T, (long long)H, K, E, (long long)R, bad ? "FAIL" : "ok", (long long)bad);
  return bad ? 1 : 0;
}
