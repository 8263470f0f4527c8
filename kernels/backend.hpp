// Where the optimizer core's kernels run: the CPU (OpenMP) or a CUDA device. The core holds
// its state in Buffers allocated by a KernelBackend and calls every kernel through it, so the
// same optimizer code runs on either. The kernels are listed once, in kernels/kernel_list.inc,
// with bodies in kernels/cpu (scape::kernels) and kernels/cuda (scape::kernels::cuda).
//
// Memory rule: Buffers of the CUDA backend are CUDA managed memory, resident on the device
// and addressable from the host. Kernels are queued in order on the backend's stream; the
// host may read or write a Buffer only after synchronize(). Kernels that return a value to
// the host synchronize themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/kernel_types.hpp"

namespace scape::kernels {

enum class DeviceKind { cpu, cuda };
const char* to_string(DeviceKind d);
// Throws std::invalid_argument naming `parameter` and the value unless it is cpu or cuda.
DeviceKind parse_device_kind(std::string_view value, std::string_view parameter);
// "cpu", "cuda": the names parse_device_kind accepts.
std::vector<std::string> device_kind_names();

// Double-buffered staging between a host array and two device chunk buffers ("slots"), for
// the offloaded residual (docs/algorithms.md, "Residual offload"). Copies are queued on a
// copy stream and ordered against the backend's kernels with events:
//   upload(s)      waits until slot s is free, then copies host -> slot s;
//   wait_upload(s) makes kernels queued after it see that copy complete;
//   download(s)    copies slot s -> host after the kernels queued so far; frees slot s;
//   release(s)     frees slot s after the kernels queued so far (nothing to copy back);
//   finish()       the host waits for every queued copy and kernel.
class ChunkCopier {
 public:
  virtual ~ChunkCopier() = default;
  virtual std::size_t chunk_elements() const = 0;
  virtual std::span<float> slot(int s) = 0;
  virtual void upload(int s, const float* host, std::size_t n) = 0;
  virtual void wait_upload(int s) = 0;
  virtual void download(int s, float* host, std::size_t n) = 0;
  virtual void release(int s) = 0;
  virtual void finish() = 0;
  // Device memory the two slots occupy.
  virtual std::size_t device_bytes() const = 0;
};

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  KernelBackend() = default;
  KernelBackend(const KernelBackend&) = delete;
  KernelBackend& operator=(const KernelBackend&) = delete;

  virtual DeviceKind kind() const = 0;
  // One line for logs: "cpu (2 OpenMP threads)", "cuda: NVIDIA H200 (sm_90, 139 GiB)".
  virtual std::string description() const = 0;

  // Memory the kernels and the host can both address, zero-filled. Throws std::bad_alloc.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
  // Page-locked host memory for the offloaded residual (plain memory on the CPU backend).
  virtual void* allocate_pinned_host(std::size_t bytes) = 0;
  virtual void deallocate_pinned_host(void* p) noexcept = 0;
  // Whether kernels of this backend can read p (host memory from std::vector cannot be read
  // by CUDA kernels; the optimizer stages such spans through Buffers).
  virtual bool can_access(const void* p) const = 0;
  // The host waits for every queued kernel and copy.
  virtual void synchronize() = 0;
  // Queued copy and zero-fill between any memory this backend can access.
  virtual void copy_bytes(const void* src, void* dst, std::size_t bytes) = 0;
  virtual void zero_bytes(void* dst, std::size_t bytes) = 0;
  virtual std::unique_ptr<ChunkCopier> make_chunk_copier(std::size_t chunk_elements) = 0;

  // The kernels of kernels/kernel_list.inc (contracts there; kernels that return a value
  // synchronize, the others are queued).
#define SCAPE_KERNEL(result, name, parameters, arguments) virtual result name parameters = 0;
#include "kernels/kernel_list.inc"
#undef SCAPE_KERNEL
};

// A new backend of that kind. cuda throws std::runtime_error when scape was built without
// CUDA or no CUDA device is visible; the message says which.
std::unique_ptr<KernelBackend> make_backend(DeviceKind kind);
// The process-wide CPU backend (stateless apart from its OpenMP threads).
KernelBackend& cpu_backend();
// Bytes held in allocate()d memory of every CPU backend, now and at most since the last
// reset_cpu_allocation_peak(): on the CPU, the memory a run would hold on a device.
struct CpuAllocations {
  std::size_t live = 0, peak = 0;
};
CpuAllocations cpu_allocations();
void reset_cpu_allocation_peak();
// Whether this build has the CUDA path, and how many devices it sees (0 without CUDA).
bool cuda_built();
int cuda_device_count();
// Free memory of the current CUDA device in bytes (0 without CUDA or a device).
std::size_t cuda_free_bytes();
// Process-wide, default off: whether the CUDA backend's GEMMs (the model's matmuls) may run on
// TF32 tensor cores (cuBLAS CUBLAS_TF32_TENSOR_OP_MATH: inputs rounded to 10 mantissa bits,
// fp32 accumulation). Off, they are fp32 in pedantic math, which the 1e-5 agreement with the
// CPU (kernels/model_kernel_list.inc) relies on; bench_model turns it on for its TF32 rows.
// Takes effect from the next GEMM on every host thread; no effect in a build without CUDA.
void set_cuda_tf32(bool on);
bool cuda_tf32();

// A typed array in a backend's memory. Host access (span(), data()) is valid only after the
// backend's synchronize().
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(KernelBackend& backend, std::size_t n = 0) : backend_(&backend) { resize(n); }
  ~Buffer() { release(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      backend_ = std::exchange(other.backend_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::span<T> span() { return {data_, size_}; }
  std::span<const T> span() const { return {data_, size_}; }
  operator std::span<T>() { return span(); }
  operator std::span<const T>() const { return span(); }
  std::size_t bytes() const { return size_ * sizeof(T); }

  // Sets the size to n. The first min(old size, n) entries are kept and new entries are zero;
  // memory is reallocated only when n exceeds the capacity. Growing waits for the backend, so
  // on return the host and any stream may use the new entries (callers fill a buffer from the
  // host or a collective right after resizing it).
  void resize(std::size_t n) {
    if (n > capacity_) {
      T* grown = static_cast<T*>(backend_->allocate(n * sizeof(T)));
      if (size_ > 0) backend_->copy_bytes(data_, grown, size_ * sizeof(T));
      release();  // frees after the queued copy (cudaFree synchronizes)
      data_ = grown;
      capacity_ = n;
      backend_->synchronize();
    } else if (n > size_) {
      backend_->zero_bytes(data_ + size_, (n - size_) * sizeof(T));
      backend_->synchronize();
    }
    size_ = n;
  }
  // Size n, every entry zero (queued: the host may read it after the backend's synchronize()).
  void assign_zero(std::size_t n) {
    resize(n);
    if (n > 0) backend_->zero_bytes(data_, n * sizeof(T));
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) backend_->deallocate(data_);
    data_ = nullptr;
    capacity_ = 0;
  }

  KernelBackend* backend_ = nullptr;
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

}  // namespace scape::kernels
