// The CPU backend: the OpenMP kernels of kernels/cpu behind the KernelBackend interface.
#include <omp.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/kernels.hpp"

namespace scape::kernels {
namespace {

constexpr std::align_val_t kAlignment{64};
constexpr std::size_t kHeader = 64;  // keeps the returned pointer on the 64-byte boundary

void* allocate_zeroed(std::size_t bytes) {
  void* p = ::operator new(bytes == 0 ? 1 : bytes, kAlignment);
  std::memset(p, 0, bytes);
  return p;
}

// What allocate() holds, process-wide: the memory a run would keep on a device, measured on
// the CPU (device_memory_estimate's test). Each block carries its size in a header.
std::atomic<std::size_t> g_live{0}, g_peak{0};

void* allocate_counted(std::size_t bytes) {
  auto* base = static_cast<std::byte*>(allocate_zeroed(kHeader + bytes));
  std::memcpy(base, &bytes, sizeof bytes);
  const std::size_t live = g_live.fetch_add(bytes) + bytes;
  std::size_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return base + kHeader;
}

void deallocate_counted(void* p) noexcept {
  auto* base = static_cast<std::byte*>(p) - kHeader;
  std::size_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  g_live.fetch_sub(bytes);
  ::operator delete(base, kAlignment);
}

// The offload logic on the CPU: the slots are host arrays and every copy happens at once, so
// the chunked, double-buffered residual can be checked against the resident one without a GPU.
// The slots are counted as allocate()d memory: on a GPU they are device memory.
class CpuChunkCopier final : public ChunkCopier {
 public:
  explicit CpuChunkCopier(std::size_t chunk) : chunk_(chunk) {
    for (auto& slot : slots_) slot = static_cast<float*>(allocate_counted(chunk * sizeof(float)));
  }
  ~CpuChunkCopier() override {
    for (float* slot : slots_) deallocate_counted(slot);
  }
  CpuChunkCopier(const CpuChunkCopier&) = delete;
  CpuChunkCopier& operator=(const CpuChunkCopier&) = delete;
  std::size_t chunk_elements() const override { return chunk_; }
  std::span<float> slot(int s) override { return {slots_[s], chunk_}; }
  void upload(int s, const float* host, std::size_t n) override { std::memcpy(slots_[s], host, n * sizeof(float)); }
  void wait_upload(int) override {}
  void download(int s, float* host, std::size_t n) override { std::memcpy(host, slots_[s], n * sizeof(float)); }
  void release(int) override {}
  void finish() override {}
  std::size_t device_bytes() const override { return 2 * chunk_ * sizeof(float); }

 private:
  std::size_t chunk_;
  float* slots_[2] = {nullptr, nullptr};
};

class CpuBackend final : public KernelBackend {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string description() const override {
    return "cpu (" + std::to_string(omp_get_max_threads()) + " OpenMP threads)";
  }
  void* allocate(std::size_t bytes) override { return allocate_counted(bytes); }
  void deallocate(void* p) noexcept override {
    if (p != nullptr) deallocate_counted(p);
  }
  void* allocate_pinned_host(std::size_t bytes) override { return allocate_zeroed(bytes); }
  void deallocate_pinned_host(void* p) noexcept override { ::operator delete(p, kAlignment); }
  bool can_access(const void*) const override { return true; }
  void synchronize() override {}
  void copy_bytes(const void* src, void* dst, std::size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }
  void zero_bytes(void* dst, std::size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
  }
  std::unique_ptr<ChunkCopier> make_chunk_copier(std::size_t chunk_elements) override {
    return std::make_unique<CpuChunkCopier>(chunk_elements);
  }

  // The kernels of kernels/kernel_list.inc, each forwarded to its CPU body.
#define SCAPE_KERNEL(result, name, parameters, arguments) \
  result name parameters override { return kernels::name arguments; }
#include "kernels/kernel_list.inc"
#undef SCAPE_KERNEL
};

}  // namespace

KernelBackend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

std::unique_ptr<KernelBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

CpuAllocations cpu_allocations() { return {g_live.load(), g_peak.load()}; }

void reset_cpu_allocation_peak() { g_peak.store(g_live.load()); }

}  // namespace scape::kernels
