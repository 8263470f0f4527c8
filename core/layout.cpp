// Flat parameter layout and shard rule (docs/algorithms.md, "Flat layout and shards").
#include "core/layout.hpp"

#include <stdexcept>

namespace scape {

std::size_t TensorSlot::numel() const {
  std::size_t n = 1;
  for (std::size_t d : shape) n *= d;
  return n;
}

std::size_t ParamLayout::add(std::string name, std::vector<std::size_t> shape, bool decay) {
  if (name.empty()) throw std::invalid_argument("ParamLayout::add: tensor name is empty");
  for (const auto& s : slots_) {
    if (s.name == name) throw std::invalid_argument("ParamLayout::add: duplicate tensor name '" + name + "'");
  }
  if (shape.empty()) throw std::invalid_argument("ParamLayout::add: tensor '" + name + "' has no dimensions");
  for (std::size_t d : shape) {
    if (d == 0) throw std::invalid_argument("ParamLayout::add: tensor '" + name + "' has a zero dimension");
  }
  TensorSlot slot{std::move(name), size_, std::move(shape), decay};
  const std::size_t numel = slot.numel();
  if (numel > max_elements_ - size_) {
    const std::string limit =
        max_elements_ == kMaxIndexed ? "2^32-1 elements (32-bit indices)" : std::to_string(max_elements_) + " elements";
    throw std::invalid_argument("ParamLayout::add: tensor '" + slot.name + "' makes the flat buffer exceed " + limit);
  }
  size_ += numel;
  slots_.push_back(std::move(slot));
  return slots_.size() - 1;
}

const TensorSlot& ParamLayout::slot(std::string_view name) const {
  for (const auto& s : slots_) {
    if (s.name == name) return s;
  }
  throw std::out_of_range("ParamLayout::slot: no tensor named '" + std::string(name) + "'");
}

Sharding::Sharding(std::size_t n, int workers) : n_(n), workers_(workers) {
  if (workers < 1) {
    throw std::invalid_argument("Sharding: workers must be >= 1, got " + std::to_string(workers));
  }
  const std::size_t w = static_cast<std::size_t>(workers);
  const std::size_t chunks = (n + kAlign * w - 1) / (kAlign * w);
  shard_size_ = kAlign * chunks;
}

std::size_t Sharding::begin(int w) const {
  const std::size_t b = static_cast<std::size_t>(w) * shard_size_;
  return b < n_ ? b : n_;
}

std::size_t Sharding::end(int w) const {
  const std::size_t e = static_cast<std::size_t>(w + 1) * shard_size_;
  return e < n_ ? e : n_;
}

int Sharding::owner(std::size_t index) const {
  if (index >= n_) throw std::out_of_range("Sharding::owner: index beyond N");
  return static_cast<int>(index / shard_size_);
}

std::vector<std::size_t> Sharding::sizes() const {
  std::vector<std::size_t> out(static_cast<std::size_t>(workers_));
  for (int w = 0; w < workers_; ++w) out[static_cast<std::size_t>(w)] = size(w);
  return out;
}

}  // namespace scape
