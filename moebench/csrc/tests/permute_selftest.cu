// Standalone check of moe_permute (every copy variant, with and without padding) and moe_unpermute
// against a CPU reference (needs a GPU to run; CI only compiles it). Usage: permute_selftest [T H K E]
#include <cmath>
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
      return -1;                                                               \
    }                                                                          \
  } while (0)

// Variants (moe_permute.h): the rows kernel fused (0) with auto / 1 / 4 / 15 rows per CTA and
// without L2 hints, after the index kernels (bit 14; with bit 15 as programmatic dependent launches,
// with bit 12 the index work in one launch), the one-row bulk kernel (bit 13), the warp copy (bit 4),
// the destination-order gather (bit 8).
const int kVariants[] = {0,     1 << 16, 4 << 16, 15 << 16, 1, 16384, 16384 | (8 << 16), 16384 | 32768,
                         32768, 16384 | 4096, 16384 | 4096 | 32768, 8192, 16, 256};

struct Case {
  int64_t T, H;
  int K, E;
  std::vector<int64_t> idx;
  std::vector<uint16_t> x;
  std::vector<float> p;
};

struct Dev {
  void *x, *idx, *out, *ws, *w, *un, *p, *po;
  int32_t *map, *tpe, *htpe;
};

// Rows by expert, then slot order; expert blocks start at multiples of pad (pad > 1).
void reference(const Case& c, int pad, std::vector<int64_t>& map, std::vector<int64_t>& tpe, int64_t& R) {
  std::vector<int64_t> cnt(c.E, 0), start(c.E, 0);
  for (auto v : c.idx) if (v >= 0) cnt[v]++;
  tpe.assign(c.E, 0);
  R = 0;
  for (int e = 0; e < c.E; ++e) {
    tpe[e] = pad > 1 ? (cnt[e] + pad - 1) / pad * pad : cnt[e];
    start[e] = R;
    R += tpe[e];
  }
  map.assign(c.T * c.K, -1);
  for (int64_t s = 0; s < c.T * c.K; ++s) if (c.idx[s] >= 0) map[s] = start[c.idx[s]]++;
}

// Mismatches of one moe_permute call against the reference (padding rows must be zero), -1 on error.
int64_t check_permute(const Case& c, const Dev& d, int variant, int pad, int wait) {
  std::vector<int64_t> ref_map, ref_tpe;
  int64_t R = 0;
  reference(c, pad, ref_map, ref_tpe, R);
  const int64_t n = c.T * c.K, rmax = n + (int64_t)c.E * (pad > 1 ? pad - 1 : 0);
  CK(cudaMemset(d.out, 0x55, rmax * c.H * 2));
  CK(cudaMemset(d.po, 0x55, rmax * 4));
  const int64_t got = moe_permute(d.x, c.H * 2, nullptr, 0, d.idx, 8, c.T, c.K, c.E, pad, d.out, nullptr, d.map,
                                  d.tpe, static_cast<const float*>(d.p), static_cast<float*>(d.po), d.ws, wait,
                                  wait ? d.htpe : nullptr, variant, 0);
  if (got < 0) { fprintf(stderr, "moe_permute variant %d: %s\n", variant, moe_last_error()); return -1; }
  CK(cudaDeviceSynchronize());
  std::vector<int32_t> map(n), tpe(c.E);
  std::vector<uint16_t> out(R * c.H);
  std::vector<float> po(R);
  CK(cudaMemcpy(map.data(), d.map, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(tpe.data(), d.tpe, c.E * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.data(), d.out, R * c.H * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(po.data(), d.po, R * 4, cudaMemcpyDeviceToHost));
  int64_t bad = wait ? got != R : got != 0;
  std::vector<char> used(R, 0);
  for (int e = 0; e < c.E; ++e) {
    bad += tpe[e] != ref_tpe[e];
    if (wait) bad += d.htpe[e] != ref_tpe[e];   // written by the index work into host memory
  }
  for (int64_t s = 0; s < n; ++s) {
    bad += map[s] != ref_map[s];
    if (ref_map[s] < 0) continue;
    used[ref_map[s]] = 1;
    bad += po[ref_map[s]] != c.p[s];
    bad += memcmp(&out[ref_map[s] * c.H], &c.x[(s / c.K) * c.H], c.H * 2) != 0;
  }
  for (int64_t r = 0; r < R; ++r)   // padding rows: zero payload and probability
    if (!used[r]) {
      bad += po[r] != 0.f;
      for (int64_t h = 0; h < c.H; ++h) bad += out[r * c.H + h] != 0;
    }
  return bad;
}

// Unpermute with weight 0.5 of the unpadded permute's rows (in d.out), mismatches or -1.
int64_t check_unpermute(const Case& c, const Dev& d) {
  std::vector<int32_t> map(c.T * c.K);
  CK(cudaMemcpy(map.data(), d.map, c.T * c.K * 4, cudaMemcpyDeviceToHost));
  std::vector<float> w(c.T * c.K, 0.5f);
  CK(cudaMemcpy(d.w, w.data(), c.T * c.K * 4, cudaMemcpyHostToDevice));
  if (moe_unpermute(d.out, MOE_BF16, d.map, d.w, MOE_F32, d.un, c.T, c.K, c.H, 0, 0) < 0) {
    fprintf(stderr, "moe_unpermute: %s\n", moe_last_error());
    return -1;
  }
  std::vector<uint16_t> un(c.T * c.H);
  CK(cudaMemcpy(un.data(), d.un, c.T * c.H * 2, cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.H; ++h) {
      float acc = 0.f;
      for (int k = 0; k < c.K; ++k)
        if (map[t * c.K + k] >= 0) {
          uint32_t b = (uint32_t)c.x[t * c.H + h] << 16;
          float f;
          memcpy(&f, &b, 4);
          acc += 0.5f * f;
        }
      const float g = __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(&un[t * c.H + h]));
      bad += fabsf(g - acc) > 1e-2f * fabsf(acc) + 1e-6f;
    }
  return bad;
}

int alloc(const Case& c, Dev& d, int max_pad) {
  const int64_t n = c.T * c.K, rmax = n + (int64_t)c.E * (max_pad - 1);
  CK(cudaMalloc(&d.x, c.T * c.H * 2));
  CK(cudaMalloc(&d.idx, n * 8));
  CK(cudaMalloc(&d.out, rmax * c.H * 2 + 16));
  CK(cudaMalloc(&d.ws, moe_permute_workspace_bytes(n, c.E, max_pad)));
  CK(cudaMalloc(&d.map, n * 4));
  CK(cudaMalloc(&d.tpe, c.E * 4));
  CK(cudaMalloc(&d.w, n * 4));
  CK(cudaMalloc(&d.un, c.T * c.H * 2));
  CK(cudaMalloc(&d.p, n * 4));
  CK(cudaMalloc(&d.po, rmax * 4));
  CK(cudaHostAlloc(&d.htpe, c.E * 4, cudaHostAllocMapped));
  CK(cudaMemcpy(d.p, c.p.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.x, c.x.data(), c.T * c.H * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.idx, c.idx.data(), n * 8, cudaMemcpyHostToDevice));
  return 0;
}

int main(int argc, char** argv) {
  Case c;
  c.T = argc > 1 ? atoll(argv[1]) : 1000;
  c.H = argc > 2 ? atoll(argv[2]) : 520;
  c.K = argc > 3 ? atoi(argv[3]) : 8;
  c.E = argc > 4 ? atoi(argv[4]) : 64;
  std::mt19937 rng(1);
  c.idx.resize(c.T * c.K);
  for (auto& v : c.idx) v = (int64_t)(rng() % (c.E + 1)) - 1;  // some -1
  c.x.resize(c.T * c.H);
  for (auto& v : c.x) v = (uint16_t)(rng() & 0x3fff);
  c.p.resize(c.T * c.K);
  for (int64_t s = 0; s < c.T * c.K; ++s) c.p[s] = (float)s + 1.f;
  const int kPad = 8;
  Dev d;
  if (alloc(c, d, kPad) < 0) return 1;
  int64_t bad_all = 0;
  for (int pad : {0, kPad})
    for (int v : kVariants)
      for (int wait : {1, 0}) {
        const int64_t bad = check_permute(c, d, v, pad, wait);
        if (bad < 0) return 1;
        if (bad) printf("permute variant %d pad %d wait %d: %lld mismatches\n", v, pad, wait, (long long)bad);
        bad_all += bad;
      }
  if (check_permute(c, d, 0, 0, 1) < 0) return 1;   // leaves the unpadded rows in d.out
  const int64_t bad_un = check_unpermute(c, d);
  if (bad_un < 0) return 1;
  bad_all += bad_un;
  printf("permute_selftest T=%lld H=%lld K=%d E=%d, %zu variants x pad {0, %d} x wait {1, 0}: %s (%lld mismatches)\n",
         (long long)c.T, (long long)c.H, c.K, c.E, sizeof(kVariants) / sizeof(int), kPad, bad_all ? "FAIL" : "ok",
         (long long)bad_all);
  return bad_all ? 1 : 0;
}
