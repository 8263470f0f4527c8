// Communicator interface seen by the optimizer core: all_reduce (average), reduce_scatter,
// all_gather, an asynchronous all_gather and reduce_scatter waited on later, barrier, rank and
// size. Backends
// (EmulatedComm in sim/, MpiComm and NcclComm in runtime/) only move bytes and sum floats;
// the wire rounding, size checks and the byte ledger live here, once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "core/ledger.hpp"

namespace scape {

// Width at which a payload crosses the wire. Values really are rounded to bf16 before they
// are reduced; in memory they stay fp32.
// fp8_e5m2: SCAPE's payload only, which the optimizer quantizes itself (a shared power-of-two
// scale, the error into the residual) before the collective; the collective carries those
// values exactly in fp32 lanes, sums in fp32, and counts 1 byte per value.
enum class WireType { fp32, bf16, fp8_e5m2 };
std::size_t wire_bytes(WireType w);
const char* to_string(WireType w);
// Throws std::invalid_argument naming `parameter` and the value when it is not fp32, bf16 or fp8_e5m2.
WireType parse_wire_type(std::string_view value, std::string_view parameter);
// "fp32", "bf16", "fp8_e5m2": the names parse_wire_type accepts (fp8_e5m2 for SCAPE's payload only).
std::vector<std::string> wire_type_names();

// Backend side of an asynchronous collective.
class AsyncRequest {
 public:
  virtual ~AsyncRequest() = default;
  virtual void wait() = 0;
};

// A collective that runs when it is waited for: where every rank of an SPMD program reaches
// the same point of its collective sequence (threads-as-ranks). Reading the receive buffer
// before wait() sees stale data, as it would with MPI.
class DeferredCollective final : public AsyncRequest {
 public:
  explicit DeferredCollective(std::function<void()> run) : run_(std::move(run)) {}
  void wait() override { run_(); }

 private:
  std::function<void()> run_;
};

// Handle of an asynchronous collective: the receive buffer is valid only after wait(), and
// the send buffer must stay alive and unchanged until then (MPI semantics).
class PendingCollective {
 public:
  PendingCollective() = default;
  explicit PendingCollective(std::unique_ptr<AsyncRequest> request) : request_(std::move(request)) {}
  bool pending() const { return request_ != nullptr; }
  void wait();

 private:
  std::unique_ptr<AsyncRequest> request_;
};

class Communicator {
 public:
  // `link`: the link class its collectives are charged to in the ledger.
  Communicator(int rank, int size, NetworkModel net, LinkClass link = LinkClass::inter);
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  ByteLedger& ledger() { return ledger_; }
  const ByteLedger& ledger() const { return ledger_; }

  // data <- mean over ranks of data (sum in rank order, then divided by W).
  void all_reduce_mean(std::span<float> data, WireType wire, std::string_view purpose);
  // send holds sum(counts) values, segment r for rank r; recv (counts[rank] values) receives
  // the mean over ranks of this rank's segment.
  void reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                           std::span<const std::size_t> counts, WireType wire, std::string_view purpose);
  // recv = concatenation over ranks of their send (counts[r] values from rank r).
  void all_gather(std::span<const float> send, std::span<float> recv, std::span<const std::size_t> counts,
                  WireType wire, std::string_view purpose);
  void all_gather_words(std::span<const std::uint64_t> send, std::span<std::uint64_t> recv,
                        std::span<const std::size_t> counts, std::string_view purpose);
  // reduce_scatter_mean at fp32 width that returns at once: a bucket of the gradient reduced
  // while the backward pass goes on (optimizer.overlap_grad_reduce), recorded as a backward
  // bucket in the ledger. Asynchronous reduce-scatters are waited for in the order they were
  // started, on every rank alike.
  PendingCollective reduce_scatter_mean_async(std::span<const float> send, std::span<float> recv,
                                              std::span<const std::size_t> counts, std::string_view purpose);
  // Whether an asynchronous collective started now reads its send buffer only after every kernel
  // queued so far has finished, on any stream (the default deferred collective: it runs at
  // wait(), after the step synchronized). When false the caller synchronizes the kernels that
  // write the buffer first: MPI's communication thread reads memory at once, and NCCL orders
  // itself only after the calling thread's current stream, not after a backend's own stream.
  virtual bool waits_for_queued_kernels() const { return true; }
  PendingCollective all_gather_words_async(std::span<const std::uint64_t> send, std::span<std::uint64_t> recv,
                                          std::span<const std::size_t> counts, std::string_view purpose);
  // Raw bytes (index/value pairs); counts in bytes.
  void all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                        std::span<const std::size_t> counts, std::string_view purpose);
  PendingCollective all_gather_bytes_async(std::span<const std::byte> send, std::span<std::byte> recv,
                                          std::span<const std::size_t> counts, std::string_view purpose);
  // The exchange of a reduce-scatter without the reduction (MPI_Alltoallv with segments that
  // depend only on the receiver): send holds sum(counts) bytes, segment r for rank r; recv
  // (W counts[rank] bytes) receives segment `rank` of every rank, in rank order. For a
  // reduction the sum cannot do, e.g. of compressed payloads (docs/algorithms.md, "1-bit Adam").
  void all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                        std::span<const std::size_t> counts, std::string_view purpose);
  void barrier();
  // A communicator of the ranks that pass the same `color` (>= 0), ranked as here, whose
  // collectives the ledger charges to `link` and models with `net` (optimizer.hierarchy's node
  // and rail groups). Collective: every rank calls it at the same point of its sequence. The
  // result may be used only while this communicator lives. Default: std::logic_error, for a
  // backend without groups.
  virtual std::unique_ptr<Communicator> split(int color, LinkClass link, NetworkModel net);
  // Ends this rank's part at once because the rank failed: outstanding and later collectives
  // return or fail instead of waiting for peers (NCCL: ncclCommAbort). Called before the rank's
  // device memory is freed, since freeing waits for the device, which a collective stuck on a
  // failed peer never lets finish; may be called from another thread (the MPI runner's
  // watchdog) and more than once. No collective may follow. Default: nothing to stop.
  virtual void abort() noexcept {}

  // Wall seconds spent in each collective (by purpose) since the last call, and the time the
  // caller was blocked waiting for asynchronous collectives of one kind (all_gather: the lagged
  // mask; reduce_scatter: the gradient buckets). Real backends make these meaningful; for
  // threads-as-ranks they only measure synchronisation.
  std::map<std::string, double> take_measured_times();
  double take_exposed_wait(CollectiveKind kind);
  // The part of take_measured_times spent in synchronous collectives, which the caller blocked
  // in (the asynchronous ones ran beside it); taken once, like the others.
  double take_blocking_seconds();
  // Moves the measured times, blocking seconds and waits of `group` (split from this one) into
  // this one: the run's report takes them from the world communicator alone, so
  // optimizer.hierarchy's node and rail collectives reach it only this way.
  void absorb_measurements(Communicator& group);

 protected:
  // Backends report the duration of an asynchronous collective and the caller's wait for it.
  void add_measured_time(std::string_view purpose, double seconds);
  // The device's own duration of the synchronous collective that just returned, when the backend
  // times it there (NCCL: CUDA events around its work on the communication stream); taken once.
  // Without one the measured time is the host's wall time around the call.
  virtual std::optional<double> take_device_seconds() { return std::nullopt; }
  void add_exposed_wait(CollectiveKind kind, double seconds);

  // The asynchronous reduce-scatter. Default: deferred, run as do_reduce_scatter_mean when it is
  // waited for (threads-as-ranks, where every rank waits in the same order); MPI and NCCL run it
  // beside the caller. The send and receive buffers stay valid until the wait.
  virtual std::unique_ptr<AsyncRequest> do_reduce_scatter_mean_async(std::span<const float> send,
                                                                     std::span<float> recv,
                                                                     std::span<const std::size_t> counts);

  // Backend hooks. Sizes are already checked; values already rounded to the wire type.
  virtual void do_all_reduce_mean(std::span<float> data) = 0;
  virtual void do_reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                                      std::span<const std::size_t> counts) = 0;
  virtual void do_all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                   std::span<const std::size_t> counts) = 0;
  virtual std::unique_ptr<AsyncRequest> do_all_gather_bytes_async(std::span<const std::byte> send,
                                                                  std::span<std::byte> recv,
                                                                  std::span<const std::size_t> counts) = 0;
  virtual void do_all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                   std::span<const std::size_t> counts) = 0;
  virtual void do_barrier() = 0;

  // Wire hooks: where payloads are rounded and copied before the backend moves them. The
  // defaults work on host memory (a loop and a std::vector); a backend whose collectives
  // need device memory (NcclComm) overrides both.
  // out = in rounded to `wire` (fp32: a plain copy). in and out may be the same span. On
  // return out is ready for the host and for the next collective.
  virtual void to_wire(std::span<const float> in, std::span<float> out, WireType wire);
  // Scratch of n floats that to_wire can write and the do_* hooks can send from; valid
  // until the next call.
  virtual std::span<float> wire_scratch(std::size_t n);

 private:
  void check_gather(std::size_t send, std::size_t recv, std::span<const std::size_t> counts,
                    std::string_view purpose) const;
  void check_scatter(std::size_t send, std::size_t recv, std::span<const std::size_t> counts,
                     std::string_view purpose) const;
  class MeasuredCall;
  // A synchronous collective's time: add_measured_time's, and counted in take_blocking_seconds.
  void add_blocking_time(std::string_view purpose, double seconds);

  int rank_;
  int size_;
  ByteLedger ledger_;
  std::vector<float> wire_scratch_;
  std::vector<std::size_t> byte_counts_;
  std::mutex measured_mutex_;
  std::map<std::string, double> measured_;
  double blocking_seconds_ = 0;
  std::array<double, kCollectiveKindCount> exposed_wait_{};
};

// The overrides of the six backend hooks above, for a backend class to write in its protected
// section instead of repeating the list (each backend defines them in its .cpp file).
#define SCAPE_COMMUNICATOR_BACKEND_HOOKS                                                                               \
  void do_all_reduce_mean(std::span<float> data) override;                                                             \
  void do_reduce_scatter_mean(std::span<const float> send, std::span<float> recv, std::span<const std::size_t> counts) \
      override;                                                                                                        \
  void do_all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,                                 \
                           std::span<const std::size_t> counts) override;                                              \
  std::unique_ptr<AsyncRequest> do_all_gather_bytes_async(std::span<const std::byte> send, std::span<std::byte> recv,  \
                                                          std::span<const std::size_t> counts) override;               \
  void do_all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,                                 \
                           std::span<const std::size_t> counts) override;                                              \
  void do_barrier() override

// The reduction every backend must use so that results are bit-identical across backends:
// out[j] = (in[0][j] + in[1][j] + ... + in[W-1][j]) / W, summed left to right in rank order.
// out must not overlap an input (std::invalid_argument): it is written rank by rank.
void mean_in_rank_order(std::span<const float* const> inputs, std::span<float> out);

}  // namespace scape
