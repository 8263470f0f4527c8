// The CUDA kernels: every function of kernels/cpu/{adam,select,bitmask,compact,scape_ops}.hpp
// with the same signature and contract, in scape::kernels::cuda. Spans hold device-accessible
// memory (cudaMalloc or managed); work is queued on current_stream() (stream.hpp), and the
// host may read outputs only after that stream is synchronized. Functions that return a value
// to the host (accumulate, topk_abs_indices, popcount*, bits_to_indices) synchronize the
// stream before returning, so their outputs are complete too.
//
// Elementwise results are bit-identical to the CPU kernels: the library is compiled with
// --fmad=false (no contraction into fused multiply-adds, which the CPU build at
// -march=x86-64-v2 cannot emit either), division and sqrtf are IEEE-rounded (nvcc's default
// -prec-div/-prec-sqrt, no -use_fast_math), denormals are kept (-ftz=false), the step scalars
// are rounded from double on the host exactly as the CPU code does, and every expression keeps
// the CPU's operation order.
//
// Size checks throw std::invalid_argument on the host before anything is queued, with the CPU
// kernels' messages. Index VALUES are not validated on the host (that would need a device
// round trip per call): out-of-range indices are skipped by the kernels, never dereferenced.
// Plain C++ header (no CUDA types), so g++-compiled code can call these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu/adam.hpp"  // AdamScalars

namespace scape::kernels::cuda {

// adam.hpp
void adamw_step(std::span<float> theta, std::span<float> m, std::span<float> v, std::span<const float> g,
                const AdamScalars& s);
void adams_step(std::span<float> theta, std::span<float> m, std::span<const float> g, const AdamScalars& s);
void adamw_step_masked(std::span<float> theta, std::span<float> m, std::span<float> v,
                       std::span<const std::uint32_t> idx, std::span<const float> m_new,
                       std::span<const float> g_bar, const AdamScalars& s);
void adams_step_masked(std::span<float> theta, std::span<float> m, std::span<const std::uint32_t> idx,
                       std::span<const float> m_new, std::span<const float> g_bar, const AdamScalars& s);
void scale(std::span<float> x, float factor);
// Synchronizes (returns a count).
std::size_t accumulate(std::span<float> acc, std::span<const float> g);

// select.hpp. Exact top-k by magnitude, ties to the lower index, NaN above +inf.
void topk_abs_mask(std::span<const float> values, std::size_t k, std::span<std::uint64_t> mask_words);
// Synchronizes.
std::size_t topk_abs_indices(std::span<const float> values, std::size_t k, std::span<std::uint32_t> out);

// bitmask.hpp
void pack_bits(std::span<const std::uint8_t> flags, std::span<std::uint64_t> words);
void unpack_bits(std::span<const std::uint64_t> words, std::span<std::uint8_t> flags);
// These four synchronize.
std::size_t popcount(std::span<const std::uint64_t> words);
std::size_t popcount_and(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b);
std::size_t popcount_or(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b);
std::size_t bits_to_indices(std::span<const std::uint64_t> words, std::uint32_t base,
                            std::span<std::uint32_t> out);
// Out-of-range indices are skipped (the CPU kernel throws and leaves the mask untouched).
void indices_to_bits(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint64_t> words);

// compact.hpp. Out-of-range indices are skipped (the CPU kernels throw).
void compact(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst);
void expand(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst);
void zero_at(std::span<float> dst, std::span<const std::uint32_t> idx);

// scape_ops.hpp
void first_moment_statistic(std::span<const float> m, std::span<const float> a, float b1, float omb1,
                            std::span<float> out);
void random_statistic(std::uint64_t key, std::uint64_t first_counter, std::span<float> out);
void pack_payload(std::span<const float> a, std::span<const float> m, std::size_t m_offset,
                  std::span<const std::uint32_t> idx, float b1, float omb1, bool with_momentum, std::span<float> b,
                  std::span<float> a_out);
void rebase_indices(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint32_t> out);
void add_momentum(std::span<float> b_bar, std::span<const float> m, std::span<const std::uint32_t> idx, float b1);
void reconstruct_gradient(std::span<const float> b_bar, std::span<const float> m,
                          std::span<const std::uint32_t> idx, float b1, float omb1, std::span<float> g_bar);
void round_to_bf16(std::span<const float> in, std::span<float> out);
void fill(std::span<float> x, float value);

// reduce.hpp
void block_sum_squares(std::span<const float> x, std::size_t block, std::span<double> partial);
float max_magnitude(std::span<const float> x);

}  // namespace scape::kernels::cuda
