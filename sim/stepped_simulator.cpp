// The stepped simulator: persistent ranks, one thread per rank for each call.
#include "sim/stepped_simulator.hpp"

#include <stdexcept>

#include "sim/sim_exchange.hpp"

namespace scape::sim {

SteppedSimulator::SteppedSimulator(config::ExperimentConfig config, std::unique_ptr<train::ExternalData> data,
                                   train::RunOptions options)
    : config_(std::move(config)), data_(std::move(data)), options_(std::move(options)), group_(config_.workers) {
  if (config_.model.type != "external") {
    throw config::ConfigError("model.type: the stepped simulator takes \"external\" gradients, got \"" +
                              config_.model.type + "\"");
  }
  log_ = std::make_unique<train::RunLog>(config_, data_->layout(), options_, 0);
  for (int r = 0; r < config_.workers; ++r) {
    comms_.push_back(std::make_unique<EmulatedComm>(group_, r, config_.world_link(), config_.world_link_class()));
    comm_ptrs_.push_back(comms_.back().get());
  }
  exchange_ = std::make_unique<SimExchange>(config_.workers, comm_ptrs_.data());
  loops_.resize(static_cast<std::size_t>(config_.workers));
  // Built on the rank threads: an optimizer may take part in collectives as it is made.
  try {
    run_rank_threads(group_, [&](int r) {
      loops_[static_cast<std::size_t>(r)] = std::make_unique<train::RankLoop>(
          config_, *data_, options_, *comms_[static_cast<std::size_t>(r)], *exchange_, r == 0 ? log_.get() : nullptr,
          nullptr, nullptr);
    });
  } catch (const std::exception& e) {
    fail(std::string("setup: ") + e.what());
    throw std::runtime_error(outcome_.error);
  }
}

SteppedSimulator::~SteppedSimulator() {
  try {
    close();
  } catch (...) {
  }
}

void SteppedSimulator::fail(const std::string& failure) {
  stopped_ = true;
  closed_ = true;
  outcome_ = log_->finish(failure);
  release_log();
}

// The run file closes with the run, so another run may write the same path at once.
void SteppedSimulator::release_log() {
  last_row_ = log_->last_row();
  log_.reset();
}

bool SteppedSimulator::step(std::span<const std::span<const float>> grads, std::span<const double> losses,
                            std::span<const double> compute_s) {
  train::require_next_step(closed_, "simulator", stopped_, steps_done_, config_.steps);
  const auto w = static_cast<std::size_t>(config_.workers);
  if (grads.size() != w) {
    throw std::invalid_argument("grads: " + std::to_string(grads.size()) + " gradients for " + std::to_string(w) +
                                " workers");
  }
  if (!losses.empty() && losses.size() != w) {
    throw std::invalid_argument("losses: " + std::to_string(losses.size()) + " values for " + std::to_string(w) +
                                " workers");
  }
  if (!compute_s.empty() && compute_s.size() != w) {
    throw std::invalid_argument("compute_seconds: " + std::to_string(compute_s.size()) + " values for " +
                                std::to_string(w) + " workers");
  }
  for (std::size_t r = 0; r < w; ++r) {
    if (grads[r].size() != size()) {
      throw std::invalid_argument("grads[" + std::to_string(r) + "]: " + std::to_string(grads[r].size()) +
                                  " values for a layout of " + std::to_string(size()));
    }
  }
  const int t = steps_done_ + 1;
  std::vector<char> stop(w, 0);
  try {
    run_rank_threads(group_, [&](int r) {
      const auto i = static_cast<std::size_t>(r);
      constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
      const train::GivenGradient given{grads[i], losses.empty() ? kNone : losses[i],
                                       compute_s.empty() ? kNone : compute_s[i], !losses.empty()};
      try {
        stop[i] = loops_[i]->step(t, given) ? 1 : 0;
      } catch (...) {
        loops_[i]->abandon();
        throw;
      }
    });
  } catch (const std::exception& e) {
    fail("step " + std::to_string(t) + ": " + e.what());
    throw std::runtime_error(outcome_.error);
  }
  steps_done_ = t;
  if (stop[0]) stopped_ = true;
  return stop[0] != 0;
}

std::span<const float> SteppedSimulator::params() const { return loops_.front()->params(); }

std::span<const float> SteppedSimulator::residual(int worker) const {
  if (worker < 0 || worker >= config_.workers) {
    throw std::out_of_range("worker: " + std::to_string(worker) + " is not in [0, " +
                            std::to_string(config_.workers) + ")");
  }
  return loops_[static_cast<std::size_t>(worker)]->optimizer().residual();
}

std::span<const std::uint64_t> SteppedSimulator::mask() const { return loops_.front()->optimizer().mask(); }

std::vector<std::pair<std::string, double>> SteppedSimulator::last_row() const {
  return log_ ? log_->last_row() : last_row_;
}

const train::RunOutcome& SteppedSimulator::close(const std::string& caller_failure) {
  if (closed_) return outcome_;
  closed_ = true;
  std::string failure = train::closing_failure(caller_failure, steps_done_, config_.steps, stopped_);
  try {
    run_rank_threads(group_, [&](int r) { loops_[static_cast<std::size_t>(r)]->finish(); });
  } catch (const std::exception& e) {
    if (failure.empty()) failure = std::string("finish: ") + e.what();
  }
  outcome_ = log_->finish(failure);
  release_log();
  return outcome_;
}

}  // namespace scape::sim
