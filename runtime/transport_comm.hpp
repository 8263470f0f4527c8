// A communicator over a caller's byte transport: the Python package backs it with
// torch.distributed (gloo on CPU, NCCL on GPU) through a nanobind trampoline, so `torchrun`
// ranks run the optimizer core with the same ledger as the MPI runtime. The transport moves
// bytes; the reductions are done here, in rank order by default, so results are bit-identical
// to the simulator's (docs/python.md).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "core/communicator.hpp"

namespace scape::runtime {

// What a caller's process group must do. Every rank calls each operation in the same order; a
// failure (a peer gone, a timeout) throws. Buffers are host memory.
class CollectiveTransport {
 public:
  virtual ~CollectiveTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // recv = the concatenation over ranks of their send (counts[r] bytes from rank r).
  virtual void all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                std::span<const std::size_t> counts) = 0;
  // MPI_Alltoallv: send holds segment r (send_counts[r] bytes) for rank r, back to back; recv
  // receives from each rank q its segment for this rank (recv_counts[q] bytes), in rank order.
  virtual void all_to_all_bytes(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                                std::span<std::byte> recv, std::span<const std::size_t> recv_counts) = 0;
  // data <- the sum over ranks of data, in the group's own order (not bit-reproducible);
  // used only when the communicator is not deterministic.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  virtual void barrier() = 0;
};

class TransportComm final : public Communicator {
 public:
  // deterministic: sums in rank order from an all-to-all (as MpiComm --deterministic); else the
  // transport's own all-reduce.
  TransportComm(CollectiveTransport& transport, NetworkModel net, bool deterministic);

 protected:
  SCAPE_COMMUNICATOR_BACKEND_HOOKS;  // Communicator's backend hooks (core/communicator.hpp)

 private:
  void reduce_scatter_in_rank_order(std::span<const float> send, std::span<float> recv,
                                    std::span<const std::size_t> counts);

  CollectiveTransport& transport_;
  bool deterministic_;
  std::vector<float> gathered_;
};

// Gathers `send` (counts[r] bytes on rank r) onto rank `root` only, over all_to_all_bytes:
// recv (sum(counts) bytes on root, empty elsewhere).
void gather_bytes(CollectiveTransport& transport, int root, std::span<const std::byte> send,
                  std::span<std::byte> recv, std::span<const std::size_t> counts);

}  // namespace scape::runtime
