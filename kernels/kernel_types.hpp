// What the kernel signatures of kernels/kernel_list.inc share besides spans: the Adam step
// scalars (rounded from double once, on the host, by the same code for the CPU and CUDA
// kernels) and the bitmask layout (bit j of word j / 64 is element j). Plain C++.
#pragma once

#include <cmath>
#include <cstddef>

namespace scape::kernels {

// Words of a bitmask over n elements.
constexpr std::size_t words_for(std::size_t n) { return (n + 63) / 64; }

// Elias-Fano code of k ascending positions p_0 < ... < p_{k-1} among n (docs/algorithms.md,
// "Mask coding"): one bit stream of 64-bit words. Position i keeps its L = ef_low_bits(n, k)
// low bits at stream bits [i L, (i + 1) L); its high part p_i >> L is unary: stream bit
// k L + (p_i >> L) + i is set. The size depends only on (n, k), so every rank knows the size of
// every other rank's message.
// L = floor(log2(n / k)), the largest L with k 2^L <= n; 0 when k = 0 or k >= n.
constexpr unsigned ef_low_bits(std::size_t n, std::size_t k) {
  unsigned low = 0;
  if (k == 0) return 0;
  while ((n >> (low + 1)) >= k) ++low;
  return low;
}
// k L low bits plus k + floor((n - 1) / 2^L) high bits (the highest set high bit is
// ((n - 1) >> L) + k - 1); nothing for k = 0.
constexpr std::size_t ef_bits(std::size_t n, std::size_t k) {
  if (k == 0) return 0;
  const unsigned low = ef_low_bits(n, k);
  return k * low + k + ((n - 1) >> low);
}
constexpr std::size_t ef_words(std::size_t n, std::size_t k) { return words_for(ef_bits(n, k)); }

// Entries DeMo's per-chunk top-k keeps of n values in chunks of `chunk` (the last may be
// short): min(k, length) per chunk.
constexpr std::size_t chunk_topk_count(std::size_t n, std::size_t chunk, std::size_t k) {
  const std::size_t full = n / chunk, tail = n % chunk;
  return full * (k < chunk ? k : chunk) + (k < tail ? k : tail);
}

// Scalars of one step, in double. Kernels derive 1 - beta in double and round every scalar
// to fp32 once: computing 1 - beta2 from an fp32 beta2 = 0.999 would be off by 1.3e-5.
struct AdamScalars {
  double lr = 0.0;     // eta_t
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double decay = 1.0;  // theta multiplier (1 - eta*lambda) for decayed tensors, 1 otherwise
  double bc1 = 1.0;    // c1 = 1 - beta1^t with bias correction, 1 without
  double bc2 = 1.0;    // c2 = 1 - beta2^t with bias correction, 1 without
  // AdamS's bias corrections on v and m, as the artifact's AdamS.py: d = sqrt(v) / sqrt(c2) + eps
  // with v = b2 m_prev^2 + (1-b2) g^2. False: on m_prev inside the root (the earlier form).
  bool adams_artifact_form = false;
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
        inv_bc1(static_cast<float>(1.0 / s.bc1)),
        adams_artifact_form(s.adams_artifact_form) {}
  float lr, beta1, beta2, eps, decay, one_minus_b1, one_minus_b2;
  float step_size;     // lr / c1 (AdamW)
  float inv_sqrt_bc2;  // 1 / sqrt(c2) (AdamW, AdamS in the artifact's form)
  float inv_bc1;       // 1 / c1 (AdamS)
  bool adams_artifact_form;
};

// The element type of the model ops (kernels/model_kernel_list.inc) on the backends.
using ModelReal = float;

// Causal self-attention over B sequences of T tokens: H query heads of hs columns and Hkv
// key/value heads (H a multiple of Hkv; Hkv == H is plain multi-head attention).
struct AttentionShape {
  int B = 1, T = 1, H = 1, Hkv = 1, hs = 1;
  int qkv_width() const { return (H + 2 * Hkv) * hs; }  // columns of the packed qkv rows
  int y_width() const { return H * hs; }
};

}  // namespace scape::kernels
