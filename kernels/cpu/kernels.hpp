// The CPU reference kernels (OpenMP, deterministic for any thread count), in scape::kernels:
// one declaration per entry of kernels/kernel_list.inc, where each contract stands. The bodies
// are in kernels/cpu/*.cpp, one file per section of the list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/kernel_types.hpp"

namespace scape::kernels {

#define SCAPE_KERNEL(result, name, parameters, arguments) result name parameters;
#include "kernels/kernel_list.inc"
#undef SCAPE_KERNEL

}  // namespace scape::kernels
