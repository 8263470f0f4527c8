// Which object runs a model's ops for its element type: the KernelBackend the model was given
// (float, on the CPU or a CUDA device), or the CPU bodies directly (double, for the
// finite-difference gradient check, which no device needs). Both have the member functions of
// kernels/model_kernel_list.inc, so the model code is written once.
#pragma once

#include <type_traits>

#include "kernels/backend.hpp"
#include "kernels/cpu/model_ops.hpp"

namespace scape::model {

template <class R>
using ModelOps =
    std::conditional_t<std::is_same_v<R, kernels::ModelReal>, kernels::KernelBackend, kernels::CpuModelOps<R>>;

// The ops object for `backend`: the backend itself for float; for double the CPU bodies, and
// `backend` must be the CPU (throws std::invalid_argument otherwise).
template <class R>
ModelOps<R>& model_ops(kernels::KernelBackend& backend) {
  if constexpr (std::is_same_v<ModelOps<R>, kernels::KernelBackend>) {
    return backend;
  } else {
    if (backend.kind() != kernels::DeviceKind::cpu) {
      throw std::invalid_argument("model: double precision runs on the CPU only, not on device '" +
                                  std::string(kernels::to_string(backend.kind())) + "'");
    }
    static ModelOps<R> cpu_ops;
    return cpu_ops;
  }
}

}  // namespace scape::model
