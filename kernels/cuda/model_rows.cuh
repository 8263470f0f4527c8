// Shared device helpers of the CUDA model ops (only kernels/cuda/model_*.cu include it): warp
// reductions and the subnormal flush of softmax tails.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>


namespace scape::kernels::cuda {

__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// As the CPU model: probabilities below the smallest normal float become 0.
__device__ inline float flush_subnormal(float v) { return fabsf(v) < FLT_MIN ? 0.0f : v; }

}  // namespace scape::kernels::cuda
