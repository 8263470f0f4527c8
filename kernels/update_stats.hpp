// One block of the update_statistics kernel (kernels/kernel_list.inc), written once for both
// devices (kernels/cpu/reduce.cpp, kernels/cuda/reduce.cu): one thread walks its block in a fixed
// order, so the double sums, the maximum and the counts are bit-identical on the CPU and the GPU
// (with the CUDA library's --fmad=false).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/sum_squares.hpp"

#ifdef __CUDACC__
#define SCAPE_UPDATE_STATS_HOST_DEVICE __host__ __device__
#else
#define SCAPE_UPDATE_STATS_HOST_DEVICE
#endif

namespace scape::kernels {

// Values per block in update_statistics' output: sum d^2, sum theta^2, max |d|, both, flipped.
constexpr std::size_t kUpdateStats = 5;

// The sign flips of coordinates [lo, hi), which lie inside one word of `stepped` (every
// coordinate is stepped when it is null): adds to both and flipped, writes the new signs.
SCAPE_UPDATE_STATS_HOST_DEVICE inline void count_sign_flips(const float* theta, const float* before,
                                                            const std::uint64_t* stepped, int previous,
                                                            std::int8_t* sign, std::size_t lo, std::size_t hi,
                                                            std::size_t& both, std::size_t& flipped) {
  const std::uint64_t word = stepped == nullptr ? ~std::uint64_t{0} : stepped[lo / 64];
  // 32-bit counts within a word: the vectorized loop adds dwords instead of widening to qwords.
  unsigned word_both = 0, word_flipped = 0;
  for (std::size_t j = lo; j < hi; ++j) {
    const float d = theta[j] - before[j];
    const int s = ((d > 0) - (d < 0)) * static_cast<int>((word >> (j % 64)) & 1u);
    const int p = sign[j];
    const int counted = previous & (s != 0) & (p != 0);
    word_both += static_cast<unsigned>(counted);
    word_flipped += static_cast<unsigned>(counted & (s != p));
    sign[j] = static_cast<std::int8_t>(s);
  }
  both += word_both;
  flipped += word_flipped;
}

// out[0..4] of one block: the two sums, max |d| from its bit pattern, and the two counts.
SCAPE_UPDATE_STATS_HOST_DEVICE inline void write_block_statistics(double diff_sum, double theta_sum,
                                                                  std::uint32_t max_bits, std::size_t both,
                                                                  std::size_t flipped, double* out) {
  out[0] = diff_sum;
  out[1] = theta_sum;
  float max = 0;
  std::memcpy(&max, &max_bits, sizeof max);
  out[2] = static_cast<double>(max);
  out[3] = static_cast<double>(both);
  out[4] = static_cast<double>(flipped);
}

// Coordinates [lo, hi): out[0..4] as the kernel's contract states; sign[j] = the new sign. The
// two double sums are in the lane order of kernels/sum_squares.hpp. The block is read from
// memory once, 64 coordinates at a time: each piece goes through three loops (the sums, the
// maximum, the signs) while it is in L1. One loop doing all three did not vectorize; three
// passes over the whole block waited on memory in the first and re-read L2 in the others. The
// pieces start at lo + 64 i, so the lanes receive the same terms in the same order as
// lane_order_sum gives them, and the sums are the same bit for bit.
SCAPE_UPDATE_STATS_HOST_DEVICE inline void update_statistics_block(const float* theta, const float* before,
                                                                   const std::uint64_t* stepped, bool have_previous,
                                                                   std::int8_t* sign, std::size_t lo, std::size_t hi,
                                                                   double* out) {
  constexpr std::size_t kPiece = 64;
  double diff_lane[kSumSquaresLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  double theta_lane[kSumSquaresLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::uint32_t max_bits = 0;
  std::size_t both = 0, flipped = 0;
  const int previous = have_previous ? 1 : 0;
  const std::size_t grouped_end = lo + (hi - lo) / kSumSquaresLanes * kSumSquaresLanes;
  for (std::size_t begin = lo; begin < hi; begin += kPiece) {
    const std::size_t end = begin + kPiece < hi ? begin + kPiece : hi;
    const std::size_t groups_end = end < grouped_end ? end : grouped_end;
    const std::size_t groups = (groups_end - begin) / kSumSquaresLanes;
    add_lane_groups(diff_lane, begin, groups, [theta, before](std::size_t j) {
      const float d = theta[j] - before[j];
      return static_cast<double>(d) * static_cast<double>(d);
    });
    add_lane_groups(theta_lane, begin, groups,
                    [theta](std::size_t j) { return static_cast<double>(theta[j]) * static_cast<double>(theta[j]); });
    // max |d| on the bit patterns with the sign cleared: for non-NaN floats their unsigned order
    // is the order of |d|, and every NaN lies above +inf, so the maximum is NaN when a d is NaN.
    for (std::size_t j = begin; j < end; ++j) {
      const float d = theta[j] - before[j];
      std::uint32_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      bits &= 0x7fffffffu;
      max_bits = bits > max_bits ? bits : max_bits;
    }
    // The piece spans two words of `stepped` when lo is not a multiple of 64.
    const std::size_t word_end = (begin / 64 + 1) * 64 < end ? (begin / 64 + 1) * 64 : end;
    count_sign_flips(theta, before, stepped, previous, sign, begin, word_end, both, flipped);
    if (word_end < end) count_sign_flips(theta, before, stepped, previous, sign, word_end, end, both, flipped);
  }
  // The lanes in lane order, then the last (hi - lo) mod 8 coordinates in index order.
  double diff_sum = 0, theta_sum = 0;
  for (std::size_t l = 0; l < kSumSquaresLanes; ++l) diff_sum += diff_lane[l];
  for (std::size_t l = 0; l < kSumSquaresLanes; ++l) theta_sum += theta_lane[l];
  for (std::size_t j = grouped_end; j < hi; ++j) {
    const float d = theta[j] - before[j];
    diff_sum += static_cast<double>(d) * static_cast<double>(d);
    theta_sum += static_cast<double>(theta[j]) * static_cast<double>(theta[j]);
  }
  write_block_statistics(diff_sum, theta_sum, max_bits, both, flipped, out);
}

// ---- The fused form (decay_update_statistics, kernels/kernel_list.inc) --------------------------

// The piece holding coordinate j: the first p with piece_ends[p] > j (the last piece when none
// is, so a short table on the GPU reads no further).
SCAPE_UPDATE_STATS_HOST_DEVICE inline std::size_t piece_of(const std::uint64_t* piece_ends, std::size_t pieces,
                                                           std::size_t j) {
  std::size_t lo = 0, hi = pieces - 1;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (piece_ends[mid] > j) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The first k with stepped[k] >= j (count when none).
SCAPE_UPDATE_STATS_HOST_DEVICE inline std::size_t first_stepped_from(const std::uint32_t* stepped, std::size_t count,
                                                                     std::size_t j) {
  std::size_t lo = 0, hi = count;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (stepped[mid] < j) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// keep_and_decay_at for entry k.
SCAPE_UPDATE_STATS_HOST_DEVICE inline void keep_and_decay_one(float* theta, const std::uint32_t* stepped,
                                                              const std::uint64_t* piece_ends,
                                                              const float* piece_factors, std::size_t pieces,
                                                              float* kept, std::size_t k) {
  const float before = theta[stepped[k]];
  kept[k] = before;
  theta[stepped[k]] = before * piece_factors[piece_of(piece_ends, pieces, stepped[k])];
}

// Pieces of 64 coordinates, as in update_statistics_block: each piece's theta after and before
// are built in local arrays (decayed, or the stepped value and its kept one), written back, and
// then go through the same three loops in the same order, so the sums are update_statistics'
// bit for bit. The last (hi - lo) mod 8 terms of the two sums wait in index order for the lanes.
SCAPE_UPDATE_STATS_HOST_DEVICE inline void decay_update_statistics_block(float* theta, const std::uint64_t* piece_ends,
                                                                         const float* piece_factors, std::size_t pieces,
                                                                         const std::uint32_t* stepped,
                                                                         const float* kept, std::size_t stepped_count,
                                                                         bool have_previous, std::int8_t* sign,
                                                                         std::size_t lo, std::size_t hi, double* out) {
  constexpr std::size_t kPiece = 64;
  double diff_lane[kSumSquaresLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  double theta_lane[kSumSquaresLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  double diff_tail[kSumSquaresLanes], theta_tail[kSumSquaresLanes];
  std::size_t tail = 0;
  std::uint32_t max_bits = 0;
  std::size_t both = 0, flipped = 0;
  const int previous = have_previous ? 1 : 0;
  const std::size_t grouped_end = lo + (hi - lo) / kSumSquaresLanes * kSumSquaresLanes;
  std::size_t p = piece_of(piece_ends, pieces, lo);
  std::size_t s = first_stepped_from(stepped, stepped_count, lo);
  float after[kPiece], before[kPiece];
  int on[kPiece];
  for (std::size_t begin = lo; begin < hi; begin += kPiece) {
    const std::size_t len = (begin + kPiece < hi ? begin + kPiece : hi) - begin;
    for (std::size_t i = 0; i < len;) {
      while (p + 1 < pieces && piece_ends[p] <= begin + i) ++p;
      const std::size_t piece_end = piece_ends[p] > begin + i ? piece_ends[p] - begin : len;
      const std::size_t stop = piece_end < len ? piece_end : len;
      const float factor = piece_factors[p];
      for (; i < stop; ++i) {
        before[i] = theta[begin + i];
        after[i] = before[i] * factor;
        on[i] = 0;
      }
    }
    for (; s < stepped_count && stepped[s] < begin + len; ++s) {
      const std::size_t i = stepped[s] - begin;
      after[i] = theta[stepped[s]];
      before[i] = kept[s];
      on[i] = 1;
    }
    for (std::size_t i = 0; i < len; ++i) theta[begin + i] = after[i];

    const std::size_t grouped = (begin + len < grouped_end ? begin + len : grouped_end);
    const std::size_t groups = grouped > begin ? (grouped - begin) / kSumSquaresLanes : 0;
    add_lane_groups(diff_lane, 0, groups, [&after, &before](std::size_t i) {
      const float d = after[i] - before[i];
      return static_cast<double>(d) * static_cast<double>(d);
    });
    add_lane_groups(theta_lane, 0, groups,
                    [&after](std::size_t i) { return static_cast<double>(after[i]) * static_cast<double>(after[i]); });
    for (std::size_t i = groups * kSumSquaresLanes; i < len; ++i) {
      const float d = after[i] - before[i];
      diff_tail[tail] = static_cast<double>(d) * static_cast<double>(d);
      theta_tail[tail] = static_cast<double>(after[i]) * static_cast<double>(after[i]);
      ++tail;
    }
    for (std::size_t i = 0; i < len; ++i) {
      const float d = after[i] - before[i];
      std::uint32_t bits = 0;
      std::memcpy(&bits, &d, sizeof bits);
      bits &= 0x7fffffffu;
      max_bits = bits > max_bits ? bits : max_bits;
    }
    if (sign == nullptr) continue;  // a worker that measures only ||theta||
    unsigned piece_both = 0, piece_flipped = 0;
    for (std::size_t i = 0; i < len; ++i) {
      const float d = after[i] - before[i];
      const int sg = ((d > 0) - (d < 0)) * on[i];
      const int was = sign[begin + i];
      const int counted = previous & (sg != 0) & (was != 0);
      piece_both += static_cast<unsigned>(counted);
      piece_flipped += static_cast<unsigned>(counted & (sg != was));
      sign[begin + i] = static_cast<std::int8_t>(sg);
    }
    both += piece_both;
    flipped += piece_flipped;
  }
  double diff_sum = 0, theta_sum = 0;
  for (std::size_t l = 0; l < kSumSquaresLanes; ++l) diff_sum += diff_lane[l];
  for (std::size_t l = 0; l < kSumSquaresLanes; ++l) theta_sum += theta_lane[l];
  for (std::size_t t = 0; t < tail; ++t) {
    diff_sum += diff_tail[t];
    theta_sum += theta_tail[t];
  }
  write_block_statistics(diff_sum, theta_sum, max_bits, both, flipped, out);
}

}  // namespace scape::kernels
