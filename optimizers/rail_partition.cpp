// The rails' parts of a layout under optimizer.rail_split (rail_partition.hpp).
#include "optimizers/rail_partition.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

namespace scape {
namespace {

void add_piece(RailPart& part, const TensorSlot& slot, std::size_t offset, std::vector<std::size_t> shape) {
  part.layout.add(slot.name, shape, slot.decay);
  part.pieces.push_back({offset, part.layout.slots().back().numel()});
}

// A part indexes what its source does: a predictor's unbounded layout (Llama 2 7B) splits into
// unbounded parts, an optimizer's 32-bit one into 32-bit ones.
std::vector<RailPart> empty_parts(const ParamLayout& layout, int rails) {
  return std::vector<RailPart>(static_cast<std::size_t>(rails), RailPart{{}, ParamLayout(layout.max_elements())});
}

std::vector<RailPart> whole_tensors(const ParamLayout& layout, int rails) {
  const auto& slots = layout.slots();
  std::vector<std::size_t> order(slots.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return slots[a].numel() > slots[b].numel(); });
  std::vector<std::size_t> load(static_cast<std::size_t>(rails), 0);
  std::vector<int> rail_of(slots.size(), 0);
  for (std::size_t s : order) {
    const auto lightest = std::min_element(load.begin(), load.end());  // the first of equal loads
    rail_of[s] = static_cast<int>(lightest - load.begin());
    *lightest += slots[s].numel();
  }
  std::vector<RailPart> parts = empty_parts(layout, rails);
  for (std::size_t s = 0; s < slots.size(); ++s) {
    add_piece(parts[static_cast<std::size_t>(rail_of[s])], slots[s], slots[s].offset, slots[s].shape);
  }
  return parts;
}

std::vector<RailPart> row_slices(const ParamLayout& layout, int rails) {
  std::vector<RailPart> parts = empty_parts(layout, rails);
  const auto g = static_cast<std::size_t>(rails);
  for (const TensorSlot& slot : layout.slots()) {
    const std::size_t rows = slot.shape.front();
    const std::size_t row_size = slot.numel() / rows;
    const std::size_t chunk = (rows + g - 1) / g;  // torch.chunk's rows a slice
    for (std::size_t l = 0; l < g; ++l) {
      const std::size_t first = std::min(rows, l * chunk), last = std::min(rows, (l + 1) * chunk);
      if (last == first) continue;
      std::vector<std::size_t> shape = slot.shape;
      shape.front() = last - first;
      add_piece(parts[l], slot, slot.offset + first * row_size, std::move(shape));
    }
  }
  return parts;
}

}  // namespace

std::vector<RailPart> split_into_rails(const ParamLayout& layout, int rails, RailSplit split) {
  if (rails < 1) throw std::invalid_argument("split_into_rails: rails must be >= 1, got " + std::to_string(rails));
  std::vector<RailPart> parts = split == RailSplit::rows ? row_slices(layout, rails) : whole_tensors(layout, rails);
  for (std::size_t l = 0; l < parts.size(); ++l) {
    if (parts[l].size() == 0) {
      throw std::invalid_argument(std::string("optimizer.rail_split: \"") + to_string(split) + "\" leaves rail " +
                                  std::to_string(l) + " of " + std::to_string(rails) + " without parameters (" +
                                  std::to_string(layout.slots().size()) +
                                  " tensors); use fewer topology.ranks_per_node or the other split");
    }
  }
  return parts;
}

std::size_t largest_rail(std::span<const RailPart> parts) {
  const auto largest = std::max_element(parts.begin(), parts.end(),
                                        [](const RailPart& a, const RailPart& b) { return a.size() < b.size(); });
  return static_cast<std::size_t>(largest - parts.begin());
}

void pack_rail(const RailPart& part, std::span<const float> full, std::span<float> packed) {
  std::size_t at = 0;
  for (const auto& p : part.pieces) {
    std::memcpy(packed.data() + at, full.data() + p.offset, p.size * sizeof(float));
    at += p.size;
  }
}

void unpack_rail(const RailPart& part, std::span<const float> packed, std::span<float> full) {
  std::size_t at = 0;
  for (const auto& p : part.pieces) {
    std::memcpy(full.data() + p.offset, packed.data() + at, p.size * sizeof(float));
    at += p.size;
  }
}

}  // namespace scape
