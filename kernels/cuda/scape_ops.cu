// SCAPE elementwise passes on the GPU (kernels/kernel_list.inc; docs/algorithms.md,
// "SCAPE" steps 1, 3, 5, 6 and 9): the CPU expressions in the CPU order, bit-identical with
// --fmad=false. random_statistic runs util/rng.hpp's counter-based generator on the device.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/fp8.hpp"
#include "kernels/size_checks.hpp"
#include "util/rng.hpp"

namespace scape::kernels::cuda {
namespace {

using checks::require_size;

__global__ void first_moment_kernel(const float* __restrict__ mm, const float* __restrict__ aa, float b1,
                                    float one_minus_b1, float* __restrict__ s, std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) s[j] = b1 * mm[j] + one_minus_b1 * aa[j];
}

__global__ void carried_first_moment_kernel(const float* __restrict__ mm, const float* __restrict__ aa,
                                            const float* __restrict__ qq, float b1, float* __restrict__ s,
                                            std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) s[j] = qq[j] + (b1 * mm[j] + aa[j]);
}

// mode 0: m and g; 1: g only; 2: m only (kernel_list.inc, candidate_momentum).
__global__ void candidate_momentum_kernel(float* __restrict__ e, const float* __restrict__ mm,
                                          const float* __restrict__ gg, float b1, float one_minus_b1, int mode,
                                          std::size_t n, unsigned long long* __restrict__ nonfinite) {
  unsigned long long count = 0;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    if (mode == 2) {
      e[j] = b1 * mm[j] + e[j];
      continue;
    }
    const float gj = gg[j];
    count += (__float_as_uint(gj) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
    e[j] = mode == 0 ? (b1 * mm[j] + one_minus_b1 * gj) + e[j] : one_minus_b1 * gj + e[j];
  }
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_down_sync(0xffffffffu, count, offset);
  if ((threadIdx.x & 31u) == 0 && count != 0) atomicAdd(nonfinite, count);
}

__global__ void carry_momentum_off_mask_kernel(float* __restrict__ q, float* __restrict__ m,
                                               const std::uint64_t* __restrict__ mask, std::size_t first_bit, float b1,
                                               float gamma, bool scaled, std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const std::size_t bit = first_bit + j;
    const bool on = (mask[bit / 64] >> (bit % 64)) & 1u;
    const float carried = b1 * m[j] + q[j];
    const float kept = scaled ? carried * gamma : carried;
    q[j] = on ? 0.0f : kept;
    if (!on) m[j] = 0.0f;
  }
}

// candidate_momentum_kernel (mode 1), carried_first_moment_kernel and carry_momentum_off_mask_kernel
// in one pass, q and m kept on the mask (kernel_list.inc, candidate_statistic_carry).
__global__ void candidate_statistic_carry_kernel(float* __restrict__ e, const float* __restrict__ gg,
                                                 float* __restrict__ q, float* __restrict__ m,
                                                 const std::uint64_t* __restrict__ mask, std::size_t first_bit,
                                                 float b1, float one_minus_b1, float gamma, bool scaled,
                                                 float* __restrict__ s, std::size_t n,
                                                 unsigned long long* __restrict__ nonfinite) {
  unsigned long long count = 0;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const float gj = gg[j], mj = m[j], qj = q[j];
    count += (__float_as_uint(gj) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
    const float a = one_minus_b1 * gj + e[j];
    e[j] = a;
    s[j] = qj + (b1 * mj + a);
    const std::size_t bit = first_bit + j;
    if ((mask[bit / 64] >> (bit % 64)) & 1u) continue;
    const float carried = b1 * mj + qj;
    q[j] = scaled ? carried * gamma : carried;
    m[j] = 0.0f;
  }
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_down_sync(0xffffffffu, count, offset);
  if ((threadIdx.x & 31u) == 0 && count != 0) atomicAdd(nonfinite, count);
}

__global__ void momentum_from_gradient_kernel(const float* __restrict__ m, std::size_t nm,
                                              const std::uint32_t* __restrict__ idx, const float* __restrict__ g_bar,
                                              float b1, float one_minus_b1, float* __restrict__ out, std::size_t k) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j >= nm) continue;
    out[i] = b1 * m[j] + one_minus_b1 * g_bar[i];
  }
}

__global__ void quantize_e5m2_kernel(const float* __restrict__ v, float w, float down, float up, float* __restrict__ q,
                                     float* __restrict__ error, std::size_t n) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads()) {
    const float qi = round_to_e5m2((v[i] / w) * down);
    q[i] = qi;
    error[i] = v[i] - w * (qi * up);
  }
}

__global__ void random_statistic_kernel(std::uint64_t key, std::uint64_t first_counter, float* __restrict__ out,
                                        std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    out[j] = static_cast<float>(rng::uniform(key, first_counter + static_cast<std::uint64_t>(j)));
  }
}

// Indices outside a (or m) are skipped; the CPU kernel does not check them.
__global__ void pack_payload_kernel(const float* __restrict__ a, std::size_t na, const float* __restrict__ m,
                                    std::size_t nm, std::size_t m_offset, const std::uint32_t* __restrict__ idx,
                                    std::size_t k, float b1, float one_minus_b1, bool with_momentum,
                                    float* __restrict__ b, float* __restrict__ a_out) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::size_t j = idx[i];
    if (j >= na || (with_momentum && (j < m_offset || j - m_offset >= nm))) continue;
    const float aj = a[j];
    b[i] = with_momentum ? b1 * m[j - m_offset] + one_minus_b1 * aj : one_minus_b1 * aj;
    if (a_out != nullptr) a_out[i] = aj;
  }
}

__global__ void rebase_kernel(const std::uint32_t* __restrict__ idx, std::uint32_t base,
                              std::uint32_t* __restrict__ out, std::size_t k) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) out[i] = idx[i] - base;
}

__global__ void add_momentum_kernel(float* __restrict__ b_bar, const float* __restrict__ m, std::size_t nm,
                                    const std::uint32_t* __restrict__ idx, std::size_t k, float b1) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j < nm) b_bar[i] += b1 * m[j];
  }
}

__global__ void reconstruct_kernel(const float* __restrict__ b_bar, const float* __restrict__ m, std::size_t nm,
                                   const std::uint32_t* __restrict__ idx, std::size_t k, float b1, float one_minus_b1,
                                   float* __restrict__ g_bar) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j < nm) g_bar[i] = (b_bar[i] - b1 * m[j]) / one_minus_b1;
  }
}

__global__ void owner_payload_gradient_kernel(float* __restrict__ b_bar, const float* __restrict__ m, std::size_t nm,
                                              float* __restrict__ q, const std::uint32_t* __restrict__ idx,
                                              std::size_t k, float b1, float one_minus_b1, float* __restrict__ g_bar) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j >= nm) continue;
    const float mj = m[j];
    float b = b_bar[i] + b1 * mj;
    if (q != nullptr) {
      b = b + q[j];
      q[j] = 0.0f;
    }
    b_bar[i] = b;
    g_bar[i] = (b - b1 * mj) / one_minus_b1;
  }
}

// Round-to-nearest-even to bf16 and back (kernels/cpu/bf16.hpp); NaN stays a quiet NaN.
__device__ inline float round_to_bf16_device(float x) {
  const std::uint32_t u = __float_as_uint(x);
  std::uint32_t bits;
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    bits = (u >> 16) | 0x0040u;
  } else {
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    bits = ((u + rounding) >> 16) & 0xffffu;
  }
  return __uint_as_float(bits << 16);
}

// in and out may alias (same index read then written by one thread), so no __restrict__.
__global__ void round_bf16_kernel(const float* in, float* out, std::size_t n) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) out[j] = round_to_bf16_device(in[j]);
}

__global__ void fill_kernel(float* __restrict__ x, std::size_t n, float value) {
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) x[j] = value;
}

}  // namespace

void first_moment_statistic(std::span<const float> m, std::span<const float> a, float b1, float one_minus_b1,
                            std::span<float> out) {
  checks::first_moment_statistic_sizes(m.size(), a.size(), out.size());
  if (out.empty()) return;
  launch(first_moment_kernel, out.size(), m.data(), a.data(), b1, one_minus_b1, out.data(), out.size());
}

void carried_first_moment_statistic(std::span<const float> m, std::span<const float> a, std::span<const float> q,
                                    float b1, std::span<float> out) {
  checks::carried_first_moment_statistic_sizes(m.size(), a.size(), q.size(), out.size());
  if (out.empty()) return;
  launch(carried_first_moment_kernel, out.size(), m.data(), a.data(), q.data(), b1, out.data(), out.size());
}

std::size_t candidate_momentum(std::span<float> e, std::span<const float> m, std::span<const float> g, float b1,
                               float one_minus_b1) {
  checks::candidate_momentum_sizes(e.size(), m.size(), g.size());
  if (e.empty()) return 0;
  const int mode = !m.empty() && !g.empty() ? 0 : (m.empty() ? 1 : 2);
  const cudaStream_t stream = current_stream();
  Scratch<unsigned long long> count(1, stream);
  SCAPE_CUDA_CHECK(cudaMemsetAsync(count.get(), 0, sizeof(unsigned long long), stream));
  launch(candidate_momentum_kernel, e.size(), e.data(), m.data(), g.data(), b1, one_minus_b1, mode, e.size(),
         count.get());
  return static_cast<std::size_t>(read_back(count.get(), stream));
}

void carry_momentum_off_mask(std::span<float> q, std::span<float> m, std::span<const std::uint64_t> mask,
                             std::size_t first_bit, float b1, float gamma) {
  checks::carry_momentum_off_mask_sizes(q.size(), m.size(), mask.size(), first_bit);
  if (q.empty()) return;
  launch(carry_momentum_off_mask_kernel, q.size(), q.data(), m.data(), mask.data(), first_bit, b1, gamma, gamma != 1.0f,
         q.size());
}

std::size_t candidate_statistic_carry(std::span<float> e, std::span<const float> g, std::span<float> q,
                                      std::span<float> m, std::span<const std::uint64_t> mask, std::size_t first_bit,
                                      float b1, float one_minus_b1, float gamma, std::span<float> out) {
  checks::candidate_statistic_carry_sizes(e.size(), g.size(), q.size(), m.size(), mask.size(), first_bit, out.size());
  if (e.empty()) return 0;
  const cudaStream_t stream = current_stream();
  Scratch<unsigned long long> count(1, stream);
  SCAPE_CUDA_CHECK(cudaMemsetAsync(count.get(), 0, sizeof(unsigned long long), stream));
  launch(candidate_statistic_carry_kernel, e.size(), e.data(), g.data(), q.data(), m.data(), mask.data(), first_bit, b1,
         one_minus_b1, gamma, gamma != 1.0f, out.data(), e.size(), count.get());
  return static_cast<std::size_t>(read_back(count.get(), stream));
}

void momentum_from_gradient(std::span<const float> m, std::span<const std::uint32_t> idx, std::span<const float> g_bar,
                            float b1, float one_minus_b1, std::span<float> out) {
  checks::momentum_from_gradient_sizes(idx.size(), g_bar.size(), out.size());
  if (idx.empty()) return;
  launch(momentum_from_gradient_kernel, idx.size(), m.data(), m.size(), idx.data(), g_bar.data(), b1, one_minus_b1,
         out.data(), idx.size());
}

void quantize_e5m2(std::span<const float> v, float w, int exponent, std::span<float> q, std::span<float> error) {
  checks::quantize_e5m2_sizes(v.size(), q.size(), error.size());
  if (v.empty()) return;
  launch(quantize_e5m2_kernel, v.size(), v.data(), w, std::ldexp(1.0f, -exponent), std::ldexp(1.0f, exponent), q.data(),
         error.data(), v.size());
}

void random_statistic(std::uint64_t key, std::uint64_t first_counter, std::span<float> out) {
  if (out.empty()) return;
  launch(random_statistic_kernel, out.size(), key, first_counter, out.data(), out.size());
}

void pack_payload(std::span<const float> a, std::span<const float> m, std::size_t m_offset,
                  std::span<const std::uint32_t> idx, float b1, float one_minus_b1, bool with_momentum,
                  std::span<float> b, std::span<float> a_out) {
  checks::pack_payload_sizes(idx.size(), b.size(), a_out.size());
  if (idx.empty()) return;
  launch(pack_payload_kernel, idx.size(), a.data(), a.size(), m.data(), m.size(), m_offset, idx.data(), idx.size(), b1,
         one_minus_b1, with_momentum, b.data(), a_out.empty() ? nullptr : a_out.data());
}

void rebase_indices(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint32_t> out) {
  require_size(out.size(), idx.size(), "rebase_indices: out");
  if (idx.empty()) return;
  launch(rebase_kernel, idx.size(), idx.data(), base, out.data(), idx.size());
}

void add_momentum(std::span<float> b_bar, std::span<const float> m, std::span<const std::uint32_t> idx, float b1) {
  require_size(b_bar.size(), idx.size(), "add_momentum: b_bar");
  if (idx.empty()) return;
  launch(add_momentum_kernel, idx.size(), b_bar.data(), m.data(), m.size(), idx.data(), idx.size(), b1);
}

void reconstruct_gradient(std::span<const float> b_bar, std::span<const float> m,
                          std::span<const std::uint32_t> idx, float b1, float one_minus_b1, std::span<float> g_bar) {
  checks::reconstruct_gradient_sizes(b_bar.size(), idx.size(), g_bar.size());
  if (idx.empty()) return;
  launch(reconstruct_kernel, idx.size(), b_bar.data(), m.data(), m.size(), idx.data(), idx.size(), b1, one_minus_b1,
         g_bar.data());
}

void owner_payload_gradient(std::span<float> b_bar, std::span<const float> m, std::span<float> q,
                            std::span<const std::uint32_t> idx, float b1, float one_minus_b1, std::span<float> g_bar) {
  checks::owner_payload_gradient_sizes(b_bar.size(), m.size(), q.size(), idx.size(), g_bar.size());
  if (idx.empty()) return;
  launch(owner_payload_gradient_kernel, idx.size(), b_bar.data(), m.data(), m.size(), q.empty() ? nullptr : q.data(),
         idx.data(), idx.size(), b1, one_minus_b1, g_bar.data());
}

void round_to_bf16(std::span<const float> in, std::span<float> out) {
  require_size(out.size(), in.size(), "round_to_bf16: out");
  if (in.empty()) return;
  launch(round_bf16_kernel, in.size(), in.data(), out.data(), in.size());
}

void fill(std::span<float> x, float value) {
  if (x.empty()) return;
  launch(fill_kernel, x.size(), x.data(), x.size(), value);
}

}  // namespace scape::kernels::cuda

