// Deterministic block reductions on the GPU (kernels/kernel_list.inc, "Reductions"): one thread per block of
// the CPU's blocking sums its block in the order of kernels/sum_squares.hpp, in double, so every
// partial sum is bit-identical to the CPU's (--fmad=false keeps x*x and the add separately rounded). The
// maximum is exact in any order; NaN is carried as a flag.
#include <cstring>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/size_checks.hpp"
#include "kernels/sum_squares.hpp"
#include "kernels/update_stats.hpp"

namespace scape::kernels::cuda {
namespace {

__global__ void block_sum_squares_kernel(const float* __restrict__ x, std::size_t n, std::size_t block,
                                         double* __restrict__ partial, std::size_t blocks) {
  for (std::size_t b = global_thread(); b < blocks; b += grid_threads()) {
    const std::size_t lo = b * block;
    partial[b] = block_sum_of_squares(x, lo, lo + block < n ? lo + block : n);
  }
}

__global__ void block_sum_squares_max_kernel(const float* __restrict__ x, std::size_t n, std::size_t block,
                                             double* __restrict__ partial, float* __restrict__ peak,
                                             std::size_t blocks) {
  for (std::size_t b = global_thread(); b < blocks; b += grid_threads()) {
    const std::size_t lo = b * block, hi = lo + block < n ? lo + block : n;
    partial[b] = block_sum_of_squares(x, lo, hi);
    peak[b] = block_max_magnitude(x, lo, hi);
  }
}

// Non-negative floats order like their bit patterns, so the maximum magnitude is an unsigned
// atomicMax over |x|'s bits; NaN is counted separately (its bits would also order, but the CPU
// reports NaN whatever its payload).
__global__ void max_magnitude_kernel(const float* __restrict__ x, std::size_t n, unsigned* __restrict__ result) {
  unsigned m = 0;
  unsigned nan = 0;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) {
    const unsigned bits = __float_as_uint(x[j]) & 0x7fffffffu;
    if (bits > 0x7f800000u) {
      nan = 1;
    } else if (bits > m) {
      m = bits;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    m = max(m, __shfl_down_sync(0xffffffffu, m, offset));
    nan |= __shfl_down_sync(0xffffffffu, nan, offset);
  }
  if ((threadIdx.x & 31u) == 0) {
    if (m != 0) atomicMax(&result[0], m);
    if (nan != 0) atomicOr(&result[1], 1u);
  }
}

__global__ void count_nonfinite_kernel(const float* __restrict__ x, std::size_t n,
                                       unsigned long long* __restrict__ count) {
  unsigned long long c = 0;
  for (std::size_t j = global_thread(); j < n; j += grid_threads()) c += isfinite(x[j]) ? 0 : 1;
  for (int offset = 16; offset > 0; offset /= 2) c += __shfl_down_sync(0xffffffffu, c, offset);
  if ((threadIdx.x & 31u) == 0 && c != 0) atomicAdd(count, c);
}

// One thread per block of coordinates, walking it in the order of kernels/update_stats.hpp as the CPU does.
__global__ void update_statistics_kernel(const float* __restrict__ theta, const float* __restrict__ before,
                                         const std::uint64_t* __restrict__ stepped, bool have_previous,
                                         std::int8_t* __restrict__ sign, std::size_t n, std::size_t block,
                                         double* __restrict__ stats, std::size_t blocks) {
  for (std::size_t b = global_thread(); b < blocks; b += grid_threads()) {
    const std::size_t lo = b * block;
    update_statistics_block(theta, before, stepped, have_previous, sign, lo, lo + block < n ? lo + block : n,
                            stats + kUpdateStats * b);
  }
}

__global__ void keep_and_decay_at_kernel(float* __restrict__ theta, const std::uint32_t* __restrict__ stepped,
                                         std::size_t count, const std::uint64_t* __restrict__ piece_ends,
                                         const float* __restrict__ piece_factors, std::size_t pieces,
                                         float* __restrict__ kept) {
  for (std::size_t k = global_thread(); k < count; k += grid_threads()) {
    keep_and_decay_one(theta, stepped, piece_ends, piece_factors, pieces, kept, k);
  }
}

// One thread per block, as update_statistics_kernel.
__global__ void decay_update_statistics_kernel(float* __restrict__ theta, const std::uint64_t* __restrict__ piece_ends,
                                               const float* __restrict__ piece_factors, std::size_t pieces,
                                               const std::uint32_t* __restrict__ stepped,
                                               const float* __restrict__ kept, std::size_t stepped_count,
                                               bool have_previous, std::int8_t* __restrict__ sign, std::size_t n,
                                               std::size_t block, double* __restrict__ stats, std::size_t blocks) {
  for (std::size_t b = global_thread(); b < blocks; b += grid_threads()) {
    const std::size_t lo = b * block;
    decay_update_statistics_block(theta, piece_ends, piece_factors, pieces, stepped, kept, stepped_count, have_previous,
                                  sign, lo, lo + block < n ? lo + block : n, stats + kUpdateStats * b);
  }
}

}  // namespace

std::size_t count_nonfinite(std::span<const float> x) {
  if (x.empty()) return 0;
  const cudaStream_t stream = current_stream();
  Scratch<unsigned long long> count(1, stream);
  SCAPE_CUDA_CHECK(cudaMemsetAsync(count.get(), 0, sizeof(unsigned long long), stream));
  launch(count_nonfinite_kernel, x.size(), x.data(), x.size(), count.get());
  unsigned long long host = 0;
  SCAPE_CUDA_CHECK(cudaMemcpyAsync(&host, count.get(), sizeof host, cudaMemcpyDeviceToHost, stream));
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return static_cast<std::size_t>(host);
}

void update_statistics(std::span<const float> theta, std::span<const float> before,
                       std::span<const std::uint64_t> stepped, bool have_previous, std::span<std::int8_t> sign,
                       std::size_t block, std::span<double> stats) {
  checks::update_statistics_sizes(theta.size(), before.size(), stepped.size(), sign.size(), block, stats.size());
  const std::size_t blocks = stats.size() / kUpdateStats;
  if (blocks == 0) return;
  launch(update_statistics_kernel, blocks, theta.data(), before.data(), stepped.empty() ? nullptr : stepped.data(),
         have_previous, sign.data(), theta.size(), block, stats.data(), blocks);
}

void keep_and_decay_at(std::span<float> theta, std::span<const std::uint32_t> stepped,
                       std::span<const std::uint64_t> piece_ends, std::span<const float> piece_factors,
                       std::span<float> kept) {
  checks::decay_pieces_sizes("keep_and_decay_at", theta.size(), piece_ends.size(), piece_factors.size(), stepped.size(),
                             kept.size());
  if (stepped.empty() || theta.empty()) return;
  launch(keep_and_decay_at_kernel, stepped.size(), theta.data(), stepped.data(), stepped.size(), piece_ends.data(),
         piece_factors.data(), piece_ends.size(), kept.data());
}

void decay_update_statistics(std::span<float> theta, std::span<const std::uint64_t> piece_ends,
                             std::span<const float> piece_factors, std::span<const std::uint32_t> stepped,
                             std::span<const float> kept, bool have_previous, std::span<std::int8_t> sign,
                             std::size_t block, std::span<double> stats) {
  checks::decay_update_statistics_sizes(theta.size(), piece_ends.size(), piece_factors.size(), stepped.size(),
                                        kept.size(), sign.size(), block, stats.size());
  const std::size_t blocks = stats.size() / kUpdateStats;
  if (blocks == 0) return;
  launch(decay_update_statistics_kernel, blocks, theta.data(), piece_ends.data(), piece_factors.data(),
         piece_ends.size(), stepped.empty() ? nullptr : stepped.data(), stepped.empty() ? nullptr : kept.data(),
         stepped.size(), have_previous, sign.empty() ? nullptr : sign.data(), theta.size(), block, stats.data(),
         blocks);
}

void block_sum_squares(std::span<const float> x, std::size_t block, std::span<double> partial) {
  checks::block_sum_squares_sizes(x.size(), block, partial.size());
  if (partial.empty()) return;
  launch(block_sum_squares_kernel, partial.size(), x.data(), x.size(), block, partial.data(), partial.size());
}

void block_sum_squares_max(std::span<const float> x, std::size_t block, std::span<double> partial,
                           std::span<float> peak) {
  checks::block_sum_squares_max_sizes(x.size(), block, partial.size(), peak.size());
  if (partial.empty()) return;
  launch(block_sum_squares_max_kernel, partial.size(), x.data(), x.size(), block, partial.data(), peak.data(),
         partial.size());
}

float max_magnitude(std::span<const float> x) {
  if (x.empty()) return 0.0f;
  const cudaStream_t stream = current_stream();
  Scratch<unsigned> result(2, stream);
  SCAPE_CUDA_CHECK(cudaMemsetAsync(result.get(), 0, 2 * sizeof(unsigned), stream));
  launch(max_magnitude_kernel, x.size(), x.data(), x.size(), result.get());
  unsigned host[2] = {0, 0};
  SCAPE_CUDA_CHECK(cudaMemcpyAsync(host, result.get(), sizeof host, cudaMemcpyDeviceToHost, stream));
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host[1] != 0) return std::numeric_limits<float>::quiet_NaN();
  float m = 0;
  std::memcpy(&m, &host[0], sizeof m);
  return m;
}

}  // namespace scape::kernels::cuda
