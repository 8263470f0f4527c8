// Checked CUDA runtime calls: SCAPE_CUDA_CHECK(call) throws std::runtime_error naming the file,
// line, the call and cudaGetErrorString of the failure; SCAPE_CUDA_CHECK_LAUNCH() does the same
// for the kernel launch just queued. Plain C++ (the runtime API header only), so host code
// compiled by g++ can use it too.
#pragma once

#include <cuda_runtime_api.h>

namespace scape::kernels::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line);

}  // namespace scape::kernels::cuda

#define SCAPE_CUDA_CHECK(call)                                                           \
  do {                                                                                   \
    const cudaError_t scape_cuda_status_ = (call);                                       \
    if (scape_cuda_status_ != cudaSuccess) {                                             \
      ::scape::kernels::cuda::throw_cuda_error(scape_cuda_status_, #call, __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)

#define SCAPE_CUDA_CHECK_LAUNCH() SCAPE_CUDA_CHECK(cudaGetLastError())
