// The run-file writer's API (RunRecorder; its state and flushes: recorder_state.cpp); the layout and the
// crash-safety contract are described in recorder.hpp.
//
// Why status / error / steps_completed are root attributes even under SWMR: HDF5 1.10 cannot
// create attributes in SWMR-write mode, but it does rewrite existing ones, variable-length
// strings included (checked with 1.10.8: rewrites of any length, read back after a clean close
// and, via SWMR-read, after SIGKILL; test_recorder covers both). So every attribute is created
// before H5Fstart_swmr_write and only rewritten afterwards; no mirror datasets are needed.
#include "run_file/recorder.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <set>
#include <stdexcept>

#include "run_file/hdf5.hpp"
#include "run_file/recorder_state.hpp"

namespace scape::run_file {

namespace {

constexpr std::array<std::string_view, 6> kStatuses = {"running", "completed", "diverged",
                                                       "failed",  "killed",    "interrupted"};

[[noreturn]] void bad_argument(const std::filesystem::path& path, const std::string& problem) {
  throw std::invalid_argument("run file " + in_quotes(path.string()) + ": " + problem);
}

// Names become HDF5 link names next to reserved ones, so they must be distinct and plain.
void check_names(const std::filesystem::path& path, const std::vector<std::string>& names, std::string_view kind,
                 std::string_view reserved) {
  std::set<std::string> seen;
  for (const std::string& name : names) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == reserved)
      bad_argument(path, std::string(kind) + " name " + in_quotes(name) + " is empty, reserved or contains '/'");
    if (!seen.insert(name).second) bad_argument(path, std::string(kind) + " name " + in_quotes(name) + " repeats");
  }
}

void check_descriptions(const std::filesystem::path& path, std::size_t descriptions, std::size_t names,
                        std::string_view kind) {
  if (descriptions != 0 && descriptions != names)
    bad_argument(path, std::to_string(descriptions) + " " + std::string(kind) + " descriptions for " +
                           std::to_string(names) + " names");
}

void check_spec(const std::filesystem::path& path, const RunFileSpec& spec) {
  if (spec.flush_interval < 1) bad_argument(path, "flush_interval must be at least 1");
  check_descriptions(path, spec.metric_descriptions.size(), spec.metric_names.size(), "metric");
  check_descriptions(path, spec.tensor_metric_descriptions.size(), spec.tensor_metric_names.size(), "tensor metric");
  check_names(path, spec.metric_names, "metric", "step");
  check_names(path, spec.tensor_metric_names, "tensor metric", "names");
  std::set<std::string> tensors(spec.tensor_names.begin(), spec.tensor_names.end());
  if (tensors.size() != spec.tensor_names.size()) bad_argument(path, "tensor names repeat");
  if (!spec.tensor_metric_names.empty() && spec.tensor_names.empty())
    bad_argument(path, "tensor metrics need at least one tensor name");
}

void check_status(const std::filesystem::path& path, std::string_view status) {
  if (std::find(kStatuses.begin(), kStatuses.end(), status) == kStatuses.end())
    bad_argument(
        path, "unknown status " + in_quotes(status) + " (running, completed, diverged, failed, killed or interrupted)");
}

}  // namespace

RunRecorder::RunRecorder(std::unique_ptr<State> state) : state_(std::move(state)) {}
RunRecorder::RunRecorder(RunRecorder&&) noexcept = default;

RunRecorder& RunRecorder::operator=(RunRecorder&& other) noexcept {
  if (this != &other) {
    close_quietly();
    state_ = std::move(other.state_);
  }
  return *this;
}

namespace {

// " (No space left on device)": the system's words for why HDF5's write failed, found in its
// message ("error message = '...'"), or "" when it names none.
std::string system_reason(const std::string& hdf5_message) {
  const std::string key = "error message = '";
  const auto at = hdf5_message.find(key);
  if (at == std::string::npos) return "";
  const auto end = hdf5_message.find('\'', at + key.size());
  if (end == std::string::npos) return "";
  return " (" + hdf5_message.substr(at + key.size(), end - at - key.size()) + ")";
}

}  // namespace

RunRecorder::~RunRecorder() { close_quietly(); }

RunRecorder::State& RunRecorder::live() const {
  if (!state_) throw std::logic_error("RunRecorder used after close or move");
  return *state_;
}

// Destructors cannot throw; a failed final flush is reported rather than lost silently.
void RunRecorder::close_quietly() noexcept {
  if (!state_) return;
  const std::string path = state_->path.string();
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "scape: closing run file '%s' failed: %s\n", path.c_str(), e.what());
  }
}

RunRecorder RunRecorder::create(const std::filesystem::path& path, const RunFileSpec& spec) {
  check_spec(path, spec);
  const auto lock = lock_hdf5();
  auto state = std::make_unique<State>(path, spec);
  try {
    state->file = File::create(path);
    state->create_objects();
    state->read_chunk_rows();
    state->file.flush();
    // Every attribute and dataset exists now; SWMR-write forbids creating more.
    state->file.start_swmr_write();
  } catch (const H5Error& e) {
    // A file that could not be made whole (a full disk, a file-size limit) is not left behind
    // half-written: a rerun would take it for another program's file.
    state.reset();
    std::error_code ec;
    if (std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);  // never a folder
    throw H5Error("run file " + in_quotes(path.string()) + " could not be created" + system_reason(e.what()) +
                  "; nothing is left behind: " + e.what());
  }
  return RunRecorder(std::move(state));
}

RunRecorder RunRecorder::open_for_resume(const std::filesystem::path& path, const RunFileSpec& spec,
                                         long steps_completed) {
  check_spec(path, spec);
  if (steps_completed < 0) bad_argument(path, "steps_completed must be non-negative");
  const auto lock = lock_hdf5();
  auto state = std::make_unique<State>(path, spec);
  state->file = File::open(path, Access::recover);
  state->open_objects();
  state->read_chunk_rows();
  // Shrinking and attribute rewrites happen before SWMR, in plain read-write mode.
  state->truncate_after(steps_completed);
  state->file.write_string_attribute("status", "running");
  state->file.write_string_attribute("error", "");
  state->file.write_int_attribute("steps_completed", steps_completed);
  state->file.write_string_attribute("checksums", "");  // the tables change: new ones at close
  // A resumed run may change steps and log.* (train/checkpoint.hpp): the file records what ran.
  state->file.write_string_attribute("config", spec.config_json);
  // The table that goes with that config (a file written before the attribute existed gains it).
  if (!spec.optimizer_keys_json.empty())
    state->file.write_string_attribute("optimizer_keys", spec.optimizer_keys_json);
  state->file.flush();
  state->file.start_swmr_write();
  return RunRecorder(std::move(state));
}

void RunRecorder::append_step(long step, std::span<const double> metrics, std::span<const double> tensor_values) {
  State& s = live();
  const std::size_t tensor_count = s.spec.tensor_names.size();
  if (metrics.size() != s.spec.metric_names.size())
    bad_argument(s.path, "append_step got " + std::to_string(metrics.size()) + " metrics, expected " +
                             std::to_string(s.spec.metric_names.size()));
  if (tensor_values.size() != s.spec.tensor_metric_names.size() * tensor_count)
    bad_argument(s.path, "append_step got " + std::to_string(tensor_values.size()) + " tensor values, expected " +
                             std::to_string(s.spec.tensor_metric_names.size() * tensor_count));
  if (step <= s.last_step)
    bad_argument(s.path, "steps must be non-negative and increase: step " + std::to_string(step) + " after " +
                             std::to_string(s.last_step));

  s.pending_steps.push_back(step);
  for (std::size_t m = 0; m < metrics.size(); ++m) s.pending_metrics[m].push_back(metrics[m]);
  for (std::size_t k = 0; k < s.pending_tensors.size(); ++k) {
    const auto row = tensor_values.subspan(k * tensor_count, tensor_count);
    s.pending_tensors[k].insert(s.pending_tensors[k].end(), row.begin(), row.end());
  }
  s.last_step = step;
  if (s.pending_steps.size() >= static_cast<std::size_t>(s.spec.flush_interval)) s.flush();
}

void RunRecorder::amend_last_step(std::size_t metric, double value) {
  State& s = live();
  if (metric >= s.spec.metric_names.size())
    bad_argument(s.path, "amend_last_step: no metric " + std::to_string(metric));
  if (!s.pending_steps.empty()) {
    s.pending_metrics[metric].back() = value;
    return;
  }
  if (s.rows == 0 || s.last_step == kNoStep) bad_argument(s.path, "amend_last_step: no row was appended");
  const auto lock = lock_hdf5();
  if (s.write_failure) throw H5Error(*s.write_failure);
  // The row is on disk: rewrite its one cell in place (the table does not grow).
  const double cell[] = {value};
  s.guarded_write("step " + std::to_string(s.last_step) + "'s " + in_quotes(s.spec.metric_names[metric]), 0,
                  [&] { s.metrics[metric].write_rows<double>(s.rows - 1, std::span<const double>(cell)); });
}

void RunRecorder::append_eval(long step, double val_loss) {
  State& s = live();
  if (step <= s.last_eval_step)
    bad_argument(s.path, "eval steps must be non-negative and increase: step " + std::to_string(step) + " after " +
                             std::to_string(s.last_eval_step));
  s.pending_eval_steps.push_back(step);
  s.pending_eval_loss.push_back(val_loss);
  s.last_eval_step = step;
}

void RunRecorder::write_final_params(std::span<const float> params) {
  State& s = live();
  if (!s.final_params) bad_argument(s.path, "created without /final/params (final_params_size 0)");
  if (params.size() != s.spec.final_params_size)
    bad_argument(s.path, "final params have " + std::to_string(params.size()) + " values, expected " +
                             std::to_string(s.spec.final_params_size));
  const auto lock = lock_hdf5();
  if (s.write_failure) throw H5Error(*s.write_failure);
  const std::uint64_t chunk = std::max<hsize_t>(s.final_params->chunk_dims().at(0), 1);
  const std::uint64_t chunks = (params.size() + chunk - 1) / chunk;
  s.guarded_write("the final parameters", kMetadataReserve + kStatusReserve + chunks * chunk * sizeof(float),
                  [&] { s.final_params->write<float>({0}, {params.size()}, params); });
}

void RunRecorder::set_status(std::string_view status, std::string_view error) {
  State& s = live();
  check_status(s.path, status);
  const auto lock = lock_hdf5();
  if (!s.write_failure) {
    s.flush();
    s.write_status(status, error);
    return;
  }
  // After a write failure (already reported) the status is recorded only where room is left
  // and HDF5 did not fail half-way; the file keeps its last flushed steps either way.
  if (s.damaged) return;
  try {
    s.write_status(status, error);
  } catch (const H5Error&) {
  }
}

void RunRecorder::flush() { live().flush(); }

void RunRecorder::close() {
  if (!state_) return;
  // Empty from here on, whatever happens; on failure the handles still close quietly.
  const std::unique_ptr<State> state = std::move(state_);
  const auto lock = lock_hdf5();
  state->close();
}

const std::filesystem::path& RunRecorder::path() const { return live().path; }

long RunRecorder::last_step() const { return live().last_step; }

}  // namespace scape::run_file
