// Checked NCCL calls: SCAPE_NCCL_CHECK(call) throws std::runtime_error naming the file, line,
// the call and NCCL's error code and string (kernels/checked_call.hpp), as SCAPE_CUDA_CHECK and
// SCAPE_MPI_CHECK do. throw_nccl_error serves a status kept for later (a call inside an NCCL
// group, checked once the group is closed).
#pragma once

#include <nccl.h>

#include <string>

#include "kernels/checked_call.hpp"

namespace scape::runtime {

[[noreturn]] inline void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  kernels::throw_call_error("NCCL", std::to_string(static_cast<int>(status)), ncclGetErrorString(status), call, file,
                            line);
}

}  // namespace scape::runtime

#define SCAPE_NCCL_CHECK(call) SCAPE_CHECKED_CALL(call, #call, ncclSuccess, ::scape::runtime::throw_nccl_error)
