// Shard message sizes and the shard coder (formats: optimizers/scape/mask_codec.hpp).
#include "optimizers/scape/mask_codec.hpp"

#include <stdexcept>
#include <string>

#include "kernels/kernel_types.hpp"

namespace scape {
namespace {

constexpr std::uint64_t kTagBits = 2;
constexpr std::uint64_t kTagMask = (std::uint64_t{1} << kTagBits) - 1;

std::uint64_t header_of(ShardFormat f, std::size_t k_new) {
  return (static_cast<std::uint64_t>(k_new) << kTagBits) | static_cast<std::uint64_t>(f);
}

[[noreturn]] void bad_message(int shard_index, const std::string& why) {
  throw std::invalid_argument("mask message of shard " + std::to_string(shard_index) + ": " + why);
}

void require_message_words(std::size_t got, std::size_t want, int shard_index) {
  if (got != want) {
    bad_message(shard_index, std::to_string(got) + " words, its format needs " + std::to_string(want));
  }
}

}  // namespace

bool mask_sizes_known(MaskEncoding e) { return e == MaskEncoding::bitmap || e == MaskEncoding::elias_fano; }

std::size_t fixed_message_words(MaskEncoding e, std::size_t n, std::size_t k) {
  if (e == MaskEncoding::bitmap) return kernels::words_for(n);
  if (e == MaskEncoding::elias_fano) return kernels::ef_words(n, k);
  throw std::invalid_argument(std::string("fixed_message_words: ") + to_string(e) + " messages vary in size");
}

std::size_t tagged_message_words(ShardFormat f, std::size_t n, std::size_t k, std::size_t k_prev, std::size_t k_new) {
  switch (f) {
    case ShardFormat::bitmap: return 1 + kernels::words_for(n);
    case ShardFormat::elias_fano: return 1 + kernels::ef_words(n, k);
    case ShardFormat::delta: return 1 + kernels::words_for(k_prev) + kernels::ef_words(n, k_new);
  }
  throw std::invalid_argument("tagged_message_words: unknown format");
}

ShardFormat smallest_format(std::size_t n, std::size_t k, std::size_t k_prev, std::size_t k_new) {
  ShardFormat best = ShardFormat::bitmap;
  for (const ShardFormat f : {ShardFormat::elias_fano, ShardFormat::delta}) {
    if (tagged_message_words(f, n, k, k_prev, k_new) < tagged_message_words(best, n, k, k_prev, k_new)) best = f;
  }
  return best;
}

void ShardCoder::encode(MaskEncoding e, std::span<const std::uint64_t> shard, std::size_t n, std::size_t k,
                        std::span<const std::uint64_t> previous, kernels::Buffer<std::uint64_t>& out) {
  if (e == MaskEncoding::bitmap) {
    out.resize(shard.size());
    kernels_.copy_bytes(shard.data(), out.data(), shard.size_bytes());
    return;
  }
  if (e == MaskEncoding::elias_fano) {
    out.resize(kernels::ef_words(n, k));
    kernels_.ef_encode(shard, n, k, out.span());
    return;
  }
  const std::size_t k_prev = kernels_.popcount(previous);
  const std::size_t k_new = k - kernels_.popcount_and(shard, previous);
  const ShardFormat f = e == MaskEncoding::delta ? ShardFormat::delta : smallest_format(n, k, k_prev, k_new);
  encode_tagged(f, shard, n, k, previous, k_prev, k_new, out);
}

void ShardCoder::encode_tagged(ShardFormat f, std::span<const std::uint64_t> shard, std::size_t n, std::size_t k,
                               std::span<const std::uint64_t> previous, std::size_t k_prev, std::size_t k_new,
                               kernels::Buffer<std::uint64_t>& out) {
  out.resize(tagged_message_words(f, n, k, k_prev, k_new));
  kernels_.synchronize();  // the host writes the header into backend memory
  out.data()[0] = header_of(f, k_new);
  const auto body = out.span().subspan(1);
  switch (f) {
    case ShardFormat::bitmap: kernels_.copy_bytes(shard.data(), body.data(), shard.size_bytes()); return;
    case ShardFormat::elias_fano: kernels_.ef_encode(shard, n, k, body); return;
    case ShardFormat::delta: {
      const std::size_t kept_words = kernels::words_for(k_prev);
      kernels_.extract_bits(shard, previous, body.first(kept_words));
      fresh_.resize(shard.size());
      kernels_.and_not_bits(shard, previous, fresh_.span());
      kernels_.ef_encode(fresh_.span(), n, k_new, body.subspan(kept_words));
      return;
    }
  }
}

void ShardCoder::decode(MaskEncoding e, std::span<const std::uint64_t> message, std::size_t n, std::size_t k,
                        std::span<const std::uint64_t> previous, std::span<std::uint64_t> shard, int shard_index) {
  kernels_.zero_bytes(shard.data(), shard.size_bytes());
  if (mask_sizes_known(e)) {
    require_message_words(message.size(), fixed_message_words(e, n, k), shard_index);
    if (e == MaskEncoding::bitmap) {
      kernels_.copy_bytes(message.data(), shard.data(), message.size_bytes());
    } else {
      kernels_.ef_decode(message, n, k, shard);
    }
    return;
  }
  if (message.empty()) bad_message(shard_index, "no header word");
  kernels_.synchronize();  // the host reads the header from backend memory
  const std::uint64_t header = message[0];
  const std::uint64_t tag = header & kTagMask;
  const std::size_t k_new = static_cast<std::size_t>(header >> kTagBits);
  if (tag > static_cast<std::uint64_t>(ShardFormat::delta))
    bad_message(shard_index, "unknown format tag " + std::to_string(tag));
  const auto f = static_cast<ShardFormat>(tag);
  if (e == MaskEncoding::delta && f != ShardFormat::delta) bad_message(shard_index, "delta message with another tag");
  if (k_new > k) bad_message(shard_index, std::to_string(k_new) + " new positions exceed k = " + std::to_string(k));
  const std::size_t k_prev = kernels_.popcount(previous);
  require_message_words(message.size(), tagged_message_words(f, n, k, k_prev, k_new), shard_index);
  const auto body = message.subspan(1);
  switch (f) {
    case ShardFormat::bitmap: kernels_.copy_bytes(body.data(), shard.data(), body.size_bytes()); return;
    case ShardFormat::elias_fano: kernels_.ef_decode(body, n, k, shard); return;
    case ShardFormat::delta: {
      const std::size_t kept_words = kernels::words_for(k_prev);
      kernels_.deposit_bits(body.first(kept_words), previous, shard);
      kernels_.ef_decode(body.subspan(kept_words), n, k_new, shard);
      return;
    }
  }
}

}  // namespace scape
