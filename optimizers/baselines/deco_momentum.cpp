// DeMo: local momentum, chunked DCT top-k extraction, sign of the averaged extracted part
// (docs/algorithms.md, "DeMo"). The transforms, selection and step run as backend kernels;
// coding and packing the message is host work on synchronized buffers, as for every collective.
#include "optimizers/baselines/deco_momentum.hpp"
#include "optimizers/baselines/coded_message.hpp"
#include "optimizers/baselines/deco_momentum_config.hpp"

#include <cmath>
#include <cstring>
#include <numbers>

#include "core/adam_step.hpp"
#include "core/metrics.hpp"
#include "core/wire_values.hpp"

namespace scape {

std::vector<float> dct_basis(std::size_t len) {
  std::vector<float> basis(len * len);
  for (std::size_t f = 0; f < len; ++f) {
    const double scale = std::sqrt((f == 0 ? 1.0 : 2.0) / static_cast<double>(len));
    for (std::size_t j = 0; j < len; ++j) {
      const double angle = std::numbers::pi * static_cast<double>(2 * j + 1) * static_cast<double>(f) /
                           (2.0 * static_cast<double>(len));
      basis[f * len + j] = static_cast<float>(scale * std::cos(angle));
    }
  }
  return basis;
}

// A sign step on its own momentum: AdamS, no v.
DecoMomentumOptimizer::DecoMomentumOptimizer(const CommonOptimizerConfig& config, const DecoMomentumSwitches& demo,
                                             const ParamLayout& layout, Communicator& comm, int total_steps)
    : OptimizerBase(config, InnerRule::adams, layout, comm, total_steps),
      demo_(demo),
      chunk_(demo.chunk),
      tail_(layout.size() % demo.chunk),
      entries_(kernels::chunk_topk_count(layout.size(), demo.chunk, demo.topk)) {
  const std::vector<float> basis = dct_basis(chunk_), tail = dct_basis(tail_);
  basis_.assign_zero(basis.size());
  tail_basis_.assign_zero(tail.size());
  kernels_.copy_bytes(basis.data(), basis_.data(), basis.size() * sizeof(float));
  kernels_.copy_bytes(tail.data(), tail_basis_.data(), tail.size() * sizeof(float));
  coeffs_.assign_zero(n_);
  removed_.assign_zero(n_);
  idx_.assign_zero(entries_);
  values_.assign_zero(entries_);
  const auto workers = static_cast<std::size_t>(comm.size());
  recv_idx_.assign_zero(entries_ * workers);
  recv_values_.assign_zero(entries_ * workers);
  positions_.assign_zero(kernels::words_for(n_));
  code_.assign_zero(kernels::ef_words(n_, entries_));
  const std::size_t message = code_.bytes() + entries_ * wire_bytes(config.wire_dtype);
  send_.resize(message);
  recv_.resize(message * workers);
  kernels_.synchronize();
}

void DecoMomentumOptimizer::transform(std::span<const float> x, bool inverse, std::span<float> out) {
  const std::size_t whole = n_ - tail_;
  kernels_.chunk_transform(x.first(whole), chunk_, basis_.span(), inverse, out.first(whole));
  if (tail_ > 0) kernels_.chunk_transform(x.subspan(whole), tail_, tail_basis_.span(), inverse, out.subspan(whole));
}

void DecoMomentumOptimizer::extract() {
  transform(m_.span(), false, coeffs_.span());
  kernels_.chunk_topk(coeffs_.span(), chunk_, demo_.topk, idx_.span(), values_.span());
  // m <- m - IDCT(extracted): the extracted coefficients alone, inverted, negated and added.
  kernels_.fill(coeffs_.span(), 0.0f);
  kernels_.expand(values_.span(), idx_.span(), coeffs_.span());
  transform(coeffs_.span(), true, removed_.span());
  kernels_.scale(removed_.span(), -1.0f);
  kernels_.accumulate(m_.span(), removed_.span());
}

void DecoMomentumOptimizer::exchange() {
  const auto workers = static_cast<std::size_t>(comm_.size());
  const std::size_t message = send_.size();
  // Positions of the coefficients among N, ascending (chunk by chunk, ascending within each).
  kernels_.zero_bytes(positions_.data(), positions_.bytes());
  kernels_.indices_to_bits(idx_.span(), 0, positions_.span());
  kernels_.ef_encode(positions_.span(), n_, entries_, code_.span());
  kernels_.synchronize();
  pack_coded_message(code_.span(), values_.span(), config_.wire_dtype, send_.data());
  const std::vector<std::size_t> counts(workers, message);
  comm_.all_gather_bytes(send_, recv_, counts, "demo_all_gather");
  unpack_coded_messages(kernels_, recv_, workers, n_, entries_, config_.wire_dtype, code_, recv_idx_.span(),
                        recv_values_.span());
  // The mean coefficient: summed one worker after another in rank order, then divided by W.
  kernels_.fill(coeffs_.span(), 0.0f);
  for (std::size_t r = 0; r < workers; ++r) {
    kernels_.scatter_add(coeffs_.span(), recv_idx_.span().subspan(r * entries_, entries_),
                   recv_values_.span().subspan(r * entries_, entries_));
  }
  kernels_.divide(coeffs_.span(), static_cast<float>(workers));
}

void DecoMomentumOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  metrics::mark_sparse_metrics_not_applicable(out);
  // m <- beta1 m + g (no 1 - beta1: DeMo's momentum accumulates the gradients themselves).
  kernels_.scale(m_.span(), static_cast<float>(config_.beta1));
  out.nonfinite_grads = kernels_.accumulate(m_.span(), grads);
  extract();
  exchange();
  transform(coeffs_.span(), true, removed_.span());
  detail::apply_weight_decay(kernels_, layout_, params, 0, n_, config_, out.lr);
  kernels_.sign_descent(params, removed_.span(), static_cast<float>(out.lr));
}

namespace {
constexpr OptimizerKeyRange kDemoRanges[] = {
    {"demo_chunk", 1, 4096, false, false, "must be in [1, 4096] elements (the DCT basis is chunk^2 floats)"},
    {"demo_topk", 1, 4096, false, false, "must be in [1, demo_chunk]"},
};
}  // namespace

std::span<const OptimizerKeyRange> deco_momentum_key_ranges() { return kDemoRanges; }

void validate_deco_momentum_switches(const DecoMomentumSwitches& demo) {
  check_key_range(kDemoRanges, "demo_chunk", static_cast<double>(demo.chunk));
  check_key_range(kDemoRanges, "demo_topk", static_cast<double>(demo.topk));
  if (demo.topk > demo.chunk) {
    reject_out_of_range("optimizer.demo_topk", static_cast<double>(demo.topk), "must be in [1, demo_chunk]");
  }
}

}  // namespace scape
