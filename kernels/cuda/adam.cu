// Elementwise AdamW / AdamS steps on the GPU (docs/algorithms.md, "Dense references", "SCAPE
// step 7"): the expressions of kernels/cpu/adam.cpp, term for term, so that with --fmad=false
// and IEEE sqrtf/division every output is bit-identical to the CPU kernel.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels::cuda {
namespace {

__global__ void adamw_kernel(float* __restrict__ th, float* __restrict__ mm, float* __restrict__ vv,
                             const float* __restrict__ gg, std::size_t n, AdamFloats h, float step_size,
                             float inv_sqrt_bc2) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const float gj = gg[j];
    const float mj = h.beta1 * mm[j] + h.one_minus_b1 * gj;
    const float vj = h.beta2 * vv[j] + h.one_minus_b2 * gj * gj;
    mm[j] = mj;
    vv[j] = vj;
    th[j] = th[j] * h.decay - step_size * mj / (sqrtf(vj) * inv_sqrt_bc2 + h.eps);
  }
}

__global__ void adams_kernel(float* __restrict__ th, float* __restrict__ mm, const float* __restrict__ gg,
                             std::size_t n, AdamFloats h, float inv_bc1) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const float gj = gg[j];
    if (h.adams_artifact_form) {
      const float mp = mm[j];
      const float vj = h.beta2 * mp * mp + h.one_minus_b2 * gj * gj;
      const float mj = h.beta1 * mp + h.one_minus_b1 * gj;
      mm[j] = mj;
      th[j] = th[j] * h.decay - h.lr * (mj * inv_bc1) / (sqrtf(vj) * h.inv_sqrt_bc2 + h.eps);
      continue;
    }
    const float mhat_prev = mm[j] * inv_bc1;
    const float d = sqrtf(h.beta2 * mhat_prev * mhat_prev + h.one_minus_b2 * gj * gj) + h.eps;
    const float mj = h.beta1 * mm[j] + h.one_minus_b1 * gj;
    mm[j] = mj;
    th[j] = th[j] * h.decay - h.lr * (mj * inv_bc1) / d;
  }
}

__global__ void adamw_masked_kernel(float* __restrict__ theta, float* __restrict__ m, float* __restrict__ v,
                                    std::size_t n, const std::uint32_t* __restrict__ idx,
                                    const float* __restrict__ m_new, const float* __restrict__ g_bar,
                                    std::size_t k, AdamFloats h, float step_size, float inv_sqrt_bc2) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j >= n) continue;
    const float gj = g_bar[i];
    const float mj = m_new[i];
    const float vj = h.beta2 * v[j] + h.one_minus_b2 * gj * gj;
    m[j] = mj;
    v[j] = vj;
    theta[j] -= step_size * mj / (sqrtf(vj) * inv_sqrt_bc2 + h.eps);
  }
}

__global__ void adams_masked_kernel(float* __restrict__ theta, float* __restrict__ m, std::size_t n,
                                    const std::uint32_t* __restrict__ idx, const float* __restrict__ m_new,
                                    const float* __restrict__ g_bar, std::size_t k, AdamFloats h, float inv_bc1) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j >= n) continue;
    const float gj = g_bar[i];
    const float mj = m_new[i];
    if (h.adams_artifact_form) {
      const float mp = m[j];
      const float vj = h.beta2 * mp * mp + h.one_minus_b2 * gj * gj;
      m[j] = mj;
      theta[j] -= h.lr * (mj * inv_bc1) / (sqrtf(vj) * h.inv_sqrt_bc2 + h.eps);
      continue;
    }
    const float mhat_prev = m[j] * inv_bc1;
    const float d = sqrtf(h.beta2 * mhat_prev * mhat_prev + h.one_minus_b2 * gj * gj) + h.eps;
    m[j] = mj;
    theta[j] -= h.lr * (mj * inv_bc1) / d;
  }
}

__global__ void scale_kernel(float* __restrict__ p, std::size_t n, float factor) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) p[j] *= factor;
}

// IEEE division (nvcc's default -prec-div), as the CPU's divps.
__global__ void divide_kernel(float* __restrict__ p, std::size_t n, float d) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) p[j] = p[j] / d;
}

// acc += g, counting the non-finite g (exponent all ones). Integer sums are exact in any
// order, so the count is deterministic.
__global__ void accumulate_kernel(float* __restrict__ a, const float* __restrict__ gg, std::size_t n,
                                  unsigned long long* __restrict__ nonfinite) {
  unsigned long long count = 0;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const float gj = gg[j];
    count += (__float_as_uint(gj) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
    a[j] += gj;
  }
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_down_sync(0xffffffffu, count, offset);
  if ((threadIdx.x & 31u) == 0 && count != 0) atomicAdd(nonfinite, count);
}

}  // namespace

void adamw_step(std::span<float> theta, std::span<float> m, std::span<float> v, std::span<const float> g,
                const AdamScalars& s) {
  checks::adamw_step_sizes(theta.size(), m.size(), v.size(), g.size());
  if (theta.empty()) return;
  const AdamFloats h(s);
  launch(adamw_kernel, theta.size(), theta.data(), m.data(), v.data(), g.data(), theta.size(), h, h.step_size,
         h.inv_sqrt_bc2);
}

void adams_step(std::span<float> theta, std::span<float> m, std::span<const float> g, const AdamScalars& s) {
  checks::adams_step_sizes(theta.size(), m.size(), g.size());
  if (theta.empty()) return;
  const AdamFloats h(s);
  launch(adams_kernel, theta.size(), theta.data(), m.data(), g.data(), theta.size(), h, h.inv_bc1);
}

void adamw_step_masked(std::span<float> theta, std::span<float> m, std::span<float> v,
                       std::span<const std::uint32_t> idx, std::span<const float> m_new,
                       std::span<const float> g_bar, const AdamScalars& s) {
  checks::adamw_step_masked_sizes(theta.size(), m.size(), v.size(), idx.size(), m_new.size(), g_bar.size());
  if (idx.empty()) return;
  const AdamFloats h(s);
  launch(adamw_masked_kernel, idx.size(), theta.data(), m.data(), v.data(), theta.size(), idx.data(), m_new.data(),
         g_bar.data(), idx.size(), h, h.step_size, h.inv_sqrt_bc2);
}

void adams_step_masked(std::span<float> theta, std::span<float> m, std::span<const std::uint32_t> idx,
                       std::span<const float> m_new, std::span<const float> g_bar, const AdamScalars& s) {
  checks::adams_step_masked_sizes(theta.size(), m.size(), idx.size(), m_new.size(), g_bar.size());
  if (idx.empty()) return;
  const AdamFloats h(s);
  launch(adams_masked_kernel, idx.size(), theta.data(), m.data(), theta.size(), idx.data(), m_new.data(),
         g_bar.data(), idx.size(), h, h.inv_bc1);
}

void scale(std::span<float> x, float factor) {
  if (factor == 1.0f || x.empty()) return;
  launch(scale_kernel, x.size(), x.data(), x.size(), factor);
}

void divide(std::span<float> x, float d) {
  if (x.empty()) return;
  launch(divide_kernel, x.size(), x.data(), x.size(), d);
}

std::size_t accumulate(std::span<float> acc, std::span<const float> g) {
  checks::require_same(acc.size(), g.size(), "accumulate: acc/g");
  if (acc.empty()) return 0;
  const cudaStream_t stream = current_stream();
  Scratch<unsigned long long> count(1, stream);
  SCAPE_CUDA_CHECK(cudaMemsetAsync(count.get(), 0, sizeof(unsigned long long), stream));
  launch(accumulate_kernel, acc.size(), acc.data(), g.data(), acc.size(), count.get());
  return static_cast<std::size_t>(read_back(count.get(), stream));
}

}  // namespace scape::kernels::cuda
