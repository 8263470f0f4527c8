// The one pattern behind SCAPE_CUDA_CHECK (kernels/cuda/check.hpp), SCAPE_NCCL_CHECK
// (runtime/nccl_check.hpp) and SCAPE_MPI_CHECK (runtime/mpi_check.hpp): run the call once,
// compare its status with the API's success value, and on failure throw std::runtime_error
//   "<file>:<line>: <API> error <code> (<API's error string>) in <call as written>".
// Plain C++, no API headers: each API's header supplies its thrower.
#pragma once

#include <stdexcept>
#include <string>

namespace scape::kernels {

[[noreturn]] inline void throw_call_error(const char* api, const std::string& code, const char* text,
                                          const char* call, const char* file, int line) {
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + api + " error " + code + " (" +
                           text + ") in " + call);
}

}  // namespace scape::kernels

// `call_text` is #call taken by the API's own macro, before any macro in the call (MPI_INT,
// MPI_COMM_WORLD) is expanded; `thrower(status, call_text, __FILE__, __LINE__)` never returns.
#define SCAPE_CHECKED_CALL(call, call_text, success, thrower)                  \
  do {                                                                         \
    const auto scape_call_status_ = (call);                                    \
    if (scape_call_status_ != (success)) {                                     \
      thrower(scape_call_status_, call_text, __FILE__, __LINE__);              \
    }                                                                          \
  } while (0)
