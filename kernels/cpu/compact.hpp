// Compaction (gather the masked values into a contiguous buffer, in mask order) and expansion
// (scatter them back). Indices are relative to the start of the dense span.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace scape::kernels {

// dst[k] = src[idx[k]]; dst.size() must equal idx.size().
void compact(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst);
// dst[idx[k]] = src[k]; other entries of dst untouched.
void expand(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst);
// dst[idx[k]] = 0.
void zero_at(std::span<float> dst, std::span<const std::uint32_t> idx);

}  // namespace scape::kernels
