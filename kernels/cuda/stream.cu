// The thread-local current stream and the checked-call error path (stream.hpp, check.hpp).
#include "kernels/cuda/stream.hpp"

#include "kernels/cuda/check.hpp"

namespace scape::kernels::cuda {
namespace {

thread_local cudaStream_t t_current_stream = cudaStreamPerThread;

}  // namespace

void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line) {
  throw_call_error("CUDA", cudaGetErrorName(error), cudaGetErrorString(error), call, file, line);
}

cudaStream_t current_stream() { return t_current_stream; }

void set_current_stream(cudaStream_t stream) { t_current_stream = stream; }

void synchronize_current_stream() { SCAPE_CUDA_CHECK(cudaStreamSynchronize(t_current_stream)); }

}  // namespace scape::kernels::cuda
