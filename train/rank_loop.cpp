// One rank's step: gradient, optimizer step, report to rank 0, checkpoint.
#include "train/rank_loop.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <cstdio>
#include <ctime>
#include <thread>

#include "optimizers/make_optimizer.hpp"
#include "train/device_memory.hpp"
#include "train/run_metrics.hpp"

namespace scape::train {
namespace {

// DiLoCo's and SparseLoCo's workers hold parameters of their own between outer steps: each
// rank's go into its checkpoint state, and a resumed rank starts from its own.
const std::string kWorkerParams = "worker.params";

double wall_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

std::string closing_failure(const std::string& caller_failure, int steps_done, int total, bool stopped) {
  if (!caller_failure.empty()) return caller_failure;
  if (stopped || steps_done >= total) return "";
  return "closed after step " + std::to_string(steps_done) + " of " + std::to_string(total);
}

void require_next_step(bool closed, const char* closed_what, bool stopped, int steps_done, int total) {
  if (closed) throw std::logic_error(std::string("step: the ") + closed_what + " is closed");
  if (stopped) throw std::logic_error("step: the run stopped at step " + std::to_string(steps_done));
  if (steps_done >= total)
    throw std::logic_error("step: all " + std::to_string(total) + " steps of the run were taken");
}

RankLoop::RankLoop(const config::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
                   Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume,
                   SharedModel* shared)
    : config_(config), options_(options), comm_(comm), exchange_(exchange), log_(log) {
  const int rank = comm.rank();
  const ParamLayout& layout = data.layout();
  // The model's parameters and gradients live in the memory of the run's device: host memory, or
  // CUDA managed memory that the model and optimizer kernels use in place and the host reads
  // (for the metrics, the log and checkpoints) after their streams have synchronized.
  device_ = config.device == kernels::DeviceKind::cpu ? nullptr : kernels::make_backend(config.device);
  backend_ = device_ ? device_.get() : &kernels::cpu_backend();
  source_ = make_gradient_source(config, data, rank, *backend_, shared);
  opt_ = make_optimizer(config.optimizer, layout, comm, config.steps);
  const bool moved = config.optimizer.device != kernels::DeviceKind::cpu || config.optimizer.residual_offload;
  if (rank == 0 && !options.quiet) {
    if (device_) {
      std::fprintf(stderr, "model: %s; memory estimate %s\n", device_->description().c_str(),
                   describe(device_memory_estimate(config, config.workers, shared != nullptr)).c_str());
    }
    if (moved) std::fprintf(stderr, "optimizer: %s\n", opt_->device_summary().c_str());
  }
  params_ = kernels::Buffer<float>(*backend_, layout.size());
  grads_ = kernels::Buffer<float>(*backend_, layout.size());
  if (resume != nullptr) {
    const StateMap& state = resume->states[static_cast<std::size_t>(rank)];
    if (state.contains(kWorkerParams)) {
      get_state_exact(state, kWorkerParams, params_.span());
    } else {
      std::copy(resume->params.begin(), resume->params.end(), params_.data());
    }
    opt_->load_state(state);
    first_ = resume->step + 1;
  } else {
    data.init_params(params_);
  }
  // On a GPU forward/backward is also timed on the model's stream with CUDA events: the source
  // starts the span just before the pass's first kernel. Not for the simulator's shared model:
  // its workers queue their passes on one stream in turn, so the span would hold the others'.
  compute_span_ = shared == nullptr ? kernels::make_device_span(*backend_) : nullptr;
  // a_i and m_prev travel to rank 0 only where an oracle metric reads them.
  want_oracle_ = config.log.oracle && has_oracle_metrics(config.optimizer);
  // overlap_grad_reduce: each gradient range goes to the optimizer as the backward pass finishes
  // it. A collective that reads host memory at once needs the range's queued kernels done.
  if (opt_->reduces_in_backward()) {
    gradient_ready_ = [this, sync = !comm.waits_for_queued_kernels()](std::size_t begin, std::size_t end) {
      if (sync) backend_->synchronize();
      opt_->gradient_ready(grads_.span(), begin, end);
    };
  }
}

RankLoop::~RankLoop() = default;

bool RankLoop::step(int t, const GivenGradient& given) {
  const int rank = comm_.rank();
  if (log_ != nullptr) log_->step_started(t, wall_seconds());
  if (options_.before_step) options_.before_step(rank, t);
  WorkerReport report;
  const double w0 = wall_seconds();
  const double c0 = thread_cpu_seconds();
  std::span<const float> grads = grads_.span();
  if (given.grads.empty()) {
    report.loss = source_->gradient(params_, t, grads_, gradient_ready_, compute_span_.get());
    // compute.type = "sleep": the rank stands for a GPU whose forward and backward take
    // compute.seconds; it sleeps out what its own gradient did not take.
    const double left = config_.compute.type == "sleep" ? config_.compute.seconds - (wall_seconds() - w0) : 0.0;
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  } else {
    grads = given.grads;
    report.loss = given.loss;
    report.loss_given = given.has_loss;
  }
  report.compute_s = thread_cpu_seconds() - c0;
  report.compute_wall_s = wall_seconds() - w0;
  if (!given.grads.empty() && !std::isnan(given.compute_s)) report.compute_s = report.compute_wall_s = given.compute_s;
  if (compute_span_ && given.grads.empty()) report.compute_device_s = compute_span_->stop_seconds();
  // Every worker's whole gradient (and a_i, m_prev) goes to rank 0 only at the steps that
  // take the metrics needing them; the others save the copies and, across processes, the
  // W N floats gathered to rank 0.
  const bool gradient_metrics = (t - 1) % config_.log.gradient_metrics_interval == 0;
  if (want_oracle_ && gradient_metrics) {
    const auto e = opt_->residual();
    acc_.resize(grads.size());
    for (std::size_t j = 0; j < grads.size(); ++j) acc_[j] = e[j] + grads[j];
    report.accumulated = acc_;
    const auto m = opt_->own_first_moment();  // before the step: the m_prev its mask statistic reads
    moment_.assign(m.begin(), m.end());
    report.first_moment = moment_;
  }
  const double w1 = wall_seconds();
  const double o0 = thread_cpu_seconds();
  report.metrics = opt_->step(params_, grads);
  report.optimizer_s = thread_cpu_seconds() - o0;
  report.optimizer_wall_s = wall_seconds() - w1;
  if (gradient_metrics) report.grads = grads;
  report.measured = comm_.take_measured_times();
  report.exposed_wait_s = comm_.take_exposed_wait(CollectiveKind::all_gather);
  report.grad_wait_exposed_s = comm_.take_exposed_wait(CollectiveKind::reduce_scatter);
  report.optimizer_kernel_wall_s = report.optimizer_wall_s - comm_.take_blocking_seconds() - report.exposed_wait_s -
                                   report.grad_wait_exposed_s;
  const StepVerdict verdict = exchange_.exchange(rank, report, [&](std::span<const WorkerReport* const> reports) {
    return log_->record_step(t, reports, opt_->mask(), *source_, params_);
  });
  if (verdict == StepVerdict::stop) return true;
  // A stop signal (only before the last step) checkpoints where checkpoints are on, then stops.
  const bool interrupted = verdict == StepVerdict::interrupt;
  if (options_.checkpoint_every > 0 && (t % options_.checkpoint_every == 0 || interrupted) && t < config_.steps) {
    StateMap mine;
    opt_->save_state(mine);
    if (has_outer_loop(config_.optimizer.type)) put_state(mine, kWorkerParams, params_.span());
    const auto states = exchange_.gather_states(rank, mine);
    if (rank == 0) log_->write_checkpoint(t, states, params_);
    exchange_.barrier(rank);
  }
  return interrupted;
}

void RankLoop::finish() {
  if (log_ != nullptr) log_->steps_ended(wall_seconds());
  opt_->finish();
  exchange_.barrier(comm_.rank());
  if (comm_.rank() == 0) log_->write_final_params(params_);
}

void RankLoop::abandon() noexcept {
  comm_.abort();
  try {
    opt_->finish();
  } catch (...) {
  }
}

}  // namespace scape::train
