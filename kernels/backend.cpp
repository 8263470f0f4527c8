// Backend selection: the CPU backend always, the CUDA backend when this build has it.
#include "kernels/backend.hpp"
#include "kernels/device_span.hpp"

#include <stdexcept>
#include <string>

#include "util/name_table.hpp"

#ifdef SCAPE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.hpp"
#endif

namespace scape::kernels {

std::unique_ptr<KernelBackend> make_cpu_backend();  // kernels/cpu/cpu_backend.cpp

constexpr EnumName<DeviceKind> kDeviceKinds[] = {{"cpu", DeviceKind::cpu}, {"cuda", DeviceKind::cuda}};

const char* to_string(DeviceKind d) { return name_of(kDeviceKinds, d); }
std::vector<std::string> device_kind_names() { return names_of(kDeviceKinds); }

DeviceKind parse_device_kind(std::string_view value, std::string_view parameter) {
  return find_by_name(kDeviceKinds, value, parameter).value;
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

std::size_t cuda_free_bytes() {
#ifdef SCAPE_HAVE_CUDA
  return cuda_device_count() > 0 ? cuda::current_device_free_bytes() : 0;
#else
  return 0;
#endif
}

void set_cuda_tf32(bool on) {
#ifdef SCAPE_HAVE_CUDA
  cuda::set_tf32_gemm(on);
#else
  (void)on;
#endif
}

bool cuda_tf32() {
#ifdef SCAPE_HAVE_CUDA
  return cuda::tf32_gemm();
#else
  return false;
#endif
}

std::unique_ptr<DeviceSpan> make_device_span(KernelBackend& backend) {
  if (backend.kind() == DeviceKind::cpu) return nullptr;
#ifdef SCAPE_HAVE_CUDA
  return cuda::make_device_span(backend);
#else
  throw std::logic_error("make_device_span: a " + std::string(to_string(backend.kind())) +
                         " backend in a build without CUDA");
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
