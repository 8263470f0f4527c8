// Pieces shared by the optimizers: per-step Adam scalars, weight decay by tensor flag, and the
// dense inner step over a range of the flat buffer (docs/algorithms.md, "Dense references").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/communicator.hpp"
#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "kernels/backend.hpp"
#include "kernels/kernel_types.hpp"

namespace scape::detail {

// Throws std::invalid_argument unless params and grads both have the layout size n.
void check_step_sizes(std::span<const float> params, std::span<const float> grads, std::size_t n);

// Scalars of step t with learning rate eta; `decayed` selects the theta multiplier 1 - eta*lambda.
kernels::AdamScalars adam_scalars(const CommonOptimizerConfig& c, double eta, int t, bool decayed);

// Calls fn(lo, hi, decay) for every piece of [begin, end) that lies in one tensor.
template <typename Fn>
void for_each_tensor_piece(const ParamLayout& layout, std::size_t begin, std::size_t end, Fn fn) {
  for (const auto& slot : layout.slots()) {
    const std::size_t lo = slot.offset > begin ? slot.offset : begin;
    const std::size_t hi = slot.end() < end ? slot.end() : end;
    if (lo < hi) fn(lo, hi, slot.decay);
  }
}

// The weight decay of [0, n) as pieces for the kernels that decay inside a pass of their own
// (keep_and_decay_at, decay_update_statistics): ends[p] and factors[p], 1 - eta lambda for a
// decayed tensor and 1 for the others (x * 1 is x), as apply_weight_decay scales them.
void weight_decay_pieces(const ParamLayout& layout, std::size_t n, const CommonOptimizerConfig& c, double eta,
                         std::vector<std::uint64_t>& ends, std::vector<float>& factors);

// theta[j] *= 1 - eta*lambda for every flagged j in [begin, end), on backend k.
void apply_weight_decay(kernels::KernelBackend& k, const ParamLayout& layout, std::span<float> theta, std::size_t begin,
                        std::size_t end, const CommonOptimizerConfig& c, double eta);

// One dense AdamW or AdamS step on [begin, end) of theta (full buffer), with decay by tensor
// flag, on backend k. m, v and g are indexed from `begin` (v is unused for AdamS).
void dense_inner_step(kernels::KernelBackend& k, InnerRule rule, const ParamLayout& layout, std::span<float> theta,
                      std::size_t begin, std::size_t end, std::span<float> m, std::span<float> v,
                      std::span<const float> g, const CommonOptimizerConfig& c, double eta, int t);

// Global-norm clipping (docs/algorithms.md, clip_grad): the factor kappa / (nu + 1e-6) by which
// the synchronized gradient is scaled when it is below 1, else 1 (and 1 when clip_grad = 0).
// `part` is this worker's part of it; when `parts_split` (each owner holds its own part) the
// parts' sums of squares are all-gathered ("clip_norm_all_gather", 8 bytes a worker) and added
// in rank order, else `part` is the whole gradient.
double clip_factor(kernels::KernelBackend& k, kernels::Buffer<double>& partial, Communicator& comm,
                   std::span<const float> part, double clip_grad, bool parts_split);
// Scales g by clip_factor in place; returns the factor.
double clip_gradient(kernels::KernelBackend& k, kernels::Buffer<double>& partial, Communicator& comm,
                     std::span<float> g, double clip_grad, bool parts_split);

}  // namespace scape::detail
