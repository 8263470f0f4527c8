// How optimizer.hierarchy = "node" splits the layout among the G rails of a node
// (docs/algorithms.md, "Hierarchy"): rail l (local rank l of every node) runs the method on its
// part alone. The part is a list of pieces of the flat buffer, stepped as a layout of its own.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "core/layout.hpp"
#include "core/optimizer_config.hpp"

namespace scape {

struct RailPart {
  // A contiguous range of the full flat buffer.
  struct Piece {
    std::size_t offset = 0;
    std::size_t size = 0;
  };
  std::vector<Piece> pieces;  // in the order the rail's layout packs them
  ParamLayout layout;         // the pieces as tensors (names, shapes, decay flags kept), back to back

  std::size_t size() const { return layout.size(); }
};

// The G rails' parts of `layout`.
// - tensors: whole tensors, dealt largest first (ties: the earlier tensor) to the rail whose part
//   is smallest so far (ties: the lower rail); each rail keeps its tensors in layout order. A
//   tensor larger than N/G stays whole on one rail, whose part then exceeds N/G.
// - rows: every tensor cut on dim 0 into G slices as FSDP2 shards it (torch.chunk: ceil(d0/G)
//   rows a slice, the last slices short or empty); slice l of every tensor goes to rail l, in
//   layout order, and an empty slice is left out.
// Throws std::invalid_argument naming optimizer.rail_split when a rail would get no parameters.
std::vector<RailPart> split_into_rails(const ParamLayout& layout, int rails, RailSplit split);

// The rail a hierarchical step waits for: the one with the largest part (ties: the lower rail).
// The step model costs it and calibration reads its records.
std::size_t largest_rail(std::span<const RailPart> parts);

// packed (part.size() values) <- the part's pieces of full (N values), in order.
void pack_rail(const RailPart& part, std::span<const float> full, std::span<float> packed);
// The part's pieces of full <- packed.
void unpack_rail(const RailPart& part, std::span<const float> packed, std::span<float> full);

}  // namespace scape
