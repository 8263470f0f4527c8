// Rank 0's run file, checkpoints, progress line and running summary. How the workers' values
// are combined into a row is train/run_metrics.cpp's table.
#include "train/run_log.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "config/compute_model.hpp"
#include "config/config_keys.hpp"
#include "run_file/hdf5.hpp"
#include "train/checkpoint.hpp"
#include "train/run_metrics.hpp"
#include "train/stop_signal.hpp"

namespace scape::train {
namespace detail {

// Progress line on stderr: at most every `every_seconds`, and at the end. Each line is one fputs,
// so the lines of a sweep's parallel points never interleave mid-line.
class Progress {
 public:
  Progress(int total, double tokens_per_step, bool quiet, std::string label, double every_seconds)
      : total_(total), tokens_(tokens_per_step), quiet_(quiet), label_(std::move(label)), every_(every_seconds) {}
  void update(int step, double loss, double val_loss, bool force) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    if (steps_at_start_ < 0) steps_at_start_ = step - 1;
    if (!force && now - last_ < std::chrono::duration<double>(every_)) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = (step - steps_at_start_) / std::max(elapsed, 1e-9);
    const double eta = (total_ - step) / std::max(rate, 1e-9);
    std::string line = label_.empty() ? "" : label_ + ": ";
    char buf[160];
    std::snprintf(buf, sizeof buf, "step %d/%d  loss %.4f", step, total_, loss);
    line += buf;
    if (!std::isnan(val_loss)) {
      std::snprintf(buf, sizeof buf, "  val %.4f", val_loss);
      line += buf;
    }
    if (tokens_ > 0) {
      std::snprintf(buf, sizeof buf, "  %.0f tok/s", rate * tokens_);
      line += buf;
    }
    std::snprintf(buf, sizeof buf, "  %.2f steps/s  ETA %dm%02ds\n", rate, static_cast<int>(eta) / 60,
                  static_cast<int>(eta) % 60);
    line += buf;
    std::fputs(line.c_str(), stderr);
  }

 private:
  int total_;
  double tokens_;
  bool quiet_;
  std::string label_;
  double every_;
  int steps_at_start_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace detail

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A non-finite gradient diverges a run, and so does a non-finite loss where the run has one.
bool report_diverged(const WorkerReport& r, bool has_loss) {
  return r.metrics.nonfinite_grads > 0 || (has_loss && !std::isfinite(r.loss));
}

// One writer per run file: another live writer is a ConfigError (exit 2) naming it; a lock its
// killed holder left behind is taken over, saying so.
run_file::RunFileLock take_writer_lock(const std::filesystem::path& out) {
  try {
    run_file::RunFileLock lock = run_file::RunFileLock::for_writing(out);
    if (lock.taken_over()) std::fprintf(stderr, "%s\n", lock.taken_over_note().c_str());
    return lock;
  } catch (const run_file::RunFileBusy& e) {
    throw config::ConfigError(e.what());
  }
}

// A file written with the measured columns (--backend mpi or nccl) holds them, one of the
// simulator does not: --resume under the other kind is refused naming both, not with the lists
// of columns the recorder would compare.
void check_resume_backend(const std::filesystem::path& out, const OptimizerConfig& optimizer, bool measured) {
  std::string marker;  // a column only runs with measured communication have
  for (const auto& c : metric_columns(optimizer, true)) {
    if (c.metric->measured_only && c.purpose.empty()) {
      marker = c.name;
      break;
    }
  }
  if (marker.empty()) return;
  bool has_marker = false;
  try {
    has_marker = run_file::File::open(out, run_file::Access::read).has_link("metrics/" + marker);
  } catch (const run_file::H5Error&) {
    return;  // the recorder's own checks name what is wrong with the file
  }
  if (has_marker == measured) return;
  const char* sim = "the simulator (--backend sim)";
  const char* ranks = "--backend mpi or nccl";
  throw config::ConfigError(out.string() + ": --resume under " + (measured ? ranks : sim) +
                            ", but the run file was written by " + (measured ? sim : ranks) +
                            " (its metric columns differ): resume it with the backend that started it");
}

}  // namespace

const char* to_string(RunStatus s) {
  constexpr const char* kNames[] = {"completed", "diverged", "failed", "interrupted"};
  return kNames[static_cast<int>(s)];
}

RunLog::RunLog(const config::ExperimentConfig& config, const ParamLayout& layout, const RunOptions& options,
               int resume_step)
    : config_(config), options_(options) {
  const nlohmann::json resolved = config.to_json();
  config_json_ = resolved.dump();
  std::vector<MetricColumn> columns = metric_columns(config.optimizer, options.measured_comm);
  run_file::RunFileSpec spec;
  spec.config_json = resolved.dump(2);
  spec.scape_version = options.scape_version;
  spec.git_sha = options.git_sha;
  // Which optimizer types read which key: the analysis reads it here, not from `scape schema`.
  spec.optimizer_keys_json = config::optimizer_key_types().dump();
  describe_metrics(columns, spec);
  for (const auto& c : columns) {
    if (c.name == "step_wall_time") step_wall_column_ = static_cast<int>(column_names_.size());
    column_names_.push_back(c.name);
  }
  for (const auto& s : layout.slots()) spec.tensor_names.push_back(s.name);
  spec.final_params_size = config.log.save_params ? layout.size() : 0;
  spec.flush_interval = config.log.flush_interval;
  if (!options.writer_lock_held) writer_lock_ = take_writer_lock(options.out);
  if (options.resume) check_resume_backend(options.out, config.optimizer, options.measured_comm);
  recorder_ = std::make_unique<run_file::RunRecorder>(
      options.resume ? run_file::RunRecorder::open_for_resume(options.out, spec, resume_step)
                     : run_file::RunRecorder::create(options.out, spec));
  if (!options.resume) {
    // The file a checkpoint left here belonged to was just replaced: the checkpoint would
    // resume the new file after another run's steps.
    std::error_code ec;
    std::filesystem::remove(checkpoint_path(options.out), ec);
  }
  outcome_.steps_completed = resume_step;
  if (options.resume) checkpoint_step_ = resume_step;
  outcome_.n_params = layout.size();
  const double tokens = options.tokens_per_step > 0 ? options.tokens_per_step
                        : config.has_data()          ? static_cast<double>(config.workers) * config.data.batch_size *
                                                  config.model.block_size
                                                     : 0.0;
  progress_ = std::make_unique<detail::Progress>(config.steps, tokens, options.quiet, options.progress_label,
                                                options.progress_every_seconds);
  combiner_ = std::make_unique<StepCombiner>(config.optimizer, config.log.oracle, layout, std::move(columns));
  combiner_->set_modelled_compute(config::modelled_compute_seconds(config));
}

RunLog::~RunLog() = default;

StepVerdict RunLog::record_step(int t, std::span<const WorkerReport* const> reports,
                                std::span<const std::uint64_t> mask, GradientSource& source,
                                std::span<const float> params) {
  std::lock_guard lock(mutex_);
  using Clock = std::chrono::steady_clock;
  evaluated_last_ = false;
  const auto r0 = Clock::now();
  combiner_->combine(reports, mask);
  const auto r1 = Clock::now();
  recorder_->append_step(t, combiner_->row(), combiner_->tensor_row());
  const auto r2 = Clock::now();
  combiner_->set_costs(std::chrono::duration<double>(r1 - r0).count(), std::chrono::duration<double>(r2 - r1).count());
  bool bad = !std::isfinite(reports[0]->metrics.update_norm);
  // A source whose loss is optional (external gradients, a replayed trace) writes NaN for "none";
  // a loss the caller stated is checked like any other.
  const bool has_loss = reports[0]->loss_given || !(source.loss_optional() && std::isnan(reports[0]->loss));
  for (const auto* r : reports) bad = bad || report_diverged(*r, has_loss);
  const double loss = combiner_->value("train_loss");
  outcome_.steps_completed = t;
  last_loss_ = loss;
  bytes_total_ += combiner_->value("bytes_sent");
  step_time_total_ += combiner_->value("step_time_model");
  ++rows_;
  if (!std::isnan(reports[0]->metrics.mask_jaccard)) {
    jaccard_total_ += reports[0]->metrics.mask_jaccard;
    ++jaccard_count_;
  }
  if (bad) {
    diverged_ = true;
    return StepVerdict::stop;
  }
  evaluated_last_ = source.has_validation() && (t % config_.eval.interval == 0 || t == config_.steps);
  if (evaluated_last_) {
    last_val_ = source.validation_loss(params, config_.eval.batches);
    recorder_->append_eval(t, last_val_);
  }
  progress_->update(t, loss, last_val_, t == config_.steps);
  // A stop signal after the last step's row changes nothing: the run is complete.
  if (const StopRequest stop = stop_request(); t < config_.steps && stop.signal != 0) {
    interrupted_by_ = stop.signal;
    interrupted_rank_ = stop.rank;
    return StepVerdict::interrupt;
  }
  return StepVerdict::go_on;
}

void RunLog::write_checkpoint(int t, const std::vector<StateMap>& states, std::span<const float> params) {
  std::lock_guard lock(mutex_);
  // Rows up to t reach the disk before the checkpoint that resumes after t.
  recorder_->flush();
  train::write_checkpoint(checkpoint_path(options_.out), config_json_, t, states, params);
  checkpoint_step_ = t;
}

void RunLog::write_final_params(std::span<const float> params) {
  std::lock_guard lock(mutex_);
  if (!diverged_ && config_.log.save_params) recorder_->write_final_params(params);
}

RunOutcome RunLog::finish(const std::string& caller_failure) {
  std::lock_guard lock(mutex_);
  std::string failure = caller_failure;
  try {
    // The rows still buffered: a file that cannot take them makes the run failed, recorded in
    // the room the recorder keeps for its status (rather than left "running").
    recorder_->flush();
  } catch (const run_file::H5Error& e) {
    if (failure.empty()) failure = e.what();
  }
  if (!failure.empty()) {
    outcome_.status = RunStatus::failed;
    outcome_.error = failure;
    recorder_->set_status("failed", failure);
  } else if (diverged_) {
    outcome_.status = RunStatus::diverged;
    outcome_.error = "non-finite loss or gradient at step " + std::to_string(outcome_.steps_completed);
    recorder_->set_status("diverged", outcome_.error);
  } else if (interrupted_by_ != 0) {
    const int t = outcome_.steps_completed;
    outcome_.status = RunStatus::interrupted;
    outcome_.signal = interrupted_by_;
    outcome_.error = std::string(signal_name(interrupted_by_)) +
                     (interrupted_rank_ >= 0 ? " to rank " + std::to_string(interrupted_rank_) : std::string()) +
                     " after step " + std::to_string(t) + "; " +
                     (checkpoint_step_ == t  ? "checkpoint at step " + std::to_string(t) + ": --resume continues"
                      : checkpoint_step_ > 0 ? "the last checkpoint is at step " + std::to_string(checkpoint_step_) +
                                                   ": --resume goes on from it"
                                             : std::string("no checkpoint (--checkpoint-every): it cannot be resumed"));
    recorder_->set_status("interrupted", outcome_.error);
  } else {
    outcome_.status = RunStatus::completed;
    recorder_->set_status("completed", "");
    std::error_code ec;
    std::filesystem::remove(checkpoint_path(options_.out), ec);
  }
  outcome_.final_val_loss = last_val_;
  outcome_.final_train_loss = last_loss_;
  outcome_.bytes_per_step = rows_ ? bytes_total_ / rows_ : kNaN;
  outcome_.mean_mask_jaccard = jaccard_count_ ? jaccard_total_ / jaccard_count_ : kNaN;
  outcome_.step_time_model = rows_ ? step_time_total_ / rows_ : kNaN;
  return outcome_;
}

void RunLog::close() {
  std::lock_guard lock(mutex_);
  recorder_->close();
}

int RunLog::steps_completed() const { return outcome_.steps_completed; }

void RunLog::step_started(int t, double wall_s) {
  std::lock_guard lock(mutex_);
  // Only a step whose row is the last written and that started in this process (not the step
  // before a resume) has a start to measure from.
  if (step_wall_column_ >= 0 && started_step_ == t - 1 && started_step_ > 0 && outcome_.steps_completed == t - 1 &&
      rows_ > 0) {
    recorder_->amend_last_step(static_cast<std::size_t>(step_wall_column_), wall_s - started_s_);
  }
  started_step_ = t;
  started_s_ = wall_s;
}

void RunLog::steps_ended(double wall_s) { step_started(started_step_ + 1, wall_s); }

std::vector<std::pair<std::string, double>> RunLog::last_row() const {
  std::vector<std::pair<std::string, double>> out;
  if (rows_ == 0) return out;
  const auto row = combiner_->row();
  for (std::size_t c = 0; c < column_names_.size(); ++c) out.emplace_back(column_names_[c], row[c]);
  if (evaluated_last_) out.emplace_back("val_loss", last_val_);
  return out;
}

}  // namespace scape::train
