// The CUDA KernelBackend (kernels/backend.hpp), device discovery and pointer classification,
// for kernels/backend.cpp and the NCCL communicator (runtime/nccl_comm.cpp).
// Plain C++: no CUDA types, so g++-compiled code can include it. The backend (CudaBackend in
// cuda_backend.cu) runs the kernels of kernels/cuda on its own non-blocking stream on the
// device current when it was made; its Buffers are managed memory prefetched to that device.
#pragma once

#include <memory>

#include "kernels/backend.hpp"
#include "kernels/device_span.hpp"

namespace scape::kernels::cuda {

// Throws std::runtime_error("device 'cuda': no CUDA device visible (<cuda error>)") when none.
std::unique_ptr<KernelBackend> make_cuda_backend();
// How many CUDA devices this process sees; 0 (never an exception) without a driver or device.
int visible_device_count();
// Free memory of the current device (cudaMemGetInfo); 0 when it cannot be read.
std::size_t current_device_free_bytes();
// The DeviceSpan (kernels/device_span.hpp) of a CUDA backend: two CUDA events on its stream.
// Throws std::invalid_argument when `backend` is not one.
std::unique_ptr<DeviceSpan> make_device_span(KernelBackend& backend);
// Whether CUDA kernels (and NCCL) can address p: device or managed memory. Host memory,
// pageable or pinned (which a kernel could reach only across the bus), is not.
bool device_accessible(const void* p);
// The switch behind kernels::set_cuda_tf32 (kernels/backend.hpp): whether gemm lets cuBLAS use
// TF32 tensor cores. Process-wide, read before each GEMM (kernels/cuda/cublas.cu).
void set_tf32_gemm(bool on);
bool tf32_gemm();

}  // namespace scape::kernels::cuda
