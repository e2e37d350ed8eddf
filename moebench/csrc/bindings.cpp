// Python bindings of moe_permute.h for moebench._C: raw device pointers and a cudaStream_t as
// integers, so this file needs only pybind11 (fast to JIT-build); moebench/ops/cuda_impl.py owns
// the tensors. The GIL is released while a call may wait for the device.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>

#include "moe_permute.h"

#ifndef TORCH_EXTENSION_NAME
#define TORCH_EXTENSION_NAME _C
#endif

namespace py = pybind11;

namespace {
template <typename P> P ptr(uintptr_t p) { return reinterpret_cast<P>(p); }
int64_t check(int64_t rc) {
  if (rc < 0) throw std::runtime_error(moe_last_error());
  return rc;
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "moebench CUDA permute/unpermute/sort_chunks kernels (pointer-level API)";
  m.def("workspace_bytes", [](int64_t n_slots, int E, int pad) {
    return (int64_t)moe_permute_workspace_bytes(n_slots, E, pad);
  });
  m.def("permute", [](uintptr_t x, int64_t xrb, uintptr_t s, int64_t srb, uintptr_t idx, int idx_bytes,
                      int64_t T, int K, int E, int pad, uintptr_t out, uintptr_t out_s, uintptr_t row_map,
                      uintptr_t tpe, uintptr_t probs, uintptr_t out_probs, uintptr_t ws, int wait,
                      uintptr_t host_tpe, int variant, uintptr_t stream) {
    int64_t rc;
    {
      py::gil_scoped_release nogil;
      rc = moe_permute(ptr<const void*>(x), xrb, ptr<const void*>(s), srb, ptr<const void*>(idx),
                       idx_bytes, T, K, E, pad, ptr<void*>(out), ptr<void*>(out_s),
                       ptr<int32_t*>(row_map), ptr<int32_t*>(tpe), ptr<const float*>(probs),
                       ptr<float*>(out_probs), ptr<void*>(ws), wait, ptr<int32_t*>(host_tpe), variant,
                       ptr<cudaStream_t>(stream));
    }
    return check(rc);
  });
  m.def("unpermute", [](uintptr_t y, int y_dtype, uintptr_t row_map, uintptr_t w, int w_dtype,
                        uintptr_t out, int64_t T, int K, int64_t H, int variant, uintptr_t stream) {
    return check(moe_unpermute(ptr<const void*>(y), y_dtype, ptr<const int32_t*>(row_map),
                               ptr<const void*>(w), w_dtype, ptr<void*>(out), T, K, H, variant,
                               ptr<cudaStream_t>(stream)));
  });
  m.def("sort_chunks", [](uintptr_t x, int64_t rb, int64_t R, uintptr_t sizes, uintptr_t idxs, int C,
                          uintptr_t out, uintptr_t stream) {
    return check(moe_sort_chunks(ptr<const void*>(x), rb, R, ptr<const int64_t*>(sizes),
                                 ptr<const int64_t*>(idxs), C, ptr<void*>(out),
                                 ptr<cudaStream_t>(stream)));
  });
}
