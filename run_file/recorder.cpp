// The run-file writer (RunRecorder) and reader (read_run_summary); the layout and the
// crash-safety contract are described in recorder.hpp.
//
// Why status / error / steps_completed are root attributes even under SWMR: HDF5 1.10 cannot
// create attributes in SWMR-write mode, but it does rewrite existing ones, variable-length
// strings included (checked with 1.10.8: rewrites of any length, read back after a clean close
// and, via SWMR-read, after SIGKILL; test_recorder covers both). So every attribute is created
// before H5Fstart_swmr_write and only rewritten afterwards; no mirror datasets are needed.
#include "experiments/recorder.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "experiments/hdf5.hpp"
#include "experiments/step_rows.hpp"

namespace scape::experiments {

namespace {

constexpr std::array<std::string_view, 5> kStatuses = {"running", "completed", "diverged", "failed", "killed"};
constexpr hsize_t kMetricChunkRows = 512;
constexpr hsize_t kTensorChunkValues = 8192;      // 64 KiB of float64 per /tensors chunk
constexpr hsize_t kParamChunkValues = 1u << 20;   // 4 MiB of float32 per /final/params chunk
constexpr long kNoStep = -1;  // steps are non-negative
// Reserved beyond the new chunks before each flush: a global-heap collection for the rewritten
// string attributes and object-header updates, plus per growing dataset its chunk index's new
// blocks. Measured with HDF5 1.10.8: at most 15 KB over 36 datasets (their first chunks).
constexpr std::uint64_t kMetadataReserve = 16 * 1024;
constexpr std::uint64_t kIndexReservePerDataset = 1024;
// Kept free by every flush for the status and error attributes (a 4 KiB global-heap collection
// when they are rewritten): whatever stops the run, its status can still be recorded.
constexpr std::uint64_t kStatusReserve = 8 * 1024;


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

// Attributes are created before SWMR-write mode starts (it forbids creating them).
void describe(const Dataset& dataset, const std::vector<MetricDescription>& descriptions, std::size_t i) {
  if (descriptions.empty()) return;
  dataset.write_string_attribute("unit", descriptions[i].unit);
  dataset.write_string_attribute("combine", descriptions[i].combine);
  dataset.write_string_attribute("doc", descriptions[i].doc);
}

void check_status(const std::filesystem::path& path, std::string_view status) {
  if (std::find(kStatuses.begin(), kStatuses.end(), status) == kStatuses.end())
    bad_argument(path, "unknown status " + in_quotes(status) + " (running, completed, diverged, failed or killed)");
}

// A growing table: dimension 0 unlimited, the others fixed.
DatasetShape rows_shape(std::vector<hsize_t> row_dims, hsize_t chunk_rows) {
  DatasetShape shape;
  shape.dims = {0};
  shape.max_dims = {H5S_UNLIMITED};
  shape.chunk = {chunk_rows};
  for (hsize_t d : row_dims) {
    shape.dims.push_back(d);
    shape.max_dims.push_back(d);
    shape.chunk.push_back(d);
  }
  return shape;
}

void check_rank(const Dataset& dataset, std::size_t rank) {
  if (dataset.dims().size() != rank)
    throw_invalid_file(dataset.file_path(), in_quotes(dataset.name()) + " must be " + std::to_string(rank) + "-D");
}

// The members of `group` must be exactly `expected` (so every dataset is appended in step).
void check_members(const File& file, const std::string& group, std::vector<std::string> expected) {
  std::vector<std::string> found = file.has_link(group) ? file.child_names(group) : std::vector<std::string>{};
  std::sort(found.begin(), found.end());
  std::sort(expected.begin(), expected.end());
  if (found == expected) return;
  const auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return "[" + s + "]";
  };
  throw_invalid_file(file.file_path(), "'/" + group + "' holds " + join(found) + " but the run spec expects " +
                                           join(expected));
}

void check_run_file(const File& file) {
  for (const char* attr : {"layout_version", "config"})
    if (!file.has_attribute(attr))
      throw_invalid_file(file.file_path(), std::string("not a scape run file (no '") + attr + "' attribute)");
  const std::int64_t version = file.read_int_attribute("layout_version");
  if (version != kRunLayoutVersion)
    throw_invalid_file(file.file_path(), "unsupported run-file layout_version " + std::to_string(version) +
                                             " (this build reads " + std::to_string(kRunLayoutVersion) + ")");
}

}  // namespace

struct RunRecorder::State {
  std::filesystem::path path;
  RunFileSpec spec;
  File file;  // declared first, so it closes after the datasets
  Dataset step, eval_step, eval_loss;
  std::vector<Dataset> metrics, tensors;  // aligned with metric_names / tensor_metric_names
  std::optional<Dataset> final_params;

  hsize_t rows = 0, eval_rows = 0;  // rows on disk
  hsize_t metric_chunk_rows = 1, tensor_chunk_rows = 1, eval_chunk_rows = 1;
  long flushed_step = 0;                    // steps_completed on disk
  std::optional<std::string> write_failure;  // set once the file could not be written
  bool damaged = false;                      // an HDF5 write itself failed (not only a reservation)
  long last_step = kNoStep, last_eval_step = kNoStep;
  std::vector<std::int64_t> pending_steps, pending_eval_steps;
  std::vector<std::vector<double>> pending_metrics, pending_tensors;  // per dataset, pending rows
  std::vector<double> pending_eval_loss;

  State(std::filesystem::path p, RunFileSpec s)
      : path(std::move(p)),
        spec(std::move(s)),
        pending_metrics(spec.metric_names.size()),
        pending_tensors(spec.tensor_metric_names.size()) {}

  void create_objects() {
    file.write_string_attribute("config", spec.config_json);
    file.write_string_attribute("status", "running");
    file.write_int_attribute("steps_completed", 0);
    file.write_string_attribute("error", "");
    file.write_string_attribute("scape_version", spec.scape_version);
    file.write_string_attribute("git_sha", spec.git_sha);
    file.write_int_attribute("layout_version", kRunLayoutVersion);

    step = file.create_dataset("metrics/step", H5T_STD_I64LE, rows_shape({}, kMetricChunkRows));
    for (std::size_t m = 0; m < spec.metric_names.size(); ++m) {
      metrics.push_back(
          file.create_dataset("metrics/" + spec.metric_names[m], H5T_IEEE_F64LE, rows_shape({}, kMetricChunkRows)));
      describe(metrics.back(), spec.metric_descriptions, m);
    }
    eval_step = file.create_dataset("eval/step", H5T_STD_I64LE, rows_shape({}, kMetricChunkRows));
    eval_loss = file.create_dataset("eval/val_loss", H5T_IEEE_F64LE, rows_shape({}, kMetricChunkRows));

    file.create_string_dataset("tensors/names", spec.tensor_names).close();
    const hsize_t tensor_count = spec.tensor_names.size();
    const hsize_t tensor_rows = std::clamp<hsize_t>(kTensorChunkValues / std::max<hsize_t>(tensor_count, 1), 1,
                                                    kMetricChunkRows);
    for (std::size_t k = 0; k < spec.tensor_metric_names.size(); ++k) {
      tensors.push_back(file.create_dataset("tensors/" + spec.tensor_metric_names[k], H5T_IEEE_F64LE,
                                            rows_shape({tensor_count}, tensor_rows)));
      describe(tensors.back(), spec.tensor_metric_descriptions, k);
    }

    if (spec.final_params_size > 0) {
      const hsize_t n = spec.final_params_size;
      // Chunked so that nothing is allocated until written; NaN marks "never written".
      final_params = file.create_dataset(
          "final/params", H5T_IEEE_F32LE,
          DatasetShape{{n}, {}, {std::min(n, kParamChunkValues)}, std::numeric_limits<double>::quiet_NaN()});
    }
  }

  // Opens the datasets of an existing file and checks them against the spec.
  void open_objects() {
    check_run_file(file);
    std::vector<std::string> metric_members = spec.metric_names;
    metric_members.push_back("step");
    check_members(file, "metrics", metric_members);
    check_members(file, "eval", {"step", "val_loss"});
    std::vector<std::string> tensor_members = spec.tensor_metric_names;
    tensor_members.push_back("names");
    check_members(file, "tensors", tensor_members);

    step = file.open_dataset("metrics/step");
    check_rank(step, 1);
    for (const std::string& name : spec.metric_names) {
      metrics.push_back(file.open_dataset("metrics/" + name));
      check_rank(metrics.back(), 1);
    }
    eval_step = file.open_dataset("eval/step");
    eval_loss = file.open_dataset("eval/val_loss");
    check_rank(eval_step, 1);
    check_rank(eval_loss, 1);

    if (file.open_dataset("tensors/names").read_strings(spec.tensor_names.size()) != spec.tensor_names)
      throw_invalid_file(file.file_path(), "'/tensors/names' differs from the run spec's tensor names");
    for (const std::string& name : spec.tensor_metric_names) {
      tensors.push_back(file.open_dataset("tensors/" + name));
      const std::vector<hsize_t> dims = tensors.back().dims();
      if (dims.size() != 2 || dims[1] != spec.tensor_names.size())
        throw_invalid_file(file.file_path(), "'/tensors/" + name + "' must be [steps, " +
                                                 std::to_string(spec.tensor_names.size()) + "]");
    }
    if (spec.final_params_size > 0) {
      final_params = file.open_dataset("final/params");
      if (final_params->dims() != std::vector<hsize_t>{spec.final_params_size})
        throw_invalid_file(file.file_path(),
                           "'/final/params' must hold " + std::to_string(spec.final_params_size) + " values");
    }
  }

  // Drops every row with step > steps_completed (also rows of a flush a kill interrupted).
  void truncate_after(long steps_completed) {
    rows = rows_up_to(read_steps(step), steps_completed, step);
    for (const std::vector<Dataset>* group : {&metrics, &tensors}) {
      for (const Dataset& d : *group) {
        std::vector<hsize_t> dims = d.dims();
        if (dims[0] < rows)
          throw_invalid_file(file.file_path(), in_quotes(d.name()) + " has fewer rows than '/metrics/step'");
        dims[0] = rows;
        d.set_extent(dims);
      }
    }
    step.set_extent({rows});

    const std::vector<std::int64_t> eval_steps = read_steps(eval_step);
    eval_rows = rows_up_to(eval_steps, steps_completed, eval_step);
    if (eval_loss.dims()[0] < eval_rows)
      throw_invalid_file(file.file_path(), "'/eval/val_loss' has fewer rows than '/eval/step'");
    eval_step.set_extent({eval_rows});
    eval_loss.set_extent({eval_rows});
    last_step = steps_completed;
    flushed_step = steps_completed;
    last_eval_step = eval_rows > 0 ? static_cast<long>(eval_steps[eval_rows - 1]) : kNoStep;
  }

  // Bytes a flush of the pending rows may add to the file: every chunk it starts, whole, and
  // room for the metadata that indexes them and for the rewritten attributes.
  std::uint64_t bytes_to_flush() const {
    const auto new_chunks = [](hsize_t before, hsize_t added, hsize_t chunk_rows) {
      const auto chunks = [&](hsize_t r) { return (r + chunk_rows - 1) / chunk_rows; };
      return chunks(before + added) - chunks(before);
    };
    const hsize_t added = pending_steps.size(), evals = pending_eval_steps.size();
    std::uint64_t bytes =
        kMetadataReserve + kStatusReserve + kIndexReservePerDataset * (metrics.size() + tensors.size() + 3);
    bytes += new_chunks(rows, added, metric_chunk_rows) * metric_chunk_rows * 8 * (metrics.size() + 1);
    bytes += new_chunks(rows, added, tensor_chunk_rows) * tensor_chunk_rows * 8 * spec.tensor_names.size() *
             tensors.size();
    bytes += new_chunks(eval_rows, evals, eval_chunk_rows) * eval_chunk_rows * 8 * 2;
    return bytes;
  }

  std::string pending_what() const {
    if (pending_steps.empty()) return "the evaluations";
    return "steps " + std::to_string(pending_steps.front()) + ".." + std::to_string(pending_steps.back());
  }

  // Stops the writer for good: later flushes throw the first failure without touching the file.
  [[noreturn]] void stop(const std::string& what, const std::string& reason) {
    if (!write_failure) {
      write_failure = "run file " + in_quotes(path.string()) + ": cannot write " + what + " (" + reason +
                      "); the steps up to " + std::to_string(flushed_step) + " are kept";
    }
    throw H5Error(*write_failure);
  }

  // Reserves `bytes`, runs `write` and flushes; a failure stops the writer (stop).
  template <typename Write>
  void guarded_write(const std::string& what, std::uint64_t bytes, Write&& write) {
    try {
      file.reserve(bytes);
    } catch (const H5Error& e) {
      stop(what, e.what());
    }
    try {
      write();
      file.flush();
    } catch (const H5Error& e) {
      damaged = true;  // HDF5 failed half-way: what reached the disk is uncertain
      stop(what, e.what());
    }
  }

  // Writes the buffered rows at their row offsets and flushes the file. /metrics/step goes
  // last: its length counts complete rows. Space is reserved first: a file that cannot grow
  // stops the run with its last flushed state intact (recorder.hpp).
  void flush() {
    const auto lock = lock_hdf5();
    if (write_failure) throw H5Error(*write_failure);
    guarded_write(pending_what(), bytes_to_flush(), [&] { write_pending(); });
  }

  void write_status(std::string_view status, std::string_view error) {
    guarded_write("the status " + in_quotes(status), kStatusReserve, [&] {
      file.write_string_attribute("status", status);
      file.write_string_attribute("error", error);
    });
  }

  void write_pending() {
    if (!pending_steps.empty()) {
      for (std::size_t m = 0; m < metrics.size(); ++m) metrics[m].write_rows<double>(rows, pending_metrics[m]);
      for (std::size_t k = 0; k < tensors.size(); ++k) tensors[k].write_rows<double>(rows, pending_tensors[k]);
      step.write_rows<std::int64_t>(rows, pending_steps);
    }
    if (!pending_eval_steps.empty()) {
      eval_loss.write_rows<double>(eval_rows, pending_eval_loss);
      eval_step.write_rows<std::int64_t>(eval_rows, pending_eval_steps);
      eval_rows += pending_eval_steps.size();
      pending_eval_steps.clear();
      pending_eval_loss.clear();
    }
    if (!pending_steps.empty()) {
      // HDF5's metadata cache writes the tables' extents and the attribute in no set order, so
      // a kill inside one flush could leave steps_completed ahead of a table's rows. Flushing the
      // rows before the attribute is written keeps steps_completed a promise that they are in the
      // file (in the OS's cache: a killed process cannot lose them; H5Fflush does not fsync).
      file.flush();
      file.write_int_attribute("steps_completed", pending_steps.back());
      rows += pending_steps.size();
      flushed_step = pending_steps.back();
      pending_steps.clear();
      for (auto& column : pending_metrics) column.clear();
      for (auto& column : pending_tensors) column.clear();
    }
  }

  // The chunk rows of the growing tables, for bytes_to_flush (created or reopened files alike).
  void read_chunk_rows() {
    const auto chunk_rows = [&](const Dataset& d) {
      const std::vector<hsize_t> chunk = d.chunk_dims();
      if (chunk.empty() || chunk[0] == 0) throw_invalid_file(path.string(), in_quotes(d.name()) + " cannot grow (not chunked)");
      return chunk[0];
    };
    metric_chunk_rows = chunk_rows(step);
    eval_chunk_rows = chunk_rows(eval_step);
    tensor_chunk_rows = tensors.empty() ? 1 : chunk_rows(tensors.front());
  }

  void close() {
    if (!write_failure) flush();
    step.close();
    eval_step.close();
    eval_loss.close();
    for (Dataset& d : metrics) d.close();
    for (Dataset& d : tensors) d.close();
    if (final_params) final_params->close();
    file.close();  // leaves SWMR-write mode and clears the superblock's "open for writing" flags
  }
};

RunRecorder::RunRecorder(std::unique_ptr<State> state) : state_(std::move(state)) {}
RunRecorder::RunRecorder(RunRecorder&&) noexcept = default;

RunRecorder& RunRecorder::operator=(RunRecorder&& other) noexcept {
  if (this != &other) {
    close_quietly();
    state_ = std::move(other.state_);
  }
  return *this;
}

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
  state->file = File::create(path);
  state->create_objects();
  state->read_chunk_rows();
  state->file.flush();
  // Every attribute and dataset exists now; SWMR-write forbids creating more.
  state->file.start_swmr_write();
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
  // A resumed run may change steps and log.* (train/checkpoint.hpp): the file records what ran.
  state->file.write_string_attribute("config", spec.config_json);
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
  if (metric >= s.spec.metric_names.size()) bad_argument(s.path, "amend_last_step: no metric " + std::to_string(metric));
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

RunFileSummary read_run_summary(const std::filesystem::path& path) {
  const auto lock = lock_hdf5();
  const File file = File::open(path, Access::read);
  check_run_file(file);
  RunFileSummary summary;
  summary.config_json = file.read_string_attribute("config");
  summary.status = file.read_string_attribute("status");
  summary.error = file.read_string_attribute("error");
  summary.steps_completed = static_cast<long>(file.read_int_attribute("steps_completed"));
  return summary;
}

}  // namespace scape::experiments
