// Backend selection: the CPU backend always, the CUDA backend when this build has it.
#include "kernels/backend.hpp"

#include <stdexcept>
#include <string>

#ifdef SCAPE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace scape::kernels {

std::unique_ptr<KernelBackend> make_cpu_backend();  // kernels/cpu/cpu_backend.cpp

const char* to_string(DeviceKind d) { return d == DeviceKind::cuda ? "cuda" : "cpu"; }

DeviceKind parse_device_kind(std::string_view value, std::string_view parameter) {
  if (value == "cpu") return DeviceKind::cpu;
  if (value == "cuda") return DeviceKind::cuda;
  throw std::invalid_argument(std::string(parameter) + ": unknown value '" + std::string(value) +
                              "' (expected cpu or cuda)");
}

bool cuda_built() {
#ifdef SCAPE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef SCAPE_HAVE_CUDA
  return cuda::visible_device_count();
#else
  return 0;
#endif
}

std::unique_ptr<KernelBackend> make_backend(DeviceKind kind) {
  if (kind == DeviceKind::cpu) return make_cpu_backend();
#ifdef SCAPE_HAVE_CUDA
  return cuda::make_cuda_backend();
#else
  throw std::runtime_error("device 'cuda': this scape was built without CUDA (no nvcc found at configure time)");
#endif
}

}  // namespace scape::kernels
