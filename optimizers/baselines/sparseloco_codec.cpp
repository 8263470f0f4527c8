// SparseLoCo's plan, quantizer and bit packing (docs/algorithms.md, "SparseLoCo").
#include "optimizers/baselines/sparseloco_codec.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/schedule.hpp"
#include "kernels/kernel_types.hpp"

namespace scape {

SparselocoPlan sparseloco_plan(const ParamLayout& layout, const CommonOptimizerConfig& config,
                               const SparselocoSwitches& sparseloco) {
  SparselocoPlan p;
  p.chunk = sparseloco.chunk;
  p.k = k_for(config.density(), p.chunk);
  for (const auto& slot : layout.slots()) {
    const std::size_t entries = kernels::chunk_topk_count(slot.numel(), p.chunk, p.k);
    p.entries.push_back(entries);
    p.total += entries;
    if (entries > 0) ++p.quantized_tensors;
  }
  p.index_bits = static_cast<unsigned>(std::bit_width(p.chunk - 1));
  p.index_bytes = config.mask_encoding == MaskEncoding::bitmap
                      ? kernels::words_for(p.total * p.index_bits) * sizeof(std::uint64_t)
                      : kernels::ef_words(layout.size(), p.total) * sizeof(std::uint64_t);
  const int bits = sparseloco.quant_bits;
  if (bits > 0) {
    p.codebook_bytes = p.quantized_tensors * ((std::size_t{1} << bits) + 1) * sizeof(float);
    p.value_bytes = kernels::words_for(p.total * static_cast<std::size_t>(bits)) * sizeof(std::uint64_t);
  } else {
    p.value_bytes = p.total * wire_bytes(config.wire_dtype);
  }
  return p;
}

QuantizedValues quantize_statistical(std::span<const float> values, int bits) {
  if (bits < 1 || bits > 8) throw std::invalid_argument("quantize_statistical: bits must be in [1, 8]");
  const std::size_t bins = std::size_t{1} << bits;
  const std::size_t n = values.size();
  QuantizedValues q;
  q.codebook.assign(bins, 0.0f);
  q.codes.assign(n, 0);
  if (n == 0) return q;
  double sum = 0;
  for (const float v : values) sum += v;
  q.shift = static_cast<float>(sum / static_cast<double>(n));
  std::vector<float> centered(n);
  double squares = 0;
  for (std::size_t i = 0; i < n; ++i) {
    centered[i] = values[i] - q.shift;
    squares += static_cast<double>(centered[i]) * centered[i];
  }
  // Templar's range: 6 standard deviations over the B bins (quantization_range = 6).
  const double sigma = n > 1 ? std::sqrt(squares / static_cast<double>(n - 1)) : 0.0;
  float scale = static_cast<float>(6.0 * sigma / static_cast<double>(bins));
  if (!(scale > 0) || !std::isfinite(scale)) scale = 1.0f;
  const float offset = static_cast<float>(bins / 2);
  std::vector<double> bin_sum(bins, 0.0);
  std::vector<std::size_t> bin_count(bins, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const float position = std::rint(centered[i] / scale + offset);
    const float clamped = std::clamp(position, 0.0f, static_cast<float>(bins - 1));
    const auto code = static_cast<std::uint8_t>(clamped);
    q.codes[i] = code;
    bin_sum[code] += centered[i];
    ++bin_count[code];
  }
  for (std::size_t b = 0; b < bins; ++b) {
    if (bin_count[b] > 0) q.codebook[b] = static_cast<float>(bin_sum[b] / static_cast<double>(bin_count[b]));
  }
  return q;
}

void pack_fixed_width(std::span<const std::uint32_t> values, unsigned width, std::span<std::uint64_t> words) {
  if (words.size() != kernels::words_for(values.size() * width) || width > 32) {
    throw std::invalid_argument("pack_fixed_width: " + std::to_string(words.size()) + " words for " +
                                std::to_string(values.size()) + " values of " + std::to_string(width) + " bits");
  }
  std::fill(words.begin(), words.end(), std::uint64_t{0});
  if (width == 0) return;  // a chunk of one coordinate: its index needs no bit
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::size_t bit = i * width;
    const std::uint64_t v = values[i];
    words[bit / 64] |= v << (bit % 64);
    if (bit % 64 + width > 64) words[bit / 64 + 1] |= v >> (64 - bit % 64);
  }
}

void unpack_fixed_width(std::span<const std::uint64_t> words, unsigned width, std::span<std::uint32_t> values) {
  if (words.size() != kernels::words_for(values.size() * width) || width > 32) {
    throw std::invalid_argument("unpack_fixed_width: " + std::to_string(words.size()) + " words for " +
                                std::to_string(values.size()) + " values of " + std::to_string(width) + " bits");
  }
  if (width == 0) {
    std::fill(values.begin(), values.end(), 0u);
    return;
  }
  const std::uint64_t mask = (std::uint64_t{1} << width) - 1;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::size_t bit = i * width;
    std::uint64_t v = words[bit / 64] >> (bit % 64);
    if (bit % 64 + width > 64) v |= words[bit / 64 + 1] << (64 - bit % 64);
    values[i] = static_cast<std::uint32_t>(v & mask);
  }
}

}  // namespace scape
