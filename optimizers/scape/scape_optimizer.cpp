// SCAPE's step, shared by its formulations (docs/algorithms.md, "SCAPE"). The numbered comments
// are the steps of "The paper formulation, one step" there, numbered as in
// python/scape/optim/scape_optimizer.py; where the frozen_momentum formulation branches, the comment
// gives its own step number ("frozen_momentum: its step 5"), and where the artifact's quirks branch,
// it says so. The formulations' own passes: scape_formulation.cpp; the statistic and the selection
// of the mask: mask_selection.cpp. Kernels are queued on the backend; the host reads a buffer only
// after kernels_.synchronize(), and every collective is handed synchronized buffers.
#include "optimizers/scape/scape_optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <string>

#include "core/adam_step.hpp"
#include "kernels/kernel_types.hpp"

namespace scape {
namespace {

template <typename T>
void copy_buffer(kernels::KernelBackend& k, const kernels::Buffer<T>& from, kernels::Buffer<T>& to) {
  to.resize(from.size());
  k.copy_bytes(from.data(), to.data(), from.bytes());
}

std::string human_bytes(std::size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = static_cast<double>(bytes);
  int u = 0;
  while (x >= 1024 && u < 4) {
    x /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", x, units[u]);
  return text;
}

}  // namespace

ScapeOptimizer::ScapeOptimizer(const CommonOptimizerConfig& config, const ScapeSwitches& scape,
                               const ParamLayout& layout, Communicator& comm, int total_steps)
    : OptimizerBase(with_scape_adams_form(config, scape), config.inner, layout, comm, total_steps),
      scape_(scape),
      owners_(layout, comm.size(), config, scape),
      own_begin_(owners_.begin(rank_)),
      own_end_(owners_.end(rank_)),
      feedback_(kernels_, n_, config),
      exchange_(kernels_, comm, owners_, config.mask_encoding) {
  mask_.assign_zero(kernels::words_for(n_));
  next_mask_.assign_zero(kernels::words_for(n_));
  local_bits_.assign_zero(owners_.word_count(rank_));
  if (carries_momentum()) q_.assign_zero(state_end_ - state_begin_);
  // The dense tensors' positions in the own segment (bit 0 = element 64 word_begin), once.
  std::vector<std::uint32_t> dense;
  const std::size_t base = 64 * owners_.word_begin(rank_);
  for (const auto& piece : owners_.pieces(rank_)) {
    if (!piece.dense) continue;
    for (std::size_t j = piece.begin; j < piece.end; ++j) dense.push_back(static_cast<std::uint32_t>(j - base));
  }
  dense_idx_.resize(dense.size());
  if (!dense.empty()) kernels_.copy_bytes(dense.data(), dense_idx_.data(), dense.size() * sizeof(std::uint32_t));
  kernels_.synchronize();
}

ScapeOptimizer::~ScapeOptimizer() = default;

std::string ScapeOptimizer::device_summary() const {
  std::string out = kernels_.description();
  const ResidualStore& e = feedback_.residual();
  if (e.offloaded()) {
    const std::size_t resident = n_ * sizeof(float);
    out += "; residual offloaded to pinned host memory: the device holds " + human_bytes(e.device_bytes()) +
           " instead of " + human_bytes(resident) + " (saves " +
           human_bytes(resident - std::min(resident, e.device_bytes())) + ")";
  }
  return out;
}

std::size_t ScapeOptimizer::k_total(double rho) const {
  if (!partitioned()) return k_for(rho, n_);
  return owners_.k_total(rho);
}

bool ScapeOptimizer::statistic_reads_residual() const {
  return scape_.mask_statistic == MaskStatistic::first_moment || scape_.mask_statistic == MaskStatistic::gradient;
}

std::size_t ScapeOptimizer::residual_pass(std::span<const float> grads, bool accumulate, bool statistic, bool deliver) {
  if (statistic) stat_.resize(statistic_end() - statistic_begin());
  // deliver_part finds each chunk's mask positions in idx_ on the host.
  kernels_.synchronize();
  std::size_t nonfinite = 0;
  const float b1 = static_cast<float>(config_.beta1);
  // With M_t known, an owner that carries q takes step 1, step 9's statistic and step 4's carry
  // of q in one pass over its shard: all three read m and q as they were before this step.
  const bool with_carry =
      accumulate && statistic && deliver && carries_momentum() && scape_.mask_statistic == MaskStatistic::first_moment;
  q_carried_ = with_carry;
  feedback_.residual().for_each_chunk(accumulate || deliver, [&](std::size_t begin, std::span<float> a) {
    // Step 1, held in the residual until step 4 writes it back: the candidate momentum
    // c_i = (b1 m_prev + (1-b1) g_i) + e_i, whose b1 m_prev a sharded worker leaves to the owner
    // (a_i = (1-b1) g_i + e_i). frozen_momentum: its step 1, a_i = e_i + g_i.
    if (accumulate && !momentum_units()) nonfinite += kernels_.accumulate(a, grads.subspan(begin, a.size()));
    if (with_carry) {
      nonfinite += candidate_with_carry(grads, begin, a);
    } else if (accumulate && momentum_units()) {
      const auto m =
          config_.sharded ? std::span<const float>{} : std::span<const float>(m_.span().subspan(begin, a.size()));
      nonfinite += kernels_.candidate_momentum(a, m, grads.subspan(begin, a.size()), b1,
                                               static_cast<float>(1.0 - config_.beta1));
    }
    if (statistic && !with_carry) {
      const std::size_t lo = std::max(begin, statistic_begin());
      const std::size_t hi = std::min(begin + a.size(), statistic_end());
      if (lo < hi) statistic_part(a.subspan(lo - begin, hi - lo), lo);
    }
    if (deliver) deliver_part(begin, a);
  });
  return nonfinite;
}

std::size_t ScapeOptimizer::candidate_with_carry(std::span<const float> grads, std::size_t begin, std::span<float> a) {
  // The chunk [begin, begin + |a|) cut at the own shard [own_begin_, own_end_): outside it step 1
  // alone (a_i = (1-b1) g_i + e_i), inside it the owner's one pass.
  const std::size_t end = begin + a.size();
  const std::size_t lo = std::clamp(own_begin_, begin, end), hi = std::clamp(own_end_, begin, end);
  const auto b1 = static_cast<float>(config_.beta1);
  const auto omb1 = static_cast<float>(1.0 - config_.beta1);
  std::size_t nonfinite = 0;
  // Each call that returns a count waits for its kernel (kernel_list.inc): empty parts are skipped.
  if (lo > begin)
    nonfinite += kernels_.candidate_momentum(a.first(lo - begin), {}, grads.subspan(begin, lo - begin), b1, omb1);
  if (hi > lo) {
    const std::size_t at = lo - state_begin_;
    nonfinite += kernels_.candidate_statistic_carry(a.subspan(lo - begin, hi - lo), grads.subspan(lo, hi - lo),
                                                    q_.span().subspan(at, hi - lo), m_.span().subspan(at, hi - lo),
                                                    mask_.span(), lo, b1, omb1, carry_decay(),
                                                    stat_.span().subspan(lo - statistic_begin(), hi - lo));
  }
  if (end > hi)
    nonfinite += kernels_.candidate_momentum(a.subspan(hi - begin), {}, grads.subspan(hi, end - hi), b1, omb1);
  return nonfinite;
}

void ScapeOptimizer::deliver_part(std::size_t begin, std::span<float> a) {
  // On the mask positions inside [begin, begin + |a|): step 3's payload in mask order, c_i itself
  // (sharded: a_i, and the owner adds b1 m_prev + q after the reduction); then step 4, the
  // residual keeps gamma c_i off the mask and delivered coordinates restart from zero.
  // frozen_momentum: its step 3, the single buffer b_i = b1 m_prev + (1-b1) a_i (sharded:
  // (1-b1) a_i, the owner adds b1 m_prev), and its step 4, gamma a_i off the mask.
  const auto all = idx_.span();
  const auto first = std::lower_bound(all.begin(), all.end(), static_cast<std::uint32_t>(begin));
  const auto last = std::lower_bound(first, all.end(), static_cast<std::uint32_t>(begin + a.size()));
  const auto i0 = static_cast<std::size_t>(first - all.begin());
  const std::size_t count = static_cast<std::size_t>(last - first);
  std::span<const std::uint32_t> ids;
  if (count > 0) {
    ids = all.subspan(i0, count);
    if (begin != 0) {
      const auto rebased = chunk_idx_.span().first(count);
      kernels_.rebase_indices(ids, static_cast<std::uint32_t>(begin), rebased);
      ids = rebased;
    }
    // Momentum units: the residual holds the payload itself (c_i, or its gradient part when sharded).
    const bool with_momentum = !config_.sharded && !momentum_units();  // replicated state: m covers [0, N)
    const auto m =
        with_momentum ? std::span<const float>(m_.span().subspan(begin, a.size())) : std::span<const float>{};
    const auto a_out = two_collectives() ? a_packed_.span().subspan(i0, count) : std::span<float>{};
    const float omb1 = momentum_units() ? 1.0f : static_cast<float>(1.0 - config_.beta1);
    kernels_.pack_payload(a, m, 0, ids, static_cast<float>(config_.beta1), omb1, with_momentum,
                          b_.span().subspan(i0, count), a_out);
  }
  feedback_.keep_off_mask(a, ids);
}

std::vector<std::size_t> ScapeOptimizer::mask_word_counts() const {
  std::vector<std::size_t> counts(static_cast<std::size_t>(owners_.workers()));
  for (int w = 0; w < owners_.workers(); ++w) counts[static_cast<std::size_t>(w)] = owners_.word_count(w);
  return counts;
}

// Coded against the mask every rank holds (the previous step's, zero at step 1); `overlapped`:
// on the communicator's asynchronous path, completed by receive_mask().
void ScapeOptimizer::start_coded_exchange(bool overlapped) {
  if (partitioned()) {
    exchange_.start(local_bits_.span(), mask_.span(), owners_.k_per_owner(selected_rho_), overlapped);
  } else {
    exchange_.start_indices(local_indices_.span(), overlapped);
  }
}

// Step 2 when M_t is chosen within the step (lag 0, and step 1 under lag 1): the parts
// select_local drew, all-gathered now.
void ScapeOptimizer::gather_mask_now() {
  kernels_.synchronize();
  if (coded()) {
    start_coded_exchange(false);
    exchange_.complete(mask_.span(), next_mask_.span());
    std::swap(mask_, next_mask_);
    return;
  }
  if (partitioned()) {
    comm_.all_gather_words(local_bits_.span(), mask_.span(), mask_word_counts(), "mask_all_gather");
    return;
  }
  gathered_counts_.assign(static_cast<std::size_t>(sharding_.workers()), local_indices_.size() * sizeof(std::uint32_t));
  gathered_indices_.resize(local_indices_.size() * static_cast<std::size_t>(sharding_.workers()));
  comm_.all_gather_bytes(std::as_bytes(local_indices_.span()), std::as_writable_bytes(gathered_indices_.span()),
                         gathered_counts_, "index_all_gather");
  kernels_.zero_bytes(mask_.data(), mask_.bytes());
  kernels_.indices_to_bits(gathered_indices_.span(), 0, mask_.span());
}

// Step 9: the all-gather of the next mask's parts starts; receive_mask() completes it.
void ScapeOptimizer::start_mask_gather() {
  kernels_.synchronize();
  if (coded()) {
    start_coded_exchange(true);
    return;
  }
  if (partitioned()) {
    pending_ =
        comm_.all_gather_words_async(local_bits_.span(), next_mask_.span(), mask_word_counts(), "mask_all_gather");
    return;
  }
  gathered_counts_.assign(static_cast<std::size_t>(sharding_.workers()), local_indices_.size() * sizeof(std::uint32_t));
  gathered_indices_.resize(local_indices_.size() * static_cast<std::size_t>(sharding_.workers()));
  pending_ = comm_.all_gather_bytes_async(std::as_bytes(local_indices_.span()),
                                          std::as_writable_bytes(gathered_indices_.span()), gathered_counts_,
                                          "index_all_gather");
}

// Step 2 under lag 1: M_t is the mask step t-1's all-gather brought.
void ScapeOptimizer::receive_mask() {
  pending_.wait();
  exchange_.complete(mask_.span(), next_mask_.span());
  if (partitioned() || coded()) {
    std::swap(mask_, next_mask_);
    return;
  }
  kernels_.zero_bytes(mask_.data(), mask_.bytes());
  kernels_.indices_to_bits(gathered_indices_.span(), 0, mask_.span());
}

std::vector<std::size_t> ScapeOptimizer::mask_counts_per_shard() {
  shard_counts_.count(mask_.span(), {});
  std::vector<std::size_t> counts(static_cast<std::size_t>(sharding_.workers()));
  for (std::size_t w = 0; w < counts.size(); ++w) counts[w] = shard_counts_.set(w);
  return counts;
}

void ScapeOptimizer::index_mask() {
  const std::size_t k = kernels_.popcount(mask_.span());
  idx_.resize(k);
  kernels_.bits_to_indices(mask_.span(), 0, idx_.span());
  b_.resize(k);
  a_packed_.resize(two_collectives() ? k : 0);
  if (feedback_.residual().offloaded()) chunk_idx_.resize(k);
  counts_ = partitioned() ? mask_counts_per_shard() : std::vector<std::size_t>{};
}

void ScapeOptimizer::reduce_payload() {
  // Step 3: one collective on M_t in mask order, b_bar = mean_i c_i (frozen_momentum: its step 5,
  // b_bar = mean_i b_i; two collectives with second_moment = two_collectives).
  const float b1 = static_cast<float>(config_.beta1);
  kernels_.synchronize();
  if (config_.sharded) {
    const std::size_t own = counts_[static_cast<std::size_t>(rank_)];
    update_offset_ = std::accumulate(counts_.begin(), counts_.begin() + rank_, std::size_t{0});
    update_idx_.resize(own);
    kernels_.rebase_indices(idx_.span().subspan(update_offset_, own), static_cast<std::uint32_t>(state_begin_),
                      update_idx_.span());
    const bool artifact = scape_.formulation == Formulation::artifact;
    if (artifact) {
      // artifact, sharded (its second quirk): each rank fills only its own part of a zero buffer,
      // with its whole candidate (a_i + b1 m_prev) + q, so the mean holds the owner's c over W.
      const auto mine = b_.span().subspan(update_offset_, own);
      kernels_.fill(b_.span().first(update_offset_), 0.0f);
      kernels_.fill(b_.span().subspan(update_offset_ + own), 0.0f);
      kernels_.add_momentum(mine, m_.span(), update_idx_.span(), b1);
      if (carries_momentum()) kernels_.add_momentum(mine, q_.span(), update_idx_.span(), 1.0f);
      kernels_.synchronize();
    }
    b_bar_.resize(own);
    comm_.reduce_scatter_mean(b_.span(), b_bar_.span(), counts_, config_.wire_dtype, "grad_reduce_scatter");
    if (two_collectives()) {
      a_bar_.resize(own);
      comm_.reduce_scatter_mean(a_packed_.span(), a_bar_.span(), counts_, config_.wire_dtype, "accum_reduce_scatter");
    }
    // The owner adds b1 m_prev (and, paper, q: the momentum it carries for every worker) in step
    // 5's own pass (reconstruct_gradient); the artifact's form added them before the reduce. Only
    // frozen_momentum with two collectives, whose step 5 reads the second one, adds b1 m_prev here
    // (it carries no q: two_collectives is refused with the momentum-unit formulations).
    if (owner_momentum_in_step5() || artifact) return;
    kernels_.add_momentum(b_bar_.span(), m_.span(), update_idx_.span(), b1);
    return;
  }
  update_offset_ = 0;
  copy_buffer(kernels_, b_, b_bar_);
  if (two_collectives()) copy_buffer(kernels_, a_packed_, a_bar_);
  kernels_.synchronize();
  comm_.all_reduce_mean(b_bar_.span(), config_.wire_dtype, "grad_all_reduce");
  if (fp8()) {  // the mean of the e5m2 values, back to the payload's units: times W 2^exponent
    kernels_.scale(b_bar_.span(), static_cast<float>(sharding_.workers()));
    kernels_.scale(b_bar_.span(), std::ldexp(1.0f, fp8_exponent_));
  }
  if (two_collectives()) comm_.all_reduce_mean(a_bar_.span(), config_.wire_dtype, "accum_all_reduce");
  copy_buffer(kernels_, idx_, update_idx_);
}

void ScapeOptimizer::reconstruct_gradient() {
  // Step 5: g_hat = (b_bar - b1 m_prev) / (1 - b1) on the mask (frozen_momentum: its step 6,
  // where the doc writes it g_bar; with second_moment = two_collectives, g_hat = mean_i a_i).
  if (two_collectives()) {
    copy_buffer(kernels_, a_bar_, g_hat_);
    return;
  }
  g_hat_.resize(update_idx_.size());
  if (owner_momentum_in_step5()) {
    // With step 3's additions of the owner (reduce_payload), one read of m at each position, and
    // step 4's q <- 0 on the mask (carry_momentum).
    const auto q = carries_momentum() ? q_.span() : std::span<float>{};
    kernels_.owner_payload_gradient(b_bar_.span(), m_.span(), q, update_idx_.span(),
                                    static_cast<float>(config_.beta1), static_cast<float>(1.0 - config_.beta1),
                                    g_hat_.span());
    return;
  }
  kernels_.reconstruct_gradient(b_bar_.span(), m_.span(), update_idx_.span(), static_cast<float>(config_.beta1),
                                static_cast<float>(1.0 - config_.beta1), g_hat_.span());
}

void ScapeOptimizer::update_masked(std::span<float> params, double eta, int t) {
  // Step 7: decay every flagged coordinate on every worker, then the inner rule on the mask
  // with m <- b_bar, then m <- 0 off the mask (frozen_momentum: its step 7, m untouched off
  // it). Step 8: the K updated values are all-gathered (sharded). The mask is decayed here and
  // the rest in the pass that measures the update (update()).
  detail::weight_decay_pieces(layout_, n_, config_, eta, decay_ends_, decay_factors_);
  updates_.decay_stepped(params, idx_.span(), decay_ends_, decay_factors_);
  const auto s = detail::adam_scalars(config_, eta, t, false);
  auto theta = params.subspan(state_begin_, state_end_ - state_begin_);
  if (rule_ == InnerRule::adamw) {
    kernels_.adamw_step_masked(theta, m_.span(), v_.span(), update_idx_.span(), b_bar_.span(), g_hat_.span(), s);
  } else {
    kernels_.adams_step_masked(theta, m_.span(), update_idx_.span(), b_bar_.span(), g_hat_.span(), s);
  }
  if (momentum_units()) zero_momentum_off_mask();
  if (!config_.sharded) return;
  own_values_.resize(update_idx_.size());
  kernels_.compact(theta, update_idx_.span(), own_values_.span());
  all_values_.resize(idx_.size());
  kernels_.synchronize();
  comm_.all_gather(own_values_.span(), all_values_.span(), counts_, config_.param_dtype, "param_all_gather");
  kernels_.expand(all_values_.span(), idx_.span(), params);
}

void ScapeOptimizer::update_dense(std::span<float> params, double eta, int t) {
  // frozen_momentum's step 7 with update = dense: g_hat = 0 off the mask and the inner rule runs
  // everywhere; its step 8 (sharded) then all-gathers every parameter.
  dense_g_.assign_zero(state_end_ - state_begin_);
  kernels_.expand(g_hat_.span(), update_idx_.span(), dense_g_.span());
  detail::dense_inner_step(kernels_, rule_, layout_, params, state_begin_, state_end_, m_.span(), v_.span(),
                           dense_g_.span(), config_, eta, t);
  if (!config_.sharded) return;
  kernels_.synchronize();
  comm_.all_gather(params.subspan(own_begin_, own_end_ - own_begin_), params, sharding_.sizes(), config_.param_dtype,
                   "param_all_gather");
}

void ScapeOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  const int t = t_;
  const double rho = density_at(config_.density_schedule(), t);
  out.target_density = rho;

  // Step 2, the mask M_t: received (lag 1 after the first step) or computed from this step's c_i
  // (frozen_momentum: a_i).
  const bool mask_known = scape_.mask_lag == 1 && t > 1;
  const bool lagged_next = scape_.mask_lag == 1 && t < schedule_.total_steps;
  if (mask_known) {
    receive_mask();
    index_mask();
  }
  // One pass over the residual when the mask is known (step 1, step 9's statistic, step 3's
  // payload and step 4's residual); otherwise the mask is selected between the accumulate pass
  // and the delivery pass. residual_clip acts before step 1.
  const bool statistic_needed = !mask_known || lagged_next;
  out.residual_clipped_norm = feedback_.clip(layout_, grads);
  out.nonfinite_grads = residual_pass(grads, true, statistic_needed && statistic_reads_residual(), mask_known);
  if (!mask_known) {
    prepare_statistic(t);
    select_local(rho);
    gather_mask_now();
    index_mask();
    residual_pass(grads, false, false, true);
  }
  // artifact: its two quirks in step 4's residual (resident and replicated: step 4 twice; sharded:
  // nothing kept outside the own shard).
  if (scape_.formulation == Formulation::artifact && !config_.sharded) double_count_residual(grads);
  if (scape_.formulation == Formulation::artifact && config_.sharded) drop_unowned_residual();
  if (fp8()) quantize_payload(t);
  feedback_.measure_residual(layout_, t, out);  // final for this step, and still in cache
  // Step 9's statistic is taken from m_prev, q and c_i (a_i) as they were before this step
  // changed them; its all-gather starts after step 8.
  if (lagged_next) {
    prepare_statistic(t + 1);
    select_local(density_at(config_.density_schedule(), t + 1));
  }
  kernels_.synchronize();
  feedback_.deliver(idx_.span(), t);

  reduce_payload();                          // step 3 (frozen_momentum: its step 5)
  reconstruct_gradient();                    // step 5 (frozen_momentum: its step 6)
  clip_reconstructed();                      // step 6
  if (carries_momentum()) carry_momentum();  // step 4 for the owner's q, before step 7 changes m
  if (scape_.update == UpdateMode::dense) {
    update_dense(params, out.lr, t);  // frozen_momentum only: its steps 7 and 8
  } else {
    update_masked(params, out.lr, t);  // steps 7 and 8
    if (tracks_updates()) {
      updates_.decay_rest_and_measure(params, idx_.span(), out);
    } else {
      updates_.decay_rest_and_norm(params, idx_.span());
    }
  }
  if (lagged_next) start_mask_gather();  // step 9
  feedback_.record_mask(layout_, mask_, k_total(rho), out);
  out.mask_codec_s = exchange_.take_codec_seconds();
}

void ScapeOptimizer::finish() {
  pending_.wait();
  exchange_.complete(mask_.span(), next_mask_.span());
}

// The lagged all-gather of the next mask has completed (save_state calls finish()), so the
// checkpoint holds the received mask; receive_mask() of the next step then finds nothing pending.
void ScapeOptimizer::save_policy_state(StateMap& state) const {
  feedback_.save(state);
  put_state(state, "mask", mask_.span());
  put_state(state, "next_mask", next_mask_.span());
  put_state(state, "gathered_indices", gathered_indices_.span());
  if (carries_momentum()) put_state(state, "carried_momentum", q_.span());
  if (fp8()) {
    put_state_value(state, "fp8_exponent", fp8_exponent_);
    put_state_value(state, "fp8_scaled", fp8_scaled_ ? 1 : 0);
  }
}

void ScapeOptimizer::load_policy_state(const StateMap& state) {
  feedback_.load(state);
  get_state_exact(state, "mask", mask_.span());
  get_state_exact(state, "next_mask", next_mask_.span());
  get_state(state, "gathered_indices", gathered_indices_);
  if (carries_momentum()) get_state_exact(state, "carried_momentum", q_.span());
  if (fp8()) {
    fp8_exponent_ = get_state_value<int>(state, "fp8_exponent");
    fp8_scaled_ = get_state_value<int>(state, "fp8_scaled") != 0;
  }
}

}  // namespace scape
