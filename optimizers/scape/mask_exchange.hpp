// The coded all-gather of SCAPE's partitioned mask (docs/algorithms.md, "Mask coding"): each
// worker codes its shard of the new mask against the mask every rank already holds, the sizes
// are all-gathered first when the encoding makes them vary (delta, auto), the messages are
// all-gathered (at once, or overlapped with the next step's compute under lag 1), and every
// shard is decoded into the full mask. With local_union masks each worker's top-K index list
// is Elias-Fano coded among N instead (any encoding other than bitmap: the other workers do
// not hold its previous list) and the union is decoded. Coding is lossless: the decoded mask
// equals the bitmap (or raw index) all-gather's bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/communicator.hpp"
#include "core/layout.hpp"
#include "kernels/backend.hpp"
#include "optimizers/scape/mask_codec.hpp"
#include "optimizers/scape/mask_ownership.hpp"

namespace scape {

class MaskExchange {
 public:
  // Owners whose ranges are not word-aligned (MaskOwnership::aligned) take the bitmap and
  // elias_fano encodings only: the others code against the previous segment, which neighbours share.
  MaskExchange(kernels::KernelBackend& k, Communicator& comm, const MaskOwnership& owners, MaskEncoding encoding);

  // Codes `local` (this worker's segment words of the new mask, owner w setting owner_k[w]
  // bits) against `previous` (the full mask every rank holds; unchanged until complete()) and
  // starts the all-gather, asynchronous when `overlapped`.
  void start(std::span<const std::uint64_t> local, std::span<const std::uint64_t> previous,
             const std::vector<std::size_t>& owner_k, bool overlapped);
  // local_union: codes this worker's ascending index list (the same length on every worker)
  // and starts the all-gather of the lists ("index_all_gather").
  void start_indices(std::span<const std::uint32_t> local, bool overlapped);
  // Waits for the all-gather started last and decodes every shard (local_union: the union of
  // every list) into `out` (full mask words, not aliasing previous). Nothing happens when no
  // all-gather is in flight.
  void complete(std::span<const std::uint64_t> previous, std::span<std::uint64_t> out);
  // Wall seconds spent coding and decoding since the last call.
  double take_codec_seconds();

 private:
  std::span<const std::uint64_t> shard_words(std::span<const std::uint64_t> mask, int w) const;
  void exchange_sizes();
  void gather(std::string_view purpose, bool overlapped);

  kernels::KernelBackend& kernels_;
  Communicator& comm_;
  const MaskOwnership& owners_;
  const MaskEncoding encoding_;
  ShardCoder coder_;
  kernels::Buffer<std::uint64_t> own_{kernels_}, received_{kernels_};
  kernels::Buffer<std::uint64_t> own_size_{kernels_}, sizes_{kernels_};  // delta, auto: message words per shard
  std::vector<std::size_t> counts_;                          // message words per shard, rank order
  std::vector<std::size_t> shard_k_;                         // set bits per shard (per list)
  kernels::Buffer<std::uint64_t> list_bits_{kernels_};             // local_union: own list as a mask
  bool union_ = false;                                       // in flight: index lists
  PendingCollective pending_;
  bool in_flight_ = false;
  double codec_s_ = 0;
};

}  // namespace scape
