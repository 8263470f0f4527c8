// Flat parameter layout: named tensor slots in one fp32 buffer, and the shard rule that
// splits that buffer among W workers (docs/algorithms.md, "Flat layout and shards").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace scape {

// One tensor inside the flat buffer. `decay` says whether decoupled weight decay applies.
struct TensorSlot {
  std::string name;
  std::size_t offset = 0;
  std::vector<std::size_t> shape;
  bool decay = false;

  std::size_t numel() const;
  std::size_t end() const { return offset + numel(); }
};

// Tensors packed back to back in insertion order; N = size().
class ParamLayout {
 public:
  // Masks and sparse payloads carry 32-bit indices, so a layout an optimizer steps holds at
  // most 2^32 - 1 elements. The closed forms (optimizers/volume.hpp) and the predictor index
  // nothing: they may describe larger models (Llama 2 7B) with kUnbounded.
  static constexpr std::size_t kMaxIndexed = 0xFFFFFFFFu;
  static constexpr std::size_t kUnbounded = static_cast<std::size_t>(-1);

  explicit ParamLayout(std::size_t max_elements = kMaxIndexed) : max_elements_(max_elements) {}

  // Appends a tensor and returns its slot index. Throws std::invalid_argument on an empty
  // or duplicate name, a zero dimension, or a total size above max_elements.
  std::size_t add(std::string name, std::vector<std::size_t> shape, bool decay);

  std::size_t size() const { return size_; }
  std::size_t max_elements() const { return max_elements_; }
  const std::vector<TensorSlot>& slots() const { return slots_; }
  // Throws std::out_of_range naming the tensor when it does not exist.
  const TensorSlot& slot(std::string_view name) const;

 private:
  std::size_t max_elements_;
  std::vector<TensorSlot> slots_;
  std::size_t size_ = 0;
};

// Shard rule: s = 64 * ceil(N / (64 W)); shard w is [w s, min((w+1) s, N)), possibly short or
// empty at the end. Boundaries are multiples of 64 so a shard's mask bits are whole words.
class Sharding {
 public:
  static constexpr std::size_t kAlign = 64;

  // Throws std::invalid_argument when workers < 1.
  Sharding(std::size_t n, int workers);

  std::size_t n() const { return n_; }
  int workers() const { return workers_; }
  std::size_t shard_size() const { return shard_size_; }
  std::size_t padded_size() const { return shard_size_ * static_cast<std::size_t>(workers_); }
  std::size_t begin(int w) const;
  std::size_t end(int w) const;
  std::size_t size(int w) const { return end(w) - begin(w); }
  // Number of 64-bit mask words that cover shard w.
  std::size_t words(int w) const { return (size(w) + 63) / 64; }
  int owner(std::size_t index) const;
  // Element counts of every shard, in rank order (the counts of a reduce-scatter of N values).
  std::vector<std::size_t> sizes() const;

 private:
  std::size_t n_;
  int workers_;
  std::size_t shard_size_;
};

}  // namespace scape
