// Elementwise AdamW and AdamS steps over spans (dense) and index lists (masked), plus the
// small elementwise helpers the optimizers share. Formulas: docs/algorithms.md, "Dense
// references" and "SCAPE step 6". The order is decay -> moments -> step.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

namespace scape::kernels {

// Scalars of one step, in double. Kernels derive 1 - beta in double and round every scalar
// to fp32 once: computing 1 - beta2 from an fp32 beta2 = 0.999 would be off by 1.3e-5.
struct AdamScalars {
  double lr = 0.0;     // eta_t
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double decay = 1.0;  // theta multiplier (1 - eta*lambda) for decayed tensors, 1 otherwise
  double bc1 = 1.0;    // c1 = 1 - beta1^t with bias correction, 1 without
  double bc2 = 1.0;    // c2 = 1 - beta2^t with bias correction, 1 without (AdamW only)
};

// The scalars as the kernels use them, each rounded from double to fp32 once on the host. The
// CPU and CUDA kernels both build their scalars here, so both round identically.
struct AdamFloats {
  explicit AdamFloats(const AdamScalars& s)
      : lr(static_cast<float>(s.lr)),
        beta1(static_cast<float>(s.beta1)),
        beta2(static_cast<float>(s.beta2)),
        eps(static_cast<float>(s.eps)),
        decay(static_cast<float>(s.decay)),
        one_minus_b1(static_cast<float>(1.0 - s.beta1)),
        one_minus_b2(static_cast<float>(1.0 - s.beta2)),
        step_size(static_cast<float>(s.lr / s.bc1)),
        inv_sqrt_bc2(static_cast<float>(1.0 / std::sqrt(s.bc2))),
        inv_bc1(static_cast<float>(1.0 / s.bc1)) {}
  float lr, beta1, beta2, eps, decay, one_minus_b1, one_minus_b2;
  float step_size;     // lr / c1 (AdamW)
  float inv_sqrt_bc2;  // 1 / sqrt(c2) (AdamW)
  float inv_bc1;       // 1 / c1 (AdamS)
};

// AdamW (PyTorch semantics) with gradient g:
//   theta *= decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   theta -= lr * (m / c1) / (sqrt(v / c2) + eps).
void adamw_step(std::span<float> theta, std::span<float> m, std::span<float> v,
                std::span<const float> g, const AdamScalars& s);

// AdamS: d = sqrt(b2 (m_prev / c1)^2 + (1-b2) g^2) + eps; m = b1 m_prev + (1-b1) g;
//   theta = theta * decay - lr * (m / c1) / d.
void adams_step(std::span<float> theta, std::span<float> m, std::span<const float> g, const AdamScalars& s);

// Masked forms used by SCAPE: only theta[idx[k]], m[idx[k]] (and v) change. The new momentum
// m_new[k] and the synchronized gradient g_bar[k] are given (compacted, in idx order), because
// SCAPE synchronizes the momentum itself and reconstructs g_bar from it. No decay here:
// SCAPE applies decay to every flagged coordinate separately (scale()).
void adamw_step_masked(std::span<float> theta, std::span<float> m, std::span<float> v,
                       std::span<const std::uint32_t> idx, std::span<const float> m_new,
                       std::span<const float> g_bar, const AdamScalars& s);
void adams_step_masked(std::span<float> theta, std::span<float> m, std::span<const std::uint32_t> idx,
                       std::span<const float> m_new, std::span<const float> g_bar, const AdamScalars& s);

// x *= factor.
void scale(std::span<float> x, float factor);
// acc += g; returns how many entries of g are NaN or +-inf.
std::size_t accumulate(std::span<float> acc, std::span<const float> g);

}  // namespace scape::kernels
