// The run file: one HDF5 file per run holding its config, status, per-step metrics, per-tensor
// metrics, evaluations and optionally the final parameters. This layout is the contract with
// the analysis scripts (layout_version 1):
//
//   root attributes  config (resolved JSON text), status ("running" | "completed" | "diverged" |
//                    "failed"), steps_completed (int64), error ("" when none), scape_version,
//                    git_sha (variable-length UTF-8 strings), layout_version (int64 = 1);
//                    optimizer_keys (JSON text, when the spec gives it: the writer's table of
//                    which optimizer types read which optimizer key, for the analysis)
//   /metrics/step    int64 [rows], extensible; the row count of the run
//   /metrics/<name>  float64 [rows], aligned with /metrics/step; NaN means "not applicable";
//                    attributes unit, combine, doc (strings) when the spec describes the metrics
//   /eval/step       int64 [evals], /eval/val_loss float64 [evals], extensible
//   /tensors/names   strings [tensors]
//   /tensors/<name>  float64 [rows, tensors], extensible along rows, aligned with /metrics/step;
//                    attributes as /metrics/<name>
//   /final/params    float32 [N], only when requested at creation; NaN until written
//
// Crash safety: rows are buffered in memory and written every flush_interval steps (and by
// flush, set_status, close and the destructor). The file is created in the latest format and
// switched to SWMR-write mode once every object exists, so the file on disk is consistent at
// every point, and a SIGKILLed run keeps every flushed step. steps_completed is the last
// flushed step: a flush writes every table's rows and flushes them to the file before it
// rewrites steps_completed, because HDF5's metadata cache writes the tables' extents in no set
// order. Rows past steps_completed (a flush a kill interrupted) are dropped by --resume and by
// scape repair. Files written before this ordering (2026-12-01) can hold a table shorter than
// steps_completed after a kill; scape repair lowers steps_completed to the rows every table holds.
//
// Reading a run file: a live or killed writer leaves the superblock marked "open for writing",
// so plain readers are refused; open it in SWMR-read mode (h5py: File(path, "r", swmr=True),
// C: H5F_ACC_RDONLY | H5F_ACC_SWMR_READ; read_run_summary does this itself), or run
// `scape repair` on a killed run's file (repair_run_file). A cleanly closed, resumed-and-closed
// or repaired file opens normally (h5dump too).
//
// Write errors (full disk, file-size limit): before each flush the recorder reserves the bytes
// the flush can add (File::reserve). When that fails, or HDF5 fails, the recorder stops for
// good: the error names the file, the steps it could not write and the last step kept, and the
// file keeps its last flushed state (and closes cleanly when the failure was a reservation).
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "run_file/run_summary.hpp"

namespace scape::run_file {

inline constexpr long kRunLayoutVersion = 1;

// What a metric's dataset says about its values (attributes "unit", "combine" and "doc"),
// written when the run file is created. Files of older versions, and of specs without
// descriptions, lack them.
struct MetricDescription {
  std::string unit, combine, doc;
};

struct RunFileSpec {
  std::string config_json, scape_version, git_sha;
  // Written as the root attribute optimizer_keys when not empty: JSON text that tells readers of
  // the config what they cannot learn from the file otherwise (train/run_log.cpp fills it with
  // config::optimizer_key_types()); this layer stores it as given.
  std::string optimizer_keys_json;
  std::vector<std::string> metric_names;         // excluding "step"
  std::vector<MetricDescription> metric_descriptions;  // empty, or one per metric name
  std::vector<std::string> tensor_names;
  std::vector<std::string> tensor_metric_names;  // e.g. residual_norm, mask_density, mask_jaccard
  std::vector<MetricDescription> tensor_metric_descriptions;  // empty, or one per tensor metric name
  std::size_t final_params_size = 0;             // 0: no /final/params
  int flush_interval = 10;
};

// One writer per run file, used from one thread at a time (HDF5 calls take hdf5_mutex()).
class RunRecorder {
 public:
  // Creates (truncating) the run file with status "running" and steps_completed 0.
  static RunRecorder create(const std::filesystem::path& path, const RunFileSpec& spec);
  // Reopens a run file, also one whose writer was killed (and not still running: its superblock
  // flags are cleared), checks it against `spec`, drops every metric / eval / tensor row with
  // step > steps_completed and continues appending with status "running". The config attribute
  // becomes spec.config_json (a resumed run may change steps and log.*), and optimizer_keys
  // spec.optimizer_keys_json when that is not empty (the table of the scape that wrote the
  // config); scape_version and git_sha are kept.
  static RunRecorder open_for_resume(const std::filesystem::path& path, const RunFileSpec& spec,
                                     long steps_completed);

  RunRecorder(RunRecorder&&) noexcept;
  RunRecorder& operator=(RunRecorder&&) noexcept;
  RunRecorder(const RunRecorder&) = delete;
  RunRecorder& operator=(const RunRecorder&) = delete;
  // Flushes buffered rows and closes; the status stays as last set. Failures go to stderr.
  ~RunRecorder();

  // Steps are non-negative and increase. `metrics` is aligned with metric_names; `tensor_values` holds
  // tensor_metric_names.size() x tensor_names.size() values, metric-major.
  void append_step(long step, std::span<const double> metrics, std::span<const double> tensor_values = {});
  // Sets metric `metric` (an index into metric_names) of the last appended row to `value`: in the
  // buffer, or in the file when a flush has written the row already. For a value known only
  // after the row (a step's wall time ends when the next step starts).
  void amend_last_step(std::size_t metric, double value);
  // Eval steps are non-negative and increase.
  void append_eval(long step, double val_loss);
  // Writes /final/params now (size final_params_size) and flushes.
  void write_final_params(std::span<const float> params);
  // status is one of running, completed, diverged, failed. Also flushes.
  void set_status(std::string_view status, std::string_view error = "");
  void flush();
  // Flushes and closes, throwing on failure; the recorder is then empty.
  void close();

  const std::filesystem::path& path() const;
  long last_step() const;

 private:
  struct State;
  explicit RunRecorder(std::unique_ptr<State> state);
  State& live() const;  // throws std::logic_error after close or move
  void close_quietly() noexcept;
  std::unique_ptr<State> state_;
};

struct RepairReport {
  bool was_open_for_writing = false;  // the superblock flags of a writer that never closed were set
  std::string status_before, status_after;
  long steps_completed = 0;            // after the repair
  long steps_completed_before = 0;     // larger when a table held fewer rows than it claimed
  std::vector<std::string> trimmed;  // datasets cut back to the rows of steps_completed
};

// `scape repair`: clears the "open for writing" flags a killed writer left, drops the rows of a
// flush the kill interrupted, reads every table back whole, and marks a "running" run
// "killed"; afterwards the file opens plainly. Harmless on a closed file. Must not run while
// the writer is alive (HDF5 cannot tell a live SWMR writer from a dead one: `scape repair` holds
// the run file's lock). Works on a copy that replaces the file only once repaired: throws
// H5Error naming the file when it is not a run file or a flushed table cannot be read, and
// std::filesystem_error when the copy cannot be made, the file left as it was either way.
RepairReport repair_run_file(const std::filesystem::path& path);

// Whether HDF5 opens the file without SWMR, as h5py.File(p, "r") and h5dump do: false while a
// writer's "open for writing" flags are set (a live writer, or one killed before it closed).
bool opens_plainly(const std::filesystem::path& path);

}  // namespace scape::run_file
