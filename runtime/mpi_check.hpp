// Checked MPI calls: SCAPE_MPI_CHECK(call) throws std::runtime_error naming the file, line, the
// call and MPI's error code and string (kernels/checked_call.hpp), as SCAPE_CUDA_CHECK and
// SCAPE_NCCL_CHECK do. Under MPI's default handler (errors are fatal) a failing call aborts
// the job before it returns; the check reports the failure wherever a communicator's handler
// lets errors return instead.
#pragma once

#include <mpi.h>

#include <string>

#include "kernels/checked_call.hpp"

namespace scape::runtime {

[[noreturn]] inline void throw_mpi_error(int status, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(status, text, &length) != MPI_SUCCESS) text[0] = '\0';
  kernels::throw_call_error("MPI", std::to_string(status), text, call, file, line);
}

}  // namespace scape::runtime

#define SCAPE_MPI_CHECK(call) SCAPE_CHECKED_CALL(call, #call, MPI_SUCCESS, ::scape::runtime::throw_mpi_error)
