// 1-bit Adam's sign compression on the GPU (kernels/kernel_list.inc; docs/algorithms.md,
// "1-bit Adam"): one thread per 64-element word running kernels/sign_word.hpp, the CPU's code,
// so bit-identical.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/sign_word.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels::cuda {
namespace {

__global__ void sign_compress_kernel(float* __restrict__ x, std::size_t n, std::size_t chunk,
                                     const float* __restrict__ scales, std::uint64_t* __restrict__ words,
                                     std::size_t w) {
  for (std::size_t k = global_thread(); k < w; k += grid_threads()) {
    const std::size_t lo = k * 64;
    words[k] = sign::compress_word(x, lo, lo + 64 < n ? lo + 64 : n, chunk, scales);
  }
}

__global__ void sign_expand_add_kernel(const std::uint64_t* __restrict__ words, std::size_t w, std::size_t chunk,
                                       const float* __restrict__ scales, float* __restrict__ acc, std::size_t n) {
  for (std::size_t k = global_thread(); k < w; k += grid_threads()) {
    const std::size_t lo = k * 64;
    sign::expand_word(words[k], lo, lo + 64 < n ? lo + 64 : n, chunk, scales, acc);
  }
}

}  // namespace

void sign_compress(std::span<float> x, std::size_t chunk, std::span<const float> scales,
                   std::span<std::uint64_t> words) {
  checks::sign_chunk_sizes(x.size(), chunk, scales.size(), words.size(), "sign_compress");
  if (words.empty()) return;
  launch(sign_compress_kernel, words.size(), x.data(), x.size(), chunk, scales.data(), words.data(), words.size());
}

void sign_expand_add(std::span<const std::uint64_t> words, std::size_t chunk, std::span<const float> scales,
                     std::span<float> acc) {
  checks::sign_chunk_sizes(acc.size(), chunk, scales.size(), words.size(), "sign_expand_add");
  if (words.empty()) return;
  launch(sign_expand_add_kernel, words.size(), words.data(), words.size(), chunk, scales.data(), acc.data(),
         acc.size());
}

}  // namespace scape::kernels::cuda
