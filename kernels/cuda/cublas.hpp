// The cuBLAS handle the CUDA model ops share: one per host thread and device, in pedantic fp32
// math (no TF32, no reduced precision; TF32 tensor cores after set_tf32_gemm(true),
// cuda_backend.hpp) unless a scope asks otherwise, pointed at current_stream() (stream.hpp)
// each time it is handed out.
#pragma once

#include <cublas_v2.h>

namespace scape::kernels::cuda {

// Throws std::runtime_error naming the call and cuBLAS's reason unless status is success.
void check_cublas(cublasStatus_t status, const char* call);

cublasHandle_t cublas_handle();

// Sets the handle's math mode for a scope (a bf16 GEMM wants tensor cores) and restores the
// fp32 mode on exit.
class CublasMathScope {
 public:
  CublasMathScope(cublasHandle_t handle, cublasMath_t mode);
  ~CublasMathScope();
  CublasMathScope(const CublasMathScope&) = delete;
  CublasMathScope& operator=(const CublasMathScope&) = delete;

 private:
  cublasHandle_t handle_;
};

}  // namespace scape::kernels::cuda
