// The CPU backend: the OpenMP kernels of kernels/cpu behind the KernelBackend interface.
#include <omp.h>

#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/adam.hpp"
#include "kernels/cpu/bitmask.hpp"
#include "kernels/cpu/compact.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/cpu/scape_ops.hpp"
#include "kernels/cpu/select.hpp"

namespace scape::kernels {
namespace {

constexpr std::align_val_t kAlignment{64};

void* allocate_zeroed(std::size_t bytes) {
  void* p = ::operator new(bytes == 0 ? 1 : bytes, kAlignment);
  std::memset(p, 0, bytes);
  return p;
}

// The offload logic on the CPU: the slots are host arrays and every copy happens at once, so
// the chunked, double-buffered residual can be checked against the resident one without a GPU.
class CpuChunkCopier final : public ChunkCopier {
 public:
  explicit CpuChunkCopier(std::size_t chunk) : chunk_(chunk), slots_{std::vector<float>(chunk), std::vector<float>(chunk)} {}
  std::size_t chunk_elements() const override { return chunk_; }
  std::span<float> slot(int s) override { return slots_[s]; }
  void upload(int s, const float* host, std::size_t n) override { std::memcpy(slots_[s].data(), host, n * sizeof(float)); }
  void wait_upload(int) override {}
  void download(int s, float* host, std::size_t n) override { std::memcpy(host, slots_[s].data(), n * sizeof(float)); }
  void release(int) override {}
  void finish() override {}
  std::size_t device_bytes() const override { return 2 * chunk_ * sizeof(float); }

 private:
  std::size_t chunk_;
  std::vector<float> slots_[2];
};

class CpuBackend final : public KernelBackend {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string description() const override {
    return "cpu (" + std::to_string(omp_get_max_threads()) + " OpenMP threads)";
  }
  void* allocate(std::size_t bytes) override { return allocate_zeroed(bytes); }
  void deallocate(void* p) noexcept override { ::operator delete(p, kAlignment); }
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

  void adamw_step(std::span<float> theta, std::span<float> m, std::span<float> v, std::span<const float> g,
                  const AdamScalars& s) override {
    kernels::adamw_step(theta, m, v, g, s);
  }
  void adams_step(std::span<float> theta, std::span<float> m, std::span<const float> g, const AdamScalars& s) override {
    kernels::adams_step(theta, m, g, s);
  }
  void adamw_step_masked(std::span<float> theta, std::span<float> m, std::span<float> v,
                         std::span<const std::uint32_t> idx, std::span<const float> m_new, std::span<const float> g_bar,
                         const AdamScalars& s) override {
    kernels::adamw_step_masked(theta, m, v, idx, m_new, g_bar, s);
  }
  void adams_step_masked(std::span<float> theta, std::span<float> m, std::span<const std::uint32_t> idx,
                         std::span<const float> m_new, std::span<const float> g_bar, const AdamScalars& s) override {
    kernels::adams_step_masked(theta, m, idx, m_new, g_bar, s);
  }
  void scale(std::span<float> x, float factor) override { kernels::scale(x, factor); }
  std::size_t accumulate(std::span<float> acc, std::span<const float> g) override {
    return kernels::accumulate(acc, g);
  }
  void fill(std::span<float> x, float value) override { kernels::fill(x, value); }
  void round_to_bf16(std::span<const float> in, std::span<float> out) override { kernels::round_to_bf16(in, out); }

  void topk_abs_mask(std::span<const float> values, std::size_t k, std::span<std::uint64_t> mask_words) override {
    kernels::topk_abs_mask(values, k, mask_words);
  }
  std::size_t topk_abs_indices(std::span<const float> values, std::size_t k, std::span<std::uint32_t> out) override {
    return kernels::topk_abs_indices(values, k, out);
  }
  std::size_t popcount(std::span<const std::uint64_t> words) override { return kernels::popcount(words); }
  std::size_t bits_to_indices(std::span<const std::uint64_t> words, std::uint32_t base,
                              std::span<std::uint32_t> out) override {
    return kernels::bits_to_indices(words, base, out);
  }
  void indices_to_bits(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint64_t> words) override {
    kernels::indices_to_bits(idx, base, words);
  }

  void compact(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst) override {
    kernels::compact(src, idx, dst);
  }
  void expand(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst) override {
    kernels::expand(src, idx, dst);
  }
  void zero_at(std::span<float> dst, std::span<const std::uint32_t> idx) override { kernels::zero_at(dst, idx); }

  void first_moment_statistic(std::span<const float> m, std::span<const float> a, float b1, float omb1,
                              std::span<float> out) override {
    kernels::first_moment_statistic(m, a, b1, omb1, out);
  }
  void random_statistic(std::uint64_t key, std::uint64_t first_counter, std::span<float> out) override {
    kernels::random_statistic(key, first_counter, out);
  }
  void pack_payload(std::span<const float> a, std::span<const float> m, std::size_t m_offset,
                    std::span<const std::uint32_t> idx, float b1, float omb1, bool with_momentum, std::span<float> b,
                    std::span<float> a_out) override {
    kernels::pack_payload(a, m, m_offset, idx, b1, omb1, with_momentum, b, a_out);
  }
  void rebase_indices(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint32_t> out) override {
    kernels::rebase_indices(idx, base, out);
  }
  void add_momentum(std::span<float> b_bar, std::span<const float> m, std::span<const std::uint32_t> idx,
                    float b1) override {
    kernels::add_momentum(b_bar, m, idx, b1);
  }
  void reconstruct_gradient(std::span<const float> b_bar, std::span<const float> m, std::span<const std::uint32_t> idx,
                            float b1, float omb1, std::span<float> g_bar) override {
    kernels::reconstruct_gradient(b_bar, m, idx, b1, omb1, g_bar);
  }
  void block_sum_squares(std::span<const float> x, std::size_t block, std::span<double> partial) override {
    kernels::block_sum_squares(x, block, partial);
  }
  float max_magnitude(std::span<const float> x) override { return kernels::max_magnitude(x); }
};

}  // namespace

KernelBackend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

std::unique_ptr<KernelBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace scape::kernels
