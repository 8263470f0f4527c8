// The set-up and ending every runner shares (run_session.hpp).
#include "train/run_session.hpp"

#include <exception>

#include "train/train_loop.hpp"

namespace scape::train {

RunSession::RunSession(const config::ExperimentConfig& config, const RunOptions& options, DeviceUse devices)
    : config_(config), options_(options), start_(std::chrono::steady_clock::now()) {
  require_devices(config_, devices.workers_per_device, devices.shared_workspace);
  data_ = load_source_data(config_);
  if (options_.resume)
    checkpoint_ = load_checkpoint(config_, options_.out, data_->layout().size(), options_.allow_unchecked_checkpoint);
}

RunLog& RunSession::open_log() {
  log_ = std::make_unique<RunLog>(config_, data_->layout(), options_, checkpoint_.step);
  return *log_;
}

RunOutcome RunSession::run(const std::function<void()>& loop) {
  std::string failure;
  try {
    loop();
  } catch (const std::exception& e) {
    const int step = log_ ? log_->steps_completed() + 1 : 0;
    failure = "step " + std::to_string(step) + ": " + e.what();
  }
  return finish(failure);
}

RunOutcome RunSession::finish(const std::string& failure) {
  RunOutcome outcome = log_->finish(failure);
  outcome.wall_s = elapsed_s();
  return outcome;
}

double RunSession::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace scape::train
