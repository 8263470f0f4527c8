// 1-bit Adam's sign compression on the CPU (docs/algorithms.md, "1-bit Adam"): one 64-element
// word per iteration (kernels/sign_word.hpp, shared with the CUDA twin).
#include "kernels/cpu/kernels.hpp"
#include "kernels/sign_word.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

using Index = std::int64_t;

// Calls word(k, lo, hi) for each 64-element word [lo, hi) of n elements, in parallel above 65536
// (each word is independent, so the result does not depend on the threads).
template <class WordFn>
void for_each_word(std::size_t n, std::size_t words, const WordFn& word) {
  const Index w = static_cast<Index>(words);
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index k = 0; k < w; ++k) {
    const std::size_t lo = static_cast<std::size_t>(k) * 64;
    word(static_cast<std::size_t>(k), lo, lo + 64 < n ? lo + 64 : n);
  }
}

}  // namespace

void sign_compress(std::span<float> x, std::size_t chunk, std::span<const float> scales,
                   std::span<std::uint64_t> words) {
  checks::sign_chunk_sizes(x.size(), chunk, scales.size(), words.size(), "sign_compress");
  for_each_word(x.size(), words.size(), [&](std::size_t k, std::size_t lo, std::size_t hi) {
    words[k] = sign::compress_word(x.data(), lo, hi, chunk, scales.data());
  });
}

void sign_expand_add(std::span<const std::uint64_t> words, std::size_t chunk, std::span<const float> scales,
                     std::span<float> acc) {
  checks::sign_chunk_sizes(acc.size(), chunk, scales.size(), words.size(), "sign_expand_add");
  for_each_word(acc.size(), words.size(), [&](std::size_t k, std::size_t lo, std::size_t hi) {
    sign::expand_word(words[k], lo, hi, chunk, scales.data(), acc.data());
  });
}

}  // namespace scape::kernels
