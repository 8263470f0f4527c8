// The shared cuBLAS handle of the CUDA model ops (cublas.hpp).
#include "kernels/cuda/cublas.hpp"

#include <atomic>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/stream.hpp"

namespace scape::kernels::cuda {
namespace {

// set_tf32_gemm's switch, read by every host thread's handle when it is handed out.
std::atomic<bool> g_tf32_gemm{false};

cublasMath_t fp32_math() {
  return g_tf32_gemm.load(std::memory_order_relaxed) ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
}

}  // namespace

void set_tf32_gemm(bool on) { g_tf32_gemm.store(on, std::memory_order_relaxed); }
bool tf32_gemm() { return g_tf32_gemm.load(std::memory_order_relaxed); }

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS: ") + call + " failed: " + cublasGetStatusString(status));
  }
}

cublasHandle_t cublas_handle() {
  struct Handle {
    cublasHandle_t handle = nullptr;
    int device = -1;
    cublasMath_t math = CUBLAS_PEDANTIC_MATH;
    ~Handle() {
      if (handle != nullptr) (void)cublasDestroy(handle);
    }
  };
  thread_local Handle h;
  int device = 0;
  SCAPE_CUDA_CHECK(cudaGetDevice(&device));
  if (h.handle == nullptr || h.device != device) {
    if (h.handle != nullptr) (void)cublasDestroy(h.handle);
    h.handle = nullptr;
    check_cublas(cublasCreate(&h.handle), "cublasCreate");
    h.device = device;
    check_cublas(cublasSetMathMode(h.handle, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
    h.math = CUBLAS_PEDANTIC_MATH;
  }
  if (const cublasMath_t math = fp32_math(); math != h.math) {
    check_cublas(cublasSetMathMode(h.handle, math), "cublasSetMathMode");
    h.math = math;
  }
  check_cublas(cublasSetStream(h.handle, current_stream()), "cublasSetStream");
  return h.handle;
}

CublasMathScope::CublasMathScope(cublasHandle_t handle, cublasMath_t mode) : handle_(handle) {
  check_cublas(cublasSetMathMode(handle_, mode), "cublasSetMathMode");
}

CublasMathScope::~CublasMathScope() { (void)cublasSetMathMode(handle_, fp32_math()); }

}  // namespace scape::kernels::cuda
