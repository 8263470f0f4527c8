// NcclComm (docs/runtime.md, "The NCCL backend"): NCCL collectives behind the Communicator
// front end, on a dedicated stream ordered after the caller's compute stream.
#include "runtime/nccl_comm.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/stream.hpp"
#include "runtime/nccl_check.hpp"

namespace scape::runtime {
namespace {

using kernels::cuda::device_accessible;

bool all_equal(std::span<const std::size_t> counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

std::size_t sum(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// Runs call(root, offset) for every root with a non-zero count (offset: the counts before it)
// inside one ncclGroupStart/End, so NCCL runs them as one operation; stops at the first failing
// call and throws naming `what`.
void per_root_group(std::span<const std::size_t> counts, const char* what,
                    const std::function<ncclResult_t(int root, std::size_t offset)>& call) {
  SCAPE_NCCL_CHECK(ncclGroupStart());
  std::size_t offset = 0;
  ncclResult_t status = ncclSuccess;
  for (std::size_t root = 0; root < counts.size() && status == ncclSuccess; ++root) {
    if (counts[root] > 0) status = call(static_cast<int>(root), offset);
    offset += counts[root];
  }
  const ncclResult_t end = ncclGroupEnd();
  if (status != ncclSuccess) throw_nccl_error(status, what, __FILE__, __LINE__);
  if (end != ncclSuccess) throw_nccl_error(end, "ncclGroupEnd", __FILE__, __LINE__);
}

}  // namespace

namespace nccl_detail {

DeviceScratch::~DeviceScratch() {
  // Normally released in stream order by the owner; this is the fallback for error paths.
  if (data_ != nullptr) (void)cudaFree(data_);
}

void* DeviceScratch::ensure(std::size_t bytes, cudaStream_t stream) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  release(stream);
  void* p = nullptr;
  SCAPE_CUDA_CHECK(cudaMallocAsync(&p, std::max<std::size_t>(bytes, 256), stream));
  data_ = p;
  capacity_ = std::max<std::size_t>(bytes, 256);
  return data_;
}

void DeviceScratch::release(cudaStream_t stream) noexcept {
  if (data_ != nullptr) {
    const cudaError_t e = cudaFreeAsync(data_, stream);
    if (e != cudaSuccess) std::fprintf(stderr, "warning: cudaFreeAsync failed: %s\n", cudaGetErrorString(e));
  }
  data_ = nullptr;
  capacity_ = 0;
}

}  // namespace nccl_detail

NcclComm::NcclComm(int rank, int size, const ncclUniqueId& id, int device, NetworkModel net)
    : Communicator(rank, size, net), device_(device) {
  try {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
    prepare_stream();
  } catch (...) {
    release();
    throw;
  }
}

NcclComm::NcclComm(int rank, int size, ncclComm_t comm, int device, NetworkModel net, LinkClass link)
    : Communicator(rank, size, net, link), device_(device), comm_(comm) {
  try {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    prepare_stream();
  } catch (...) {
    release();
    throw;
  }
}

void NcclComm::prepare_stream() {
  SCAPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  SCAPE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  SCAPE_CUDA_CHECK(cudaEventCreate(&sync_start_));
  SCAPE_CUDA_CHECK(cudaEventCreate(&sync_done_));
  SCAPE_CUDA_CHECK(cudaMemsetAsync(barrier_.ensure(sizeof(float), stream_), 0, sizeof(float), stream_));
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

NcclComm::~NcclComm() {
  if (parent_ != nullptr) {
    parent_->blocked_.disown(blocked_);
    std::lock_guard lock(parent_->children_mutex_);
    std::erase(parent_->children_, this);
  }
  release();
}

std::unique_ptr<Communicator> NcclComm::split(int color, LinkClass link, NetworkModel net) {
  if (color < 0) throw std::invalid_argument("split: color must be >= 0, got " + std::to_string(color));
  SCAPE_CUDA_CHECK(cudaSetDevice(device_));
  ncclComm_t group = nullptr;
  int group_rank = 0, group_size = 0;
  {
    const BlockedClock::Scope blocked(blocked_);
    SCAPE_NCCL_CHECK(ncclCommSplit(comm_, color, rank(), &group, nullptr));
  }
  SCAPE_NCCL_CHECK(ncclCommUserRank(group, &group_rank));
  SCAPE_NCCL_CHECK(ncclCommCount(group, &group_size));
  std::unique_ptr<NcclComm> child(new NcclComm(group_rank, group_size, group, device_, net, link));
  child->parent_ = this;
  blocked_.adopt(child->blocked_);
  std::lock_guard lock(children_mutex_);
  children_.push_back(child.get());
  return child;
}

void NcclComm::abort() noexcept {
  {
    std::lock_guard lock(children_mutex_);  // a rank stuck in a node or rail collective is freed too
    for (NcclComm* child : children_) child->abort();
  }
  if (aborted_.exchange(true)) return;
  (void)cudaSetDevice(device_);
  if (comm_ != nullptr) {
    const ncclResult_t r = ncclCommAbort(comm_);
    if (r != ncclSuccess) std::fprintf(stderr, "warning: NcclComm: ncclCommAbort failed: %s\n", ncclGetErrorString(r));
  }
}

void NcclComm::release() noexcept {
  (void)cudaSetDevice(device_);
  bool healthy = !aborted_.load();
  if (healthy && comm_ != nullptr) {
    ncclResult_t state = ncclSuccess;
    healthy = ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
  }
  // A failed communicator may never let its stream drain: abort it instead of waiting.
  if (stream_ != nullptr && healthy) {
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "warning: NcclComm: cudaStreamSynchronize failed: %s\n", cudaGetErrorString(e));
      healthy = false;
    }
  }
  if (comm_ != nullptr) {
    if (!aborted_.exchange(true)) {  // not yet aborted by abort()
      const ncclResult_t r = healthy ? ncclCommDestroy(comm_) : ncclCommAbort(comm_);
      if (r != ncclSuccess) {
        std::fprintf(stderr, "warning: NcclComm: %s failed: %s\n", healthy ? "ncclCommDestroy" : "ncclCommAbort",
                     ncclGetErrorString(r));
      }
    }
    comm_ = nullptr;
  }
  if (stream_ != nullptr) {
    stage_in_.release(stream_);
    stage_out_.release(stream_);
    scratch_.release(stream_);
    barrier_.release(stream_);
    if (healthy) (void)cudaStreamSynchronize(stream_);
  }
  if (compute_done_ != nullptr) (void)cudaEventDestroy(compute_done_);
  if (sync_start_ != nullptr) (void)cudaEventDestroy(sync_start_);
  if (sync_done_ != nullptr) (void)cudaEventDestroy(sync_done_);
  sync_start_ = sync_done_ = nullptr;
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  compute_done_ = nullptr;
  stream_ = nullptr;
}

void NcclComm::begin() {
  device_seconds_.reset();
  SCAPE_CUDA_CHECK(cudaSetDevice(device_));
  SCAPE_CUDA_CHECK(cudaEventRecord(compute_done_, kernels::cuda::current_stream()));
  SCAPE_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0));
  SCAPE_CUDA_CHECK(cudaEventRecord(sync_start_, stream_));
}

std::optional<double> NcclComm::take_device_seconds() {
  std::optional<double> s = device_seconds_;
  device_seconds_.reset();
  return s;
}

void NcclComm::check_async_error() {
  ncclResult_t state = ncclSuccess;
  SCAPE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
  if (state != ncclSuccess) throw_nccl_error(state, "the communicator (asynchronous error)", __FILE__, __LINE__);
}

void NcclComm::finish() {
  SCAPE_CUDA_CHECK(cudaEventRecord(sync_done_, stream_));
  {
    const BlockedClock::Scope blocked(blocked_);
    SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  check_async_error();
  float ms = 0;
  SCAPE_CUDA_CHECK(cudaEventElapsedTime(&ms, sync_start_, sync_done_));
  device_seconds_ = ms / 1e3;
}

void NcclComm::wait_event(cudaEvent_t event) {
  const BlockedClock::Scope blocked(blocked_);
  SCAPE_CUDA_CHECK(cudaEventSynchronize(event));
}

const void* NcclComm::readable(const void* p, std::size_t bytes, nccl_detail::DeviceScratch& stage) {
  if (bytes == 0 || device_accessible(p)) return p;
  void* d = stage.ensure(bytes, stream_);
  SCAPE_CUDA_CHECK(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, stream_));
  return d;
}

void* NcclComm::writable(void* p, std::size_t bytes, nccl_detail::DeviceScratch& stage, bool keep) {
  if (bytes == 0 || device_accessible(p)) return p;
  void* d = stage.ensure(bytes, stream_);
  if (keep) SCAPE_CUDA_CHECK(cudaMemcpyAsync(d, p, bytes, cudaMemcpyHostToDevice, stream_));
  return d;
}

void NcclComm::copy_back(void* p, const void* staged, std::size_t bytes) {
  if (bytes == 0 || p == staged) return;
  // A copy to pageable memory returns when it is done, so it waits for the collective too.
  const BlockedClock::Scope blocked(blocked_);
  SCAPE_CUDA_CHECK(cudaMemcpyAsync(p, staged, bytes, cudaMemcpyDeviceToHost, stream_));
}

std::span<float> NcclComm::wire_scratch(std::size_t n) {
  return {static_cast<float*>(scratch_.ensure(n * sizeof(float), stream_)), n};
}

void NcclComm::to_wire(std::span<const float> in, std::span<float> out, WireType wire) {
  const std::size_t bytes = in.size() * sizeof(float);
  if (bytes == 0) return;
  begin();
  const auto* src = static_cast<const float*>(readable(in.data(), bytes, stage_in_));
  auto* dst = static_cast<float*>(writable(out.data(), bytes, stage_out_, false));
  if (wire == WireType::bf16) {
    // The optimizer's kernel, queued on this communicator's stream.
    const kernels::cuda::StreamScope on_comm_stream(stream_);
    kernels::cuda::round_to_bf16(std::span<const float>(src, in.size()), std::span<float>(dst, in.size()));
  } else if (src != dst) {
    SCAPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  copy_back(out.data(), dst, bytes);
  finish();
}

void NcclComm::do_all_reduce_mean(std::span<float> data) {
  const std::size_t bytes = data.size_bytes();
  if (bytes == 0) return;
  begin();
  auto* d = static_cast<float*>(writable(data.data(), bytes, stage_out_, true));
  SCAPE_NCCL_CHECK(ncclAllReduce(d, d, data.size(), ncclFloat, ncclAvg, comm_, stream_));
  copy_back(data.data(), d, bytes);
  finish();
}

void NcclComm::queue_reduce_scatter(const float* send, float* recv, std::span<const std::size_t> counts) {
  // NCCL checks the receive pointer of every reduce it roots; this rank roots none when it
  // receives nothing, but never hand NCCL a null pointer.
  auto* r_or_dummy = recv != nullptr ? recv : static_cast<float*>(barrier_.ensure(sizeof(float), stream_));
  if (!always_grouped_ && all_equal(counts)) {
    SCAPE_NCCL_CHECK(ncclReduceScatter(send, recv, counts[0], ncclFloat, ncclAvg, comm_, stream_));
    return;
  }
  // Unequal segments: one reduce per root, grouped.
  per_root_group(counts, "ncclReduce", [&](int root, std::size_t offset) {
    return ncclReduce(send + offset, r_or_dummy, counts[static_cast<std::size_t>(root)], ncclFloat, ncclAvg, root,
                      comm_, stream_);
  });
}

void NcclComm::do_reduce_scatter_mean(std::span<const float> send, std::span<float> recv,
                                      std::span<const std::size_t> counts) {
  if (sum(counts) == 0) return;
  begin();
  const auto* s = static_cast<const float*>(readable(send.data(), send.size_bytes(), stage_in_));
  auto* r = static_cast<float*>(writable(recv.data(), recv.size_bytes(), stage_out_, false));
  queue_reduce_scatter(s, r, counts);
  copy_back(recv.data(), r, recv.size_bytes());
  finish();
}

void NcclComm::queue_gather(const void* send, void* recv, std::span<const std::size_t> counts) {
  if (!always_grouped_ && all_equal(counts)) {
    if (counts[0] > 0) {
      SCAPE_NCCL_CHECK(ncclAllGather(send, recv, counts[0], ncclUint8, comm_, stream_));
    }
    return;
  }
  // Unequal segments: one broadcast per root into its place in recv, grouped.
  per_root_group(counts, "ncclBroadcast", [&](int root, std::size_t offset) {
    void* dst = static_cast<std::byte*>(recv) + offset;
    // The send buffer is read only on the root; elsewhere any valid pointer will do.
    const void* src = root == rank() ? send : dst;
    return ncclBroadcast(src, dst, counts[static_cast<std::size_t>(root)], ncclUint8, root, comm_, stream_);
  });
}

void NcclComm::do_all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                   std::span<const std::size_t> counts) {
  if (recv.empty()) return;
  begin();
  const void* s = readable(send.data(), send.size(), stage_in_);
  void* r = writable(recv.data(), recv.size(), stage_out_, false);
  queue_gather(s, r, counts);
  copy_back(recv.data(), r, recv.size());
  finish();
}

void NcclComm::do_all_to_all_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                   std::span<const std::size_t> counts) {
  if (sum(counts) == 0) return;
  begin();
  const auto* s = static_cast<const std::byte*>(readable(send.data(), send.size(), stage_in_));
  auto* r = static_cast<std::byte*>(writable(recv.data(), recv.size(), stage_out_, false));
  const std::size_t mine = counts[static_cast<std::size_t>(rank())];
  // One send and one receive per peer, grouped so NCCL runs them as one operation.
  SCAPE_NCCL_CHECK(ncclGroupStart());
  std::size_t offset = 0;
  ncclResult_t status = ncclSuccess;
  for (std::size_t peer = 0; peer < counts.size() && status == ncclSuccess; ++peer) {
    if (counts[peer] > 0)
      status = ncclSend(s + offset, counts[peer], ncclUint8, static_cast<int>(peer), comm_, stream_);
    if (mine > 0 && status == ncclSuccess) {
      status = ncclRecv(r + peer * mine, mine, ncclUint8, static_cast<int>(peer), comm_, stream_);
    }
    offset += counts[peer];
  }
  const ncclResult_t end = ncclGroupEnd();
  if (status != ncclSuccess) throw_nccl_error(status, "ncclSend/ncclRecv", __FILE__, __LINE__);
  if (end != ncclSuccess) throw_nccl_error(end, "ncclGroupEnd", __FILE__, __LINE__);
  copy_back(recv.data(), r, recv.size());
  finish();
}

// A collective queued on the communication stream between two timing events; wait() blocks
// the host on the second and, when recv is host memory, copies the staged result into it. The
// wait is exposed time of `kind`, the time between the events is measured as `measured`.
class NcclComm::AsyncCollective final : public AsyncRequest {
 public:
  AsyncCollective(NcclComm& comm, CollectiveKind kind, const char* measured)
      : comm_(comm), kind_(kind), measured_(measured) {
    SCAPE_CUDA_CHECK(cudaEventCreate(&start_));
    const cudaError_t e = cudaEventCreate(&done_);
    if (e != cudaSuccess) {
      (void)cudaEventDestroy(start_);
      kernels::cuda::throw_cuda_error(e, "cudaEventCreate(&done_)", __FILE__, __LINE__);
    }
  }
  ~AsyncCollective() override {
    // Events still pending are released by CUDA once they complete; the staging buffers are
    // freed in stream order, after the collective.
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(done_);
    stage_in_.release(comm_.stream_);
    stage_out_.release(comm_.stream_);
  }
  AsyncCollective(const AsyncCollective&) = delete;
  AsyncCollective& operator=(const AsyncCollective&) = delete;

  // Queues `collective` (device send and receive pointers) after the caller's compute stream.
  void issue(std::span<const std::byte> send, std::span<std::byte> recv,
             const std::function<void(const void*, void*)>& collective) {
    const void* s = comm_.readable(send.data(), send.size(), stage_in_);
    void* r = comm_.writable(recv.data(), recv.size(), stage_out_, false);
    if (r != recv.data()) {
      host_recv_ = recv;
      staged_ = r;
    }
    SCAPE_CUDA_CHECK(cudaEventRecord(start_, comm_.stream_));
    collective(s, r);
    SCAPE_CUDA_CHECK(cudaEventRecord(done_, comm_.stream_));
  }

  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    SCAPE_CUDA_CHECK(cudaSetDevice(comm_.device_));
    comm_.wait_event(done_);
    if (staged_ != nullptr) {
      SCAPE_CUDA_CHECK(
          cudaMemcpyAsync(host_recv_.data(), staged_, host_recv_.size(), cudaMemcpyDeviceToHost, comm_.stream_));
      SCAPE_CUDA_CHECK(cudaStreamSynchronize(comm_.stream_));
    }
    comm_.add_exposed_wait(kind_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    float ms = 0;
    SCAPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, done_));
    comm_.add_measured_time(measured_, ms / 1e3);
    comm_.check_async_error();
  }

 private:
  NcclComm& comm_;
  CollectiveKind kind_;
  const char* measured_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t done_ = nullptr;
  nccl_detail::DeviceScratch stage_in_, stage_out_;
  std::span<std::byte> host_recv_;
  void* staged_ = nullptr;
};

std::unique_ptr<AsyncRequest> NcclComm::do_all_gather_bytes_async(std::span<const std::byte> send,
                                                                  std::span<std::byte> recv,
                                                                  std::span<const std::size_t> counts) {
  begin();
  auto request = std::make_unique<AsyncCollective>(*this, CollectiveKind::all_gather, "async_all_gather");
  request->issue(send, recv, [&](const void* s, void* r) { queue_gather(s, r, counts); });
  return request;
}

std::unique_ptr<AsyncRequest> NcclComm::do_reduce_scatter_mean_async(std::span<const float> send,
                                                                    std::span<float> recv,
                                                                    std::span<const std::size_t> counts) {
  // begin() orders the bucket after the backward kernels queued so far on the compute stream,
  // which go on with the rest of the backward pass while NCCL reduces this bucket.
  begin();
  auto request = std::make_unique<AsyncCollective>(*this, CollectiveKind::reduce_scatter, "async_reduce_scatter");
  request->issue(std::as_bytes(send), std::as_writable_bytes(recv), [&](const void* s, void* r) {
    if (sum(counts) > 0) queue_reduce_scatter(static_cast<const float*>(s), static_cast<float*>(r), counts);
  });
  return request;
}

void NcclComm::do_barrier() {
  begin();
  auto* b = static_cast<float*>(barrier_.ensure(sizeof(float), stream_));
  SCAPE_NCCL_CHECK(ncclAllReduce(b, b, 1, ncclFloat, ncclSum, comm_, stream_));
  finish();
}

std::unique_ptr<NcclComm> make_single_process_nccl_comm(NetworkModel net) {
  if (kernels::cuda::visible_device_count() == 0) throw std::runtime_error("NCCL setup failed: no CUDA device visible");
  SCAPE_CUDA_CHECK(cudaSetDevice(0));
  ncclUniqueId id{};
  SCAPE_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::make_unique<NcclComm>(0, 1, id, 0, net);
}

}  // namespace scape::runtime
