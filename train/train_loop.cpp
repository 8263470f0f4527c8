// One rank's training loop, and the device check every runner makes before writing anything.
#include "train/train_loop.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <ctime>
#include <vector>

#include "train/device_memory.hpp"
#include "train/rank_loop.hpp"

namespace scape::train {
namespace {

// When destroyed by an exception's unwinding, abandons the rank (RankLoop::abandon): aborts the
// communicator and settles the optimizer's asynchronous collectives before any buffer is freed.
// After an abort (NCCL, the simulator's thread group) the waits return or fail at once rather
// than run a collective the peers never join; on MPI the peers take part in the collectives this
// rank started, and a dead peer leaves the wait to the watchdog.
class AbandonOnFailure {
 public:
  explicit AbandonOnFailure(RankLoop& loop) : loop_(loop), exceptions_(std::uncaught_exceptions()) {}
  ~AbandonOnFailure() {
    if (std::uncaught_exceptions() > exceptions_) loop_.abandon();
  }
  AbandonOnFailure(const AbandonOnFailure&) = delete;
  AbandonOnFailure& operator=(const AbandonOnFailure&) = delete;

 private:
  RankLoop& loop_;
  int exceptions_;
};

}  // namespace

void train_rank(const config::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
                Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume,
                SharedModel* shared) {
  RankLoop loop(config, data, options, comm, exchange, log, resume, shared);
  const AbandonOnFailure abandon_on_failure(loop);
  for (int t = loop.first_step(); t <= config.steps; ++t) {
    if (loop.step(t)) break;
  }
  loop.finish();
}

namespace {

void require_device(kernels::DeviceKind device, const char* key) {
  if (device != kernels::DeviceKind::cuda) return;
  if (!kernels::cuda_built()) {
    throw config::ConfigError(std::string(key) +
                              ": cuda, but this scape was built without CUDA (no nvcc at configure time)");
  }
  if (kernels::cuda_device_count() == 0) {
    throw config::ConfigError(std::string(key) + ": cuda, but no CUDA device is visible on this machine");
  }
}

}  // namespace

void require_devices(const config::ExperimentConfig& config, int workers_per_device, bool shared_workspace) {
  require_device(config.device, "device");
  require_device(config.optimizer.device, "optimizer.device");
  if (config.device != kernels::DeviceKind::cuda) return;
  const DeviceMemory need = device_memory_estimate(config, workers_per_device, shared_workspace);
  const std::size_t free = kernels::cuda_free_bytes();
  if (free > 0 && need.total() > free) {
    char have[64];
    std::snprintf(have, sizeof have, "%.1f GiB", static_cast<double>(free) / (1024.0 * 1024.0 * 1024.0));
    throw config::ConfigError("device: cuda: the run needs about " + describe(need) + " on the GPU, but " + have +
                              " are free: lower workers, data.batch_size or model.block_size");
  }
}

}  // namespace scape::train
