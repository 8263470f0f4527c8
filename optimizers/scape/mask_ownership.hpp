// Who chooses which bits of SCAPE's partitioned mask, and how many (docs/algorithms.md, "SCAPE",
// mask scope and ownership): each worker owns one contiguous range of the flat buffer, cut into
// pieces that it selects separately. Sharded state, or mask_scope = shard: the shard rule's
// ranges (multiples of 64). Replicated state with mask_scope = tensor: whole tensors dealt in
// layout order as contiguous runs of about N / W elements each (tensor_runs). Pieces: under mask_scope = tensor
// every tensor (or its fragment in a shard) is a piece of k = max(1, floor(rho n)) bits, and a
// tensor named in dense_tensors keeps all its bits; under mask_scope = shard the whole range is
// one piece of k_for(rho, n) = ceil(rho n) bits. The owner's bits travel as the mask words that
// cover its range (word_begin .. word_begin + word_count); neighbours may share a boundary word.
#pragma once

#include <cstddef>
#include <vector>

#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "optimizers/scape/scape_config.hpp"

namespace scape {

struct MaskPiece {
  std::size_t begin = 0, end = 0;  // elements of the flat buffer
  bool dense = false;              // every bit set whatever the density
};

class MaskOwnership {
 public:
  // Throws std::invalid_argument when workers < 1.
  MaskOwnership(const ParamLayout& layout, int workers, const CommonOptimizerConfig& config,
                const ScapeSwitches& scape);

  int workers() const { return static_cast<int>(ranges_.size()); }
  std::size_t n() const { return n_; }
  std::size_t begin(int w) const { return ranges_[static_cast<std::size_t>(w)].begin; }
  std::size_t end(int w) const { return ranges_[static_cast<std::size_t>(w)].end; }
  std::size_t size(int w) const { return end(w) - begin(w); }
  // Whether every range starts on a word boundary (the shard rule's ranges do).
  bool aligned() const { return aligned_; }
  // The mask words that carry owner w's bits, and the bits of those words up to its end.
  std::size_t word_begin(int w) const { return begin(w) / 64; }
  std::size_t word_count(int w) const;
  std::size_t segment_bits(int w) const { return size(w) == 0 ? 0 : end(w) - 64 * word_begin(w); }
  const std::vector<MaskPiece>& pieces(int w) const { return pieces_[static_cast<std::size_t>(w)]; }
  // Bits owner w sets at density rho, and their sum K over the owners.
  std::size_t k(int w, double rho) const;
  std::size_t k_total(double rho) const;
  std::vector<std::size_t> k_per_owner(double rho) const;

 private:
  std::size_t n_;
  bool per_tensor_;
  bool aligned_ = true;
  std::vector<MaskPiece> ranges_;  // one per worker (dense unused)
  std::vector<std::vector<MaskPiece>> pieces_;
};

// Replicated mask_scope = tensor ownership: the [begin, end) range of each of `workers` owners.
std::vector<MaskPiece> tensor_runs(const ParamLayout& layout, int workers);

// k of one tensor piece of n elements at density rho: all n when rho >= 1, else
// max(1, floor(rho n)) with the product taken as the integer it lies within 1e-9 of.
std::size_t k_tensor_piece(double rho, std::size_t n);

}  // namespace scape
