// DGC-style raw-gradient top-k with error feedback (docs/algorithms.md, "Baseline").
#include "core/topk_ef_optimizer.hpp"

#include <algorithm>
#include <cstring>

#include "core/optim_common.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/kernels.hpp"

namespace scape {

TopkEfOptimizer::TopkEfOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                                 int total_steps)
    : config_(config),
      layout_(layout),
      comm_(comm),
      schedule_{config.lr, config.resolved_min_lr(), config.warmup_steps, total_steps},
      n_(layout.size()),
      e_(n_, 0.0f),
      m_(n_, 0.0f),
      v_(config.inner == InnerRule::adamw ? n_ : 0, 0.0f),
      g_bar_(n_, 0.0f),
      local_mask_(kernels::words_for(n_), 0),
      previous_mask_(kernels::words_for(n_), 0),
      union_mask_(kernels::words_for(n_), 0),
      staleness_(n_),
      updates_(n_) {}

void TopkEfOptimizer::pack_pairs() {
  // Wire record per selected coordinate: 4-byte index, then the value at the wire width.
  const std::size_t value_bytes = wire_bytes(config_.wire_dtype);
  const std::size_t record = sizeof(std::uint32_t) + value_bytes;
  send_.resize(idx_.size() * record);
  for (std::size_t i = 0; i < idx_.size(); ++i) {
    std::byte* p = send_.data() + i * record;
    std::memcpy(p, &idx_[i], sizeof(std::uint32_t));
    const float a = e_[idx_[i]];
    if (config_.wire_dtype == WireType::bf16) {
      const std::uint16_t bits = kernels::float_to_bf16_bits(a);
      std::memcpy(p + sizeof(std::uint32_t), &bits, sizeof bits);
    } else {
      std::memcpy(p + sizeof(std::uint32_t), &a, sizeof a);
    }
  }
}

void TopkEfOptimizer::sum_pairs_in_rank_order(std::size_t k) {
  // g_bar = (sum over workers in rank order of their delivered values) / W, zero elsewhere.
  const std::size_t value_bytes = wire_bytes(config_.wire_dtype);
  const std::size_t record = sizeof(std::uint32_t) + value_bytes;
  const std::size_t workers = static_cast<std::size_t>(comm_.size());
  std::fill(g_bar_.begin(), g_bar_.end(), 0.0f);
  std::fill(union_mask_.begin(), union_mask_.end(), 0);
  for (std::size_t r = 0; r < workers; ++r) {
    for (std::size_t i = 0; i < k; ++i) {
      const std::byte* p = recv_.data() + (r * k + i) * record;
      std::uint32_t j;
      std::memcpy(&j, p, sizeof j);
      float value;
      if (config_.wire_dtype == WireType::bf16) {
        std::uint16_t bits;
        std::memcpy(&bits, p + sizeof(std::uint32_t), sizeof bits);
        value = kernels::bf16_bits_to_float(bits);
      } else {
        std::memcpy(&value, p + sizeof(std::uint32_t), sizeof value);
      }
      g_bar_[j] += value;
      union_mask_[j / 64] |= std::uint64_t{1} << (j % 64);
    }
  }
  const float w = static_cast<float>(workers);
  for (float& g : g_bar_) g /= w;
}

StepMetrics TopkEfOptimizer::step(std::span<float> params, std::span<const float> grads) {
  detail::check_step_sizes(params, grads, n_);
  const int t = ++t_;
  const double rho = density_at(config_.density(), config_.density_warmup, t);
  const std::size_t k = k_for(rho, n_);
  StepMetrics out;
  out.step = t;
  out.lr = learning_rate(schedule_, t);
  out.target_density = rho;
  out.local_grad_norm = metrics::l2_norm(grads);
  updates_.before(params);

  out.nonfinite_grads = kernels::accumulate(e_, grads);
  idx_.resize(k);
  kernels::topk_abs_indices(e_, k, idx_);
  std::fill(local_mask_.begin(), local_mask_.end(), 0);
  kernels::indices_to_bits(idx_, 0, local_mask_);
  pack_pairs();
  if (config_.residual) {
    kernels::zero_at(e_, idx_);
  } else {
    std::fill(e_.begin(), e_.end(), 0.0f);
  }
  staleness_.deliver(idx_, t);

  recv_.resize(send_.size() * static_cast<std::size_t>(comm_.size()));
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm_.size()), send_.size());
  comm_.all_gather_bytes(send_, recv_, counts, "topk_all_gather");
  sum_pairs_in_rank_order(k);
  detail::dense_inner_step(kernels::cpu_backend(), config_.inner, layout_, params, 0, n_, m_, v_, g_bar_, config_, out.lr, t);

  // Mask metrics describe this worker's own mask; fill-in is the union over workers / K.
  metrics::fill_mask_metrics(layout_, local_mask_, have_previous_mask_ ? std::span<const std::uint64_t>(previous_mask_)
                                                                       : std::span<const std::uint64_t>{},
                             k, out);
  out.fill_in = k ? static_cast<double>(kernels::popcount(union_mask_)) / static_cast<double>(k) : 0.0;
  previous_mask_ = local_mask_;
  have_previous_mask_ = true;
  updates_.after(params, out);
  metrics::fill_residual_metrics(kernels::cpu_backend(), partial_, layout_, e_, updates_.theta_norm(), out);
  staleness_.fill(t, out);
  out.comm = comm_.ledger().drain();
  return out;
}

void TopkEfOptimizer::save_state(StateMap& state) {
  put_state_value(state, "t", t_);
  put_state(state, "residual", e_);
  put_state(state, "m", m_);
  put_state(state, "v", v_);
  put_state(state, "previous_mask", previous_mask_);
  put_state_value(state, "have_previous_mask", static_cast<std::uint8_t>(have_previous_mask_));
  staleness_.save(state, "staleness.");
  updates_.save(state, "updates.");
}

void TopkEfOptimizer::load_state(const StateMap& state) {
  t_ = get_state_value<int>(state, "t");
  get_state(state, "residual", e_);
  get_state(state, "m", m_);
  get_state(state, "v", v_);
  get_state(state, "previous_mask", previous_mask_);
  have_previous_mask_ = get_state_value<std::uint8_t>(state, "have_previous_mask") != 0;
  staleness_.load(state, "staleness.");
  updates_.load(state, "updates.");
}

}  // namespace scape
