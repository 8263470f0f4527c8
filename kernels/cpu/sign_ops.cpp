// 1-bit Adam's sign compression on the CPU (docs/algorithms.md, "1-bit Adam"): one 64-element
// word per iteration (kernels/sign_word.hpp, shared with the CUDA twin).
#include "kernels/cpu/kernels.hpp"
#include "kernels/sign_word.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

using Index = std::int64_t;

}  // namespace

void sign_compress(std::span<float> x, std::size_t chunk, std::span<const float> scales,
                   std::span<std::uint64_t> words) {
  checks::sign_chunk_sizes(x.size(), chunk, scales.size(), words.size(), "sign_compress");
  const std::size_t n = x.size();
  const Index w = static_cast<Index>(words.size());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index k = 0; k < w; ++k) {
    const std::size_t lo = static_cast<std::size_t>(k) * 64;
    const std::size_t hi = lo + 64 < n ? lo + 64 : n;
    words[static_cast<std::size_t>(k)] = sign::compress_word(x.data(), lo, hi, chunk, scales.data());
  }
}

void sign_expand_add(std::span<const std::uint64_t> words, std::size_t chunk, std::span<const float> scales,
                     std::span<float> acc) {
  checks::sign_chunk_sizes(acc.size(), chunk, scales.size(), words.size(), "sign_expand_add");
  const std::size_t n = acc.size();
  const Index w = static_cast<Index>(words.size());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index k = 0; k < w; ++k) {
    const std::size_t lo = static_cast<std::size_t>(k) * 64;
    const std::size_t hi = lo + 64 < n ? lo + 64 : n;
    sign::expand_word(words[static_cast<std::size_t>(k)], lo, hi, chunk, scales.data(), acc.data());
  }
}

}  // namespace scape::kernels
