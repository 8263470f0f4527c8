// Checked CUDA runtime calls: SCAPE_CUDA_CHECK(call) throws std::runtime_error naming the file,
// line, the call and cudaGetErrorName / cudaGetErrorString of the failure
// (kernels/checked_call.hpp); SCAPE_CUDA_CHECK_LAUNCH() does the same for the kernel launch just
// queued. Plain C++ (the runtime API header only), so host code compiled by g++ can use it too.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/checked_call.hpp"

namespace scape::kernels::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line);

}  // namespace scape::kernels::cuda

#define SCAPE_CUDA_CHECK(call) SCAPE_CHECKED_CALL(call, #call, cudaSuccess, ::scape::kernels::cuda::throw_cuda_error)

#define SCAPE_CUDA_CHECK_LAUNCH() SCAPE_CUDA_CHECK(cudaGetLastError())
