// moebench permute / unpermute / sort-chunks kernels: plain C API over raw device pointers.
// Legend: T tokens, H hidden, K top-k, E experts, R permuted rows, C chunks.
// Every function launches on `stream` and returns 0 (or a row count) on success, < 0 on error
// (message in moe_last_error()). No torch dependency: the Python glue and CMake both use this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

enum MoeDtype { MOE_F32 = 0, MOE_BF16 = 1, MOE_F16 = 2 };

// Bytes of device workspace moe_permute needs for n_slots = T*K slots, E experts, padding pad.
size_t moe_permute_workspace_bytes(int64_t n_slots, int E, int pad);

// Rows of x [T, x_row_bytes] (and scales [T, s_row_bytes], may be null) to out [R, ...] grouped by
// expert, Megatron order (expert, then token, then k); idx [T, K] int32/int64 (idx_bytes 4/8),
// -1 = skipped; pad > 1 pads each expert to a multiple of pad with zero rows. Writes row_map
// [T, K] int32 and tokens_per_expert [E] int32. out must hold T*K + E*(pad-1) rows. probs [T, K]
// fp32 (may be null): out_probs [R] gets probs[t, k] at row row_map[t, k], 0 on padding rows.
// wait != 0: returns the row count R, waiting only for the index work (the copy stays queued, or,
// fused, runs on in the same kernel); host_tpe (E int32 of mapped pinned host memory, may be null)
// then holds tokens_per_expert too. wait == 0: returns 0 without waiting.
// variant (tuning knobs; 0 is the default; impl "cuda@V[:C]" in moebench.ops):
// default copy = the rows kernel (csrc/permute_rows.cuh; sm_90+, 16-byte rows at 16-byte aligned
// addresses): one-warp CTAs each bulk-load C whole rows into shared memory, then bulk-store their
// C x K rows; bits 16-20 = C, rows per CTA, 1-16 (0: auto, as many as 112 KB hold); bit 0 = no L2
// evict-first hints; bit 14 = after the separate index kernels (route_rank + route_scan), not with
// the index work fused into the copy (the default where E <= 1024 and the device takes a
// cooperative launch); bit 15 (with bit 14) = route_scan and the rows kernel as programmatic dependent
// launches (sm_90+): the rows kernel's first loads run while the index kernels end, and with wait the
// host polls the row count instead of waiting on an event; bit 12 (with bit 14) = the index work in one
// launch: the last rank block to finish scans the counts (fewer, larger rank blocks). Rows the rows kernel
// cannot take (shared memory, alignment) go to the bulk kernel, then the warp copy.
// bit 13 = the one-row bulk-copy (TMA) kernel, the previous default: bit 0 = no L2 evict-first
// hints, bits 5-6 = 3 (0), 2, 3 or 4 buffers per block, bit 7 = row chunks <= 4 KB not 16 KB.
// bit 4 = per-warp register copy: bit 0 = streaming loads/stores, bit 1 = 8 vectors per lane in
// flight, not 4, bits 2-3 = 1, 2, 4 or 8 warps per token. bit 8 = gather in destination order by
// token tile (csrc/permute_gather.cuh; 16-byte rows): bit 9 = plain stores, not streaming, bits
// 10-11 = tiles of 512 (0), 128, 2048 or 8192 tokens.
int64_t moe_permute(const void* x, int64_t x_row_bytes, const void* scales, int64_t s_row_bytes,
                    const void* idx, int idx_bytes, int64_t T, int K, int E, int pad, void* out,
                    void* out_scales, int32_t* row_map, int32_t* tokens_per_expert,
                    const float* probs, float* out_probs, void* workspace, int wait,
                    int32_t* host_tpe, int variant, cudaStream_t stream);

// out[t] = sum_k w[t,k] * y[row_map[t,k]] (row_map >= 0), fp32 accumulation in k order.
// y [R, H] and out [T, H] of y_dtype; w [T, K] of w_dtype. variant bit 1: 2 vectors per row in
// flight per lane for K <= 8 (more registers, fewer warps: slower on Hopper, so off by default;
// docs/decisions.md, "The permute and unpermute defaults").
int moe_unpermute(const void* y, int y_dtype, const int32_t* row_map, const void* w, int w_dtype,
                  void* out, int64_t T, int K, int64_t H, int variant, cudaStream_t stream);

// Megatron sort_chunks_by_idxs: x [R, row_bytes] split into C chunks of split_sizes (int64,
// device), concatenated in sorted_idxs order (int64, device) into out.
int moe_sort_chunks(const void* x, int64_t row_bytes, int64_t R, const int64_t* split_sizes,
                    const int64_t* sorted_idxs, int C, void* out, cudaStream_t stream);

const char* moe_last_error(void);

#ifdef __cplusplus
}
#endif
