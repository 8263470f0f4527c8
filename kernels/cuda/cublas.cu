// The shared cuBLAS handle of the CUDA model ops (cublas.hpp).
#include "kernels/cuda/cublas.hpp"

#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/stream.hpp"

namespace scape::kernels::cuda {

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("cuBLAS: ") + call + " failed: " + cublasGetStatusString(status));
  }
}

cublasHandle_t cublas_handle() {
  struct Handle {
    cublasHandle_t handle = nullptr;
    int device = -1;
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
  }
  check_cublas(cublasSetStream(h.handle, current_stream()), "cublasSetStream");
  return h.handle;
}

CublasMathScope::CublasMathScope(cublasHandle_t handle, cublasMath_t mode) : handle_(handle) {
  check_cublas(cublasSetMathMode(handle_, mode), "cublasSetMathMode");
}

CublasMathScope::~CublasMathScope() { (void)cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH); }

}  // namespace scape::kernels::cuda
