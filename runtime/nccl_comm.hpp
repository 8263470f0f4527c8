// NcclComm: the Communicator over NCCL, one process (and one GPU) per rank
// (docs/runtime.md, "The NCCL backend"). Every collective runs on one NCCL communicator and
// one dedicated non-blocking communication stream, ordered after the caller's compute stream
// (kernels::cuda::current_stream()) with a CUDA event, so the optimizer's queued kernels are
// complete before NCCL reads their output. Synchronous collectives return with the result
// ready for the host and every stream; the asynchronous ones (the lagged all-gather, the
// gradient buckets of overlap_grad_reduce) return at once and their wait() blocks the host on
// a CUDA event. Every collective's measured time is the stream's own, from CUDA events around its
// work after the wait for the compute stream.
//
// Memory: buffers may be device or managed memory (used in place) or plain host memory
// (staged through device buffers, correct but slower). Means use NCCL's ncclAvg (for floats:
// each input scaled by 1/W, then summed in NCCL's order), so results can differ from
// EmulatedComm's rank-order sum divided by W in the last bits for W > 2; W = 1 and W = 2 are
// exact (scaling by 1 or 1/2 is exact and a sum of two floats does not depend on its order),
// barring subnormals.
//
// Ordering: NcclComm orders its work after kernels::cuda::current_stream() of the calling
// thread. Kernels queued on any other stream must be synchronized by the caller first (the
// optimizer calls its backend's synchronize() before every collective).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "core/communicator.hpp"
#include "runtime/blocked_clock.hpp"

namespace scape::runtime {

namespace nccl_detail {

// Device memory from the stream-ordered allocator, grown on demand (the contents are not kept
// when it grows). release() frees it in stream order, so queued work may still use it.
class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void* ensure(std::size_t bytes, cudaStream_t stream);
  void release(cudaStream_t stream) noexcept;

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace nccl_detail

class NcclComm final : public Communicator {
 public:
  // Collective over the `size` ranks that share `id`: joins the NCCL communicator on `device`
  // (made the calling thread's current device).
  NcclComm(int rank, int size, const ncclUniqueId& id, int device, NetworkModel net);
  ~NcclComm() override;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // Seconds the oldest blocking wait of this rank has been running (0 when none), here or in a
  // group split from this communicator: the MPI runner's watchdog reads it from another thread.
  double blocked_for() const { return blocked_.blocked_for(); }
  // ncclCommSplit (color, keyed by this rank so the group keeps the order) as an NcclComm of its
  // own on the same device, with a stream of its own; abort() here aborts it too.
  std::unique_ptr<Communicator> split(int color, LinkClass link, NetworkModel net) override;
  // Tests on one GPU: use the per-root grouped calls (ncclReduce, ncclBroadcast) even when
  // every rank's count is equal, so W = 1 exercises the path that unequal counts take.
  void set_always_grouped(bool on) { always_grouped_ = on; }
  // The model's kernels run on its backend's own stream, which begin() does not wait for.
  bool waits_for_queued_kernels() const override { return false; }
  // ncclCommAbort, once, from any thread; release() then skips every wait on the stream.
  void abort() noexcept override;

 protected:
  SCAPE_COMMUNICATOR_BACKEND_HOOKS;  // Communicator's backend hooks (core/communicator.hpp)
  void to_wire(std::span<const float> in, std::span<float> out, WireType wire) override;
  std::optional<double> take_device_seconds() override;
  std::span<float> wire_scratch(std::size_t n) override;
  std::unique_ptr<AsyncRequest> do_reduce_scatter_mean_async(std::span<const float> send, std::span<float> recv,
                                                             std::span<const std::size_t> counts) override;

 private:
  class AsyncCollective;
  friend class AsyncCollective;
  // Takes over `comm`, a communicator already joined (a split's), on `device`.
  NcclComm(int rank, int size, ncclComm_t comm, int device, NetworkModel net, LinkClass link);
  // The stream, events and barrier word, after comm_ is joined.
  void prepare_stream();
  // Makes this rank's device current and queues a wait for the caller's compute stream.
  void begin();
  // Host waits for the communication stream (watchdog-visible), then checks NCCL's state.
  void finish();
  void wait_event(cudaEvent_t event);
  // A device pointer holding `bytes` bytes of p: p itself when kernels can read it, else a
  // copy (queued on the stream) in `stage`.
  const void* readable(const void* p, std::size_t bytes, nccl_detail::DeviceScratch& stage);
  // A device pointer for results destined to p: p itself, or `stage` (filled with a copy of p
  // first when `keep` is set); copy_back moves staged results to p.
  void* writable(void* p, std::size_t bytes, nccl_detail::DeviceScratch& stage, bool keep);
  void copy_back(void* p, const void* staged, std::size_t bytes);
  // recv = concatenation of every rank's counts[r] bytes, queued on the stream.
  void queue_gather(const void* send, void* recv, std::span<const std::size_t> counts);
  // recv = the mean over ranks of this rank's counts[rank] floats of send, queued on the stream.
  void queue_reduce_scatter(const float* send, float* recv, std::span<const std::size_t> counts);
  void check_async_error();
  void release() noexcept;

  int device_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> aborted_{false};
  cudaEvent_t compute_done_ = nullptr;
  // Around the work of each synchronous collective on the stream, after its wait for compute.
  cudaEvent_t sync_start_ = nullptr, sync_done_ = nullptr;
  std::optional<double> device_seconds_;
  nccl_detail::DeviceScratch stage_in_, stage_out_, scratch_, barrier_;
  BlockedClock blocked_;
  bool always_grouped_ = false;
  NcclComm* parent_ = nullptr;  // the communicator it was split from
  mutable std::mutex children_mutex_;
  std::vector<NcclComm*> children_;  // the live groups split from this one (abort() reaches them)
};

// The NcclComm of a single-process run: rank 0 of 1 on device 0, with a fresh NCCL id
// (ncclGetUniqueId). Needs no MPI, so the W = 1 checks run where no MPI is installed; the
// communicator of an MPI rank comes from make_nccl_comm (runtime/nccl_bootstrap.hpp).
// Throws std::runtime_error when no CUDA device is visible or NCCL fails to initialise.
std::unique_ptr<NcclComm> make_single_process_nccl_comm(NetworkModel net);

}  // namespace scape::runtime
