// SCAPE elementwise passes on the CPU (docs/algorithms.md, "SCAPE").
#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/fp8.hpp"
#include "kernels/size_checks.hpp"
#include "util/rng.hpp"

namespace scape::kernels {
namespace {

using Index = std::int64_t;

using checks::require_size;

// Calls body(lo, hi, shift, word) for the elements [lo, hi) of [0, n) whose bits first_bit + j
// lie in one mask word, bit (shift + j) % 64 of `word`, in parallel over the words (a body's
// inner loop then shifts a single word, which vectorizes); returns the sum of what the bodies
// return.
template <typename Body>
std::size_t for_each_mask_word(std::size_t n, std::span<const std::uint64_t> mask, std::size_t first_bit, Body body) {
  if (n == 0) return 0;
  const std::size_t w0 = first_bit / 64;
  const auto words = static_cast<Index>(words_for(first_bit + n) - w0);
  std::size_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (n > 65536)
  for (Index w = 0; w < words; ++w) {
    const std::size_t word_bit = 64 * (w0 + static_cast<std::size_t>(w));
    const std::size_t lo = std::max(word_bit, first_bit) - first_bit;
    const std::size_t hi = std::min(word_bit + 64, first_bit + n) - first_bit;
    total += body(lo, hi, first_bit, mask[w0 + static_cast<std::size_t>(w)]);
  }
  return total;
}

}  // namespace

void first_moment_statistic(std::span<const float> m, std::span<const float> a, float b1, float omb1,
                            std::span<float> out) {
  checks::first_moment_statistic_sizes(m.size(), a.size(), out.size());
  const float* __restrict mm = m.data();
  const float* __restrict aa = a.data();
  float* __restrict s = out.data();
  const Index n = static_cast<Index>(out.size());
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
  for (Index j = 0; j < n; ++j) s[j] = b1 * mm[j] + omb1 * aa[j];
}

void carried_first_moment_statistic(std::span<const float> m, std::span<const float> a, std::span<const float> q,
                                    float b1, std::span<float> out) {
  checks::carried_first_moment_statistic_sizes(m.size(), a.size(), q.size(), out.size());
  const float* __restrict mm = m.data();
  const float* __restrict aa = a.data();
  const float* __restrict qq = q.data();
  float* __restrict s = out.data();
  const Index n = static_cast<Index>(out.size());
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
  for (Index j = 0; j < n; ++j) s[j] = qq[j] + (b1 * mm[j] + aa[j]);
}

std::size_t candidate_momentum(std::span<float> e, std::span<const float> m, std::span<const float> g, float b1,
                               float omb1) {
  checks::candidate_momentum_sizes(e.size(), m.size(), g.size());
  float* __restrict ee = e.data();
  const float* __restrict mm = m.data();
  const float* __restrict gg = g.data();
  const Index n = static_cast<Index>(e.size());
  std::size_t nonfinite = 0;
  if (!m.empty() && !g.empty()) {
#pragma omp parallel for simd schedule(static) reduction(+ : nonfinite) if (parallel : n > 65536)
    for (Index j = 0; j < n; ++j) {
      nonfinite += std::isfinite(gg[j]) ? 0u : 1u;
      ee[j] = (b1 * mm[j] + omb1 * gg[j]) + ee[j];
    }
  } else if (m.empty()) {
#pragma omp parallel for simd schedule(static) reduction(+ : nonfinite) if (parallel : n > 65536)
    for (Index j = 0; j < n; ++j) {
      nonfinite += std::isfinite(gg[j]) ? 0u : 1u;
      ee[j] = omb1 * gg[j] + ee[j];
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
    for (Index j = 0; j < n; ++j) ee[j] = b1 * mm[j] + ee[j];
  }
  return nonfinite;
}

void carry_momentum_off_mask(std::span<float> q, std::span<float> m, std::span<const std::uint64_t> mask,
                             std::size_t first_bit, float b1, float gamma) {
  checks::carry_momentum_off_mask_sizes(q.size(), m.size(), mask.size(), first_bit);
  float* __restrict qq = q.data();
  float* __restrict mm = m.data();
  const bool scaled = gamma != 1.0f;
  const auto carry = [&](std::size_t lo, std::size_t hi, std::size_t shift, std::uint64_t word) {
    for (std::size_t j = lo; j < hi; ++j) {
      const bool on = (word >> ((shift + j) % 64)) & 1u;
      const float carried = b1 * mm[j] + qq[j];
      const float kept = scaled ? carried * gamma : carried;
      qq[j] = on ? 0.0f : kept;
      mm[j] = on ? mm[j] : 0.0f;
    }
    return std::size_t{0};
  };
  for_each_mask_word(q.size(), mask, first_bit, carry);
}

std::size_t candidate_statistic_carry(std::span<float> e, std::span<const float> g, std::span<float> q,
                                      std::span<float> m, std::span<const std::uint64_t> mask, std::size_t first_bit,
                                      float b1, float omb1, float gamma, std::span<float> out) {
  checks::candidate_statistic_carry_sizes(e.size(), g.size(), q.size(), m.size(), mask.size(), first_bit, out.size());
  float* __restrict ee = e.data();
  const float* __restrict gg = g.data();
  float* __restrict qq = q.data();
  float* __restrict mm = m.data();
  float* __restrict s = out.data();
  // Each value rounds as in the passes this one replaces: candidate_momentum, then
  // carried_first_moment_statistic on the new e, then carry_momentum_off_mask (q kept on the mask).
  // Written so that gcc 12 vectorizes it (3-4x faster alone at N = 16M on an AVX2 host, where the
  // scalar loop was a quarter of bench_scape_step's samples): the body reads its own restrict copies
  // of the closure's pointers and scalars, chooses q and m by bit operations on the mask bit
  // (selects kept the loop scalar), and scales by gamma without a branch on gamma = 1.
  const auto pass = [=](std::size_t lo, std::size_t hi, std::size_t shift, std::uint64_t word) {
    float* __restrict e_ = ee;
    const float* __restrict g_ = gg;
    float* __restrict q_ = qq;
    float* __restrict m_ = mm;
    float* __restrict s_ = s;
    const float b1_ = b1, omb1_ = omb1, gamma_ = gamma;
    std::size_t nonfinite = 0;
#pragma omp simd reduction(+ : nonfinite)
    for (std::size_t j = lo; j < hi; ++j) {
      const float gj = g_[j], mj = m_[j], qj = q_[j];
      nonfinite += std::isfinite(gj) ? 0u : 1u;
      const float a = omb1_ * gj + e_[j];
      e_[j] = a;
      s_[j] = qj + (b1_ * mj + a);
      // all ones on the mask, zero off it
      const auto on = static_cast<std::uint32_t>(0u - static_cast<std::uint32_t>((word >> ((shift + j) % 64)) & 1u));
      const float carried = b1_ * mj + qj;
      const float kept = carried * gamma_;  // gamma = 1 leaves every value as it is, a NaN's payload too
      using std::bit_cast;
      q_[j] = bit_cast<float>((bit_cast<std::uint32_t>(qj) & on) | (bit_cast<std::uint32_t>(kept) & ~on));
      m_[j] = bit_cast<float>(bit_cast<std::uint32_t>(mj) & on);
    }
    return nonfinite;
  };
  return for_each_mask_word(e.size(), mask, first_bit, pass);
}

void momentum_from_gradient(std::span<const float> m, std::span<const std::uint32_t> idx, std::span<const float> g_bar,
                            float b1, float omb1, std::span<float> out) {
  checks::momentum_from_gradient_sizes(idx.size(), g_bar.size(), out.size());
  for (std::size_t i = 0; i < idx.size(); ++i) out[i] = b1 * m[idx[i]] + omb1 * g_bar[i];
}

void quantize_e5m2(std::span<const float> v, float w, int exponent, std::span<float> q, std::span<float> error) {
  checks::quantize_e5m2_sizes(v.size(), q.size(), error.size());
  const float down = std::ldexp(1.0f, -exponent), up = std::ldexp(1.0f, exponent);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float qi = round_to_e5m2((v[i] / w) * down);
    q[i] = qi;
    error[i] = v[i] - w * (qi * up);
  }
}

void random_statistic(std::uint64_t key, std::uint64_t first_counter, std::span<float> out) {
  const Index n = static_cast<Index>(out.size());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index j = 0; j < n; ++j) {
    out[static_cast<std::size_t>(j)] =
        static_cast<float>(rng::uniform(key, first_counter + static_cast<std::uint64_t>(j)));
  }
}

void pack_payload(std::span<const float> a, std::span<const float> m, std::size_t m_offset,
                  std::span<const std::uint32_t> idx, float b1, float omb1, bool with_momentum, std::span<float> b,
                  std::span<float> a_out) {
  checks::pack_payload_sizes(idx.size(), b.size(), a_out.size());
  const Index k = static_cast<Index>(idx.size());
  const bool two = !a_out.empty();
#pragma omp parallel for schedule(static) if (k > 16384)
  for (Index i = 0; i < k; ++i) {
    const auto ii = static_cast<std::size_t>(i);
    const std::size_t j = idx[ii];
    const float aj = a[j];
    b[ii] = with_momentum ? b1 * m[j - m_offset] + omb1 * aj : omb1 * aj;
    if (two) a_out[ii] = aj;
  }
}

void rebase_indices(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint32_t> out) {
  require_size(out.size(), idx.size(), "rebase_indices: out");
  for (std::size_t i = 0; i < idx.size(); ++i) out[i] = idx[i] - base;
}

void add_momentum(std::span<float> b_bar, std::span<const float> m, std::span<const std::uint32_t> idx, float b1) {
  require_size(b_bar.size(), idx.size(), "add_momentum: b_bar");
  for (std::size_t i = 0; i < idx.size(); ++i) b_bar[i] += b1 * m[idx[i]];
}

void reconstruct_gradient(std::span<const float> b_bar, std::span<const float> m,
                          std::span<const std::uint32_t> idx, float b1, float omb1, std::span<float> g_bar) {
  checks::reconstruct_gradient_sizes(b_bar.size(), idx.size(), g_bar.size());
  for (std::size_t i = 0; i < idx.size(); ++i) g_bar[i] = (b_bar[i] - b1 * m[idx[i]]) / omb1;
}

void owner_payload_gradient(std::span<float> b_bar, std::span<const float> m, std::span<float> q,
                            std::span<const std::uint32_t> idx, float b1, float omb1, std::span<float> g_bar) {
  checks::owner_payload_gradient_sizes(b_bar.size(), m.size(), q.size(), idx.size(), g_bar.size());
  const Index k = static_cast<Index>(idx.size());
  const bool with_q = !q.empty();
#pragma omp parallel for schedule(static) if (k > 16384)
  for (Index i = 0; i < k; ++i) {
    const auto ii = static_cast<std::size_t>(i);
    const std::size_t j = idx[ii];
    const float mj = m[j];
    float b = b_bar[ii] + b1 * mj;
    if (with_q) {
      b = b + q[j];  // add_momentum's b1 = 1: 1 * q[j] is q[j] exactly
      q[j] = 0.0f;
    }
    b_bar[ii] = b;
    g_bar[ii] = (b - b1 * mj) / omb1;
  }
}

void round_to_bf16(std::span<const float> in, std::span<float> out) {
  require_size(out.size(), in.size(), "round_to_bf16: out");
  for (std::size_t j = 0; j < in.size(); ++j) out[j] = round_to_bf16(in[j]);
}

void fill(std::span<float> x, float value) {
  for (float& v : x) v = value;
}

}  // namespace scape::kernels
