// Exact top-k by magnitude: a two-level radix select on the bit pattern of |x|. Pass 1
// histograms the high 15 bits and finds the bucket holding the k-th largest; pass 2 writes the
// mask bits above that bucket and marks the bucket's members as candidates; passes 3 and 4
// touch only the candidates: histogram their low 16 bits, then take those above the threshold
// and the ties at it, lowest indices first (an introselect replaces the low histogram when the
// bucket holds few candidates). Only passes 1 and 2 read all of the input. Below 2^16 elements
// an introselect on a copy of the keys replaces the two histogram passes. A sparse selection
// (k <= n/8) first tries a threshold estimated from a strided sample: one pass, its chunks in
// parallel, keeps every key at or above it, and a select on those candidates (radix when they
// are many, else an introselect) finds the exact threshold; when the estimate keeps fewer than
// k keys (or too many), the paths above run instead. The one pass replaces the two histogram
// passes, so it is the path sparse masks take.
#include <algorithm>
#include <bit>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <omp.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kernels/cpu/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

// With the sign bit cleared, the uint32 order of a float's bits is its magnitude order
// (+0 == -0, NaN above +inf), so magnitudes can be ranked with integer histograms.
inline std::uint32_t magnitude_key(float x) { return std::bit_cast<std::uint32_t>(x) & 0x7fffffffu; }

constexpr unsigned kLowBits = 16;
constexpr std::size_t kHighBuckets = std::size_t{1} << (31 - kLowBits);  // the sign bit is clear
constexpr std::size_t kLowBuckets = std::size_t{1} << kLowBits;
constexpr std::uint32_t kLowMask = (std::uint32_t{1} << kLowBits) - 1;

// Below this many elements per chunk the per-chunk histograms cost more than the work they split.
constexpr std::size_t kMinChunkElements = std::size_t{1} << 18;

// Below this many elements the radix select loses to an introselect on a copy of the keys:
// clearing and faulting in ~0.4 MB of histograms costs ~0.2 ms, an introselect on 2^15 keys
// about as much (measured single-threaded on the dev VM).
constexpr std::size_t kRadixMinElements = std::size_t{1} << 16;

// Splits [0, n) into contiguous chunks that start on word boundaries, so each chunk owns its
// mask words. The split depends only on n and the thread count it is made with; every pass
// reuses it, which is what lets per-chunk tie counts from one pass steer the next.
struct Chunking {
  std::size_t n = 0;
  std::size_t words = 0;
  std::size_t count = 1;

  std::size_t first_word(std::size_t c) const { return words * c / count; }
  std::size_t begin(std::size_t c) const { return std::min(n, 64 * first_word(c)); }
  std::size_t end(std::size_t c) const { return std::min(n, 64 * first_word(c + 1)); }
};

Chunking make_chunking(std::size_t n) {
  const auto threads = static_cast<std::size_t>(std::max(1, omp_get_max_threads()));
  const std::size_t words = words_for(n);
  return {n, words, std::clamp<std::size_t>(n / kMinChunkElements, 1, std::min(threads, words))};
}

// Calls body(chunk) for every chunk, one chunk per thread: each pass's per-chunk histogram rows
// and mask words then have a single writer.
template <typename Body>
void for_each_chunk(const Chunking& chunks, Body body) {
  const auto nc = static_cast<std::int64_t>(chunks.count);
#pragma omp parallel for schedule(static, 1) if (nc > 1)
  for (std::int64_t c = 0; c < nc; ++c) body(static_cast<std::size_t>(c));
}

// Where the rank-th largest (1-based) sits in per-chunk histograms (chunk c occupies
// [c*buckets, (c+1)*buckets)) read from the top bucket down: its bucket, how many of that
// bucket's entries fall inside the top `rank`, and how many entries the bucket holds. The scan
// sums the chunks bucket by bucket and stops at the bucket, so no merged histogram is built.
struct BucketPick {
  std::uint32_t bucket = 0;
  std::uint64_t take = 0;
  std::uint64_t count = 0;
};

BucketPick pick_bucket(const std::vector<std::uint32_t>& per_chunk, std::size_t chunks, std::size_t buckets,
                       std::uint64_t rank) {
  std::uint64_t above = 0;
  for (std::size_t b = buckets; b-- > 0;) {
    std::uint64_t count = 0;
    for (std::size_t c = 0; c < chunks; ++c) count += per_chunk[c * buckets + b];
    if (above + count >= rank) return {static_cast<std::uint32_t>(b), rank - above, count};
    above += count;
  }
  throw std::logic_error("topk_abs_mask: histogram holds fewer entries than the rank sought");
}

// Per-thread scratch words, reused across calls and not cleared (every word is written before it
// is read): allocating them afresh maps and faults in new pages on every call, 16 pieces a step.
std::uint64_t* scratch_words(std::size_t size, int which) {
  thread_local std::vector<std::uint64_t> storage[2];
  std::vector<std::uint64_t>& words = storage[which];
  if (words.size() < size) words.resize(size);
  return words.data();
}

// Per-thread histogram storage, cleared on every call: allocating 0.1-0.4 MB afresh faults in
// new pages each time, which at 10^5 elements cost more than the pass that fills them.
std::vector<std::uint32_t>& cleared_histogram(std::size_t size, int which) {
  thread_local std::vector<std::uint32_t> storage[2];
  std::vector<std::uint32_t>& h = storage[which];
  h.assign(size, 0);
  return h;
}

const std::vector<std::uint32_t>& histogram_high(const float* values, const Chunking& chunks) {
  std::vector<std::uint32_t>& hist = cleared_histogram(chunks.count * kHighBuckets, 0);
  for_each_chunk(chunks, [&](std::size_t chunk) {
    std::uint32_t* h = hist.data() + chunk * kHighBuckets;
    for (std::size_t j = chunks.begin(chunk); j < chunks.end(chunk); ++j) ++h[magnitude_key(values[j]) >> kLowBits];
  });
  return hist;
}

// Which of the (up to 64) values at v have their high bits above bucket `high`, and which in it.
struct WordSplit {
  std::uint64_t above = 0;
  std::uint64_t inside = 0;
};

WordSplit split_word(const float* v, std::size_t len, std::uint32_t high) {
#if defined(__SSE2__)
  // Pass 2 is half of the top-k time; four lanes with movemask run it at memory speed, where
  // the scalar shift-or loop below is compute-bound at about half that.
  if (len == 64) {
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
    const __m128i bucket = _mm_set1_epi32(static_cast<int>(high));
    WordSplit split;
    for (unsigned q = 0; q < 16; ++q) {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 4 * q));
      // Bucket numbers are below 2^15, so the signed compare orders them correctly.
      const __m128i buckets = _mm_srli_epi32(_mm_and_si128(bits, magnitude), kLowBits);
      const auto above = static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(buckets, bucket))));
      const auto inside = static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(buckets, bucket))));
      split.above |= std::uint64_t{above} << (4 * q);
      split.inside |= std::uint64_t{inside} << (4 * q);
    }
    return split;
  }
#endif
  WordSplit split;
  for (std::size_t b = 0; b < len; ++b) {
    const std::uint32_t bucket = magnitude_key(v[b]) >> kLowBits;
    split.above |= std::uint64_t{bucket > high} << b;
    split.inside |= std::uint64_t{bucket == high} << b;
  }
  return split;
}

// Pass 2: words[w] gets the values above bucket `high` (all of them are in the top k),
// inside[w] those in it (the candidates the low bits decide between).
void split_at_bucket(const float* values, const Chunking& chunks, std::uint32_t high, std::uint64_t* words,
                     std::uint64_t* inside) {
  for_each_chunk(chunks, [&](std::size_t chunk) {
    for (std::size_t w = chunks.first_word(chunk); w < chunks.first_word(chunk + 1); ++w) {
      const WordSplit split = split_word(values + 64 * w, std::min<std::size_t>(64, chunks.n - 64 * w), high);
      words[w] = split.above;
      inside[w] = split.inside;
    }
  });
}

// Calls visit(j) for every set bit j of inside[] within chunk c, ascending.
template <typename Visit>
void for_each_in_chunk(const Chunking& chunks, std::size_t chunk, const std::uint64_t* inside, Visit visit) {
  for (std::size_t w = chunks.first_word(chunk); w < chunks.first_word(chunk + 1); ++w) {
    for (std::uint64_t bits = inside[w]; bits != 0; bits &= bits - 1) {
      visit(w, static_cast<unsigned>(std::countr_zero(bits)));
    }
  }
}

// Pass 3: histogram of the low bits of the candidates, per chunk.
const std::vector<std::uint32_t>& histogram_low(const float* values, const Chunking& chunks,
                                                const std::uint64_t* inside) {
  std::vector<std::uint32_t>& hist = cleared_histogram(chunks.count * kLowBuckets, 1);
  for_each_chunk(chunks, [&](std::size_t chunk) {
    std::uint32_t* h = hist.data() + chunk * kLowBuckets;
    for_each_in_chunk(chunks, chunk, inside, [&](std::size_t w, unsigned b) {
      ++h[magnitude_key(values[64 * w + b]) & kLowMask];
    });
  });
  return hist;
}

// The ties needed at the threshold go to the lowest indices: hand them out chunk by chunk.
std::vector<std::uint64_t> ties_per_chunk(std::uint64_t needed, const std::vector<std::uint32_t>& low_hist,
                                          std::uint32_t low, std::size_t chunks) {
  std::vector<std::uint64_t> taken(chunks, 0);
  for (std::size_t c = 0; c < chunks; ++c) {
    taken[c] = std::min<std::uint64_t>(needed, low_hist[c * kLowBuckets + low]);
    needed -= taken[c];
  }
  return taken;
}

// Pass 4: among the candidates, takes the low bits above `low` and, per chunk, the first
// ties_taken[c] equal to it.
void take_from_bucket(const float* values, const Chunking& chunks, const std::uint64_t* inside, std::uint32_t low,
                      const std::vector<std::uint64_t>& ties_taken, std::uint64_t* words) {
  for_each_chunk(chunks, [&](std::size_t chunk) {
    std::uint64_t ties_left = ties_taken[chunk];
    for_each_in_chunk(chunks, chunk, inside, [&](std::size_t w, unsigned b) {
      const std::uint32_t key_low = magnitude_key(values[64 * w + b]) & kLowMask;
      const bool tie_taken = key_low == low && ties_left > 0;
      ties_left -= tie_taken ? 1 : 0;
      if (key_low > low || tie_taken) words[w] |= std::uint64_t{1} << b;
    });
  });
}

// The k-th largest of `keys` (1 <= k <= keys.size()) and how many of the k largest equal it
// (the ties that must be taken at the threshold). Here by an introselect on the keys, which it
// takes by value: after nth_element everything before the k-th is >= it and everything after <= it.
struct KthKey {
  std::uint32_t key = 0;
  std::uint64_t ties = 0;
};

KthKey kth_largest_key_introselect(std::vector<std::uint32_t> keys, std::uint64_t k) {
  const auto kth = keys.begin() + static_cast<std::ptrdiff_t>(k - 1);
  std::nth_element(keys.begin(), kth, keys.end(), std::greater<>());
  const std::uint32_t key = *kth;
  const auto above = static_cast<std::uint64_t>(std::count_if(keys.begin(), kth, [&](std::uint32_t x) {
    return x > key;
  }));
  return {key, k - above};
}

// From this many keys a two-level radix select finds the k-th faster than the introselect:
// two linear passes and two 2^15-2^16-bucket histograms against nth_element's ~10 ns a key
// (the sampled path's ~1.25 k marked keys a tensor: 20 ms of a 16M-parameter step at 10%).
constexpr std::size_t kRadixKthMinKeys = std::size_t{1} << 15;

// The same k-th key and ties by the two histograms of select_radix over the keys themselves
// (high 15 bits, then the low 16 bits of those in the k-th's high bucket). The keys are
// magnitude keys, below 2^31, as the high histogram's size assumes.
KthKey kth_largest_key_radix(const std::vector<std::uint32_t>& keys, std::uint64_t k) {
  std::vector<std::uint32_t>& high_hist = cleared_histogram(kHighBuckets, 0);
  for (const std::uint32_t key : keys) ++high_hist[key >> kLowBits];
  const BucketPick high = pick_bucket(high_hist, 1, kHighBuckets, k);
  std::vector<std::uint32_t>& low_hist = cleared_histogram(kLowBuckets, 1);
  for (const std::uint32_t key : keys) {
    if ((key >> kLowBits) == high.bucket) ++low_hist[key & kLowMask];
  }
  const BucketPick low = pick_bucket(low_hist, 1, kLowBuckets, high.take);
  return {(high.bucket << kLowBits) | low.bucket, low.take};
}

KthKey kth_largest_key(std::vector<std::uint32_t> keys, std::uint64_t k) {
  if (keys.size() >= kRadixKthMinKeys) return kth_largest_key_radix(keys, k);
  return kth_largest_key_introselect(std::move(keys), k);
}

// Below this many candidates in the threshold bucket, an introselect on their low bits costs
// less than clearing and scanning the 2^16-bucket low histogram of every chunk.
constexpr std::uint64_t kFewCandidates = kLowBuckets / 8;

// Passes 3 and 4 for few candidates: their low bits in index order, chunk by chunk; the
// threshold from an introselect on a copy; the ties needed handed out to the lowest indices.
void take_from_few(const float* values, const Chunking& chunks, const std::uint64_t* inside, std::uint64_t take,
                   std::uint64_t candidates, std::uint64_t* words) {
  std::vector<std::uint32_t> keys;
  keys.reserve(candidates);
  std::vector<std::size_t> chunk_end(chunks.count);
  for (std::size_t c = 0; c < chunks.count; ++c) {
    for_each_in_chunk(chunks, c, inside, [&](std::size_t w, unsigned b) {
      keys.push_back(magnitude_key(values[64 * w + b]) & kLowMask);
    });
    chunk_end[c] = keys.size();
  }
  const KthKey threshold = kth_largest_key(keys, take);
  const std::uint32_t low = threshold.key;
  std::uint64_t needed = threshold.ties;
  std::vector<std::uint64_t> ties_taken(chunks.count, 0);
  for (std::size_t c = 0; c < chunks.count; ++c) {
    const auto first = keys.begin() + static_cast<std::ptrdiff_t>(c == 0 ? 0 : chunk_end[c - 1]);
    const auto last = keys.begin() + static_cast<std::ptrdiff_t>(chunk_end[c]);
    ties_taken[c] = std::min<std::uint64_t>(needed, static_cast<std::uint64_t>(std::count(first, last, low)));
    needed -= ties_taken[c];
  }
  take_from_bucket(values, chunks, inside, low, ties_taken, words);
}

// Large inputs: radix select on the high bits, then on the low bits of the candidates.
void select_radix(const float* values, const Chunking& chunks, std::uint64_t k, std::uint64_t* words,
                  std::uint64_t* inside) {
  const BucketPick high = pick_bucket(histogram_high(values, chunks), chunks.count, kHighBuckets, k);
  split_at_bucket(values, chunks, high.bucket, words, inside);
  if (high.count < kFewCandidates) {
    take_from_few(values, chunks, inside, high.take, high.count, words);
    return;
  }
  const std::vector<std::uint32_t>& low_hist = histogram_low(values, chunks, inside);
  const BucketPick low = pick_bucket(low_hist, chunks.count, kLowBuckets, high.take);
  take_from_bucket(values, chunks, inside, low.bucket, ties_per_chunk(low.take, low_hist, low.bucket, chunks.count),
                   words);
}

// Bits of the (up to 64) values at v whose magnitude key is at least `least` (> 0).
std::uint64_t at_least_word(const float* v, std::size_t len, std::uint32_t least) {
#if defined(__SSE2__)
  if (len == 64) {
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff);
    // Keys are below 2^31, so the signed compare orders them correctly.
    const __m128i below = _mm_set1_epi32(static_cast<int>(least - 1));
    std::uint64_t bits = 0;
    for (unsigned q = 0; q < 16; ++q) {
      const __m128i keys = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 4 * q)), magnitude);
      const auto hit = static_cast<unsigned>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(keys, below))));
      bits |= std::uint64_t{hit} << (4 * q);
    }
    return bits;
  }
#endif
  std::uint64_t bits = 0;
  for (std::size_t b = 0; b < len; ++b) bits |= std::uint64_t{magnitude_key(v[b]) >= least} << b;
  return bits;
}

// Selections this sparse or sparser try the sampled threshold first.
constexpr std::uint64_t kSampledMaxDensityInverse = 8;
constexpr std::size_t kSampleSize = 2048;

// The sampled threshold: the key of rank ~1.25 k of a strided sample, lowered by a margin of 8
// sample ranks, is at or below the k-th largest key unless the sample was unlucky. 0 when
// every key would qualify (nothing gained).
std::uint32_t sampled_threshold(const float* values, std::size_t n, std::uint64_t k) {
  const std::size_t s = std::min(n, kSampleSize), stride = n / s;
  std::vector<std::uint32_t> sample(s);
  for (std::size_t i = 0; i < s; ++i) sample[i] = magnitude_key(values[i * stride]);
  const std::size_t rank = std::min<std::size_t>(s, (5 * k * s + 4 * n - 1) / (4 * n) + 8);
  const auto pick = sample.begin() + static_cast<std::ptrdiff_t>(rank - 1);
  std::nth_element(sample.begin(), pick, sample.end(), std::greater<>());
  return *pick;
}

// One pass, chunk by chunk: inside[] marks the keys at or above `least`, and keys[c] gets
// chunk c's marked keys in index order. A chunk stops once it holds more than n/4 keys: the
// sampled path is then abandoned, and the ties that cause it should not fill memory.
std::vector<std::vector<std::uint32_t>> mark_at_least(const float* values, const Chunking& chunks, std::uint32_t least,
                                                      std::uint64_t* inside) {
  std::vector<std::vector<std::uint32_t>> keys(chunks.count);
  for_each_chunk(chunks, [&](std::size_t chunk) {
    std::vector<std::uint32_t>& out = keys[chunk];
    for (std::size_t w = chunks.first_word(chunk); w < chunks.first_word(chunk + 1); ++w) {
      if (out.size() > chunks.n / 4) break;
      inside[w] = at_least_word(values + 64 * w, std::min<std::size_t>(64, chunks.n - 64 * w), least);
      for (std::uint64_t bits = inside[w]; bits != 0; bits &= bits - 1) {
        out.push_back(magnitude_key(values[64 * w + static_cast<std::size_t>(std::countr_zero(bits))]));
      }
    }
  });
  return keys;
}

// Below this many marked keys the take pass, which reads only the n/64 marked words and the
// keys (both in cache), costs less than waking the other threads for it.
constexpr std::size_t kParallelTakeMinKeys = std::size_t{1} << 16;

// Among the marked keys, takes those above `threshold` and, per chunk, the first ties_taken[c]
// equal to it; writes every word of the mask.
void take_marked(const Chunking& chunks, const std::uint64_t* inside,
                 const std::vector<std::vector<std::uint32_t>>& keys, std::uint32_t threshold,
                 const std::vector<std::uint64_t>& ties_taken, std::size_t marked, std::uint64_t* words) {
  const auto take_chunk = [&](std::size_t chunk) {
    const std::uint32_t* next = keys[chunk].data();
    std::uint64_t ties = ties_taken[chunk];
    for (std::size_t w = chunks.first_word(chunk); w < chunks.first_word(chunk + 1); ++w) {
      std::uint64_t taken = 0;
      for (std::uint64_t bits = inside[w]; bits != 0; bits &= bits - 1) {
        const std::uint32_t key = *next++;
        const bool tie_taken = key == threshold && ties > 0;
        ties -= tie_taken ? 1 : 0;
        if (key > threshold || tie_taken) taken |= bits & (~bits + 1);  // the lowest set bit
      }
      words[w] = taken;
    }
  };
  if (marked >= kParallelTakeMinKeys) {
    for_each_chunk(chunks, take_chunk);
    return;
  }
  for (std::size_t c = 0; c < chunks.count; ++c) take_chunk(c);
}

// The sampled path (k <= n/8): one pass marks the keys at or above the sampled threshold
// (`inside`), and if they number at least k (and at most n/4, past which ties make the gather
// cost more than the histograms) an introselect on them gives the exact k-th key, whose ties go
// to the lowest indices, chunk by chunk. Returns false, having written nothing final, when the
// estimate does not hold.
bool select_sampled(const float* values, const Chunking& chunks, std::uint64_t k, std::uint64_t* words,
                    std::uint64_t* inside) {
  const std::uint32_t least = sampled_threshold(values, chunks.n, k);
  if (least == 0) return false;
  const std::vector<std::vector<std::uint32_t>> keys = mark_at_least(values, chunks, least, inside);
  std::vector<std::uint32_t> all;
  for (const auto& part : keys) all.insert(all.end(), part.begin(), part.end());
  const std::size_t marked = all.size();
  if (marked < k || marked > chunks.n / 4) return false;
  const KthKey kth = kth_largest_key(std::move(all), k);
  std::uint64_t needed = kth.ties;
  std::vector<std::uint64_t> ties_taken(chunks.count, 0);
  for (std::size_t c = 0; c < chunks.count; ++c) {
    const auto ties = static_cast<std::uint64_t>(std::count(keys[c].begin(), keys[c].end(), kth.key));
    ties_taken[c] = std::min<std::uint64_t>(needed, ties);
    needed -= ties_taken[c];
  }
  take_marked(chunks, inside, keys, kth.key, ties_taken, marked, words);
  return true;
}

// Small inputs: the histograms' fixed cost (~0.4 MB to clear and scan) dwarfs the data, so an
// introselect on a copy of the keys finds the threshold instead; one chunk takes all ties.
void select_small(const float* values, const Chunking& chunks, std::uint64_t k, std::uint64_t* words,
                  std::uint64_t* inside) {
  std::vector<std::uint32_t> keys(chunks.n);
  std::transform(values, values + chunks.n, keys.begin(), magnitude_key);
  const KthKey threshold = kth_largest_key(std::move(keys), k);
  split_at_bucket(values, chunks, threshold.key >> kLowBits, words, inside);
  take_from_bucket(values, chunks, inside, threshold.key & kLowMask, {threshold.ties}, words);
}

void set_first_bits(std::span<std::uint64_t> words, std::size_t n) {
  std::fill(words.begin(), words.end(), ~std::uint64_t{0});
  if (n % 64 != 0) words.back() = (std::uint64_t{1} << (n % 64)) - 1;
}

}  // namespace

void topk_abs_mask(std::span<const float> values, std::size_t k, std::span<std::uint64_t> mask_words) {
  const std::size_t n = values.size();
  checks::topk_abs_mask_sizes(n, k, mask_words.size());  // n within the 32-bit per-chunk histogram counters
  if (k == 0) {
    std::fill(mask_words.begin(), mask_words.end(), 0);
    return;
  }
  if (k == n) {
    set_first_bits(mask_words, n);
    return;
  }
  const Chunking chunks = make_chunking(n);
  // Candidate bits for the threshold bucket; every word is written before it is read.
  std::uint64_t* inside = scratch_words(chunks.words, 0);
  if (k <= n / kSampledMaxDensityInverse && select_sampled(values.data(), chunks, k, mask_words.data(), inside)) {
    return;
  }
  if (n < kRadixMinElements) {
    select_small(values.data(), chunks, k, mask_words.data(), inside);
  } else {
    select_radix(values.data(), chunks, k, mask_words.data(), inside);
  }
}

std::size_t topk_abs_indices(std::span<const float> values, std::size_t k, std::span<std::uint32_t> out) {
  checks::topk_abs_indices_sizes(k, out.size());
  const std::span<std::uint64_t> mask(scratch_words(words_for(values.size()), 1), words_for(values.size()));
  topk_abs_mask(values, k, mask);
  return bits_to_indices(mask, 0, out.first(k));
}

}  // namespace scape::kernels
