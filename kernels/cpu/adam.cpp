// Elementwise AdamW / AdamS steps (docs/algorithms.md, "Dense references", "SCAPE step 7"),
// and the plain elementwise passes beside them: scale, divide, accumulate.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

using Index = std::int64_t;

// The loops over [lo, hi), for for_shares (kernels/cpu/parallel.hpp). The scalars come by value:
// read through a reference, the compiler must assume the stores to theta/m/v may change them,
// so it reloads them every element and will not vectorize.
void adamw_range(float* __restrict th, float* __restrict mm, float* __restrict vv, const float* __restrict gg,
                 const AdamFloats h, Index lo, Index hi) {
#pragma omp simd
  for (Index j = lo; j < hi; ++j) {
    const float gj = gg[j];
    const float mj = h.beta1 * mm[j] + h.one_minus_b1 * gj;
    const float vj = h.beta2 * vv[j] + h.one_minus_b2 * gj * gj;
    mm[j] = mj;
    vv[j] = vj;
    th[j] = th[j] * h.decay - h.step_size * mj / (std::sqrt(vj) * h.inv_sqrt_bc2 + h.eps);
  }
}

void adams_range(float* __restrict th, float* __restrict mm, const float* __restrict gg, const AdamFloats h, Index lo,
                 Index hi) {
#pragma omp simd
  for (Index j = lo; j < hi; ++j) {
    const float gj = gg[j];
    const float mhat_prev = mm[j] * h.inv_bc1;
    const float d = std::sqrt(h.beta2 * mhat_prev * mhat_prev + h.one_minus_b2 * gj * gj) + h.eps;
    const float mj = h.beta1 * mm[j] + h.one_minus_b1 * gj;
    mm[j] = mj;
    th[j] = th[j] * h.decay - h.lr * (mj * h.inv_bc1) / d;
  }
}

// AdamS in the artifact's form: v = b2 m_prev^2 + (1-b2) g^2, d = sqrt(v) / sqrt(c2) + eps.
void adams_artifact_range(float* __restrict th, float* __restrict mm, const float* __restrict gg, const AdamFloats h,
                          Index lo, Index hi) {
#pragma omp simd
  for (Index j = lo; j < hi; ++j) {
    const float gj = gg[j];
    const float mp = mm[j];
    const float vj = h.beta2 * mp * mp + h.one_minus_b2 * gj * gj;
    const float mj = h.beta1 * mp + h.one_minus_b1 * gj;
    mm[j] = mj;
    th[j] = th[j] * h.decay - h.lr * (mj * h.inv_bc1) / (std::sqrt(vj) * h.inv_sqrt_bc2 + h.eps);
  }
}

std::size_t accumulate_range(float* __restrict a, const float* __restrict gg, Index lo, Index hi) {
  std::size_t nonfinite = 0;
#pragma omp simd reduction(+ : nonfinite)
  for (Index j = lo; j < hi; ++j) {
    const float gj = gg[j];
    nonfinite += std::isfinite(gj) ? 0u : 1u;
    a[j] += gj;
  }
  return nonfinite;
}

}  // namespace

void adamw_step(std::span<float> theta, std::span<float> m, std::span<float> v, std::span<const float> g,
                const AdamScalars& s) {
  checks::adamw_step_sizes(theta.size(), m.size(), v.size(), g.size());
  const AdamFloats h(s);
  for_shares(static_cast<Index>(theta.size()), 32768, [&](Index lo, Index hi) {
    adamw_range(theta.data(), m.data(), v.data(), g.data(), h, lo, hi);
  });
}

void adams_step(std::span<float> theta, std::span<float> m, std::span<const float> g, const AdamScalars& s) {
  checks::adams_step_sizes(theta.size(), m.size(), g.size());
  const AdamFloats h(s);
  for_shares(static_cast<Index>(theta.size()), 32768, [&](Index lo, Index hi) {
    if (h.adams_artifact_form) {
      adams_artifact_range(theta.data(), m.data(), g.data(), h, lo, hi);
    } else {
      adams_range(theta.data(), m.data(), g.data(), h, lo, hi);
    }
  });
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
  if (h.adams_artifact_form) {
#pragma omp parallel for schedule(static) firstprivate(h) if (k > 16384)
    for (Index i = 0; i < k; ++i) {
      const std::uint32_t j = idx[static_cast<std::size_t>(i)];
      const float gj = g_bar[static_cast<std::size_t>(i)];
      const float mp = m[j];
      const float vj = h.beta2 * mp * mp + h.one_minus_b2 * gj * gj;
      const float mj = m_new[static_cast<std::size_t>(i)];
      m[j] = mj;
      theta[j] -= h.lr * (mj * inv_bc1) / (std::sqrt(vj) * h.inv_sqrt_bc2 + h.eps);
    }
    return;
  }
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
  return sum_over_shares(static_cast<Index>(acc.size()), 65536, [&](Index lo, Index hi) {
    return accumulate_range(acc.data(), g.data(), lo, hi);
  });
}

}  // namespace scape::kernels
