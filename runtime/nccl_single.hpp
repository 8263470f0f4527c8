// `scape run --backend nccl` in a scape built without MPI (the carried device check, a laptop
// with one GPU): one rank in this process on GPU 0, the NCCL communicator over a single-rank
// clique, and the run log, checkpoints and outcome of the other runners.
#pragma once

#include "config/config.hpp"
#include "train/train_loop.hpp"

namespace scape::runtime {

// Runs `config` as the one NCCL rank of this process, with the optimizer on the GPU as
// `--backend nccl` places it. Throws config::ConfigError, before anything is written, when
// workers is not 1, no CUDA device is visible, or the optimizer has no CUDA path.
train::RunOutcome run_nccl_single_process(const config::ExperimentConfig& config, const train::RunOptions& options);

}  // namespace scape::runtime
