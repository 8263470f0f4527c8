// SparseLoCo's outer step: error feedback, chunked top-k, quantization, the all-gather of the
// messages and the averaged step (docs/algorithms.md, "SparseLoCo"). The dense passes run as
// backend kernels; coding the message is host work on synchronized buffers, as for every
// collective.
#include "optimizers/baselines/sparseloco.hpp"

#include <algorithm>
#include <cstring>

#include "core/metrics.hpp"
#include "core/wire_values.hpp"
#include "kernels/kernel_types.hpp"

namespace scape {

SparselocoOptimizer::SparselocoOptimizer(const CommonOptimizerConfig& config, const OuterLoopSwitches& outer,
                                         const SparselocoSwitches& sparseloco, const ParamLayout& layout,
                                         Communicator& comm, int total_steps)
    : OuterLoopOptimizer(config, outer, layout, comm, total_steps, 1),
      sparseloco_(sparseloco),
      plan_(sparseloco_plan(layout, config, sparseloco)) {
  error_.assign_zero(n_);
  keep_in_checkpoint("sparseloco.error", error_);
  delta_.assign_zero(n_);
  mean_.assign_zero(n_);
  const auto workers = static_cast<std::size_t>(comm.size());
  idx_.assign_zero(plan_.total);
  selected_.assign_zero(plan_.total);
  recv_idx_.assign_zero(plan_.total * workers);
  recv_values_.assign_zero(plan_.total * workers);
  positions_.assign_zero(kernels::words_for(n_));
  code_.assign_zero(kernels::ef_words(n_, plan_.total));
  send_.resize(plan_.message_bytes());
  recv_.resize(plan_.message_bytes() * workers);
  kernels_.synchronize();
}

void SparselocoOptimizer::select() {
  std::size_t at = 0;
  const auto& slots = layout_.slots();
  for (std::size_t t = 0; t < slots.size(); ++t) {
    const std::size_t entries = plan_.entries[t];
    if (entries == 0) continue;
    kernels_.chunk_topk(error_.span().subspan(slots[t].offset, slots[t].numel()), plan_.chunk, plan_.k,
                        idx_.span().subspan(at, entries), selected_.span().subspan(at, entries));
    at += entries;
  }
  kernels_.synchronize();
  // chunk_topk counts from its tensor's start; the message and the sums count from the buffer's.
  at = 0;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    const auto offset = static_cast<std::uint32_t>(slots[t].offset);
    for (std::size_t i = 0; i < plan_.entries[t]; ++i) idx_.data()[at + i] += offset;
    at += plan_.entries[t];
  }
}

void SparselocoOptimizer::encode(std::byte* message) {
  const std::size_t total = plan_.total;
  const auto& slots = layout_.slots();
  if (config_.mask_encoding == MaskEncoding::bitmap) {
    // Each index within its chunk, at index_bits bits (12 at C = 4096, as Templar packs them).
    std::vector<std::uint32_t> local(total);
    std::size_t at = 0;
    for (std::size_t t = 0; t < slots.size(); ++t) {
      for (std::size_t i = at; i < at + plan_.entries[t]; ++i) {
        local[i] = static_cast<std::uint32_t>((idx_.data()[i] - slots[t].offset) % plan_.chunk);
      }
      at += plan_.entries[t];
    }
    std::vector<std::uint64_t> words(kernels::words_for(total * plan_.index_bits));
    pack_fixed_width(local, plan_.index_bits, words);
    if (!words.empty()) std::memcpy(message, words.data(), plan_.index_bytes);
  } else {
    // The positions ascend over the whole buffer: one Elias-Fano code of K among N.
    kernels_.zero_bytes(positions_.data(), positions_.bytes());
    kernels_.indices_to_bits(idx_.span(), 0, positions_.span());
    kernels_.ef_encode(positions_.span(), n_, total, code_.span());
    kernels_.synchronize();
    std::memcpy(message, code_.data(), plan_.index_bytes);
  }
  std::byte* values = message + plan_.index_bytes;
  const int bits = sparseloco_.quant_bits;
  if (bits == 0) {
    const std::size_t width = wire_bytes(config_.wire_dtype);
    for (std::size_t i = 0; i < total; ++i) {
      write_wire_value(values + i * width, selected_.data()[i], config_.wire_dtype);
    }
    return;
  }
  // One codebook per tensor (its shift, then its 2^bits bin means), then every code.
  std::vector<std::uint32_t> codes(total);
  std::size_t at = 0;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    const std::size_t entries = plan_.entries[t];
    if (entries == 0) continue;
    const QuantizedValues q = quantize_statistical(std::span<const float>(selected_.data() + at, entries), bits);
    std::memcpy(values, &q.shift, sizeof(float));
    std::memcpy(values + sizeof(float), q.codebook.data(), q.codebook.size() * sizeof(float));
    values += (q.codebook.size() + 1) * sizeof(float);
    for (std::size_t i = 0; i < entries; ++i) codes[at + i] = q.codes[i];
    at += entries;
  }
  std::vector<std::uint64_t> words(kernels::words_for(total * static_cast<std::size_t>(bits)));
  pack_fixed_width(codes, static_cast<unsigned>(bits), words);
  std::memcpy(values, words.data(), plan_.value_bytes);
}

void SparselocoOptimizer::decode(const std::byte* message, std::span<std::uint32_t> idx, std::span<float> values) {
  const std::size_t total = plan_.total;
  const std::size_t chunk = plan_.chunk;
  const auto& slots = layout_.slots();
  if (config_.mask_encoding == MaskEncoding::bitmap) {
    std::vector<std::uint64_t> words(kernels::words_for(total * plan_.index_bits));
    if (!words.empty()) std::memcpy(words.data(), message, plan_.index_bytes);
    std::vector<std::uint32_t> local(total);
    unpack_fixed_width(words, plan_.index_bits, local);
    // The entries come chunk by chunk, min(k, length) of each.
    std::size_t i = 0;
    for (const auto& slot : slots) {
      for (std::size_t start = 0; start < slot.numel(); start += chunk) {
        const std::size_t kept = std::min(plan_.k, std::min(chunk, slot.numel() - start));
        for (std::size_t e = 0; e < kept; ++e, ++i) idx[i] = static_cast<std::uint32_t>(slot.offset + start + local[i]);
      }
    }
  } else {
    std::memcpy(code_.data(), message, plan_.index_bytes);
    kernels_.ef_decode_indices(code_.span(), n_, total, idx);
    kernels_.synchronize();
  }
  const std::byte* from = message + plan_.index_bytes;
  const int bits = sparseloco_.quant_bits;
  if (bits == 0) {
    const std::size_t width = wire_bytes(config_.wire_dtype);
    for (std::size_t i = 0; i < total; ++i) values[i] = read_wire_value(from + i * width, config_.wire_dtype);
    return;
  }
  const std::size_t bins = std::size_t{1} << bits;
  const std::byte* codebooks = from;
  std::vector<std::uint64_t> words(kernels::words_for(total * static_cast<std::size_t>(bits)));
  std::memcpy(words.data(), from + plan_.codebook_bytes, plan_.value_bytes);
  std::vector<std::uint32_t> codes(total);
  unpack_fixed_width(words, static_cast<unsigned>(bits), codes);
  std::vector<float> book(bins + 1);  // the shift, then the bins
  std::size_t at = 0;
  for (std::size_t t = 0; t < slots.size(); ++t) {
    if (plan_.entries[t] == 0) continue;
    std::memcpy(book.data(), codebooks, book.size() * sizeof(float));
    codebooks += book.size() * sizeof(float);
    for (std::size_t i = at; i < at + plan_.entries[t]; ++i) values[i] = book[1 + codes[i]] + book[0];
    at += plan_.entries[t];
  }
}

void SparselocoOptimizer::outer_step(std::span<const float> params, std::size_t lo, std::size_t hi,
                                     StepMetrics& out) {
  const std::span<float> delta = delta_.span().subspan(lo, hi - lo);
  pseudo_gradient(params, lo, delta);
  out.pseudo_grad_norm = metrics::device_l2_norm(kernels_, norm_partial_, delta);
  // e_i <- beta e_i + Delta_i, then its top-k per chunk, quantized.
  kernels_.scale(error_.span(), static_cast<float>(sparseloco_.ef_decay));
  kernels_.accumulate(error_.span(), delta);
  select();
  encode(send_.data());
  // What this worker delivers is what every receiver decodes from its message; e_i keeps the rest.
  decode(send_.data(), idx_.span(), selected_.span());
  kernels_.scale(selected_.span(), -1.0f);
  kernels_.scatter_add(error_.span(), idx_.span(), selected_.span());
  const auto workers = static_cast<std::size_t>(comm_.size());
  const std::size_t message = send_.size();
  comm_.all_gather_bytes(send_, recv_, std::vector<std::size_t>(workers, message), "sparseloco_all_gather");
  const std::size_t total = plan_.total;
  for (std::size_t r = 0; r < workers; ++r) {
    decode(recv_.data() + r * message, recv_idx_.span().subspan(r * total, total),
           recv_values_.span().subspan(r * total, total));
  }
  // The mean over workers: each worker's values added into zeros in rank order, then / W; then
  // theta_global -= outer_lr mean.
  kernels_.fill(mean_.span(), 0.0f);
  for (std::size_t r = 0; r < workers; ++r) {
    kernels_.scatter_add(mean_.span(), recv_idx_.span().subspan(r * total, total),
                         recv_values_.span().subspan(r * total, total));
  }
  kernels_.divide(mean_.span(), static_cast<float>(workers));
  kernels_.scale(mean_.span(), -static_cast<float>(outer_.resolved_outer_lr(kSparselocoOuterLr)));
  kernels_.accumulate(global_.span(), mean_.span());
}

}  // namespace scape
