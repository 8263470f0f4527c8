// The SCAPE-specific elementwise passes (docs/algorithms.md, "SCAPE" steps 2, 4, 5 and 8),
// kept as kernels so the CPU and CUDA paths run the same formulas in the same order. Index
// lists hold mask positions, ascending and distinct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace scape::kernels {

// Step 8's ranking statistic: out[j] = b1 * m[j] + omb1 * a[j].
void first_moment_statistic(std::span<const float> m, std::span<const float> a, float b1, float omb1,
                            std::span<float> out);
// The random-mask statistic: out[j] = (float) rng::uniform(key, first_counter + j).
void random_statistic(std::uint64_t key, std::uint64_t first_counter, std::span<float> out);

// Step 2, the single buffer on the mask, in mask order:
//   b[i] = b1 * m[idx[i] - m_offset] + omb1 * a[idx[i]]   (with_momentum)
//   b[i] = omb1 * a[idx[i]]                               (sharded: the owner adds b1 m later)
// and, when a_out is not empty (second_moment = two_collectives), a_out[i] = a[idx[i]].
// `a` and the indices cover the whole flat buffer; m covers [m_offset, m_offset + m.size()).
void pack_payload(std::span<const float> a, std::span<const float> m, std::size_t m_offset,
                  std::span<const std::uint32_t> idx, float b1, float omb1, bool with_momentum, std::span<float> b,
                  std::span<float> a_out);
// out[i] = idx[i] - base (mask positions made relative to the start of the state range).
void rebase_indices(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint32_t> out);
// Step 4 (sharded): b_bar[i] += b1 * m[idx[i]], the owner's momentum added after the reduce.
void add_momentum(std::span<float> b_bar, std::span<const float> m, std::span<const std::uint32_t> idx, float b1);
// Step 5: g_bar[i] = (b_bar[i] - b1 * m[idx[i]]) / omb1.
void reconstruct_gradient(std::span<const float> b_bar, std::span<const float> m,
                          std::span<const std::uint32_t> idx, float b1, float omb1, std::span<float> g_bar);

// out[j] = the bf16-representable float nearest to in[j] (ties to even); in and out may alias.
void round_to_bf16(std::span<const float> in, std::span<float> out);
void fill(std::span<float> x, float value);

}  // namespace scape::kernels
