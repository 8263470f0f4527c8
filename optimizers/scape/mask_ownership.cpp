// SCAPE's mask owners and pieces (optimizers/scape/mask_ownership.hpp).
#include "optimizers/scape/mask_ownership.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/schedule.hpp"

namespace scape {

std::size_t k_tensor_piece(double rho, std::size_t n) {
  if (n == 0) return 0;
  if (rho >= 1.0) return n;
  const double x = rho * static_cast<double>(n);
  const double nearest = std::round(x);
  const double k = std::abs(x - nearest) <= 1e-9 * std::max(1.0, x) ? nearest : std::floor(x);
  return std::clamp(static_cast<std::size_t>(std::max(0.0, k)), std::size_t{1}, n);
}

std::vector<MaskPiece> tensor_runs(const ParamLayout& layout, int workers) {
  // The artifact's rule (fp8_topk_adams_reducer.py, commit 1a39ade, the reducer's __init__):
  // owner w takes tensors until its own count reaches N / W (compared as count * W >= N,
  // exactly; the tensor that crosses it stays, the overshoot is not carried), and hands on
  // earlier when only as many tensors remain as later owners, so each gets one. The artifact
  // deals in its gradient buffer's order, which Megatron fills from the last parameter back
  // (param_and_grad_buffer.py); here the layout is dealt forward, so that each owner's range is
  // contiguous in the flat buffer. On the Llama tables the busiest owner is the same (the
  // embedding or the head alone, from 16 GPUs) and within 3% at 4 and 8 (docs/PREDICTING.md).
  const auto& slots = layout.slots();
  const std::size_t n = layout.size(), w_count = static_cast<std::size_t>(workers);
  std::vector<MaskPiece> runs(w_count);
  std::size_t w = 0, count = 0;
  std::size_t start = 0;
  for (std::size_t j = 0; j < slots.size(); ++j) {
    count += slots[j].numel();
    const std::size_t remaining = slots.size() - 1 - j;
    const std::size_t later = w_count - 1 - w;
    if (w + 1 < w_count && remaining > 0 && (count * w_count >= n || remaining <= later)) {
      runs[w] = {start, slots[j].end(), false};
      start = slots[j].end();
      ++w;
      count = 0;
    }
  }
  runs[w] = {start, n, false};
  for (std::size_t r = w + 1; r < w_count; ++r) runs[r] = {n, n, false};
  return runs;
}

MaskOwnership::MaskOwnership(const ParamLayout& layout, int workers, const CommonOptimizerConfig& config,
                             const ScapeSwitches& scape)
    : n_(layout.size()),
      // local_union masks are not partitioned: each worker ranks the whole buffer.
      per_tensor_(scape.mask_scope == MaskScope::tensor && scape.mask_partition == MaskPartition::partitioned) {
  if (workers < 1) throw std::invalid_argument("MaskOwnership: workers must be >= 1");
  if (per_tensor_ && !config.sharded) {  // whole tensors for replicated state
    ranges_ = tensor_runs(layout, workers);
  } else {
    const Sharding shards(n_, workers);
    for (int w = 0; w < workers; ++w) ranges_.push_back({shards.begin(w), shards.end(w), false});
  }
  pieces_.resize(ranges_.size());
  for (std::size_t w = 0; w < ranges_.size(); ++w) {
    const MaskPiece range = ranges_[w];
    if (range.begin % 64 != 0 && range.begin < range.end) aligned_ = false;
    if (!per_tensor_) {
      if (range.begin < range.end) pieces_[w].push_back(range);
      continue;
    }
    for (const auto& slot : layout.slots()) {
      const std::size_t lo = std::max(slot.offset, range.begin), hi = std::min(slot.end(), range.end);
      if (lo < hi) pieces_[w].push_back({lo, hi, scape.dense_tensor(slot.name)});
    }
  }
}

std::size_t MaskOwnership::word_count(int w) const {
  if (size(w) == 0) return 0;
  return (end(w) + 63) / 64 - word_begin(w);
}

std::size_t MaskOwnership::k(int w, double rho) const {
  std::size_t k = 0;
  for (const auto& p : pieces(w)) {
    const std::size_t n = p.end - p.begin;
    if (p.dense) {
      k += n;
    } else {
      k += per_tensor_ ? k_tensor_piece(rho, n) : k_for(rho, n);
    }
  }
  return k;
}

std::size_t MaskOwnership::k_total(double rho) const {
  std::size_t k = 0;
  for (int w = 0; w < workers(); ++w) k += this->k(w, rho);
  return k;
}

std::vector<std::size_t> MaskOwnership::k_per_owner(double rho) const {
  std::vector<std::size_t> out(ranges_.size());
  for (int w = 0; w < workers(); ++w) out[static_cast<std::size_t>(w)] = k(w, rho);
  return out;
}

}  // namespace scape
