// DGC-style raw-gradient top-k with error feedback (docs/algorithms.md, "Baseline"). The
// arithmetic runs as backend kernels; packing the wire records is host work on synchronized
// buffers, as for every collective.
#include "core/topk_ef_optimizer.hpp"

#include <cstring>
#include <vector>

#include "core/optim_common.hpp"
#include "kernels/cpu/bf16.hpp"
#include "kernels/cpu/kernels.hpp"

namespace scape {
namespace {

// Wire record per selected coordinate: 4-byte index, then the value at the wire width.
std::size_t record_bytes(WireType wire) { return sizeof(std::uint32_t) + wire_bytes(wire); }

void write_record(std::byte* p, std::uint32_t index, float value, WireType wire) {
  std::memcpy(p, &index, sizeof index);
  if (wire == WireType::bf16) {
    const std::uint16_t bits = kernels::float_to_bf16_bits(value);
    std::memcpy(p + sizeof index, &bits, sizeof bits);
  } else {
    std::memcpy(p + sizeof index, &value, sizeof value);
  }
}

void read_record(const std::byte* p, WireType wire, std::uint32_t& index, float& value) {
  std::memcpy(&index, p, sizeof index);
  if (wire == WireType::bf16) {
    std::uint16_t bits;
    std::memcpy(&bits, p + sizeof index, sizeof bits);
    value = kernels::bf16_bits_to_float(bits);
  } else {
    std::memcpy(&value, p + sizeof index, sizeof value);
  }
}

}  // namespace

TopkEfOptimizer::TopkEfOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                                 int total_steps)
    : FeedbackOptimizer(config, layout, comm, total_steps) {
  g_bar_.assign_zero(n_);
  union_mask_.assign_zero(kernels::words_for(n_));
  k_.synchronize();
}

std::size_t TopkEfOptimizer::select(std::span<const float> grads, std::size_t k) {
  const auto e = feedback_.residual().resident();
  const std::size_t nonfinite = k_.accumulate(e, grads);
  idx_.resize(k);
  k_.topk_abs_indices(e, k, idx_.span());
  k_.zero_bytes(mask_.data(), mask_.bytes());
  k_.indices_to_bits(idx_.span(), 0, mask_.span());
  sent_values_.resize(k);
  k_.compact(e, idx_.span(), sent_values_.span());
  feedback_.keep_off_mask(e, idx_.span());
  return nonfinite;
}

void TopkEfOptimizer::exchange_pairs() {
  const std::size_t record = record_bytes(config_.wire_dtype);
  const std::size_t k = idx_.size();
  const auto workers = static_cast<std::size_t>(comm_.size());
  send_.resize(k * record);
  recv_.resize(send_.size() * workers);
  recv_idx_.resize(k * workers);
  recv_values_.resize(k * workers);
  k_.synchronize();
  for (std::size_t i = 0; i < k; ++i) {
    write_record(send_.data() + i * record, idx_.data()[i], sent_values_.data()[i], config_.wire_dtype);
  }
  const std::vector<std::size_t> counts(workers, send_.size());
  comm_.all_gather_bytes(send_.span(), recv_.span(), counts, "topk_all_gather");
  for (std::size_t i = 0; i < k * workers; ++i) {
    read_record(recv_.data() + i * record, config_.wire_dtype, recv_idx_.data()[i], recv_values_.data()[i]);
  }
}

std::size_t TopkEfOptimizer::average_delivered(std::size_t k) {
  const auto workers = static_cast<std::size_t>(comm_.size());
  // g_bar[j] += value for every record, one worker after another in rank order (a worker's
  // indices are distinct, as scatter_add requires), so each sum is added in rank order.
  k_.fill(g_bar_.span(), 0.0f);
  for (std::size_t r = 0; r < workers; ++r) {
    k_.scatter_add(g_bar_.span(), recv_idx_.span().subspan(r * k, k), recv_values_.span().subspan(r * k, k));
  }
  // Then g_bar /= W over the whole buffer: off the union g_bar is still the +0 of the fill, and
  // +0 / W is +0, so only the union changes.
  k_.divide(g_bar_.span(), static_cast<float>(workers));
  k_.zero_bytes(union_mask_.data(), union_mask_.bytes());
  k_.indices_to_bits(recv_idx_.span(), 0, union_mask_.span());
  return k_.popcount(union_mask_.span());
}

void TopkEfOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  const int t = t_;
  const double rho = density_at(config_.density(), config_.density_warmup, t);
  const std::size_t k = k_for(rho, n_);
  out.target_density = rho;
  out.residual_clipped_norm = feedback_.clip(layout_, grads);
  out.nonfinite_grads = select(grads, k);
  k_.synchronize();
  feedback_.deliver(idx_.span(), t);
  exchange_pairs();
  const std::size_t delivered = average_delivered(k);
  detail::dense_inner_step(k_, rule_, layout_, params, 0, n_, m_.span(), v_.span(), g_bar_.span(), config_, out.lr, t);

  // Mask metrics describe this worker's own mask; fill-in is the union over workers / K.
  feedback_.record_mask(layout_, mask_, k, out);
  out.fill_in = k ? static_cast<double>(delivered) / static_cast<double>(k) : 0.0;
}

}  // namespace scape
