// The float model ops of the CPU backend (scape::kernels, declared from
// kernels/model_kernel_list.inc): each forwards to its templated body in kernels/cpu/model_ops.hpp.
#include "kernels/cpu/model_ops.hpp"

#include "kernels/cpu/kernels.hpp"

namespace scape::kernels {

#define SCAPE_KERNEL(result, name, parameters, arguments) \
  result name parameters { return model_cpu::name<ModelReal> arguments; }
#include "kernels/model_kernel_list.inc"
#undef SCAPE_KERNEL

}  // namespace scape::kernels
