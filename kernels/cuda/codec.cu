// Mask coding kernels on the GPU (kernels/kernel_list.inc, "Elias-Fano coding"): every output
// bit depends on the rank of its position among the set bits, so each kernel first counts the
// set bits of every word and takes a CUB exclusive scan of the counts (each word's first rank),
// then one thread per word writes its bits. Writes that may share a word with another thread's
// use atomicOr; the result does not depend on scheduling.
#include <cub/device/device_scan.cuh>

#include <stdexcept>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels::cuda {
namespace {

// Word w of `words` restricted to the global bit range [first_bit, end_bit).
__device__ inline std::uint64_t word_in_range(const std::uint64_t* words, std::size_t w, std::size_t first_bit,
                                              std::size_t end_bit) {
  std::uint64_t word = words[w];
  const std::size_t lo = 64 * w;
  if (first_bit > lo) word = first_bit >= lo + 64 ? 0 : word & (~0ull << (first_bit - lo));
  if (end_bit < lo + 64) word = end_bit <= lo ? 0 : word & (~0ull >> (lo + 64 - end_bit));
  return word;
}

// counts[w] = set bits of word w inside [first_bit, end_bit); counts[nw] = 0.
__global__ void count_kernel(const std::uint64_t* __restrict__ words, std::size_t nw, std::size_t first_bit,
                             std::size_t end_bit, std::uint64_t* __restrict__ counts) {
  for (std::size_t w = global_thread(); w <= nw; w += grid_threads()) {
    counts[w] = w == nw ? 0 : static_cast<std::uint64_t>(__popcll(word_in_range(words, w, first_bit, end_bit)));
  }
}

// offsets[w] = set bits (inside [first_bit, end_bit)) of the words before w; returns the total.
// offsets must hold nw + 1 entries. Synchronizes (reads the total back).
std::uint64_t rank_offsets(const std::uint64_t* words, std::size_t nw, std::size_t first_bit, std::size_t end_bit,
                           std::uint64_t* offsets, cudaStream_t stream) {
  Scratch<std::uint64_t> counts(nw + 1, stream);
  launch(count_kernel, nw + 1, words, nw, first_bit, end_bit, counts.get());
  std::size_t temp_bytes = 0;
  SCAPE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, counts.get(), offsets, nw + 1, stream));
  {
    Scratch<unsigned char> temp(temp_bytes, stream);
    SCAPE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.get(), temp_bytes, counts.get(), offsets, nw + 1, stream));
  }
  return read_back(offsets + nw, stream);
}

__device__ inline void or_bit(unsigned long long* out, std::size_t bit) {
  atomicOr(out + bit / 64, 1ull << (bit % 64));
}

__device__ inline bool bit_of(const std::uint64_t* in, std::size_t bit) {
  return ((in[bit / 64] >> (bit % 64)) & 1u) != 0;
}

// The `width` (< 64) low bits of value ORed in at stream bits [offset, offset + width).
__device__ inline void or_field(unsigned long long* out, std::size_t offset, std::uint64_t value, unsigned width) {
  if (width == 0) return;
  value &= ~0ull >> (64 - width);
  const unsigned shift = static_cast<unsigned>(offset % 64);
  atomicOr(out + offset / 64, static_cast<unsigned long long>(value << shift));
  if (shift + width > 64) atomicOr(out + offset / 64 + 1, static_cast<unsigned long long>(value >> (64 - shift)));
}

__device__ inline std::uint64_t field_at(const std::uint64_t* in, std::size_t offset, unsigned width) {
  if (width == 0) return 0;
  const unsigned shift = static_cast<unsigned>(offset % 64);
  std::uint64_t value = in[offset / 64] >> shift;
  if (shift + width > 64) value |= in[offset / 64 + 1] << (64 - shift);
  return value & (~0ull >> (64 - width));
}

__global__ void and_not_kernel(const std::uint64_t* __restrict__ a, const std::uint64_t* __restrict__ b,
                               std::uint64_t* __restrict__ out, std::size_t nw) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) out[w] = a[w] & ~b[w];
}

__global__ void or_kernel(const std::uint64_t* __restrict__ src, std::uint64_t* __restrict__ dst, std::size_t nw) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) dst[w] |= src[w];
}

__global__ void extract_kernel(const std::uint64_t* __restrict__ source, const std::uint64_t* __restrict__ positions,
                               std::size_t nw, const std::uint64_t* __restrict__ offsets,
                               unsigned long long* __restrict__ out) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    std::size_t rank = offsets[w];
    for (std::uint64_t word = positions[w]; word != 0; word &= word - 1, ++rank) {
      const std::size_t p = 64 * w + static_cast<std::size_t>(__ffsll(static_cast<long long>(word)) - 1);
      if (bit_of(source, p)) or_bit(out, rank);
    }
  }
}

// One thread owns word w of out, so it ORs without atomics.
__global__ void deposit_kernel(const std::uint64_t* __restrict__ packed, const std::uint64_t* __restrict__ positions,
                               std::size_t nw, const std::uint64_t* __restrict__ offsets,
                               std::uint64_t* __restrict__ out) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    std::size_t rank = offsets[w];
    std::uint64_t bits = 0;
    for (std::uint64_t word = positions[w]; word != 0; word &= word - 1, ++rank) {
      if (bit_of(packed, rank)) bits |= word & (~word + 1);
    }
    out[w] |= bits;
  }
}

struct EfShape {
  std::size_t n_bits, k;
  unsigned low;
  std::size_t high_start, high_end;  // stream bits of the unary high parts
};

EfShape ef_shape(std::size_t n_bits, std::size_t k) {
  const unsigned low = ef_low_bits(n_bits, k);
  return {n_bits, k, low, k * low, ef_bits(n_bits, k)};
}

// Entries past k (a mask with more than k bits) are skipped, never written out of range.
__global__ void ef_encode_kernel(const std::uint64_t* __restrict__ words, std::size_t nw,
                                 const std::uint64_t* __restrict__ offsets, EfShape shape,
                                 unsigned long long* __restrict__ out) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    std::size_t i = offsets[w];
    for (std::uint64_t word = word_in_range(words, w, 0, shape.n_bits); word != 0 && i < shape.k;
         word &= word - 1, ++i) {
      const std::size_t p = 64 * w + static_cast<std::size_t>(__ffsll(static_cast<long long>(word)) - 1);
      const std::size_t high = shape.high_start + (p >> shape.low) + i;
      if (high >= shape.high_end) continue;
      or_field(out, i * shape.low, p, shape.low);
      or_bit(out, high);
    }
  }
}

// Writes position i either as a bit of `words` or as entry i of `indices` (the other is null).
__global__ void ef_decode_kernel(const std::uint64_t* __restrict__ code, std::size_t nw,
                                 const std::uint64_t* __restrict__ offsets, EfShape shape,
                                 unsigned long long* __restrict__ words, std::uint32_t* __restrict__ indices) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    std::size_t i = offsets[w];
    std::uint64_t word = word_in_range(code, w, shape.high_start, shape.high_end);
    for (; word != 0 && i < shape.k; word &= word - 1, ++i) {
      const std::size_t bit = 64 * w + static_cast<std::size_t>(__ffsll(static_cast<long long>(word)) - 1);
      const std::size_t p = ((bit - shape.high_start - i) << shape.low) | field_at(code, i * shape.low, shape.low);
      if (p >= shape.n_bits) continue;
      if (words != nullptr) {
        or_bit(words, p);
      } else {
        indices[i] = static_cast<std::uint32_t>(p);
      }
    }
  }
}

unsigned long long* as_atomic(std::uint64_t* p) { return reinterpret_cast<unsigned long long*>(p); }

// ef_decode and ef_decode_indices after their size checks: one of words and indices is null.
void decode_positions(std::span<const std::uint64_t> code, std::size_t n_bits, std::size_t k,
                      unsigned long long* words, std::uint32_t* indices) {
  if (k == 0) return;
  const cudaStream_t stream = current_stream();
  const EfShape shape = ef_shape(n_bits, k);
  const std::size_t nw = code.size();
  Scratch<std::uint64_t> offsets(nw + 1, stream);
  rank_offsets(code.data(), nw, shape.high_start, shape.high_end, offsets.get(), stream);
  launch(ef_decode_kernel, nw, code.data(), nw, offsets.get(), shape, words, indices);
}

}  // namespace

void and_not_bits(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b, std::span<std::uint64_t> out) {
  checks::and_not_bits_sizes(a.size(), b.size(), out.size());
  if (a.empty()) return;
  launch(and_not_kernel, a.size(), a.data(), b.data(), out.data(), a.size());
}

void or_bits(std::span<const std::uint64_t> src, std::span<std::uint64_t> dst) {
  checks::or_bits_sizes(src.size(), dst.size());
  if (src.empty()) return;
  launch(or_kernel, src.size(), src.data(), dst.data(), src.size());
}

// The running count of set bits of `positions` before each of its words (device scratch) and
// their total: where each word's bits go in a packed buffer (extract_bits, deposit_bits).
namespace {
struct PackedOffsets {
  PackedOffsets(std::span<const std::uint64_t> positions, cudaStream_t stream)
      : offsets(positions.size() + 1, stream),
        set(rank_offsets(positions.data(), positions.size(), 0, 64 * positions.size(), offsets.get(), stream)) {}
  Scratch<std::uint64_t> offsets;
  std::uint64_t set;
};
}  // namespace

void extract_bits(std::span<const std::uint64_t> source, std::span<const std::uint64_t> positions,
                  std::span<std::uint64_t> out) {
  checks::require_same_words(source.size(), positions.size(), "extract_bits");
  const cudaStream_t stream = current_stream();
  const PackedOffsets packed(positions, stream);
  checks::packed_bits_sizes(source.size(), positions.size(), out.size(), packed.set, "extract_bits");
  if (!out.empty()) SCAPE_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.size_bytes(), stream));
  if (positions.empty()) return;
  launch(extract_kernel, positions.size(), source.data(), positions.data(), positions.size(), packed.offsets.get(),
         as_atomic(out.data()));
}

void deposit_bits(std::span<const std::uint64_t> packed_bits, std::span<const std::uint64_t> positions,
                  std::span<std::uint64_t> out) {
  checks::require_same_words(out.size(), positions.size(), "deposit_bits");
  const PackedOffsets packed(positions, current_stream());
  checks::packed_bits_sizes(out.size(), positions.size(), packed_bits.size(), packed.set, "deposit_bits");
  if (positions.empty()) return;
  launch(deposit_kernel, positions.size(), packed_bits.data(), positions.data(), positions.size(), packed.offsets.get(),
         out.data());
}

void ef_encode(std::span<const std::uint64_t> words, std::size_t n_bits, std::size_t k, std::span<std::uint64_t> out) {
  checks::ef_sizes(words.size(), n_bits, k, out.size(), "ef_encode");
  const cudaStream_t stream = current_stream();
  if (!out.empty()) SCAPE_CUDA_CHECK(cudaMemsetAsync(out.data(), 0, out.size_bytes(), stream));
  if (k == 0 || words.empty()) return;
  const std::size_t nw = words.size();
  Scratch<std::uint64_t> offsets(nw + 1, stream);
  rank_offsets(words.data(), nw, 0, n_bits, offsets.get(), stream);
  launch(ef_encode_kernel, nw, words.data(), nw, offsets.get(), ef_shape(n_bits, k), as_atomic(out.data()));
}

void ef_decode(std::span<const std::uint64_t> code, std::size_t n_bits, std::size_t k, std::span<std::uint64_t> words) {
  checks::ef_sizes(words.size(), n_bits, k, code.size(), "ef_decode");
  decode_positions(code, n_bits, k, as_atomic(words.data()), nullptr);
}

void ef_decode_indices(std::span<const std::uint64_t> code, std::size_t n_bits, std::size_t k,
                       std::span<std::uint32_t> indices) {
  checks::ef_indices_sizes(indices.size(), n_bits, k, code.size(), "ef_decode_indices");
  decode_positions(code, n_bits, k, nullptr, indices.data());
}

}  // namespace scape::kernels::cuda
