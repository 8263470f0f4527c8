// Bitmask kernels on the GPU (kernels/kernel_list.inc, "Bitmasks"): byte-flag packing, popcounts and the
// index-list conversions. bits_to_indices writes ascending indices from a per-word popcount
// and a CUB exclusive scan of those counts (each word's output offset), so the order never
// depends on scheduling.
#include <cub/device/device_scan.cuh>

#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/bit_ranges.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels::cuda {
namespace {

std::string size_text(std::size_t value) { return std::to_string(value); }

using checks::require_same_words;
using checks::require_words;

// Eight byte flags read as one little-endian word -> 8 bits (kernels/cpu/bitmask.cpp).
__device__ inline std::uint64_t pack_eight(std::uint64_t bytes) {
  constexpr std::uint64_t low7 = 0x7f7f7f7f7f7f7f7full;
  const std::uint64_t nonzero_high = (((bytes & low7) + low7) | bytes) & ~low7;
  return ((nonzero_high >> 7) * 0x0102040810204080ull) >> 56;
}

// One thread per word. `aligned`: flags is 16-byte aligned, so whole words load as 4 x 16 B.
__global__ void pack_kernel(const std::uint8_t* __restrict__ flags, std::size_t n, std::uint64_t* __restrict__ words,
                            std::size_t nw, bool aligned) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    const std::size_t first = 64 * w;
    std::uint64_t word = 0;
    if (aligned && first + 64 <= n) {
      const auto* vec = reinterpret_cast<const ulonglong2*>(flags + first);
#pragma unroll
      for (unsigned q = 0; q < 4; ++q) {
        const ulonglong2 pair = vec[q];
        word |= pack_eight(pair.x) << (16 * q);
        word |= pack_eight(pair.y) << (16 * q + 8);
      }
    } else {
      const std::size_t len = n - first < 64 ? n - first : 64;
      for (std::size_t b = 0; b < len; ++b) word |= std::uint64_t{flags[first + b] != 0} << b;
    }
    words[w] = word;
  }
}

// Bits i of the byte b spread to bytes i (value 0 or 1) of the result.
__device__ inline std::uint64_t spread_byte(std::uint64_t b) {
  std::uint64_t out = 0;
#pragma unroll
  for (unsigned i = 0; i < 8; ++i) out |= ((b >> i) & 1u) << (8 * i);
  return out;
}

__global__ void unpack_kernel(const std::uint64_t* __restrict__ words, std::size_t nw, std::uint8_t* __restrict__ flags,
                              std::size_t n, bool aligned) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    const std::size_t first = 64 * w;
    const std::uint64_t word = words[w];
    if (aligned && first + 64 <= n) {
      auto* vec = reinterpret_cast<ulonglong2*>(flags + first);
#pragma unroll
      for (unsigned q = 0; q < 4; ++q) {
        vec[q] = make_ulonglong2(spread_byte((word >> (16 * q)) & 0xffu), spread_byte((word >> (16 * q + 8)) & 0xffu));
      }
    } else {
      const std::size_t len = n - first < 64 ? n - first : 64;
      for (std::size_t b = 0; b < len; ++b) flags[first + b] = static_cast<std::uint8_t>((word >> b) & 1u);
    }
  }
}

// The byte-flag kernels load whole words as 16-byte vectors when the flags allow it.
bool aligned16(const std::uint8_t* flags) { return reinterpret_cast<std::uintptr_t>(flags) % 16 == 0; }

enum class Combine { none, and_, or_ };

template <Combine C>
__global__ void popcount_kernel(const std::uint64_t* __restrict__ a, const std::uint64_t* __restrict__ b,
                                std::size_t nw, unsigned long long* __restrict__ total) {
  unsigned long long count = 0;
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    std::uint64_t word = a[w];
    if constexpr (C == Combine::and_) word &= b[w];
    if constexpr (C == Combine::or_) word |= b[w];
    count += static_cast<unsigned long long>(__popcll(word));
  }
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_down_sync(0xffffffffu, count, offset);
  if ((threadIdx.x & 31u) == 0 && count != 0) atomicAdd(total, count);
}

template <Combine C>
std::size_t popcount_of(const std::uint64_t* a, const std::uint64_t* b, std::size_t nw) {
  if (nw == 0) return 0;
  const cudaStream_t stream = current_stream();
  Scratch<unsigned long long> total(1, stream);
  SCAPE_CUDA_CHECK(cudaMemsetAsync(total.get(), 0, sizeof(unsigned long long), stream));
  launch(popcount_kernel<C>, nw, a, b, nw, total.get());
  return static_cast<std::size_t>(read_back(total.get(), stream));
}

// counts[w] = popcount(words[w]) for w < nw and counts[nw] = 0, so the exclusive scan of the
// nw + 1 counts ends with the total. highest_plus_one gets 1 + the highest set bit (0: none).
__global__ void word_counts_kernel(const std::uint64_t* __restrict__ words, std::size_t nw,
                                   std::uint32_t* __restrict__ counts,
                                   unsigned long long* __restrict__ highest_plus_one) {
  for (std::size_t w = global_thread(); w <= nw; w += grid_threads()) {
    if (w == nw) {
      counts[w] = 0;
      continue;
    }
    const std::uint64_t word = words[w];
    counts[w] = static_cast<std::uint32_t>(__popcll(word));
    if (word != 0) atomicMax(highest_plus_one, static_cast<unsigned long long>(64 * w + 64 - __clzll(word)));
  }
}

// Thread per word: its set bits go to out[offsets[w]...], ascending. Writes stop at capacity.
__global__ void write_indices_kernel(const std::uint64_t* __restrict__ words, std::size_t nw,
                                     const std::uint32_t* __restrict__ offsets, std::uint32_t base,
                                     std::uint32_t* __restrict__ out, std::size_t capacity) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    std::uint64_t word = words[w];
    std::size_t at = offsets[w];
    const std::uint32_t first = base + static_cast<std::uint32_t>(64 * w);
    while (word != 0 && at < capacity) {
      out[at++] = first + static_cast<std::uint32_t>(__ffsll(static_cast<long long>(word)) - 1);
      word &= word - 1;
    }
  }
}

__global__ void indices_to_bits_kernel(const std::uint32_t* __restrict__ idx, std::size_t k, std::uint32_t base,
                                       unsigned long long* __restrict__ words, std::size_t nw) {
  for (std::size_t i = global_thread(); i < k; i += grid_threads()) {
    const std::uint32_t j = idx[i];
    if (j < base) continue;
    const std::size_t bit = j - base;
    if (bit >= 64 * nw) continue;
    atomicOr(words + bit / 64, 1ull << (bit % 64));
  }
}

// One block of threads per range: each thread counts its words, the block adds them in
// unsigned integers (exact in any order) with atomics.
__global__ void mask_range_counts_kernel(const std::uint64_t* __restrict__ mask,
                                         const std::uint64_t* __restrict__ previous,
                                         const std::uint64_t* __restrict__ ranges,
                                         unsigned long long* __restrict__ counts, std::size_t n_ranges) {
  for (std::size_t r = blockIdx.x; r < n_ranges; r += gridDim.x) {
    const std::uint64_t begin = ranges[2 * r], end = ranges[2 * r + 1];
    unsigned long long set = 0, both = 0, either = 0;
    if (begin < end) {
      for (std::uint64_t w = begin / 64 + threadIdx.x; w <= (end - 1) / 64; w += blockDim.x) {
        const std::uint64_t keep = range_word_mask(w, begin, end), m = mask[w] & keep;
        set += static_cast<unsigned long long>(__popcll(m));
        if (previous == nullptr) continue;
        const std::uint64_t p = previous[w] & keep;
        both += static_cast<unsigned long long>(__popcll(m & p));
        either += static_cast<unsigned long long>(__popcll(m | p));
      }
    }
    if (set != 0) atomicAdd(&counts[3 * r], set);
    if (both != 0) atomicAdd(&counts[3 * r + 1], both);
    if (either != 0) atomicAdd(&counts[3 * r + 2], either);
  }
}

}  // namespace

void pack_bits(std::span<const std::uint8_t> flags, std::span<std::uint64_t> words) {
  require_words(words.size(), flags.size(), "pack_bits");
  if (words.empty()) return;
  launch(pack_kernel, words.size(), flags.data(), flags.size(), words.data(), words.size(), aligned16(flags.data()));
}

void unpack_bits(std::span<const std::uint64_t> words, std::span<std::uint8_t> flags) {
  require_words(words.size(), flags.size(), "unpack_bits");
  if (words.empty()) return;
  launch(unpack_kernel, words.size(), words.data(), words.size(), flags.data(), flags.size(), aligned16(flags.data()));
}

std::size_t popcount(std::span<const std::uint64_t> words) {
  return popcount_of<Combine::none>(words.data(), nullptr, words.size());
}

std::size_t popcount_and(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b) {
  require_same_words(a.size(), b.size(), "popcount_and");
  return popcount_of<Combine::and_>(a.data(), b.data(), a.size());
}

std::size_t popcount_or(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b) {
  require_same_words(a.size(), b.size(), "popcount_or");
  return popcount_of<Combine::or_>(a.data(), b.data(), a.size());
}

void mask_range_counts(std::span<const std::uint64_t> mask, std::span<const std::uint64_t> previous,
                       std::span<const std::uint64_t> ranges, std::span<std::uint64_t> counts) {
  // The ranges are checked where the host can read them (the Buffers are managed memory).
  checks::mask_range_counts_sizes(mask.size(), previous.size(), ranges.size(), counts.size(), nullptr);
  if (counts.empty()) return;
  const cudaStream_t stream = current_stream();
  SCAPE_CUDA_CHECK(cudaMemsetAsync(counts.data(), 0, counts.size_bytes(), stream));
  const std::size_t n_ranges = ranges.size() / 2;
  const unsigned grid = static_cast<unsigned>(n_ranges < 65535 ? n_ranges : 65535);
  mask_range_counts_kernel<<<grid, 256, 0, stream>>>(mask.data(), previous.empty() ? nullptr : previous.data(),
                                                     ranges.data(),
                                                     reinterpret_cast<unsigned long long*>(counts.data()), n_ranges);
  SCAPE_CUDA_CHECK_LAUNCH();
}

std::size_t bits_to_indices(std::span<const std::uint64_t> words, std::uint32_t base, std::span<std::uint32_t> out) {
  const std::size_t nw = words.size();
  if (nw == 0) return 0;
  if (nw >= (std::size_t{1} << 26)) {  // 2^32 bits: the uint32 offsets below would overflow
    throw std::invalid_argument("bits_to_indices: " + size_text(nw) + " words exceed the 2^32 - 1 bits supported");
  }
  const cudaStream_t stream = current_stream();
  Scratch<std::uint32_t> counts(nw + 1, stream);
  Scratch<std::uint32_t> offsets(nw + 1, stream);
  Scratch<unsigned long long> highest(1, stream);
  SCAPE_CUDA_CHECK(cudaMemsetAsync(highest.get(), 0, sizeof(unsigned long long), stream));
  launch(word_counts_kernel, nw + 1, words.data(), nw, counts.get(), highest.get());
  std::size_t temp_bytes = 0;
  SCAPE_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, counts.get(), offsets.get(), nw + 1, stream));
  {
    Scratch<unsigned char> temp(temp_bytes, stream);
    SCAPE_CUDA_CHECK(
        cub::DeviceScan::ExclusiveSum(temp.get(), temp_bytes, counts.get(), offsets.get(), nw + 1, stream));
  }
  const std::size_t total = read_back(offsets.get() + nw, stream);
  const unsigned long long highest_plus_one = read_back(highest.get(), stream);
  // The CPU kernel's checks, in its order: the highest index must fit a uint32, out must hold all.
  if (highest_plus_one > 0) {
    const std::uint64_t top = highest_plus_one - 1;
    if (base + top > std::numeric_limits<std::uint32_t>::max()) {
      throw std::invalid_argument("bits_to_indices: base " + size_text(base) + " + bit " + size_text(top) +
                                  " overflows a uint32 index");
    }
  }
  if (total > out.size()) {
    throw std::invalid_argument("bits_to_indices: " + size_text(total) + " bits set, out holds " +
                                size_text(out.size()));
  }
  launch(write_indices_kernel, nw, words.data(), nw, offsets.get(), base, out.data(), out.size());
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return total;
}

void indices_to_bits(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint64_t> words) {
  if (idx.empty() || words.empty()) return;
  launch(indices_to_bits_kernel, idx.size(), idx.data(), idx.size(), base,
         reinterpret_cast<unsigned long long*>(words.data()), words.size());
}

}  // namespace scape::kernels::cuda
