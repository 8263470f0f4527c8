// The CUDA kernels, in scape::kernels::cuda: one declaration per entry of
// kernels/kernel_list.inc (the contracts stand there), with the CPU kernels' signatures. Spans
// hold device-accessible memory (cudaMalloc or managed); work is queued on current_stream()
// (stream.hpp), and the host may read outputs only after that stream is synchronized, except
// for the kernels that return a value, which synchronize it before returning.
//
// Elementwise results are bit-identical to the CPU kernels: the library is compiled with
// --fmad=false (no contraction into fused multiply-adds, which the CPU build at
// -march=x86-64-v2 cannot emit either), division and sqrtf are IEEE-rounded (nvcc's default
// -prec-div/-prec-sqrt, no -use_fast_math), denormals are kept (-ftz=false), the step scalars
// are rounded from double on the host exactly as the CPU code does, and every expression keeps
// the CPU's operation order.
//
// Plain C++ header (no CUDA types), so g++-compiled code can call these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/kernel_types.hpp"

namespace scape::kernels::cuda {

#define SCAPE_KERNEL(result, name, parameters, arguments) result name parameters;
#include "kernels/kernel_list.inc"
#undef SCAPE_KERNEL

}  // namespace scape::kernels::cuda
