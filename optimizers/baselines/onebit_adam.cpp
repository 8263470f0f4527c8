// 1-bit Adam with worker and server error feedback (docs/algorithms.md, "1-bit Adam"). The
// arithmetic runs as backend kernels; packing wire segments is host work on synchronized
// buffers, as for every collective.
#include "optimizers/baselines/onebit_adam.hpp"
#include "optimizers/baselines/onebit_adam_config.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/adam_step.hpp"
#include "core/metrics.hpp"
#include "kernels/cpu/kernels.hpp"

namespace scape {

// Adam: its variance is frozen, not dropped.
OnebitAdamOptimizer::OnebitAdamOptimizer(const CommonOptimizerConfig& config, const OnebitAdamSwitches& onebit,
                                         const ParamLayout& layout, Communicator& comm, int total_steps)
    : OptimizerBase(config, InnerRule::adamw, layout, comm, total_steps), onebit_(onebit) {
  const std::size_t chunk = onebit.sign_chunk;
  std::size_t scale_offset = 0, byte_offset = 0;
  for (int w = 0; w < comm.size(); ++w) {
    Segment s{sharding_.begin(w), sharding_.size(w), 0, scale_offset, 0, byte_offset};
    s.scales = (s.size + chunk - 1) / chunk;
    s.bytes = kernels::words_for(s.size) * sizeof(std::uint64_t) + s.scales * sizeof(float);
    scale_offset += s.scales;
    byte_offset += s.bytes;
    segments_.push_back(s);
    segment_bytes_.push_back(s.bytes);
  }
  worker_error_.assign_zero(n_);
  server_error_.assign_zero(sharding_.size(rank_));
  keep_in_checkpoint("onebit.worker_error", worker_error_);
  keep_in_checkpoint("onebit.server_error", server_error_);
  local_.assign_zero(n_);
  m_sync_.assign_zero(n_);
  acc_.assign_zero(sharding_.size(rank_));
  g_bar_.assign_zero(n_);
  words_.assign_zero(kernels::words_for(n_));
  scales_.assign_zero(scale_offset);
  send_.resize(byte_offset);
  recv_.resize(segment_bytes_[static_cast<std::size_t>(rank_)] * static_cast<std::size_t>(comm.size()));
  gathered_.resize(byte_offset);
  kernels_.synchronize();
}

void OnebitAdamOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  metrics::mark_sparse_metrics_not_applicable(out);
  kernels_.synchronize();  // grads may be a staged copy still being written
  std::size_t nonfinite = 0;
  for (float g : grads) nonfinite += !std::isfinite(g);
  out.nonfinite_grads = nonfinite;
  if (t_ <= onebit_.freeze_step) {
    warmup_step(params, grads, out.lr);
    return;
  }
  synchronize_momentum(grads);
  frozen_variance_step(params, out.lr, t_);
}

void OnebitAdamOptimizer::warmup_step(std::span<float> params, std::span<const float> grads, double eta) {
  kernels_.copy_bytes(grads.data(), g_bar_.data(), grads.size_bytes());
  kernels_.synchronize();
  comm_.all_reduce_mean(g_bar_.span(), config_.wire_dtype, "grad_all_reduce");
  detail::dense_inner_step(kernels_, InnerRule::adamw, layout_, params, 0, n_, m_.span(), v_.span(), g_bar_.span(),
                           config_, eta, t_);
}

void OnebitAdamOptimizer::compress(std::span<float> x, const Segment& s) {
  if (s.size == 0) return;
  const std::size_t chunk = onebit_.sign_chunk;
  partial_.resize(s.scales);
  kernels_.block_sum_squares(x, chunk, partial_.span());
  kernels_.synchronize();
  // The L2 scale of each chunk, ||x_c|| / sqrt(|c|), as DeepSpeed's compressed all-reduce.
  float* scales = scales_.data() + s.scale_offset;
  for (std::size_t c = 0; c < s.scales; ++c) {
    const std::size_t len = std::min(chunk, s.size - c * chunk);
    scales[c] = static_cast<float>(std::sqrt(partial_.data()[c] / static_cast<double>(len)));
  }
  kernels_.sign_compress(x, chunk, scales_.span().subspan(s.scale_offset, s.scales),
                   words_.span().subspan(s.begin / 64, kernels::words_for(s.size)));
}

void OnebitAdamOptimizer::pack(const Segment& s, std::byte* wire) const {
  const std::size_t word_bytes = kernels::words_for(s.size) * sizeof(std::uint64_t);
  if (word_bytes > 0) std::memcpy(wire, words_.data() + s.begin / 64, word_bytes);
  if (s.scales > 0) std::memcpy(wire + word_bytes, scales_.data() + s.scale_offset, s.scales * sizeof(float));
}

void OnebitAdamOptimizer::unpack(const Segment& s, const std::byte* wire) {
  const std::size_t word_bytes = kernels::words_for(s.size) * sizeof(std::uint64_t);
  if (word_bytes > 0) std::memcpy(words_.data() + s.begin / 64, wire, word_bytes);
  if (s.scales > 0) std::memcpy(scales_.data() + s.scale_offset, wire + word_bytes, s.scales * sizeof(float));
}

void OnebitAdamOptimizer::expand_add(const Segment& s, std::span<float> acc) {
  if (s.size == 0) return;
  kernels_.sign_expand_add(words_.span().subspan(s.begin / 64, kernels::words_for(s.size)), onebit_.sign_chunk,
                           scales_.span().subspan(s.scale_offset, s.scales), acc);
}

void OnebitAdamOptimizer::synchronize_momentum(std::span<const float> grads) {
  const float b1 = static_cast<float>(config_.beta1);
  const float omb1 = static_cast<float>(1.0 - config_.beta1);
  // Worker: c_i = e_i + (b1 m + (1 - b1) g_i), compressed per segment; e_i keeps the error.
  kernels_.first_moment_statistic(m_.span(), grads, b1, omb1, local_.span());
  kernels_.accumulate(worker_error_.span(), local_.span());
  for (const Segment& s : segments_) compress(worker_error_.span().subspan(s.begin, s.size), s);
  kernels_.synchronize();
  for (const Segment& s : segments_) pack(s, send_.data() + s.byte_offset);
  comm_.all_to_all_bytes(send_, recv_, segment_bytes_, "momentum_all_to_all");

  // Owner: the mean of the W decompressed segments, in rank order, plus the server error,
  // compressed again; e_s keeps the error.
  const Segment& own = segments_[static_cast<std::size_t>(rank_)];
  kernels_.fill(acc_.span(), 0.0f);
  for (int q = 0; q < comm_.size(); ++q) {
    kernels_.synchronize();  // the previous expansion has read words_ and scales_
    unpack(own, recv_.data() + static_cast<std::size_t>(q) * own.bytes);
    expand_add(own, acc_.span());
  }
  kernels_.divide(acc_.span(), static_cast<float>(comm_.size()));
  kernels_.accumulate(server_error_.span(), acc_.span());
  compress(server_error_.span(), own);
  kernels_.synchronize();
  pack(own, send_.data() + own.byte_offset);
  comm_.all_gather_bytes(std::span<const std::byte>(send_).subspan(own.byte_offset, own.bytes), gathered_,
                         segment_bytes_, "momentum_all_gather");

  // Every worker: the synchronized momentum, segment by segment.
  kernels_.fill(m_sync_.span(), 0.0f);
  for (const Segment& s : segments_) unpack(s, gathered_.data() + s.byte_offset);
  for (const Segment& s : segments_) expand_add(s, m_sync_.span().subspan(s.begin, s.size));
}

void OnebitAdamOptimizer::frozen_variance_step(std::span<float> params, double eta, int t) {
  // AdamW's kernel with beta1 = 0 (m <- m_sync exactly) and beta2 = 1 (v unchanged): the
  // decay, then theta -= eta (m / c1) / (sqrt(v / c2) + eps) with c2 of the freeze step.
  const double c2 = config_.bias_correction ? 1.0 - std::pow(config_.beta2, onebit_.freeze_step) : 1.0;
  detail::for_each_tensor_piece(layout_, 0, n_, [&](std::size_t lo, std::size_t hi, bool decay) {
    kernels::AdamScalars s = detail::adam_scalars(config_, eta, t, decay);
    s.beta1 = 0.0;
    s.beta2 = 1.0;
    s.bc2 = c2;
    const std::size_t n = hi - lo;
    kernels_.adamw_step(params.subspan(lo, n), m_.span().subspan(lo, n), v_.span().subspan(lo, n),
                  m_sync_.span().subspan(lo, n), s);
  });
}

namespace {
constexpr OptimizerKeyRange kOnebitRanges[] = {
    {"freeze_step", 1, std::numeric_limits<double>::infinity(), false, true,
     "must be >= 1 (the variance is frozen after a dense Adam step)"},
    {"sign_chunk", 1, 1 << 30, false, false, "must be in [1, 2^30] elements"},
};
}  // namespace

std::span<const OptimizerKeyRange> onebit_adam_key_ranges() { return kOnebitRanges; }

void validate_onebit_adam_switches(const OnebitAdamSwitches& onebit) {
  check_key_range(kOnebitRanges, "freeze_step", onebit.freeze_step);
  check_key_range(kOnebitRanges, "sign_chunk", static_cast<double>(onebit.sign_chunk));
}

}  // namespace scape
