// One rank's training loop, and the device check every runner makes before writing anything.
#include "train/train_loop.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <ctime>
#include <vector>

#include "kernels/device_span.hpp"
#include "train/device_memory.hpp"
#include "train/run_metrics.hpp"

namespace scape::train {
namespace {

double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// When destroyed by an exception's unwinding: aborts the communicator, then settles the
// optimizer's asynchronous collectives (the lagged all-gather, the gradient buckets), which may
// still read the gradient or write the optimizer's buffers on MPI's communication thread, before
// any of those buffers is freed. After an abort (NCCL, the simulator's thread group) the waits
// return or fail at once rather than run a collective the peers never join; on MPI the
// peers take part in the collectives this rank started, and a dead peer leaves the wait to the
// watchdog. A second failure while settling is dropped: the first one is the run's error.
class AbortOnFailure {
 public:
  AbortOnFailure(Communicator& comm, Optimizer& opt)
      : comm_(comm), opt_(opt), exceptions_(std::uncaught_exceptions()) {}
  ~AbortOnFailure() {
    if (std::uncaught_exceptions() <= exceptions_) return;
    comm_.abort();
    try {
      opt_.finish();
    } catch (...) {
    }
  }
  AbortOnFailure(const AbortOnFailure&) = delete;
  AbortOnFailure& operator=(const AbortOnFailure&) = delete;

 private:
  Communicator& comm_;
  Optimizer& opt_;
  int exceptions_;
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

void train_rank(const experiments::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
                Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume,
                SharedModel* shared) {
  const int rank = comm.rank();
  const ParamLayout& layout = data.layout();
  // The model's parameters and gradients live in the memory of the run's device: host memory, or
  // CUDA managed memory that the model and optimizer kernels use in place and the host reads
  // (for the metrics, the log and checkpoints) after their streams have synchronized.
  const std::unique_ptr<kernels::KernelBackend> device =
      config.device == kernels::DeviceKind::cpu ? nullptr : kernels::make_backend(config.device);
  kernels::KernelBackend& backend = device ? *device : kernels::cpu_backend();
  auto source = make_gradient_source(config, data, rank, backend, shared);
  auto opt = make_optimizer(config.optimizer, layout, comm, config.steps);
  const bool moved = config.optimizer.device != kernels::DeviceKind::cpu || config.optimizer.residual_offload;
  if (rank == 0 && !options.quiet) {
    if (device) {
      std::fprintf(stderr, "model: %s; memory estimate %s\n", device->description().c_str(),
                   describe(device_memory_estimate(config, config.workers, shared != nullptr)).c_str());
    }
    if (moved) std::fprintf(stderr, "optimizer: %s\n", opt->device_summary().c_str());
  }
  kernels::Buffer<float> params(backend, layout.size()), grads(backend, layout.size());
  std::vector<float> acc, moment;
  int first = 1;
  if (resume != nullptr) {
    std::copy(resume->params.begin(), resume->params.end(), params.data());
    opt->load_state(resume->states[static_cast<std::size_t>(rank)]);
    first = resume->step + 1;
  } else {
    data.init_params(params);
  }
  // Declared after every buffer of this rank, so a failure unwinding out of the loop aborts the
  // communicator before any of them is freed (Communicator::abort).
  const AbortOnFailure abort_on_failure(comm, *opt);
  // On a GPU forward/backward is also timed on the model's stream with CUDA events: the source
  // starts the span just before the pass's first kernel. Not for the simulator's shared model:
  // its workers queue their passes on one stream in turn, so the span would hold the others'.
  const std::unique_ptr<kernels::DeviceSpan> compute_span =
      shared == nullptr ? kernels::make_device_span(backend) : nullptr;
  const bool want_oracle = config.log.oracle && has_sparse_metrics(config.optimizer);
  // overlap_grad_reduce: each gradient range goes to the optimizer as the backward pass finishes
  // it. A collective that reads host memory at once needs the range's queued kernels done.
  model::GradientReady gradient_ready;
  if (opt->reduces_in_backward()) {
    gradient_ready = [&, sync = !comm.waits_for_queued_kernels()](std::size_t begin, std::size_t end) {
      if (sync) backend.synchronize();
      opt->gradient_ready(grads.span(), begin, end);
    };
  }
  for (int t = first; t <= config.steps; ++t) {
    if (options.before_step) options.before_step(rank, t);
    WorkerReport report;
    const double w0 = wall_seconds();
    const double c0 = thread_cpu_seconds();
    report.loss = source->gradient(params, t, grads, gradient_ready, compute_span.get());
    report.compute_s = thread_cpu_seconds() - c0;
    report.compute_wall_s = wall_seconds() - w0;
    if (compute_span) report.compute_device_s = compute_span->stop_seconds();
    // Every worker's whole gradient (and a_i, m_prev) goes to rank 0 only at the steps that
    // take the metrics needing them; the others save the copies and, across processes, the
    // W N floats gathered to rank 0.
    const bool gradient_metrics = (t - 1) % config.log.gradient_metrics_interval == 0;
    if (want_oracle && gradient_metrics) {
      const auto e = opt->residual();
      acc.resize(grads.size());
      const float* g = grads.data();
      for (std::size_t j = 0; j < grads.size(); ++j) acc[j] = e[j] + g[j];
      report.accumulated = acc;
      const auto m = opt->own_first_moment();  // before the step: the m_prev its mask statistic reads
      moment.assign(m.begin(), m.end());
      report.first_moment = moment;
    }
    const double w1 = wall_seconds();
    const double o0 = thread_cpu_seconds();
    report.metrics = opt->step(params, grads);
    report.optimizer_s = thread_cpu_seconds() - o0;
    report.optimizer_wall_s = wall_seconds() - w1;
    if (gradient_metrics) report.grads = grads.span();
    report.measured = comm.take_measured_times();
    report.exposed_wait_s = comm.take_exposed_wait(CollectiveKind::all_gather);
    report.grad_wait_exposed_s = comm.take_exposed_wait(CollectiveKind::reduce_scatter);
    const bool stop = exchange.exchange(rank, report, [&](std::span<const WorkerReport* const> reports) {
      return log->record_step(t, reports, opt->mask(), *source, params);
    });
    if (stop) break;
    if (options.checkpoint_every > 0 && t % options.checkpoint_every == 0 && t < config.steps) {
      StateMap mine;
      opt->save_state(mine);
      const auto states = exchange.gather_states(rank, mine);
      if (rank == 0) log->write_checkpoint(t, states, params);
      exchange.barrier(rank);
    }
  }
  opt->finish();
  exchange.barrier(rank);
  if (rank == 0) log->write_final_params(params);
}

namespace {

void require_device(kernels::DeviceKind device, const char* key) {
  if (device != kernels::DeviceKind::cuda) return;
  if (!kernels::cuda_built()) {
    throw experiments::ConfigError(std::string(key) +
                                   ": cuda, but this scape was built without CUDA (no nvcc at configure time)");
  }
  if (kernels::cuda_device_count() == 0) {
    throw experiments::ConfigError(std::string(key) + ": cuda, but no CUDA device is visible on this machine");
  }
}

}  // namespace

void require_devices(const experiments::ExperimentConfig& config, int workers_per_device, bool shared_workspace) {
  require_device(config.device, "device");
  require_device(config.optimizer.device, "optimizer.device");
  if (config.device != kernels::DeviceKind::cuda) return;
  const DeviceMemory need = device_memory_estimate(config, workers_per_device, shared_workspace);
  const std::size_t free = kernels::cuda_free_bytes();
  if (free > 0 && need.total() > free) {
    char have[64];
    std::snprintf(have, sizeof have, "%.1f GiB", static_cast<double>(free) / (1024.0 * 1024.0 * 1024.0));
    throw experiments::ConfigError("device: cuda: the run needs about " + describe(need) + " on the GPU, but " + have +
                                   " are free: lower workers, data.batch_size or model.block_size");
  }
}

}  // namespace scape::train
