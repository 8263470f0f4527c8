// Gather (compact), scatter (expand), scatter-add and zeroing at an index list on the GPU
// (kernels/kernel_list.inc, "Compaction"). Sizes are checked on the host as on the CPU; an
// index out of range of the dense buffer is skipped on the device (the CPU kernel throws
// instead: checking values on the host would cost a device round trip per call).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels::cuda {
namespace {

using checks::require_compacted;

__global__ void compact_kernel(const float* __restrict__ src, std::size_t n, const std::uint32_t* __restrict__ idx,
                               float* __restrict__ dst, std::size_t k) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j < n) dst[i] = src[j];
  }
}

__global__ void expand_kernel(const float* __restrict__ src, const std::uint32_t* __restrict__ idx, std::size_t k,
                              float* __restrict__ dst, std::size_t n) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j < n) dst[j] = src[i];
  }
}

// The indices of one launch are distinct (the contract), so no two threads add to one entry.
__global__ void scatter_add_kernel(float* __restrict__ dst, std::size_t n, const std::uint32_t* __restrict__ idx,
                                   const float* __restrict__ src, std::size_t k) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j < n) dst[j] += src[i];
  }
}

__global__ void zero_at_kernel(float* __restrict__ dst, std::size_t n, const std::uint32_t* __restrict__ idx,
                               std::size_t k) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j < n) dst[j] = 0.0f;
  }
}

}  // namespace

void compact(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst) {
  require_compacted(idx.size(), dst.size(), "compact");
  if (idx.empty()) return;
  launch(compact_kernel, idx.size(), src.data(), src.size(), idx.data(), dst.data(), idx.size());
}

void expand(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst) {
  require_compacted(idx.size(), src.size(), "expand");
  if (idx.empty()) return;
  launch(expand_kernel, idx.size(), src.data(), idx.data(), idx.size(), dst.data(), dst.size());
}

void scatter_add(std::span<float> dst, std::span<const std::uint32_t> idx, std::span<const float> src) {
  require_compacted(idx.size(), src.size(), "scatter_add");
  if (idx.empty()) return;
  launch(scatter_add_kernel, idx.size(), dst.data(), dst.size(), idx.data(), src.data(), idx.size());
}

void zero_at(std::span<float> dst, std::span<const std::uint32_t> idx) {
  if (idx.empty()) return;
  launch(zero_at_kernel, idx.size(), dst.data(), dst.size(), idx.data(), idx.size());
}

}  // namespace scape::kernels::cuda
