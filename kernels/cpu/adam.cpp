// Elementwise AdamW / AdamS steps (docs/algorithms.md, "Dense references", "SCAPE step 6"),
// and the plain elementwise passes beside them: scale, divide, accumulate.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

using Index = std::int64_t;

// Each kernel keeps its AdamFloats in a local, taken firstprivate by the loops: read through
// a reference, the compiler must assume the stores to theta/m/v may change the scalars, so it
// reloads them every element and will not vectorize.

}  // namespace

void adamw_step(std::span<float> theta, std::span<float> m, std::span<float> v, std::span<const float> g,
                const AdamScalars& s) {
  checks::adamw_step_sizes(theta.size(), m.size(), v.size(), g.size());
  const AdamFloats h(s);
  const float step_size = h.step_size;
  const float inv_sqrt_bc2 = h.inv_sqrt_bc2;
  float* __restrict th = theta.data();
  float* __restrict mm = m.data();
  float* __restrict vv = v.data();
  const float* __restrict gg = g.data();
  const Index n = static_cast<Index>(theta.size());
#pragma omp parallel for simd schedule(static) firstprivate(h) if (parallel : n > 32768)
  for (Index j = 0; j < n; ++j) {
    const float gj = gg[j];
    const float mj = h.beta1 * mm[j] + h.one_minus_b1 * gj;
    const float vj = h.beta2 * vv[j] + h.one_minus_b2 * gj * gj;
    mm[j] = mj;
    vv[j] = vj;
    th[j] = th[j] * h.decay - step_size * mj / (std::sqrt(vj) * inv_sqrt_bc2 + h.eps);
  }
}

void adams_step(std::span<float> theta, std::span<float> m, std::span<const float> g, const AdamScalars& s) {
  checks::adams_step_sizes(theta.size(), m.size(), g.size());
  const AdamFloats h(s);
  const float inv_bc1 = h.inv_bc1;
  float* __restrict th = theta.data();
  float* __restrict mm = m.data();
  const float* __restrict gg = g.data();
  const Index n = static_cast<Index>(theta.size());
#pragma omp parallel for simd schedule(static) firstprivate(h) if (parallel : n > 32768)
  for (Index j = 0; j < n; ++j) {
    const float gj = gg[j];
    const float mhat_prev = mm[j] * inv_bc1;
    const float d = std::sqrt(h.beta2 * mhat_prev * mhat_prev + h.one_minus_b2 * gj * gj) + h.eps;
    const float mj = h.beta1 * mm[j] + h.one_minus_b1 * gj;
    mm[j] = mj;
    th[j] = th[j] * h.decay - h.lr * (mj * inv_bc1) / d;
  }
}

void adamw_step_masked(std::span<float> theta, std::span<float> m, std::span<float> v,
                       std::span<const std::uint32_t> idx, std::span<const float> m_new,
                       std::span<const float> g_bar, const AdamScalars& s) {
  checks::adamw_step_masked_sizes(theta.size(), m.size(), v.size(), idx.size(), m_new.size(), g_bar.size());
  const AdamFloats h(s);
  const float step_size = h.step_size;
  const float inv_sqrt_bc2 = h.inv_sqrt_bc2;
  const Index k = static_cast<Index>(idx.size());
#pragma omp parallel for schedule(static) firstprivate(h) if (k > 16384)
  for (Index i = 0; i < k; ++i) {
    const std::uint32_t j = idx[static_cast<std::size_t>(i)];
    const float gj = g_bar[static_cast<std::size_t>(i)];
    const float mj = m_new[static_cast<std::size_t>(i)];
    const float vj = h.beta2 * v[j] + h.one_minus_b2 * gj * gj;
    m[j] = mj;
    v[j] = vj;
    theta[j] -= step_size * mj / (std::sqrt(vj) * inv_sqrt_bc2 + h.eps);
  }
}

void adams_step_masked(std::span<float> theta, std::span<float> m, std::span<const std::uint32_t> idx,
                       std::span<const float> m_new, std::span<const float> g_bar, const AdamScalars& s) {
  checks::adams_step_masked_sizes(theta.size(), m.size(), idx.size(), m_new.size(), g_bar.size());
  const AdamFloats h(s);
  const float inv_bc1 = h.inv_bc1;
  const Index k = static_cast<Index>(idx.size());
#pragma omp parallel for schedule(static) firstprivate(h) if (k > 16384)
  for (Index i = 0; i < k; ++i) {
    const std::uint32_t j = idx[static_cast<std::size_t>(i)];
    const float gj = g_bar[static_cast<std::size_t>(i)];
    const float mhat_prev = m[j] * inv_bc1;
    const float d = std::sqrt(h.beta2 * mhat_prev * mhat_prev + h.one_minus_b2 * gj * gj) + h.eps;
    const float mj = m_new[static_cast<std::size_t>(i)];
    m[j] = mj;
    theta[j] -= h.lr * (mj * inv_bc1) / d;
  }
}

void scale(std::span<float> x, float factor) {
  if (factor == 1.0f) return;
  float* __restrict p = x.data();
  const Index n = static_cast<Index>(x.size());
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
  for (Index j = 0; j < n; ++j) p[j] *= factor;
}

void divide(std::span<float> x, float d) {
  float* __restrict p = x.data();
  const Index n = static_cast<Index>(x.size());
  // Without -ffast-math the compiler keeps the division (divps): IEEE-rounded like CUDA's.
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
  for (Index j = 0; j < n; ++j) p[j] = p[j] / d;
}

std::size_t accumulate(std::span<float> acc, std::span<const float> g) {
  checks::require_same(acc.size(), g.size(), "accumulate: acc/g");
  float* __restrict a = acc.data();
  const float* __restrict gg = g.data();
  const Index n = static_cast<Index>(acc.size());
  std::size_t nonfinite = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : nonfinite) if (parallel : n > 65536)
  for (Index j = 0; j < n; ++j) {
    const float gj = gg[j];
    nonfinite += std::isfinite(gj) ? 0u : 1u;
    a[j] += gj;
  }
  return nonfinite;
}

}  // namespace scape::kernels
