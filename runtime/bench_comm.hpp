// `scape bench-comm`: times every collective the optimizers use over a range of sizes, as
// nccl-tests does (algbw = payload / time, busbw = algbw x the ring factor: 2 (W-1)/W for
// all-reduce, (W-1)/W for reduce-scatter and all-gather), and writes the rows in the format
// `scape predict --calibrate` reads (docs/PREDICTING.md, "Calibration").
#pragma once

#include <mpi.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "core/communicator.hpp"

namespace scape::runtime {

struct BenchCommOptions {
  std::size_t min_bytes = 1024;       // payload of the smallest size (nccl-tests -b)
  std::size_t max_bytes = 64 << 20;   // of the largest (-e)
  double factor = 2.0;                // between sizes (-f)
  int warmup = 5;                     // untimed calls per size
  int iters = 20;                     // timed calls per size (-n)
  // > 0: every size is timed again, each call after this long with the link idle (a barrier,
  // then a sleep), the rows marked "idle": a collective that follows compute, not another
  // collective (docs/PREDICTING.md, "A link's load"). 0: back-to-back calls only.
  double idle_gap_s = 0;
  std::filesystem::path out = "bench-comm.h5";
};

// The communicator and the memory it reads in place (device memory for NCCL).
struct BenchBackend {
  std::string name;
  std::function<std::unique_ptr<Communicator>(MPI_Comm world)> make;
  std::function<void*(std::size_t bytes)> allocate;  // zero-filled
  std::function<void(void*)> release;
};

BenchBackend mpi_bench_backend();

// busbw / algbw of nccl-tests for `collective` among `workers`.
double bus_factor(CollectiveKind kind, int workers);

// Collective over `world` (every rank, same options); rank 0 prints the table and writes the
// file. Returns the exit status (0; 2 for invalid options, the same on every rank).
int bench_comm(MPI_Comm world, const BenchBackend& backend, const BenchCommOptions& options);

}  // namespace scape::runtime
