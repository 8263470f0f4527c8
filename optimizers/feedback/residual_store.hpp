// The per-worker error-feedback residual e_i (a full model replica), either resident in the
// backend's memory or offloaded: kept in pinned host memory and streamed through two device
// chunks with double buffering, so the device holds 2 * chunk floats instead of N
// (docs/algorithms.md, "Devices and residual offload").
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>

#include "kernels/backend.hpp"

namespace scape {

class ResidualStore {
 public:
  // A pass over the residual: called once per chunk with the chunk's first flat index and
  // the chunk itself in memory the backend's kernels can address.
  using ChunkFn = std::function<void(std::size_t begin, std::span<float> chunk)>;

  ResidualStore(kernels::KernelBackend& backend, std::size_t n, bool offload, std::size_t chunk_elements);
  ~ResidualStore();
  ResidualStore(const ResidualStore&) = delete;
  ResidualStore& operator=(const ResidualStore&) = delete;

  std::size_t size() const { return n_; }
  bool offloaded() const { return copier_ != nullptr; }
  // Queues fn's kernels over consecutive chunks covering [0, N) (one chunk when resident).
  // Offloaded: chunk c + 1 is uploaded while chunk c is processed and chunk c - 1 copied
  // back; with write_back the chunks are copied back to host memory, and the pass ends with
  // the host waiting for every copy.
  void for_each_chunk(bool write_back, const ChunkFn& fn);
  // The whole residual in the backend's memory, for policies that rank it as one array (top-k
  // over all N). Throws std::logic_error when the residual is offloaded.
  std::span<float> resident();
  // The residual as the host sees it, valid after the backend's synchronize().
  std::span<float> host_view();
  std::span<const float> host_view() const;
  // Device memory the residual occupies: N floats resident, two chunks offloaded.
  std::size_t device_bytes() const;

 private:
  kernels::KernelBackend& backend_;
  std::size_t n_;
  kernels::Buffer<float> resident_;
  float* host_ = nullptr;  // offloaded: pinned host array of N floats
  std::unique_ptr<kernels::ChunkCopier> copier_;
};

}  // namespace scape
