// `scape run --backend nccl` and `scape bench-comm --backend nccl`: the MPI runner (runtime/mpi_run.hpp) with an
// NcclComm per rank and the optimizer's kernels and state on that rank's GPU (docs/runtime.md).
#pragma once

#include "config/config.hpp"
#include "runtime/bench_comm.hpp"
#include "runtime/mpi_run.hpp"
#include "train/train_loop.hpp"

namespace scape::runtime {

// As run_mpi, with config.optimizer.device forced to cuda. Every rank stops with exit status
// 2 and a clear message when a rank sees no CUDA device or the configuration cannot run on one.
int run_nccl(const config::ExperimentConfig& config, train::RunOptions options, const MpiOptions& mpi);

// `scape bench-comm --backend nccl`: NcclComm on each rank's GPU, buffers in device memory
// (NCCL reads them in place, as the optimizer's own buffers).
BenchBackend nccl_bench_backend();

}  // namespace scape::runtime
