// The stream the CUDA kernels of this thread are queued on. Every function in
// scape::kernels::cuda launches on current_stream(); CudaBackend sets it to its own stream
// (StreamScope) around each call. The default is cudaStreamPerThread: each host thread (a
// simulated worker) gets its own implicit stream, so threads never serialize on the legacy
// default stream, and work from one thread stays in issue order.
#pragma once

#include <cuda_runtime_api.h>

namespace scape::kernels::cuda {

cudaStream_t current_stream();
void set_current_stream(cudaStream_t stream);
// The host waits for everything queued on current_stream().
void synchronize_current_stream();

// Sets the current stream for a scope and restores the previous one on exit.
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t stream) : previous_(current_stream()) { set_current_stream(stream); }
  ~StreamScope() { set_current_stream(previous_); }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t previous_;
};

}  // namespace scape::kernels::cuda
