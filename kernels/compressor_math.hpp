// The per-element arithmetic of the PowerSGD and DeMo kernels (kernels/kernel_list.inc,
// "Low-rank and chunked-DCT compression"), written once for both devices (kernels/cpu/
// compressors.cpp and kernels/cuda/compressors.cu), so the two add the same terms in the same
// order: every sum runs in double, in index order, and is rounded to float once.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define SCAPE_COMPRESSOR_HOST_DEVICE __host__ __device__
#else
#define SCAPE_COMPRESSOR_HOST_DEVICE
#endif

namespace scape::kernels::compressor {

// (A B)[i, c] for A rows x inner and B inner x cols, both row-major.
SCAPE_COMPRESSOR_HOST_DEVICE inline float product_entry(const float* a, const float* b, std::size_t inner,
                                                        std::size_t cols, std::size_t i, std::size_t c) {
  double sum = 0.0;
  for (std::size_t j = 0; j < inner; ++j) sum += static_cast<double>(a[i * inner + j]) * b[j * cols + c];
  return static_cast<float>(sum);
}

// (A^T B)[j, c] for A rows x cols_a and B rows x cols, both row-major.
SCAPE_COMPRESSOR_HOST_DEVICE inline float transposed_product_entry(const float* a, const float* b, std::size_t rows,
                                                                   std::size_t cols_a, std::size_t cols,
                                                                   std::size_t j, std::size_t c) {
  double sum = 0.0;
  for (std::size_t i = 0; i < rows; ++i) sum += static_cast<double>(a[i * cols_a + j]) * b[i * cols + c];
  return static_cast<float>(sum);
}

// (P Q^T)[i, j] for P rows x rank and Q cols x rank, row-major.
SCAPE_COMPRESSOR_HOST_DEVICE inline float outer_entry(const float* p, const float* q, std::size_t rank,
                                                      std::size_t i, std::size_t j) {
  double sum = 0.0;
  for (std::size_t c = 0; c < rank; ++c) sum += static_cast<double>(p[i * rank + c]) * q[j * rank + c];
  return static_cast<float>(sum);
}

// Modified Gram-Schmidt on the columns of P (rows x rank, row-major), in column order: each
// column loses its projections on the earlier (already unit) columns, twice (the warm start
// makes P's columns nearly parallel, and one pass in fp32 storage leaves them orthogonal only
// to cond(P) times the rounding; the second pass restores it), then is divided by its norm; a
// column whose norm is 0 is left zero (a rank-deficient P delivers fewer directions).
SCAPE_COMPRESSOR_HOST_DEVICE inline void orthonormalize(float* p, std::size_t rows, std::size_t rank) {
  for (std::size_t c = 0; c < rank; ++c) {
    for (std::size_t pass = 0; pass < 2 * c; ++pass) {
      const std::size_t d = pass % c;
      double dot = 0.0;
      for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(p[i * rank + c]) * p[i * rank + d];
      for (std::size_t i = 0; i < rows; ++i) {
        p[i * rank + c] = static_cast<float>(p[i * rank + c] - dot * p[i * rank + d]);
      }
    }
    double sq = 0.0;
    for (std::size_t i = 0; i < rows; ++i) sq += static_cast<double>(p[i * rank + c]) * p[i * rank + c];
    const double norm = sqrt(sq);
    for (std::size_t i = 0; i < rows; ++i) {
      p[i * rank + c] = norm > 0.0 ? static_cast<float>(p[i * rank + c] / norm) : 0.0f;
    }
  }
}

// Entry f of the basis transform of one chunk x[0, len): sum_j basis[f len + j] x[j], or with
// `transpose` sum_j basis[j len + f] x[j].
SCAPE_COMPRESSOR_HOST_DEVICE inline float transform_entry(const float* x, const float* basis, std::size_t len,
                                                          bool transpose, std::size_t f) {
  double sum = 0.0;
  for (std::size_t j = 0; j < len; ++j) {
    const float b = transpose ? basis[j * len + f] : basis[f * len + j];
    sum += static_cast<double>(b) * x[j];
  }
  return static_cast<float>(sum);
}

// |x| as an unsigned key: the bit pattern with the sign cleared orders magnitudes (+0 == -0,
// NaN above +inf), a total order, so a top-k by it always selects exactly k entries.
SCAPE_COMPRESSOR_HOST_DEVICE inline std::uint32_t magnitude_bits(float x) {
  std::uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return bits & 0x7fffffffu;
}

// Whether entry a (magnitude key ka) ranks above entry b: larger magnitude, ties to the lower
// index. A strict total order.
SCAPE_COMPRESSOR_HOST_DEVICE inline bool ranks_above(std::uint32_t ka, std::size_t a, std::uint32_t kb, std::size_t b) {
  return ka > kb || (ka == kb && a < b);
}

// The top-k of one chunk y[0, len) by magnitude, ties to the lower index: the positions
// ascending into idx (offset by `base`) and their values into values; k <= len. k passes,
// each taking the highest-ranked entry below the previous pick: O(k len), no scratch.
SCAPE_COMPRESSOR_HOST_DEVICE inline void chunk_topk(const float* y, std::size_t len, std::size_t k, std::uint32_t base,
                                                    std::uint32_t* idx, float* values) {
  std::size_t prev = 0;
  std::uint32_t prev_key = 0;
  for (std::size_t s = 0; s < k; ++s) {
    std::size_t best = len;
    std::uint32_t best_key = 0;
    for (std::size_t i = 0; i < len; ++i) {
      const std::uint32_t key = magnitude_bits(y[i]);
      if (s > 0 && !ranks_above(prev_key, prev, key, i)) continue;
      if (best == len || ranks_above(key, i, best_key, best)) {
        best = i;
        best_key = key;
      }
    }
    prev = best;
    prev_key = best_key;
    // Insertion into the ascending list of picks so far.
    std::size_t at = s;
    while (at > 0 && idx[at - 1] > base + best) {
      idx[at] = idx[at - 1];
      --at;
    }
    idx[at] = base + static_cast<std::uint32_t>(best);
  }
  for (std::size_t s = 0; s < k; ++s) values[s] = y[idx[s] - base];
}

// theta - lr sign(u): sign(+-0) = 0 leaves theta as it is; NaN in u gives NaN.
SCAPE_COMPRESSOR_HOST_DEVICE inline float sign_descent(float theta, float u, float lr) {
  if (u > 0.0f) return theta - lr;
  if (u < 0.0f) return theta + lr;
  return u == u ? theta : u;
}

}  // namespace scape::kernels::compressor
