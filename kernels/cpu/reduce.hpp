// Deterministic reductions for the step metrics: fixed blocks, each summed in index order, so
// a norm does not depend on the thread count or the device (the CUDA versions sum each block
// in the same order and are bit-identical).
#pragma once

#include <cstddef>
#include <span>

namespace scape::kernels {

// partial[b] = sum over j in [b * block, min(n, (b + 1) * block)) of (double) x[j]^2, added in
// index order. partial.size() must be ceil(n / block); block must be > 0.
void block_sum_squares(std::span<const float> x, std::size_t block, std::span<double> partial);
// max |x[j]| (0 for empty x); NaN when any x[j] is NaN.
float max_magnitude(std::span<const float> x);

}  // namespace scape::kernels
