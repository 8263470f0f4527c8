// CUDA bodies of the GEMM model ops (kernels/model_kernel_list.inc): gemm through cublasSgemm in
// pedantic fp32 (TF32 off), gemm_bf16 through cublasGemmEx on operands rounded to bf16 (round to
// nearest even, as the CPU's round_to_bf16) with fp32 accumulation and output.
#include <cuda_bf16.h>

#include <cstddef>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/model_checks.hpp"

namespace scape::kernels::cuda {
namespace {

__global__ void to_bf16_kernel(__nv_bfloat16* out, const float* in, std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) out[j] = __float2bfloat16_rn(in[j]);
}

// The bf16 copies of one call's operands: device memory per host thread, grown as needed. A
// call on another stream than the previous one first waits for that stream, so no queued GEMM
// still reads the copies being overwritten.
class Bf16Scratch {
 public:
  ~Bf16Scratch() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  __nv_bfloat16* reserve(std::size_t elements) {
    const cudaStream_t stream = current_stream();
    if (last_stream_ != nullptr && last_stream_ != stream) SCAPE_CUDA_CHECK(cudaStreamSynchronize(last_stream_));
    last_stream_ = stream;
    if (elements > capacity_) {
      if (data_ != nullptr) SCAPE_CUDA_CHECK(cudaFree(data_));  // synchronizes the device first
      data_ = nullptr;
      SCAPE_CUDA_CHECK(cudaMalloc(&data_, elements * sizeof(__nv_bfloat16)));
      capacity_ = elements;
    }
    return data_;
  }

 private:
  __nv_bfloat16* data_ = nullptr;
  std::size_t capacity_ = 0;
  cudaStream_t last_stream_ = nullptr;
};

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, std::span<const float> a, std::span<const float> b,
          bool accumulate, std::span<float> c) {
  checks::gemm(M, N, K, a.size(), b.size(), c.size());
  if (M == 0 || N == 0) return;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_cublas(cublasSgemm(cublas_handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                           N, M, K, &alpha, b.data(), trans_b ? K : N, a.data(), trans_a ? M : K, &beta, c.data(), N),
               "cublasSgemm");
}

void gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, std::span<const float> a, std::span<const float> b,
               bool accumulate, std::span<float> c) {
  checks::gemm(M, N, K, a.size(), b.size(), c.size());
  if (M == 0 || N == 0) return;
  thread_local Bf16Scratch scratch;
  __nv_bfloat16* a16 = scratch.reserve(a.size() + b.size());
  __nv_bfloat16* b16 = a16 + a.size();
  if (!a.empty()) launch(to_bf16_kernel, a.size(), a16, a.data(), a.size());
  if (!b.empty()) launch(to_bf16_kernel, b.size(), b16, b.data(), b.size());
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cublasHandle_t handle = cublas_handle();
  const CublasMathScope tensor_cores(handle, CUBLAS_DEFAULT_MATH);
  check_cublas(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                            &alpha, b16, CUDA_R_16BF, trans_b ? K : N, a16, CUDA_R_16BF, trans_a ? M : K, &beta,
                            c.data(), CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx (bf16)");
}

}  // namespace scape::kernels::cuda
