// DGC-style raw-gradient top-k with error feedback (docs/algorithms.md, "Baseline"). The
// arithmetic runs as backend kernels; packing the wire records is host work on synchronized
// buffers, as for every collective.
#include "optimizers/baselines/topk_ef.hpp"
#include "optimizers/baselines/coded_message.hpp"

#include <chrono>
#include <cstring>
#include <vector>

#include "core/adam_step.hpp"
#include "core/wire_values.hpp"
#include "kernels/cpu/kernels.hpp"

namespace scape {
namespace {

// Wire record per selected coordinate: 4-byte index, then the value at the wire width.
std::size_t record_bytes(WireType wire) { return sizeof(std::uint32_t) + wire_bytes(wire); }

void write_record(std::byte* p, std::uint32_t index, float value, WireType wire) {
  std::memcpy(p, &index, sizeof index);
  write_wire_value(p + sizeof index, value, wire);
}

void read_record(const std::byte* p, WireType wire, std::uint32_t& index, float& value) {
  std::memcpy(&index, p, sizeof index);
  value = read_wire_value(p + sizeof index, wire);
}

}  // namespace

TopkEfOptimizer::TopkEfOptimizer(const CommonOptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                                 int total_steps)
    : FeedbackOptimizer(config, layout, comm, total_steps) {
  union_mask_.assign_zero(kernels::words_for(n_));
  kernels_.synchronize();
}

std::size_t TopkEfOptimizer::select(std::span<const float> grads, std::size_t k) {
  const auto e = feedback_.residual().resident();
  const std::size_t nonfinite = kernels_.accumulate(e, grads);
  idx_.resize(k);
  kernels_.topk_abs_mask(e, k, mask_.span());
  kernels_.bits_to_indices(mask_.span(), 0, idx_.span());
  sent_values_.resize(k);
  kernels_.compact(e, idx_.span(), sent_values_.span());
  feedback_.keep_off_mask(e, idx_.span());
  return nonfinite;
}

// Coded messages: the Elias-Fano code of the k indices among N (ascending, as idx_ holds them),
// then the k values in that order at the wire width.
void TopkEfOptimizer::exchange_coded() {
  const std::size_t k = idx_.size();
  const auto workers = static_cast<std::size_t>(comm_.size());
  const std::size_t code_bytes = kernels::ef_words(n_, k) * sizeof(std::uint64_t);
  const std::size_t value_bytes = wire_bytes(config_.wire_dtype);
  const std::size_t message = code_bytes + k * value_bytes;
  send_.resize(message);
  recv_.resize(message * workers);
  recv_idx_.resize(k * workers);
  recv_values_.resize(k * workers);
  code_.resize(code_bytes / sizeof(std::uint64_t));
  auto clock = std::chrono::steady_clock::now();
  kernels_.ef_encode(mask_.span(), n_, k, code_.span());
  kernels_.synchronize();
  codec_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock).count();
  pack_coded_message(code_.span(), sent_values_.span(), config_.wire_dtype, send_.data());
  const std::vector<std::size_t> counts(workers, message);
  comm_.all_gather_bytes(send_.span(), recv_.span(), counts, "topk_all_gather");
  clock = std::chrono::steady_clock::now();
  unpack_coded_messages(kernels_, recv_.span(), workers, n_, k, config_.wire_dtype, code_, recv_idx_.span(),
                        recv_values_.span());
  codec_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - clock).count();
}

void TopkEfOptimizer::exchange_pairs() {
  if (config_.mask_encoding != MaskEncoding::bitmap) {
    exchange_coded();
    return;
  }
  const std::size_t record = record_bytes(config_.wire_dtype);
  const std::size_t k = idx_.size();
  const auto workers = static_cast<std::size_t>(comm_.size());
  send_.resize(k * record);
  recv_.resize(send_.size() * workers);
  recv_idx_.resize(k * workers);
  recv_values_.resize(k * workers);
  kernels_.synchronize();
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
  // g_bar is +0 everywhere here (zeroed at construction, and on the last step's union after
  // its inner step). g_bar[j] += value for every record, one worker after another in rank
  // order (a worker's indices are distinct, as scatter_add requires), so each sum is added in
  // rank order.
  for (std::size_t r = 0; r < workers; ++r) {
    kernels_.scatter_add(g_bar_.span(), recv_idx_.span().subspan(r * k, k), recv_values_.span().subspan(r * k, k));
  }
  kernels_.zero_bytes(union_mask_.data(), union_mask_.bytes());
  kernels_.indices_to_bits(recv_idx_.span(), 0, union_mask_.span());
  const std::size_t delivered = kernels_.popcount(union_mask_.span());
  // Then g_bar /= W on the union only: off it g_bar is +0, which / W leaves as it is, so this
  // equals dividing the whole buffer bit for bit at a tenth of the memory traffic.
  union_idx_.resize(delivered);
  union_values_.resize(delivered);
  kernels_.bits_to_indices(union_mask_.span(), 0, union_idx_.span());
  kernels_.compact(g_bar_.span(), union_idx_.span(), union_values_.span());
  kernels_.divide(union_values_.span(), static_cast<float>(workers));
  kernels_.expand(union_values_.span(), union_idx_.span(), g_bar_.span());
  return delivered;
}

void TopkEfOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  const int t = t_;
  const std::size_t k = begin_step(grads, out);
  out.nonfinite_grads = select(grads, k);
  feedback_.measure_residual(layout_, t, out);  // final for this step, and still in cache
  kernels_.synchronize();
  feedback_.deliver(idx_.span(), t);
  codec_s_ = 0;
  exchange_pairs();
  out.mask_codec_s = codec_s_;
  const std::size_t delivered = average_delivered(k);
  detail::clip_gradient(kernels_, clip_partial_, comm_, g_bar_.span(), config_.clip_grad, false);
  detail::dense_inner_step(kernels_, rule_, layout_, params, 0, n_, m_.span(), v_.span(), g_bar_.span(), config_,
                           out.lr, t);
  kernels_.zero_at(g_bar_.span(), union_idx_.span());  // +0 everywhere again for the next step

  // Mask metrics describe this worker's own mask; fill-in is the union over workers / K.
  feedback_.record_mask(layout_, mask_, k, out);
  out.fill_in = k ? static_cast<double>(delivered) / static_cast<double>(k) : 0.0;
}

}  // namespace scape
