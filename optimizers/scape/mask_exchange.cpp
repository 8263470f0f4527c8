// Coded mask all-gather (optimizers/scape/mask_exchange.hpp).
#include "optimizers/scape/mask_exchange.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include "core/schedule.hpp"

namespace scape {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

MaskExchange::MaskExchange(kernels::KernelBackend& k, Communicator& comm, const MaskOwnership& owners,
                           MaskEncoding encoding)
    : kernels_(k), comm_(comm), owners_(owners), encoding_(encoding), coder_(k) {
  if (!owners.aligned() && !mask_sizes_known(encoding)) {
    throw std::invalid_argument(std::string("optimizer.mask_encoding: ") + to_string(encoding) +
                                " codes each owner's bits against its previous ones, which needs word-aligned owners; "
                                "replicated mask_scope = tensor owners are whole tensors (use bitmap or elias_fano, "
                                "or optimizer.mask_scope = shard)");
  }
  const auto workers = static_cast<std::size_t>(owners.workers());
  counts_.assign(workers, 0);
  shard_k_.assign(workers, 0);
}

std::span<const std::uint64_t> MaskExchange::shard_words(std::span<const std::uint64_t> mask, int w) const {
  // Aligned owners own whole words; the others share a boundary word with a neighbour.
  return mask.subspan(owners_.word_begin(w), owners_.word_count(w));
}

void MaskExchange::exchange_sizes() {
  const auto workers = static_cast<std::size_t>(owners_.workers());
  own_size_.resize(1);
  sizes_.resize(workers);
  kernels_.synchronize();
  own_size_.data()[0] = own_.size();
  const std::vector<std::size_t> ones(workers, 1);
  comm_.all_gather_words(own_size_.span(), sizes_.span(), ones, "mask_size_all_gather");
  kernels_.synchronize();
  for (std::size_t w = 0; w < workers; ++w) counts_[w] = static_cast<std::size_t>(sizes_.data()[w]);
}

void MaskExchange::start(std::span<const std::uint64_t> local, std::span<const std::uint64_t> previous,
                         const std::vector<std::size_t>& owner_k, bool overlapped) {
  const auto clock = std::chrono::steady_clock::now();
  const int me = comm_.rank();
  shard_k_ = owner_k;
  coder_.encode(encoding_, local, owners_.segment_bits(me), shard_k_[static_cast<std::size_t>(me)],
                shard_words(previous, me), own_);
  kernels_.synchronize();
  codec_s_ += seconds_since(clock);
  if (mask_sizes_known(encoding_)) {
    for (int w = 0; w < owners_.workers(); ++w) {
      const auto i = static_cast<std::size_t>(w);
      counts_[i] = fixed_message_words(encoding_, owners_.segment_bits(w), shard_k_[i]);
    }
  } else {
    exchange_sizes();
  }
  union_ = false;
  gather("mask_all_gather", overlapped);
}

void MaskExchange::start_indices(std::span<const std::uint32_t> local, bool overlapped) {
  const auto clock = std::chrono::steady_clock::now();
  const std::size_t n = owners_.n();
  list_bits_.assign_zero(kernels::words_for(n));
  kernels_.indices_to_bits(local, 0, list_bits_.span());
  own_.resize(kernels::ef_words(n, local.size()));
  kernels_.ef_encode(list_bits_.span(), n, local.size(), own_.span());
  kernels_.synchronize();
  codec_s_ += seconds_since(clock);
  shard_k_.assign(shard_k_.size(), local.size());
  counts_.assign(counts_.size(), own_.size());
  union_ = true;
  gather("index_all_gather", overlapped);
}

void MaskExchange::gather(std::string_view purpose, bool overlapped) {
  std::size_t total = 0;
  for (const std::size_t c : counts_) total += c;
  received_.resize(total);
  if (overlapped) {
    pending_ = comm_.all_gather_words_async(own_.span(), received_.span(), counts_, purpose);
  } else {
    comm_.all_gather_words(own_.span(), received_.span(), counts_, purpose);
  }
  in_flight_ = true;
}

void MaskExchange::complete(std::span<const std::uint64_t> previous, std::span<std::uint64_t> out) {
  if (!in_flight_) return;
  pending_.wait();
  in_flight_ = false;
  const auto clock = std::chrono::steady_clock::now();
  std::size_t offset = 0;
  if (union_) {
    // ef_decode ORs each list's positions into the mask: the union.
    kernels_.zero_bytes(out.data(), out.size_bytes());
    for (std::size_t w = 0; w < counts_.size(); ++w) {
      kernels_.ef_decode(received_.span().subspan(offset, counts_[w]), owners_.n(), shard_k_[w], out);
      offset += counts_[w];
    }
    kernels_.synchronize();
    codec_s_ += seconds_since(clock);
    return;
  }
  // Unaligned owners share boundary words: each segment is ORed into the cleared mask
  // (ef_decode sets bits without clearing), the bitmap's words by or_bits.
  if (!owners_.aligned()) kernels_.zero_bytes(out.data(), out.size_bytes());
  for (int w = 0; w < owners_.workers(); ++w) {
    const auto i = static_cast<std::size_t>(w);
    const auto message = received_.span().subspan(offset, counts_[i]);
    const auto target = out.subspan(owners_.word_begin(w), owners_.word_count(w));
    if (owners_.aligned()) {
      coder_.decode(encoding_, message, owners_.segment_bits(w), shard_k_[i], shard_words(previous, w), target, w);
    } else if (encoding_ == MaskEncoding::bitmap) {
      kernels_.or_bits(message, target);
    } else {
      kernels_.ef_decode(message, owners_.segment_bits(w), shard_k_[i], target);
    }
    offset += counts_[i];
  }
  kernels_.synchronize();
  codec_s_ += seconds_since(clock);
}

double MaskExchange::take_codec_seconds() {
  const double s = codec_s_;
  codec_s_ = 0;
  return s;
}

}  // namespace scape
