// Shared pieces of the CUDA kernel sources (not a public header: only kernels/cuda/*.cu
// include it): launch geometry and the checked launch of a grid-stride kernel, stream-ordered
// scratch memory, and reading one device value back to the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/stream.hpp"

namespace scape::kernels::cuda {

constexpr unsigned kThreads = 256;
// Grid-stride loops: enough blocks to fill an H200 several times over, few enough that
// per-block setup (shared histograms, reductions) stays negligible.
constexpr std::size_t kMaxBlocks = 8192;

inline unsigned blocks_for(std::size_t items, std::size_t per_block = kThreads) {
  const std::size_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// A grid-stride loop's position and stride.
__device__ inline std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_threads() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

// Queues a grid-stride kernel over `items` items on current_stream() (blocks_for(items) blocks
// of kThreads) and checks the launch.
template <typename... Parameters, typename... Arguments>
void launch(void (*kernel)(Parameters...), std::size_t items, Arguments... arguments) {
  kernel<<<blocks_for(items), kThreads, 0, current_stream()>>>(arguments...);
  SCAPE_CUDA_CHECK_LAUNCH();
}

// Device memory for one call, allocated and freed in stream order on `stream` (cudaMallocAsync
// from the device's default pool), so it never races with work queued before or after.
template <typename T>
class Scratch {
 public:
  Scratch(std::size_t count, cudaStream_t stream) : stream_(stream) {
    SCAPE_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), (count == 0 ? 1 : count) * sizeof(T), stream));
  }
  ~Scratch() {
    // A failure here would be a sticky error already reported by the next checked call.
    (void)cudaFreeAsync(data_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  cudaStream_t stream_;
};

// Copies *device to the host after the work queued on `stream`, and waits for it.
template <typename T>
T read_back(const T* device, cudaStream_t stream) {
  T value{};
  SCAPE_CUDA_CHECK(cudaMemcpyAsync(&value, device, sizeof(T), cudaMemcpyDeviceToHost, stream));
  SCAPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return value;
}

// With the sign bit cleared, the uint32 order of a float's bits is its magnitude order
// (+0 == -0, NaN above +inf); the same key as kernels/cpu/select.cpp.
__device__ inline std::uint32_t magnitude_key(float x) { return __float_as_uint(x) & 0x7fffffffu; }

}  // namespace scape::kernels::cuda
