// Coded masks on the wire (docs/algorithms.md, "Mask coding"): one shard's bits as a message of
// 64-bit words in the format of an encoding, with the sizes every rank can compute and the
// coder that writes and reads messages with backend kernels (kernels/kernel_list.inc).
//
// Messages of one shard of n bits with k set, against the previous step's shard (k_prev set):
//   bitmap      the words_for(n) mask words;
//   elias_fano  ef_words(n, k) words (kernels/kernel_types.hpp);
//   delta, auto a header word (format tag in bits 0-1, the count k_new of positions not in the
//               previous shard above them), then the body of the tagged format: bitmap words,
//               Elias-Fano words, or (delta) words_for(k_prev) "kept" bits, bit r saying whether
//               the r-th previous position stays, followed by the k_new new positions
//               Elias-Fano coded among n.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/optimizer.hpp"
#include "kernels/backend.hpp"

namespace scape {

enum class ShardFormat : std::uint64_t { bitmap = 0, elias_fano = 1, delta = 2 };

// Whether every rank knows every shard's message size from (n, k) alone (bitmap, elias_fano);
// the others exchange sizes first.
bool mask_sizes_known(MaskEncoding e);
// Words of a message of a size-known encoding.
std::size_t fixed_message_words(MaskEncoding e, std::size_t n, std::size_t k);
// Words of a tagged (delta or auto) message in format f, header included.
std::size_t tagged_message_words(ShardFormat f, std::size_t n, std::size_t k, std::size_t k_prev, std::size_t k_new);
// The format auto picks: the smallest of the three, ties to the simpler (bitmap, then
// elias_fano, then delta).
ShardFormat smallest_format(std::size_t n, std::size_t k, std::size_t k_prev, std::size_t k_new);

// Writes and reads shard messages. The spans are backend memory; both calls may synchronize.
class ShardCoder {
 public:
  explicit ShardCoder(kernels::KernelBackend& k) : kernels_(k) {}

  // The message of `shard` (n bits, k set) against `previous` (same length) into out.
  void encode(MaskEncoding e, std::span<const std::uint64_t> shard, std::size_t n, std::size_t k,
              std::span<const std::uint64_t> previous, kernels::Buffer<std::uint64_t>& out);
  // Writes the shard a message codes into `shard` (cleared first). Throws std::invalid_argument
  // naming the shard when the message does not fit its size or tag.
  void decode(MaskEncoding e, std::span<const std::uint64_t> message, std::size_t n, std::size_t k,
              std::span<const std::uint64_t> previous, std::span<std::uint64_t> shard, int shard_index);

 private:
  void encode_tagged(ShardFormat f, std::span<const std::uint64_t> shard, std::size_t n, std::size_t k,
                     std::span<const std::uint64_t> previous, std::size_t k_prev, std::size_t k_new,
                     kernels::Buffer<std::uint64_t>& out);

  kernels::KernelBackend& kernels_;
  kernels::Buffer<std::uint64_t> fresh_{kernels_};  // delta: positions not in the previous shard
};

}  // namespace scape
