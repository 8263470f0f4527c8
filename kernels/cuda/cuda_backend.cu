// CudaBackend: the KernelBackend of kernels/backend.hpp on one CUDA device. Kernels and copies
// are queued on the backend's own non-blocking stream (each method makes it the thread's
// current stream for its duration, see stream.hpp); Buffers are managed memory, zero-filled and
// prefetched to the device. CudaChunkCopier implements ChunkCopier's event contract with two
// cudaMalloc slots and a second (copy) stream.
#include "kernels/cuda/cuda_backend.hpp"

#include <cuda_runtime.h>

#include <new>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/stream.hpp"

namespace scape::kernels::cuda {
namespace {

// Sets the backend's device and stream for one method call, restoring the previous stream.
class Activate {
 public:
  Activate(int device, cudaStream_t stream) : scope_(stream) { SCAPE_CUDA_CHECK(cudaSetDevice(device)); }

 private:
  StreamScope scope_;
};

// Double-buffered staging between host memory and two device slots (backend.hpp, ChunkCopier).
// Events, per slot s:
//   slot_free[s]     recorded when the slot may be overwritten (after its download on the copy
//                    stream, or after the kernels that used it on the compute stream);
//   uploaded[s]      recorded on the copy stream after the host -> slot copy;
//   compute_done[s]  recorded on the compute stream before a download, so the copy waits for
//                    the kernels that wrote the slot.
// Waiting on a never-recorded event is a no-op, so the first upload of a slot does not wait.
// The copier must not outlive the backend whose stream it orders against.
class CudaChunkCopier final : public ChunkCopier {
 public:
  CudaChunkCopier(int device, cudaStream_t compute, std::size_t chunk)
      : device_(device), compute_(compute), chunk_(chunk) {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    try {
      SCAPE_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
      for (int s = 0; s < 2; ++s) {
        SCAPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&slots_[s]), (chunk_ == 0 ? 1 : chunk_) * sizeof(float)));
        SCAPE_CUDA_CHECK(cudaEventCreateWithFlags(&slot_free_[s], cudaEventDisableTiming));
        SCAPE_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_[s], cudaEventDisableTiming));
        SCAPE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_[s], cudaEventDisableTiming));
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CudaChunkCopier() override { destroy(); }
  CudaChunkCopier(const CudaChunkCopier&) = delete;
  CudaChunkCopier& operator=(const CudaChunkCopier&) = delete;

  std::size_t chunk_elements() const override { return chunk_; }
  std::span<float> slot(int s) override { return {slots_[check_slot(s)], chunk_}; }

  void upload(int s, const float* host, std::size_t n) override {
    const int i = check_slot(s);
    check_count(n, "upload");
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaStreamWaitEvent(copy_, slot_free_[i], 0));
    if (n > 0) {
      SCAPE_CUDA_CHECK(cudaMemcpyAsync(slots_[i], host, n * sizeof(float), cudaMemcpyHostToDevice, copy_));
    }
    SCAPE_CUDA_CHECK(cudaEventRecord(uploaded_[i], copy_));
  }
  void wait_upload(int s) override {
    const int i = check_slot(s);
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaStreamWaitEvent(compute_, uploaded_[i], 0));
  }
  void download(int s, float* host, std::size_t n) override {
    const int i = check_slot(s);
    check_count(n, "download");
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaEventRecord(compute_done_[i], compute_));
    SCAPE_CUDA_CHECK(cudaStreamWaitEvent(copy_, compute_done_[i], 0));
    if (n > 0) {
      SCAPE_CUDA_CHECK(cudaMemcpyAsync(host, slots_[i], n * sizeof(float), cudaMemcpyDeviceToHost, copy_));
    }
    SCAPE_CUDA_CHECK(cudaEventRecord(slot_free_[i], copy_));
  }
  void release(int s) override {
    const int i = check_slot(s);
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaEventRecord(slot_free_[i], compute_));
  }
  void finish() override {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaStreamSynchronize(copy_));
    SCAPE_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  std::size_t device_bytes() const override { return 2 * chunk_ * sizeof(float); }

 private:
  static int check_slot(int s) {
    if (s != 0 && s != 1) throw std::invalid_argument("ChunkCopier: slot " + std::to_string(s) + " is not 0 or 1");
    return s;
  }
  void check_count(std::size_t n, const char* what) const {
    if (n > chunk_) {
      throw std::invalid_argument(std::string("ChunkCopier::") + what + ": " + std::to_string(n) +
                                  " elements exceed the chunk of " + std::to_string(chunk_));
    }
  }
  void destroy() noexcept {
    (void)cudaSetDevice(device_);
    if (copy_ != nullptr) (void)cudaStreamSynchronize(copy_);
    for (int s = 0; s < 2; ++s) {
      if (slot_free_[s] != nullptr) (void)cudaEventDestroy(slot_free_[s]);
      if (uploaded_[s] != nullptr) (void)cudaEventDestroy(uploaded_[s]);
      if (compute_done_[s] != nullptr) (void)cudaEventDestroy(compute_done_[s]);
      if (slots_[s] != nullptr) (void)cudaFree(slots_[s]);  // synchronizes the device first
      slot_free_[s] = uploaded_[s] = compute_done_[s] = nullptr;
      slots_[s] = nullptr;
    }
    if (copy_ != nullptr) (void)cudaStreamDestroy(copy_);
    copy_ = nullptr;
  }

  int device_;
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  std::size_t chunk_;
  float* slots_[2] = {nullptr, nullptr};
  cudaEvent_t slot_free_[2] = {nullptr, nullptr};
  cudaEvent_t uploaded_[2] = {nullptr, nullptr};
  cudaEvent_t compute_done_[2] = {nullptr, nullptr};
};

class CudaBackend final : public KernelBackend {
 public:
  CudaBackend() {
    SCAPE_CUDA_CHECK(cudaGetDevice(&device_));
    int concurrent = 0;
    SCAPE_CUDA_CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device_));
    prefetch_ = concurrent != 0;
    SCAPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~CudaBackend() override {
    (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string description() const override {
    cudaDeviceProp prop{};
    SCAPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    const auto gib = static_cast<long long>(static_cast<double>(prop.totalGlobalMem) / double(1ull << 30) + 0.5);
    return "cuda: " + std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
           ", " + std::to_string(gib) + " GiB)";
  }

  // Managed memory, prefetched to the device and zero-filled there, complete on return (so
  // work on any stream may use it).
  void* allocate(std::size_t bytes) override {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    const std::size_t size = bytes == 0 ? 1 : bytes;
    void* p = nullptr;
    if (cudaMallocManaged(&p, size, cudaMemAttachGlobal) != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
    try {
      if (prefetch_) {
        cudaMemLocation location{};
        location.type = cudaMemLocationTypeDevice;
        location.id = device_;
        SCAPE_CUDA_CHECK(cudaMemPrefetchAsync(p, size, location, 0, stream_));
      }
      SCAPE_CUDA_CHECK(cudaMemsetAsync(p, 0, size, stream_));
      SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    } catch (...) {
      (void)cudaFree(p);
      throw;
    }
    return p;
  }
  // cudaFree synchronizes the device, so no queued kernel still uses p.
  void deallocate(void* p) noexcept override {
    if (p == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)cudaFree(p);
  }
  void* allocate_pinned_host(std::size_t bytes) override {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      throw std::bad_alloc();
    }
    return p;
  }
  void deallocate_pinned_host(void* p) noexcept override {
    if (p != nullptr) (void)cudaFreeHost(p);
  }
  bool can_access(const void* p) const override { return device_accessible(p); }
  void synchronize() override {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_bytes(const void* src, void* dst, std::size_t bytes) override {
    if (bytes == 0) return;
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }
  void zero_bytes(void* dst, std::size_t bytes) override {
    if (bytes == 0) return;
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  std::unique_ptr<ChunkCopier> make_chunk_copier(std::size_t chunk_elements) override {
    return std::make_unique<CudaChunkCopier>(device_, stream_, chunk_elements);
  }

  // The kernels of kernels/kernel_list.inc, each queued on this backend's device and stream.
#define SCAPE_KERNEL(result, name, parameters, arguments) \
  result name parameters override {                       \
    Activate on(device_, stream_);                        \
    return cuda::name arguments;                          \
  }
#include "kernels/kernel_list.inc"
#undef SCAPE_KERNEL

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool prefetch_ = false;
};

class CudaDeviceSpan final : public DeviceSpan {
 public:
  explicit CudaDeviceSpan(const CudaBackend& backend) : device_(backend.device()), stream_(backend.stream()) {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaEventCreate(&start_));
    const cudaError_t e = cudaEventCreate(&stop_);
    if (e != cudaSuccess) {
      (void)cudaEventDestroy(start_);
      throw_cuda_error(e, "cudaEventCreate(&stop_)", __FILE__, __LINE__);
    }
  }
  ~CudaDeviceSpan() override {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  CudaDeviceSpan(const CudaDeviceSpan&) = delete;
  CudaDeviceSpan& operator=(const CudaDeviceSpan&) = delete;

  void start() override {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaEventRecord(start_, stream_));
  }
  double stop_seconds() override {
    SCAPE_CUDA_CHECK(cudaSetDevice(device_));
    SCAPE_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    SCAPE_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    SCAPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms / 1e3;
  }

 private:
  int device_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceSpan> make_device_span(KernelBackend& backend) {
  const auto* cuda_backend = dynamic_cast<const CudaBackend*>(&backend);
  if (cuda_backend == nullptr) throw std::invalid_argument("make_device_span: not a CUDA backend");
  return std::make_unique<CudaDeviceSpan>(*cuda_backend);
}

bool device_accessible(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error an unregistered pointer may leave
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::size_t current_device_free_bytes() {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return free;
}

std::unique_ptr<KernelBackend> make_cuda_backend() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    const cudaError_t reason = status != cudaSuccess ? status : cudaErrorNoDevice;
    throw std::runtime_error(std::string("device 'cuda': no CUDA device visible (") + cudaGetErrorString(reason) + ")");
  }
  return std::make_unique<CudaBackend>();
}

}  // namespace scape::kernels::cuda
