// Argument checks shared by the CPU and CUDA kernels, so a bad call throws the same
// std::invalid_argument, with the same message, on either device (before any launch). The
// kernels that check more than one size have their whole check here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>

#include "kernels/kernel_types.hpp"

namespace scape::kernels::checks {

// Two dense buffers of one elementwise kernel.
inline void require_same(std::size_t a, std::size_t b, const char* what) {
  if (a != b) {
    throw std::invalid_argument(std::string(what) + ": buffer sizes differ (" + std::to_string(a) + " vs " +
                                std::to_string(b) + ")");
  }
}

// An index list and the compacted values it gathers or scatters.
inline void require_compacted(std::size_t indices, std::size_t values, const char* what) {
  if (indices != values) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(indices) + " indices but " +
                                std::to_string(values) + " compacted values");
  }
}

// A buffer that must hold exactly `want` entries.
inline void require_size(std::size_t got, std::size_t want, const char* what) {
  if (got != want) {
    throw std::invalid_argument(std::string(what) + ": buffer holds " + std::to_string(got) + " entries, expected " +
                                std::to_string(want));
  }
}

// A bitmask of `have` 64-bit words that must cover `bits` bits.
inline void require_words(std::size_t have, std::size_t bits, const char* what) {
  const std::size_t need = words_for(bits);
  if (have != need) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(have) + " words given, " +
                                std::to_string(bits) + " bits need " + std::to_string(need));
  }
}

// Two bitmasks combined word by word.
inline void require_same_words(std::size_t a, std::size_t b, const char* what) {
  if (a != b) {
    throw std::invalid_argument(std::string(what) + ": masks differ in length (" + std::to_string(a) + " vs " +
                                std::to_string(b) + " words)");
  }
}

// ---- Whole checks of single kernels (sizes of their spans, in parameter order).

inline void adamw_step_sizes(std::size_t theta, std::size_t m, std::size_t v, std::size_t g) {
  require_same(theta, m, "adamw_step: theta/m");
  require_same(theta, v, "adamw_step: theta/v");
  require_same(theta, g, "adamw_step: theta/g");
}

inline void adams_step_sizes(std::size_t theta, std::size_t m, std::size_t g) {
  require_same(theta, m, "adams_step: theta/m");
  require_same(theta, g, "adams_step: theta/g");
}

inline void adamw_step_masked_sizes(std::size_t theta, std::size_t m, std::size_t v, std::size_t idx,
                                    std::size_t m_new, std::size_t g_bar) {
  require_same(theta, m, "adamw_step_masked: theta/m");
  require_same(theta, v, "adamw_step_masked: theta/v");
  require_same(idx, m_new, "adamw_step_masked: idx/m_new");
  require_same(idx, g_bar, "adamw_step_masked: idx/g_bar");
}

inline void adams_step_masked_sizes(std::size_t theta, std::size_t m, std::size_t idx, std::size_t m_new,
                                    std::size_t g_bar) {
  require_same(theta, m, "adams_step_masked: theta/m");
  require_same(idx, m_new, "adams_step_masked: idx/m_new");
  require_same(idx, g_bar, "adams_step_masked: idx/g_bar");
}

// k <= n, a mask of words_for(n) words, and n within the 32-bit histogram counters.
inline void topk_abs_mask_sizes(std::size_t n, std::size_t k, std::size_t mask_words) {
  if (k > n) {
    throw std::invalid_argument("topk_abs_mask: k = " + std::to_string(k) + " exceeds n = " + std::to_string(n));
  }
  if (mask_words != words_for(n)) {
    throw std::invalid_argument("topk_abs_mask: mask has " + std::to_string(mask_words) + " words, n = " +
                                std::to_string(n) + " needs " + std::to_string(words_for(n)));
  }
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    throw std::invalid_argument("topk_abs_mask: n = " + std::to_string(n) + " exceeds 2^32 - 1");
  }
}

inline void topk_abs_indices_sizes(std::size_t k, std::size_t out) {
  if (out < k) {
    throw std::invalid_argument("topk_abs_indices: out holds " + std::to_string(out) + " entries, k = " +
                                std::to_string(k));
  }
}

inline void first_moment_statistic_sizes(std::size_t m, std::size_t a, std::size_t out) {
  require_size(m, out, "first_moment_statistic: m");
  require_size(a, out, "first_moment_statistic: a");
}

inline void carried_first_moment_statistic_sizes(std::size_t m, std::size_t a, std::size_t q, std::size_t out) {
  require_size(m, out, "carried_first_moment_statistic: m");
  require_size(a, out, "carried_first_moment_statistic: a");
  require_size(q, out, "carried_first_moment_statistic: q");
}

// Sign compression: a chunk > 0, ceil(n / chunk) scales, words_for(n) words.
inline void sign_chunk_sizes(std::size_t n, std::size_t chunk, std::size_t scales, std::size_t words,
                             const char* what) {
  if (chunk == 0) throw std::invalid_argument(std::string(what) + ": chunk must be > 0");
  require_size(scales, (n + chunk - 1) / chunk, what);
  require_words(words, n, what);
}

inline void pack_payload_sizes(std::size_t idx, std::size_t b, std::size_t a_out) {
  require_size(b, idx, "pack_payload: b");
  if (a_out != 0) require_size(a_out, idx, "pack_payload: a_out");
}

inline void quantize_e5m2_sizes(std::size_t v, std::size_t q, std::size_t error) {
  require_size(q, v, "quantize_e5m2: q");
  require_size(error, v, "quantize_e5m2: error");
}

inline void candidate_momentum_sizes(std::size_t e, std::size_t m, std::size_t g) {
  if (m == 0 && g == 0 && e != 0) throw std::invalid_argument("candidate_momentum: m and g are both empty");
  if (m != 0) require_size(m, e, "candidate_momentum: m");
  if (g != 0) require_size(g, e, "candidate_momentum: g");
}

// A mask read from bit first_bit for n elements: its words must reach bit first_bit + n - 1.
inline void require_mask_bits(std::size_t mask_words, std::size_t first_bit, std::size_t n, const char* what) {
  if (n != 0 && mask_words < words_for(first_bit + n)) {
    throw std::invalid_argument(std::string(what) + ": the mask has " + std::to_string(mask_words) +
                                " words, bits up to " + std::to_string(first_bit + n) + " need " +
                                std::to_string(words_for(first_bit + n)));
  }
}

inline void carry_momentum_off_mask_sizes(std::size_t q, std::size_t m, std::size_t mask_words, std::size_t first_bit) {
  require_size(m, q, "carry_momentum_off_mask: m");
  require_mask_bits(mask_words, first_bit, q, "carry_momentum_off_mask");
}

inline void candidate_statistic_carry_sizes(std::size_t e, std::size_t g, std::size_t q, std::size_t m,
                                            std::size_t mask_words, std::size_t first_bit, std::size_t out) {
  require_size(g, e, "candidate_statistic_carry: g");
  require_size(q, e, "candidate_statistic_carry: q");
  require_size(m, e, "candidate_statistic_carry: m");
  require_size(out, e, "candidate_statistic_carry: out");
  require_mask_bits(mask_words, first_bit, e, "candidate_statistic_carry");
}

inline void momentum_from_gradient_sizes(std::size_t idx, std::size_t g_bar, std::size_t out) {
  require_size(g_bar, idx, "momentum_from_gradient: g_bar");
  require_size(out, idx, "momentum_from_gradient: out");
}

inline void reconstruct_gradient_sizes(std::size_t b_bar, std::size_t idx, std::size_t g_bar) {
  require_size(b_bar, idx, "reconstruct_gradient: b_bar");
  require_size(g_bar, idx, "reconstruct_gradient: g_bar");
}

inline void owner_payload_gradient_sizes(std::size_t b_bar, std::size_t m, std::size_t q, std::size_t idx,
                                         std::size_t g_bar) {
  require_size(b_bar, idx, "owner_payload_gradient: b_bar");
  require_size(g_bar, idx, "owner_payload_gradient: g_bar");
  if (q != 0) require_size(q, m, "owner_payload_gradient: q");
}

inline void block_sum_squares_sizes(std::size_t n, std::size_t block, std::size_t partial) {
  if (block == 0) throw std::invalid_argument("block_sum_squares: block must be > 0");
  require_size(partial, (n + block - 1) / block, "block_sum_squares: partial");
}

inline void block_sum_squares_max_sizes(std::size_t n, std::size_t block, std::size_t partial, std::size_t peak) {
  if (block == 0) throw std::invalid_argument("block_sum_squares_max: block must be > 0");
  require_size(partial, (n + block - 1) / block, "block_sum_squares_max: partial");
  require_size(peak, partial, "block_sum_squares_max: peak");
}

inline void mask_range_counts_sizes(std::size_t mask_words, std::size_t previous_words, std::size_t ranges,
                                    std::size_t counts, const std::uint64_t* range_data) {
  if (previous_words != 0) require_size(previous_words, mask_words, "mask_range_counts: previous");
  if (ranges % 2 != 0) throw std::invalid_argument("mask_range_counts: ranges must hold (begin, end) pairs");
  require_size(counts, 3 * (ranges / 2), "mask_range_counts: counts");
  for (std::size_t r = 0; range_data != nullptr && r < ranges; r += 2) {
    if (range_data[r] > range_data[r + 1] || range_data[r + 1] > 64 * mask_words) {
      throw std::invalid_argument("mask_range_counts: range [" + std::to_string(range_data[r]) + ", " +
                                  std::to_string(range_data[r + 1]) + ") outside the " +
                                  std::to_string(64 * mask_words) + " bits of the mask");
    }
  }
}

inline void update_statistics_sizes(std::size_t n, std::size_t before, std::size_t stepped_words, std::size_t sign,
                                    std::size_t block, std::size_t stats) {
  if (block == 0) throw std::invalid_argument("update_statistics: block must be > 0");
  require_size(before, n, "update_statistics: before");
  require_size(sign, n, "update_statistics: sign");
  if (stepped_words != 0 && stepped_words < words_for(n)) {
    throw std::invalid_argument("update_statistics: the stepped mask has " + std::to_string(stepped_words) +
                                " words, N = " + std::to_string(n) + " needs " + std::to_string(words_for(n)));
  }
  require_size(stats, 5 * ((n + block - 1) / block), "update_statistics: stats");
}

// keep_and_decay_at and decay_update_statistics: a factor per piece, a kept value per stepped
// coordinate, and at least one piece when there is a coordinate to decay.
inline void decay_pieces_sizes(const std::string& kernel, std::size_t n, std::size_t ends, std::size_t factors,
                               std::size_t stepped, std::size_t kept) {
  require_size(factors, ends, (kernel + ": piece_factors").c_str());
  require_size(kept, stepped, (kernel + ": kept").c_str());
  if (n > 0 && ends == 0) throw std::invalid_argument(kernel + ": no pieces for " + std::to_string(n) + " coordinates");
}

inline void decay_update_statistics_sizes(std::size_t n, std::size_t ends, std::size_t factors, std::size_t stepped,
                                          std::size_t kept, std::size_t sign, std::size_t block, std::size_t stats) {
  decay_pieces_sizes("decay_update_statistics", n, ends, factors, stepped, kept);
  if (block == 0) throw std::invalid_argument("decay_update_statistics: block must be > 0");
  if (sign != 0) require_size(sign, n, "decay_update_statistics: sign");
  require_size(stats, 5 * ((n + block - 1) / block), "decay_update_statistics: stats");
}

// The values the CPU checks (kernels/kernel_list.inc: on CUDA they are assumed): the pieces end
// at or past n, and the stepped coordinates ascend below n.
inline void decay_pieces_values(const std::string& kernel, std::size_t n, std::span<const std::uint64_t> ends,
                                std::span<const std::uint32_t> stepped) {
  if (!ends.empty() && ends.back() < n) {
    throw std::invalid_argument(kernel + ": the pieces end at " + std::to_string(ends.back()) +
                                ", before N = " + std::to_string(n));
  }
  for (std::size_t k = 0; k < stepped.size(); ++k) {
    if (stepped[k] >= n || (k > 0 && stepped[k] <= stepped[k - 1])) {
      throw std::invalid_argument(kernel + ": stepped[" + std::to_string(k) + "] = " + std::to_string(stepped[k]) +
                                  " is not ascending below N = " + std::to_string(n));
    }
  }
}

// ---- Low-rank and chunked-DCT compression (kernels/kernel_list.inc).

// M rows x cols, and a factor of `factor_rows` rows whose size fixes the rank; the other
// factor must be (other_rows x rank).
inline std::size_t lowrank_sizes(std::size_t m, std::size_t rows, std::size_t cols, std::size_t factor,
                                 std::size_t factor_rows, std::size_t other, std::size_t other_rows,
                                 const char* what) {
  if (rows == 0 || cols == 0) throw std::invalid_argument(std::string(what) + ": rows and cols must be > 0");
  require_size(m, rows * cols, what);
  if (factor % factor_rows != 0) {
    throw std::invalid_argument(std::string(what) + ": factor of " + std::to_string(factor) +
                                " entries is not a multiple of " + std::to_string(factor_rows) + " rows");
  }
  const std::size_t rank = factor / factor_rows;
  require_size(other, other_rows * rank, what);
  return rank;
}

inline void orthonormalize_sizes(std::size_t p, std::size_t rows) {
  if (rows == 0 || p % rows != 0) {
    throw std::invalid_argument("orthonormalize_columns: " + std::to_string(p) + " entries are not rows (" +
                                std::to_string(rows) + ") x rank");
  }
}

inline void chunk_transform_sizes(std::size_t x, std::size_t chunk, std::size_t basis, std::size_t out) {
  if (chunk == 0 || x % chunk != 0) {
    throw std::invalid_argument("chunk_transform: " + std::to_string(x) + " values are not whole chunks of " +
                                std::to_string(chunk));
  }
  require_size(basis, chunk * chunk, "chunk_transform: basis");
  require_size(out, x, "chunk_transform: out");
}

inline void chunk_topk_sizes(std::size_t n, std::size_t chunk, std::size_t k, std::size_t idx, std::size_t values) {
  if (chunk == 0 || k == 0) throw std::invalid_argument("chunk_topk: chunk and k must be > 0");
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    throw std::invalid_argument("chunk_topk: n = " + std::to_string(n) + " exceeds 2^32 - 1");
  }
  require_size(idx, chunk_topk_count(n, chunk, k), "chunk_topk: idx");
  require_size(values, chunk_topk_count(n, chunk, k), "chunk_topk: values");
}

// ---- Mask coding (kernels/kernel_list.inc, "Elias-Fano coding").

inline void and_not_bits_sizes(std::size_t a, std::size_t b, std::size_t out) {
  require_same_words(a, b, "and_not_bits: a/b");
  require_same_words(a, out, "and_not_bits: a/out");
}

inline void or_bits_sizes(std::size_t src, std::size_t dst) { require_same_words(src, dst, "or_bits: src/dst"); }

// `packed` is the packed side (out of extract_bits, the input of deposit_bits) and must hold
// one bit per set bit of positions.
inline void packed_bits_sizes(std::size_t dense, std::size_t positions, std::size_t packed, std::size_t set_bits,
                              const char* what) {
  require_same_words(dense, positions, what);
  require_words(packed, set_bits, what);
}

inline void ef_sizes(std::size_t words, std::size_t n_bits, std::size_t k, std::size_t code, const char* what) {
  if (k > n_bits) {
    throw std::invalid_argument(std::string(what) + ": k = " + std::to_string(k) + " exceeds n = " +
                                std::to_string(n_bits));
  }
  require_words(words, n_bits, what);
  require_size(code, ef_words(n_bits, k), what);
}

// ef_decode_indices: the code of k positions among n_bits, written as k uint32 indices.
inline void ef_indices_sizes(std::size_t indices, std::size_t n_bits, std::size_t k, std::size_t code,
                             const char* what) {
  if (n_bits > (std::size_t{1} << 32)) {
    throw std::invalid_argument(std::string(what) + ": n = " + std::to_string(n_bits) +
                                " positions do not fit uint32 indices");
  }
  ef_sizes(words_for(n_bits), n_bits, k, code, what);
  require_size(indices, k, what);
}

}  // namespace scape::kernels::checks
