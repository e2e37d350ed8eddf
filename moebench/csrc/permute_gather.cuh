// permute_gather: the permute's copy in destination order (variant bit 8), included by
// moe_permute.cu inside its anonymous namespace (it uses CopyArgs, slot_row, warp_copy_row, cdiv).
//
// Why: the scatter copies (one source row read, K rows written from it) stay well below the plain
// copy rate on Hopper whatever their mechanics (docs/decisions.md, "The permute and unpermute
// defaults"). Here every
// output row is written in order by one warp, reading its source row again, so the writes are
// long sequential runs and the K reads of a token should hit L2: the work is ordered by token
// tile (TT tokens, 512 by default: 7.3 MB of sources at H 7168 bf16) and, inside a tile, by
// expert, so the rows of one (tile, expert) item are one contiguous run of the output and the
// sources in use at any time are about one tile. Stores stream (st.global.cs) so the written rows
// do not push the sources out of L2; loads are plain (__ldg), to stay cached.
//   gather_index : one thread per slot: row_map, and inv[row] = slot (the token of each row).
//   permute_gather: persistent blocks stride over items (tile g, expert e); item rows are
//                 [estart[e] + base[g*G][e], estart[e] + base[(g+1)*G][e]) (ecount for the last
//                 tile), G = route blocks per tile; the block's warps take rows in turn.
// Variant bits: 9 = plain stores, not streaming; 10-11 = tile of 512 (0), 128, 2048 or 8192 tokens.

__device__ __forceinline__ int cdiv_dev(int a, int b) { return (a + b - 1) / b; }

__global__ void __launch_bounds__(kThreads) gather_index_kernel(
    const void* __restrict__ idx, bool idx64, int64_t n, int E, int SB,
    const int32_t* __restrict__ estart, const int32_t* __restrict__ base,
    const int32_t* __restrict__ lrank, int32_t* __restrict__ inv, int32_t* __restrict__ row_map,
    const float* __restrict__ probs, float* __restrict__ out_probs) {
  const int64_t s = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (s >= n) return;
  const int row = slot_row(idx, idx64, s, E, SB, estart, base, lrank);
  write_row(row_map, probs, out_probs, s, row);
  if (row >= 0) inv[row] = (int32_t)s;
}

template <bool CS, int U>
__global__ void __launch_bounds__(kThreads, 4) permute_gather_kernel(
    const uint4* __restrict__ x, int64_t nv, const uint8_t* __restrict__ sx, int64_t s_bytes,
    int K, int E, int NB, int G, const int32_t* __restrict__ base,
    const int32_t* __restrict__ estart, const int32_t* __restrict__ ecount,
    const int32_t* __restrict__ inv, uint4* __restrict__ out, uint8_t* __restrict__ sout) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n_items = (int64_t)cdiv_dev(NB, G) * E;
  for (int64_t it = blockIdx.x; it < n_items; it += gridDim.x) {
    const int g = (int)(it / E), e = (int)(it - (int64_t)g * E);
    const int b1 = min(NB, (g + 1) * G);
    const int r0 = estart[e] + base[(int64_t)g * G * E + e];
    const int r1 = estart[e] + (b1 < NB ? base[(int64_t)b1 * E + e] : ecount[e]);
    for (int r = r0 + warp; r < r1; r += kWarps) {
      const int64_t t = inv[r] / K;
      warp_copy_row<uint4, U, CS>(x + t * nv, out + (int64_t)r * nv, nv, lane);
      if (s_bytes > 0) {  // fp8 scales: one row, 4-byte words when aligned
        const uint8_t* ss = sx + t * s_bytes;
        uint8_t* sd = sout + (int64_t)r * s_bytes;
        if ((s_bytes & 3) == 0)
          for (int64_t i = lane; i < s_bytes / 4; i += 32)
            reinterpret_cast<uint32_t*>(sd)[i] = reinterpret_cast<const uint32_t*>(ss)[i];
        else
          for (int64_t i = lane; i < s_bytes; i += 32) sd[i] = ss[i];
      }
    }
  }
}

// Gather path: rows a multiple of 16 bytes at 16-byte aligned addresses, else 1 (not taken).
// inv: one int32 of workspace per output row (padding included). The index kernel writes row_map,
// so the copy need not.
int gather_copy(const CopyArgs& a, int NB, const int32_t* ecount, int32_t* inv, int variant,
                int dev, cudaStream_t st) {
  if (a.rb % 16 != 0 || !aligned<uint4>(a.x) || !aligned<uint4>(a.out)) return 1;
  const int64_t n = a.T * a.K;
  gather_index_kernel<<<(unsigned)cdiv(n, kThreads), kThreads, 0, st>>>(
      a.idx, a.idx64, n, a.E, a.SB, a.estart, a.base, a.lrank, inv, a.row_map, a.probs, a.out_probs);
  MOE_CHECK_LAUNCH("gather_index_kernel");
  static const int kTile[4] = {512, 128, 2048, 8192};
  const int64_t tile = kTile[(variant >> 10) & 3];
  const int G = (int)std::max<int64_t>(1, tile * a.K / a.SB);
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t items = cdiv(NB, G) * a.E;
  const unsigned grid = (unsigned)std::min<int64_t>(items, (int64_t)sms * 4);
  const auto* x = static_cast<const uint4*>(a.x);
  auto* o = static_cast<uint4*>(a.out);
  const auto* sx = static_cast<const uint8_t*>(a.sx);
  auto* so = static_cast<uint8_t*>(a.sout);
  if (variant & 512)
    permute_gather_kernel<false, 4><<<grid, kThreads, 0, st>>>(x, a.rb / 16, sx, a.sb, a.K, a.E, NB, G,
                                                               a.base, a.estart, ecount, inv, o, so);
  else
    permute_gather_kernel<true, 4><<<grid, kThreads, 0, st>>>(x, a.rb / 16, sx, a.sb, a.K, a.E, NB, G,
                                                              a.base, a.estart, ecount, inv, o, so);
  MOE_CHECK_LAUNCH("permute_gather_kernel");
  return 0;
}
