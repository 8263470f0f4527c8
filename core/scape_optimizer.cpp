// SCAPE step (docs/algorithms.md, "SCAPE"): the numbered comments refer to steps 1-8 there.
#include "core/scape_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/optim_common.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/bitmask.hpp"
#include "kernels/cpu/compact.hpp"
#include "kernels/cpu/select.hpp"

namespace scape {
namespace {

using Index = std::int64_t;
constexpr std::uint64_t kRandomMaskPurpose = 0x6d61736b;  // "mask"

}  // namespace

ScapeOptimizer::ScapeOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                               int total_steps)
    : config_(config),
      layout_(layout),
      comm_(comm),
      schedule_{config.lr, config.resolved_min_lr(), config.warmup_steps, total_steps},
      sharding_(layout.size(), comm.size()),
      n_(layout.size()),
      rank_(comm.rank()),
      state_begin_(config.sharded ? sharding_.begin(comm.rank()) : 0),
      state_end_(config.sharded ? sharding_.end(comm.rank()) : layout.size()),
      own_begin_(sharding_.begin(comm.rank())),
      own_end_(sharding_.end(comm.rank())),
      e_(n_, 0.0f),
      m_(state_end_ - state_begin_, 0.0f),
      v_(config.inner == InnerRule::adamw ? state_end_ - state_begin_ : 0, 0.0f),
      mask_(kernels::words_for(n_), 0),
      previous_mask_(kernels::words_for(n_), 0),
      next_mask_(kernels::words_for(n_), 0),
      local_bits_(sharding_.words(comm.rank()), 0),
      staleness_(n_),
      updates_(n_) {}

ScapeOptimizer::~ScapeOptimizer() = default;

std::size_t ScapeOptimizer::k_total(double rho) const {
  if (!partitioned()) return k_for(rho, n_);
  std::size_t k = 0;
  for (int w = 0; w < sharding_.workers(); ++w) k += k_for(rho, sharding_.size(w));
  return k;
}

void ScapeOptimizer::compute_statistic(int use_step) {
  // Step 8: the owner's view of this step's first moment, m~ = b1 m_prev + (1-b1) a, before
  // masking; the alternatives rank |a|, |m_prev| or seeded noise instead.
  const std::size_t lo = partitioned() ? own_begin_ : 0;
  const std::size_t hi = partitioned() ? own_end_ : n_;
  stat_.resize(hi - lo);
  const float b1 = static_cast<float>(config_.beta1);
  const float omb1 = static_cast<float>(1.0 - config_.beta1);
  const float* a = e_.data() + lo;
  const float* m = m_.data() + (lo - state_begin_);
  float* s = stat_.data();
  const Index count = static_cast<Index>(hi - lo);
  switch (config_.mask_statistic) {
    case MaskStatistic::first_moment:
#pragma omp parallel for simd schedule(static) if (count > 65536)
      for (Index j = 0; j < count; ++j) s[j] = b1 * m[j] + omb1 * a[j];
      break;
    case MaskStatistic::gradient:
      std::copy(a, a + count, s);
      break;
    case MaskStatistic::momentum_only:
      std::copy(m, m + count, s);
      break;
    case MaskStatistic::random: {
      // Keyed by the step that uses the mask and, for local_union, by the worker.
      std::uint64_t key = rng::derive(rng::derive(config_.seed, kRandomMaskPurpose), static_cast<std::uint64_t>(use_step));
      if (!partitioned()) key = rng::derive(key, static_cast<std::uint64_t>(rank_));
#pragma omp parallel for schedule(static) if (count > 65536)
      for (Index j = 0; j < count; ++j) {
        s[j] = static_cast<float>(rng::uniform(key, lo + static_cast<std::uint64_t>(j)));
      }
      break;
    }
  }
}

void ScapeOptimizer::select_local(double rho) {
  if (partitioned()) {
    kernels::topk_abs_mask(stat_, k_for(rho, own_end_ - own_begin_), local_bits_);
  } else {
    local_indices_.resize(k_for(rho, n_));
    kernels::topk_abs_indices(stat_, local_indices_.size(), local_indices_);
  }
}

void ScapeOptimizer::gather_mask_now() {
  if (partitioned()) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(sharding_.workers()));
    for (int w = 0; w < sharding_.workers(); ++w) counts[static_cast<std::size_t>(w)] = sharding_.words(w);
    comm_.all_gather_words(local_bits_, mask_, counts, "mask_all_gather");
    return;
  }
  gathered_counts_.assign(static_cast<std::size_t>(sharding_.workers()), local_indices_.size() * sizeof(std::uint32_t));
  gathered_indices_.resize(local_indices_.size() * static_cast<std::size_t>(sharding_.workers()));
  comm_.all_gather_bytes(std::as_bytes(std::span<const std::uint32_t>(local_indices_)),
                         std::as_writable_bytes(std::span<std::uint32_t>(gathered_indices_)), gathered_counts_,
                         "index_all_gather");
  std::fill(mask_.begin(), mask_.end(), 0);
  kernels::indices_to_bits(gathered_indices_, 0, mask_);
}

void ScapeOptimizer::start_mask_gather() {
  if (partitioned()) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(sharding_.workers()));
    for (int w = 0; w < sharding_.workers(); ++w) counts[static_cast<std::size_t>(w)] = sharding_.words(w);
    pending_ = comm_.all_gather_words_async(local_bits_, next_mask_, counts, "mask_all_gather");
    return;
  }
  gathered_counts_.assign(static_cast<std::size_t>(sharding_.workers()), local_indices_.size() * sizeof(std::uint32_t));
  gathered_indices_.resize(local_indices_.size() * static_cast<std::size_t>(sharding_.workers()));
  pending_ = comm_.all_gather_bytes_async(std::as_bytes(std::span<const std::uint32_t>(local_indices_)),
                                          std::as_writable_bytes(std::span<std::uint32_t>(gathered_indices_)),
                                          gathered_counts_, "index_all_gather");
}

void ScapeOptimizer::receive_mask() {
  pending_.wait();
  if (partitioned()) {
    mask_.swap(next_mask_);
    return;
  }
  std::fill(mask_.begin(), mask_.end(), 0);
  kernels::indices_to_bits(gathered_indices_, 0, mask_);
}

std::vector<std::size_t> ScapeOptimizer::mask_counts_per_shard() const {
  std::vector<std::size_t> counts(static_cast<std::size_t>(sharding_.workers()));
  for (int w = 0; w < sharding_.workers(); ++w) {
    counts[static_cast<std::size_t>(w)] = metrics::popcount_range(mask_, sharding_.begin(w), sharding_.end(w));
  }
  return counts;
}

void ScapeOptimizer::pack_payload() {
  // Step 2: the single buffer b_i = b1 m_prev + (1-b1) a_i on the mask, in mask order. A
  // worker without m_prev for a coordinate (sharded) sends (1-b1) a_i; the owner adds b1 m_prev.
  idx_.resize(kernels::popcount(mask_));
  kernels::bits_to_indices(mask_, 0, idx_);
  const std::size_t k = idx_.size();
  b_.resize(k);
  const bool two = config_.second_moment == SecondMoment::two_collectives;
  a_packed_.resize(two ? k : 0);
  const float b1 = static_cast<float>(config_.beta1);
  const float omb1 = static_cast<float>(1.0 - config_.beta1);
#pragma omp parallel for schedule(static) if (k > 16384)
  for (Index i = 0; i < static_cast<Index>(k); ++i) {
    const std::size_t j = idx_[static_cast<std::size_t>(i)];
    const float a = e_[j];
    b_[static_cast<std::size_t>(i)] = config_.sharded ? omb1 * a : b1 * m_[j - state_begin_] + omb1 * a;
    if (two) a_packed_[static_cast<std::size_t>(i)] = a;
  }
}

void ScapeOptimizer::synchronize(std::span<const std::size_t> counts) {
  // Step 4: one collective (two with second_moment = two_collectives).
  const bool two = config_.second_moment == SecondMoment::two_collectives;
  if (config_.sharded) {
    const std::size_t own = counts[static_cast<std::size_t>(rank_)];
    update_offset_ = std::accumulate(counts.begin(), counts.begin() + rank_, std::size_t{0});
    b_bar_.resize(own);
    comm_.reduce_scatter_mean(b_, b_bar_, counts, config_.wire_dtype, "grad_reduce_scatter");
    if (two) {
      a_bar_.resize(own);
      comm_.reduce_scatter_mean(a_packed_, a_bar_, counts, config_.wire_dtype, "accum_reduce_scatter");
    }
    update_idx_.resize(own);
    const float b1 = static_cast<float>(config_.beta1);
    for (std::size_t i = 0; i < own; ++i) {
      update_idx_[i] = idx_[update_offset_ + i] - static_cast<std::uint32_t>(state_begin_);
      b_bar_[i] += b1 * m_[update_idx_[i]];
    }
    return;
  }
  update_offset_ = 0;
  b_bar_ = b_;
  comm_.all_reduce_mean(b_bar_, config_.wire_dtype, "grad_all_reduce");
  if (two) {
    a_bar_ = a_packed_;
    comm_.all_reduce_mean(a_bar_, config_.wire_dtype, "accum_all_reduce");
  }
  update_idx_ = idx_;
}

void ScapeOptimizer::reconstruct_gradient() {
  // Step 5: g_bar = (b_bar - b1 m_prev) / (1 - b1) on the mask; no second collective.
  const std::size_t k = update_idx_.size();
  g_bar_.resize(k);
  if (config_.second_moment == SecondMoment::two_collectives) {
    std::copy(a_bar_.begin(), a_bar_.end(), g_bar_.begin());
    return;
  }
  const float b1 = static_cast<float>(config_.beta1);
  const float omb1 = static_cast<float>(1.0 - config_.beta1);
  for (std::size_t i = 0; i < k; ++i) g_bar_[i] = (b_bar_[i] - b1 * m_[update_idx_[i]]) / omb1;
}

void ScapeOptimizer::update_masked(std::span<float> params, double eta, int t, std::span<const std::size_t> counts) {
  // Step 6: decay every flagged coordinate on every worker, then the inner rule on the mask
  // with m <- b_bar. Step 7: the K updated values are all-gathered (sharded).
  detail::apply_weight_decay(layout_, params, 0, n_, config_, eta);
  const auto s = detail::adam_scalars(config_, eta, t, false);
  auto theta = params.subspan(state_begin_, state_end_ - state_begin_);
  if (config_.inner == InnerRule::adamw) {
    kernels::adamw_step_masked(theta, m_, v_, update_idx_, b_bar_, g_bar_, s);
  } else {
    kernels::adams_step_masked(theta, m_, update_idx_, b_bar_, g_bar_, s);
  }
  if (!config_.sharded) return;
  own_values_.resize(update_idx_.size());
  kernels::compact(theta, update_idx_, own_values_);
  all_values_.resize(idx_.size());
  comm_.all_gather(own_values_, all_values_, counts, config_.param_dtype, "param_all_gather");
  kernels::expand(all_values_, idx_, params);
}

void ScapeOptimizer::update_dense(std::span<float> params, double eta, int t) {
  // Step 6 with update = dense: g_bar = 0 off the mask and the inner rule runs everywhere;
  // sharded mode then all-gathers every parameter.
  dense_g_.assign(state_end_ - state_begin_, 0.0f);
  kernels::expand(g_bar_, update_idx_, dense_g_);
  detail::dense_inner_step(config_.inner, layout_, params, state_begin_, state_end_, m_, v_, dense_g_, config_, eta, t);
  if (!config_.sharded) return;
  comm_.all_gather(params.subspan(own_begin_, own_end_ - own_begin_), params, sharding_.sizes(), config_.param_dtype,
                   "param_all_gather");
}

StepMetrics ScapeOptimizer::step(std::span<float> params, std::span<const float> grads) {
  detail::check_step_sizes(params, grads, n_);
  const int t = ++t_;
  const double rho = density_at(config_.density(), config_.density_warmup, t);
  StepMetrics out;
  out.step = t;
  out.lr = learning_rate(schedule_, t);
  out.target_density = rho;
  out.local_grad_norm = metrics::l2_norm(grads);
  updates_.before(params);

  // Step 1: a_i = e_i + g_i, held in e_ until the residual is written back.
  out.nonfinite_grads = kernels::accumulate(e_, grads);

  // The mask M_t: computed now (lag 0, and the first step under lag 1) or received.
  if (config_.mask_lag == 0 || t == 1) {
    compute_statistic(t);
    select_local(rho);
    gather_mask_now();
  } else {
    receive_mask();
  }
  // Step 8's statistic needs m_prev and a_i as they are now; its all-gather starts at the end.
  const bool lagged_next = config_.mask_lag == 1 && t < schedule_.total_steps;
  if (lagged_next) {
    compute_statistic(t + 1);
    select_local(density_at(config_.density(), config_.density_warmup, t + 1));
  }

  const std::vector<std::size_t> counts = partitioned() ? mask_counts_per_shard() : std::vector<std::size_t>{};
  pack_payload();
  // Step 3: the residual keeps a_i off the mask; delivered coordinates restart from zero.
  if (config_.residual) {
    kernels::zero_at(e_, idx_);
  } else {
    std::fill(e_.begin(), e_.end(), 0.0f);
  }
  staleness_.deliver(idx_, t);

  synchronize(counts);
  reconstruct_gradient();
  if (config_.update == UpdateMode::dense) {
    update_dense(params, out.lr, t);
  } else {
    update_masked(params, out.lr, t, counts);
  }
  if (lagged_next) start_mask_gather();

  metrics::fill_mask_metrics(layout_, mask_, have_previous_mask_ ? std::span<const std::uint64_t>(previous_mask_)
                                                                 : std::span<const std::uint64_t>{},
                             k_total(rho), out);
  previous_mask_ = mask_;
  have_previous_mask_ = true;
  updates_.after(params, out);
  metrics::fill_residual_metrics(layout_, e_, updates_.theta_norm(), out);
  staleness_.fill(t, out);
  out.comm = comm_.ledger().drain();
  return out;
}

void ScapeOptimizer::finish() { pending_.wait(); }

void ScapeOptimizer::save_state(StateMap& state) {
  // The lagged all-gather of the next mask completes here, so the checkpoint holds the
  // received mask; receive_mask() of the next step then finds nothing pending.
  pending_.wait();
  put_state_value(state, "t", t_);
  put_state(state, "residual", e_);
  put_state(state, "m", m_);
  put_state(state, "v", v_);
  put_state(state, "mask", mask_);
  put_state(state, "previous_mask", previous_mask_);
  put_state(state, "next_mask", next_mask_);
  put_state(state, "gathered_indices", gathered_indices_);
  put_state_value(state, "have_previous_mask", static_cast<std::uint8_t>(have_previous_mask_));
  staleness_.save(state, "staleness.");
  updates_.save(state, "updates.");
}

void ScapeOptimizer::load_state(const StateMap& state) {
  t_ = get_state_value<int>(state, "t");
  get_state(state, "residual", e_);
  get_state(state, "m", m_);
  get_state(state, "v", v_);
  get_state(state, "mask", mask_);
  get_state(state, "previous_mask", previous_mask_);
  get_state(state, "next_mask", next_mask_);
  get_state(state, "gathered_indices", gathered_indices_);
  have_previous_mask_ = get_state_value<std::uint8_t>(state, "have_previous_mask") != 0;
  staleness_.load(state, "staleness.");
  updates_.load(state, "updates.");
}

}  // namespace scape
