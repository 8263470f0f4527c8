// Exact top-k by magnitude on the GPU (kernels/kernel_list.inc; docs/algorithms.md, "Masks"):
// a radix select on the 31-bit key |x| (the float's bits with the sign cleared; NaN ranks above
// +inf), then one pass that writes the mask. No sort, no host round trip:
//
//   pass 1-3  histogram one digit of the key (bits 30..20, 19..10, 9..0) over the elements whose
//             higher digits equal the prefix found so far: shared-memory histograms per block,
//             merged with global atomics; after each pass a one-block kernel scans the histogram
//             from the top (cub::BlockScan) and picks the bucket holding the k-th largest, which
//             extends the prefix and leaves the rank still sought inside that bucket. After pass
//             3 the prefix is the exact threshold key T and `need` is how many of the elements
//             with key == T belong to the top k.
//   mask      every element with key > T, plus the first `need` elements (by index) with key ==
//             T. Each block owns a contiguous range of words; pass 3 also stores each block's
//             own histogram, so a block knows how many ties at T lie in the blocks before it (a
//             deterministic exclusive sum) and hence whether it takes all, none or some of its
//             ties. Only the (at most one) block that takes some walks its words in order, 8 at
//             a time, ranking ties by index with a per-tile prefix sum; every other block writes
//             words straight from warp ballots of key >= T or key > T.
//
// So the selection reads the input 4 times and never depends on scheduling: the result equals
// the CPU kernel's bit for bit. k = 0 and k = n are written directly.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels::cuda {
namespace {

constexpr unsigned kSelectThreads = 256;
constexpr unsigned kSelectWarps = kSelectThreads / 32;
constexpr unsigned kPickThreads = 1024;
constexpr unsigned kUnroll = 8;                   // independent loads in flight per thread
constexpr std::size_t kMinWordsPerBlock = 64;     // 4096 elements
constexpr std::size_t kMaxSelectBlocks = 1024;
constexpr unsigned kBinsHigh = 2048;              // digit 1: key bits 30..20
constexpr unsigned kBinsLow = 1024;               // digits 2 and 3: bits 19..10 and 9..0
constexpr unsigned kFullWarp = 0xffffffffu;

struct SelectState {
  std::uint32_t prefix;   // key bits fixed by the passes so far; after pass 3 the threshold T
  std::uint32_t rank;     // rank (1-based) still sought among the keys matching the prefix
  std::uint32_t partial;  // after pass 3: 1 when only some of the keys equal to T are taken
};

// Block b owns words [first_word(b), first_word(b + 1)); the same split for every kernel.
struct Partition {
  std::size_t n;
  std::size_t words;
  unsigned blocks;
  __device__ std::size_t first_word(unsigned b) const { return words * b / blocks; }
  __device__ std::size_t first_element(unsigned b) const {
    const std::size_t e = 64 * first_word(b);
    return e < n ? e : n;
  }
};

// Histogram of key bits [shift, shift + log2(Bins)) over the keys with (key & prefix_mask) ==
// state->prefix. block_hist (optional) receives each block's own counts.
template <unsigned Bins>
__global__ void __launch_bounds__(kSelectThreads)
    histogram_kernel(const float* __restrict__ values, Partition part, unsigned shift, std::uint32_t prefix_mask,
                     const SelectState* __restrict__ state, std::uint32_t* __restrict__ hist,
                     std::uint32_t* __restrict__ block_hist) {
  __shared__ std::uint32_t local[Bins];
  for (unsigned i = threadIdx.x; i < Bins; i += kSelectThreads) local[i] = 0;
  __syncthreads();
  const std::uint32_t prefix = state->prefix;
  const std::size_t begin = part.first_element(blockIdx.x);
  const std::size_t end = part.first_element(blockIdx.x + 1);
  for (std::size_t base = begin + threadIdx.x; base < end; base += kUnroll * kSelectThreads) {
    std::uint32_t key[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) {
      const std::size_t j = base + u * kSelectThreads;
      valid[u] = j < end;
      key[u] = valid[u] ? magnitude_key(values[j]) : 0u;
    }
#pragma unroll
    for (unsigned u = 0; u < kUnroll; ++u) {
      if (valid[u] && (key[u] & prefix_mask) == prefix) atomicAdd(&local[(key[u] >> shift) & (Bins - 1)], 1u);
    }
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < Bins; i += kSelectThreads) {
    const std::uint32_t c = local[i];
    if (c != 0) atomicAdd(&hist[i], c);
    if (block_hist != nullptr) block_hist[static_cast<std::size_t>(blockIdx.x) * Bins + i] = c;
  }
}

// One block: finds the bucket holding the rank-th largest key (buckets read from the top),
// appends it to the prefix and keeps the rank left inside it. `first_rank` is k on pass 1
// (0 afterwards: the rank comes from the state).
template <unsigned Bins>
__global__ void __launch_bounds__(kPickThreads)
    pick_kernel(const std::uint32_t* __restrict__ hist, unsigned shift, SelectState* __restrict__ state,
                std::uint32_t first_rank, bool last) {
  constexpr unsigned kItems = Bins / kPickThreads;
  static_assert(kItems * kPickThreads == Bins, "bins must be a multiple of the pick block");
  using Scan = cub::BlockScan<std::uint32_t, kPickThreads>;
  __shared__ typename Scan::TempStorage temp;
  // Read by every thread before the scan's barriers; written by one thread after them.
  const std::uint32_t rank = first_rank != 0 ? first_rank : state->rank;
  const std::uint32_t prefix = state->prefix;
  std::uint32_t count[kItems];
  std::uint32_t inclusive[kItems];
#pragma unroll
  for (unsigned q = 0; q < kItems; ++q) count[q] = hist[Bins - 1 - (threadIdx.x * kItems + q)];
  Scan(temp).InclusiveSum(count, inclusive);
#pragma unroll
  for (unsigned q = 0; q < kItems; ++q) {
    const std::uint32_t above = inclusive[q] - count[q];  // keys in higher buckets
    if (count[q] != 0 && above < rank && rank <= inclusive[q]) {
      const std::uint32_t bucket = Bins - 1 - (threadIdx.x * kItems + q);
      state->prefix = prefix | (bucket << shift);
      state->rank = rank - above;
      if (last) state->partial = rank - above < count[q] ? 1u : 0u;
    }
  }
}

// Loads element e (0 past the end; `valid` says which).
__device__ inline std::uint32_t key_at(const float* values, std::size_t e, std::size_t n, bool& valid) {
  valid = e < n;
  return valid ? magnitude_key(values[e]) : 0u;
}

__global__ void __launch_bounds__(kSelectThreads)
    write_mask_kernel(const float* __restrict__ values, Partition part, const SelectState* __restrict__ state,
                      const std::uint32_t* __restrict__ block_hist, unsigned long long* __restrict__ words) {
  using Reduce = cub::BlockReduce<std::uint32_t, kSelectThreads>;
  __shared__ typename Reduce::TempStorage reduce_temp;
  __shared__ std::uint32_t ties_before_block;
  __shared__ std::uint32_t warp_ties[kSelectWarps];

  const std::uint32_t threshold = state->prefix;  // T
  const std::uint32_t need = state->rank;         // keys equal to T to take, lowest indices first
  const unsigned b = blockIdx.x;
  const std::size_t w0 = part.first_word(b);
  const std::size_t w1 = part.first_word(b + 1);
  const unsigned warp = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;

  // The fast path takes key >= cut: cut = T takes every tie, T + 1 none.
  std::uint32_t cut = threshold;
  bool ordered = false;
  std::uint32_t before = 0;
  if (state->partial != 0) {
    const unsigned low = threshold & (kBinsLow - 1);
    std::uint32_t sum = 0;
    for (unsigned i = threadIdx.x; i < b; i += kSelectThreads)
      sum += block_hist[static_cast<std::size_t>(i) * kBinsLow + low];
    sum = Reduce(reduce_temp).Sum(sum);
    if (threadIdx.x == 0) ties_before_block = sum;
    __syncthreads();
    before = ties_before_block;
    const std::uint32_t mine = block_hist[static_cast<std::size_t>(b) * kBinsLow + low];
    if (before >= need) {
      cut = threshold + 1;
    } else if (before + mine > need) {
      ordered = true;
    }
  }

  if (!ordered) {
    for (std::size_t w = w0 + warp; w < w1; w += kUnroll * kSelectWarps) {
      std::uint32_t lo[kUnroll], hi[kUnroll];
      bool lo_ok[kUnroll], hi_ok[kUnroll];
#pragma unroll
      for (unsigned u = 0; u < kUnroll; ++u) {
        const std::size_t ww = w + u * kSelectWarps;
        const std::size_t limit = ww < w1 ? part.n : 0;  // words past the block's range read nothing
        lo[u] = key_at(values, 64 * ww + lane, limit, lo_ok[u]);
        hi[u] = key_at(values, 64 * ww + 32 + lane, limit, hi_ok[u]);
      }
#pragma unroll
      for (unsigned u = 0; u < kUnroll; ++u) {
        const unsigned lo_bits = __ballot_sync(kFullWarp, lo_ok[u] && lo[u] >= cut);
        const unsigned hi_bits = __ballot_sync(kFullWarp, hi_ok[u] && hi[u] >= cut);
        const std::size_t ww = w + u * kSelectWarps;
        if (lane == 0 && ww < w1) words[ww] = lo_bits | (static_cast<unsigned long long>(hi_bits) << 32);
      }
    }
    return;
  }

  // The block where the cut falls inside the ties: tiles of kSelectWarps words, one per warp,
  // ties ranked by index through a prefix sum of the warps' tie counts.
  std::uint32_t ties_before_tile = before;
  for (std::size_t tile = w0; tile < w1; tile += kSelectWarps) {
    const std::size_t ww = tile + warp;
    const std::size_t limit = ww < w1 ? part.n : 0;
    bool lo_ok, hi_ok;
    const std::uint32_t lo = key_at(values, 64 * ww + lane, limit, lo_ok);
    const std::uint32_t hi = key_at(values, 64 * ww + 32 + lane, limit, hi_ok);
    const unsigned long long above =
        __ballot_sync(kFullWarp, lo_ok && lo > threshold) |
        (static_cast<unsigned long long>(__ballot_sync(kFullWarp, hi_ok && hi > threshold)) << 32);
    const unsigned long long ties =
        __ballot_sync(kFullWarp, lo_ok && lo == threshold) |
        (static_cast<unsigned long long>(__ballot_sync(kFullWarp, hi_ok && hi == threshold)) << 32);
    if (lane == 0) warp_ties[warp] = static_cast<std::uint32_t>(__popcll(ties));
    __syncthreads();
    std::uint32_t ties_before_word = ties_before_tile;
    std::uint32_t tile_ties = 0;
    for (unsigned i = 0; i < kSelectWarps; ++i) {
      if (i < warp) ties_before_word += warp_ties[i];
      tile_ties += warp_ties[i];
    }
    __syncthreads();  // warp_ties is rewritten by the next tile
    if (lane == 0 && ww < w1) {
      unsigned long long kept = 0;
      if (ties_before_word < need) {
        std::uint32_t take = need - ties_before_word;
        for (unsigned long long rest = ties; rest != 0 && take > 0; --take) {
          const unsigned long long lowest = rest & (~rest + 1);
          kept |= lowest;
          rest ^= lowest;
        }
      }
      words[ww] = above | kept;
    }
    ties_before_tile += tile_ties;
  }
}

// k == n: every bit below n.
__global__ void set_first_bits_kernel(unsigned long long* __restrict__ words, std::size_t nw, std::size_t n) {
  for (std::size_t w = global_thread(); w < nw; w += grid_threads()) {
    const std::size_t bits = n - 64 * w;
    words[w] = bits >= 64 ? ~0ull : (1ull << bits) - 1;
  }
}

}  // namespace

void topk_abs_mask(std::span<const float> values, std::size_t k, std::span<std::uint64_t> mask_words) {
  const std::size_t n = values.size();
  checks::topk_abs_mask_sizes(n, k, mask_words.size());
  if (n == 0) return;
  const std::size_t nw = mask_words.size();
  const cudaStream_t stream = current_stream();
  auto* words = reinterpret_cast<unsigned long long*>(mask_words.data());
  if (k == 0) {
    SCAPE_CUDA_CHECK(cudaMemsetAsync(words, 0, nw * sizeof(std::uint64_t), stream));
    return;
  }
  if (k == n) {
    launch(set_first_bits_kernel, nw, words, nw, n);
    return;
  }

  std::size_t blocks = (nw + kMinWordsPerBlock - 1) / kMinWordsPerBlock;
  blocks = blocks > kMaxSelectBlocks ? kMaxSelectBlocks : blocks;
  const Partition part{n, nw, static_cast<unsigned>(blocks)};

  // Scratch: the three merged histograms and the state (zeroed), then the per-block counts of
  // pass 3 (every entry written by pass 3 before the mask pass reads it).
  constexpr std::size_t kStateOffset = kBinsHigh + 2 * kBinsLow;
  constexpr std::size_t kStateWords = 4;
  static_assert(sizeof(SelectState) <= kStateWords * sizeof(std::uint32_t));
  Scratch<std::uint32_t> scratch(kStateOffset + kStateWords + blocks * kBinsLow, stream);
  std::uint32_t* hist1 = scratch.get();
  std::uint32_t* hist2 = hist1 + kBinsHigh;
  std::uint32_t* hist3 = hist2 + kBinsLow;
  auto* state = reinterpret_cast<SelectState*>(scratch.get() + kStateOffset);
  std::uint32_t* block_hist = scratch.get() + kStateOffset + kStateWords;
  SCAPE_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, (kStateOffset + kStateWords) * sizeof(std::uint32_t), stream));

  const float* v = values.data();
  const auto grid = static_cast<unsigned>(blocks);
  histogram_kernel<kBinsHigh><<<grid, kSelectThreads, 0, stream>>>(v, part, 20, 0u, state, hist1, nullptr);
  SCAPE_CUDA_CHECK_LAUNCH();
  pick_kernel<kBinsHigh><<<1, kPickThreads, 0, stream>>>(hist1, 20, state, static_cast<std::uint32_t>(k), false);
  SCAPE_CUDA_CHECK_LAUNCH();
  histogram_kernel<kBinsLow><<<grid, kSelectThreads, 0, stream>>>(v, part, 10, 0x7ff00000u, state, hist2, nullptr);
  SCAPE_CUDA_CHECK_LAUNCH();
  pick_kernel<kBinsLow><<<1, kPickThreads, 0, stream>>>(hist2, 10, state, 0u, false);
  SCAPE_CUDA_CHECK_LAUNCH();
  histogram_kernel<kBinsLow><<<grid, kSelectThreads, 0, stream>>>(v, part, 0, 0x7ffffc00u, state, hist3, block_hist);
  SCAPE_CUDA_CHECK_LAUNCH();
  pick_kernel<kBinsLow><<<1, kPickThreads, 0, stream>>>(hist3, 0, state, 0u, true);
  SCAPE_CUDA_CHECK_LAUNCH();
  write_mask_kernel<<<grid, kSelectThreads, 0, stream>>>(v, part, state, block_hist, words);
  SCAPE_CUDA_CHECK_LAUNCH();
}

std::size_t topk_abs_indices(std::span<const float> values, std::size_t k, std::span<std::uint32_t> out) {
  checks::topk_abs_indices_sizes(k, out.size());
  const std::size_t nw = words_for(values.size());
  Scratch<std::uint64_t> mask(nw, current_stream());
  topk_abs_mask(values, k, {mask.get(), nw});
  return bits_to_indices({mask.get(), nw}, 0, out.first(k));
}

}  // namespace scape::kernels::cuda
