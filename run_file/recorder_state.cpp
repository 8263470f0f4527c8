// How a RunRecorder creates or reopens the tables of its run file and flushes its rows into them.
#include "run_file/recorder_state.hpp"

#include <algorithm>
#include <limits>

#include "run_file/run_summary.hpp"
#include "run_file/step_rows.hpp"
#include "run_file/table_checksums.hpp"

namespace scape::run_file {

namespace {

constexpr hsize_t kMetricChunkRows = 512;
constexpr hsize_t kTensorChunkValues = 8192;      // 64 KiB of float64 per /tensors chunk
constexpr hsize_t kParamChunkValues = 1u << 20;   // 4 MiB of float32 per /final/params chunk

// Attributes are created before SWMR-write mode starts (it forbids creating them).
void describe(const Dataset& dataset, const std::vector<MetricDescription>& descriptions, std::size_t i) {
  if (descriptions.empty()) return;
  dataset.write_string_attribute("unit", descriptions[i].unit);
  dataset.write_string_attribute("combine", descriptions[i].combine);
  dataset.write_string_attribute("doc", descriptions[i].doc);
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

}  // namespace

void RunRecorder::State::create_objects() {
  file.write_string_attribute("config", spec.config_json);
  file.write_string_attribute("status", "running");
  file.write_int_attribute("steps_completed", 0);
  file.write_string_attribute("error", "");
  file.write_string_attribute("scape_version", spec.scape_version);
  file.write_string_attribute("git_sha", spec.git_sha);
  file.write_int_attribute("layout_version", kRunLayoutVersion);
  if (!spec.optimizer_keys_json.empty()) file.write_string_attribute("optimizer_keys", spec.optimizer_keys_json);
  file.write_string_attribute("checksums", "");  // written at close (SWMR-write cannot create it then)

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
  const hsize_t tensor_rows =
      std::clamp<hsize_t>(kTensorChunkValues / std::max<hsize_t>(tensor_count, 1), 1, kMetricChunkRows);
  for (std::size_t k = 0; k < spec.tensor_metric_names.size(); ++k) {
    tensors.push_back(file.create_dataset("tensors/" + spec.tensor_metric_names[k], H5T_IEEE_F64LE,
                                          rows_shape({tensor_count}, tensor_rows)));
    describe(tensors.back(), spec.tensor_metric_descriptions, k);
  }

  create_final_params();
}

void RunRecorder::State::create_final_params() {
  if (spec.final_params_size == 0) return;
  const hsize_t n = spec.final_params_size;
  // Chunked so that nothing is allocated until written; NaN marks "never written".
  final_params = file.create_dataset(
      "final/params", H5T_IEEE_F32LE,
      DatasetShape{{n}, {}, {std::min(n, kParamChunkValues)}, std::numeric_limits<double>::quiet_NaN()});
}

void RunRecorder::State::open_objects() {
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
      throw_invalid_file(file.file_path(),
                         "'/tensors/" + name + "' must be [steps, " + std::to_string(spec.tensor_names.size()) + "]");
  }
  // The parameters the stopped run saved when it stopped are not this run's end (a resumed run
  // that diverges saves none), and log.save_params may change on resume: they go, and come
  // back unwritten (NaN) when this run saves its own.
  if (file.has_link("final/params")) file.remove_link("final/params");
  create_final_params();
}

void RunRecorder::State::truncate_after(long steps_completed) {
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

std::uint64_t RunRecorder::State::bytes_to_flush() const {
  const auto new_chunks = [](hsize_t before, hsize_t added, hsize_t chunk_rows) {
    const auto chunks = [&](hsize_t r) { return (r + chunk_rows - 1) / chunk_rows; };
    return chunks(before + added) - chunks(before);
  };
  const hsize_t added = pending_steps.size(), evals = pending_eval_steps.size();
  std::uint64_t bytes =
      kMetadataReserve + kStatusReserve + kIndexReservePerDataset * (metrics.size() + tensors.size() + 3);
  bytes += new_chunks(rows, added, metric_chunk_rows) * metric_chunk_rows * 8 * (metrics.size() + 1);
  bytes +=
      new_chunks(rows, added, tensor_chunk_rows) * tensor_chunk_rows * 8 * spec.tensor_names.size() * tensors.size();
  bytes += new_chunks(eval_rows, evals, eval_chunk_rows) * eval_chunk_rows * 8 * 2;
  return bytes;
}

std::string RunRecorder::State::pending_what() const {
  if (pending_steps.empty()) return "the evaluations";
  return "steps " + std::to_string(pending_steps.front()) + ".." + std::to_string(pending_steps.back());
}

void RunRecorder::State::stop(const std::string& what, const std::string& reason) {
  if (!write_failure) {
    write_failure = "run file " + in_quotes(path.string()) + ": cannot write " + what + " (" + reason +
                    "); the steps up to " + std::to_string(flushed_step) + " are kept";
  }
  throw H5Error(*write_failure);
}

void RunRecorder::State::flush() {
  const auto lock = lock_hdf5();
  if (write_failure) throw H5Error(*write_failure);
  guarded_write(pending_what(), bytes_to_flush(), [&] { write_pending(); });
}

void RunRecorder::State::write_status(std::string_view status, std::string_view error) {
  guarded_write("the status " + in_quotes(status), kStatusReserve, [&] {
    file.write_string_attribute("status", status);
    file.write_string_attribute("error", error);
  });
}

void RunRecorder::State::write_pending() {
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

void RunRecorder::State::read_chunk_rows() {
  const auto chunk_rows = [&](const Dataset& d) {
    const std::vector<hsize_t> chunk = d.chunk_dims();
    if (chunk.empty() || chunk[0] == 0)
      throw_invalid_file(path.string(), in_quotes(d.name()) + " cannot grow (not chunked)");
    return chunk[0];
  };
  metric_chunk_rows = chunk_rows(step);
  eval_chunk_rows = chunk_rows(eval_step);
  tensor_chunk_rows = tensors.empty() ? 1 : chunk_rows(tensors.front());
}

void RunRecorder::State::close() {
  if (!write_failure) {
    flush();
    // Every row is in the file: what a reader checks the tables against from now on. Where
    // there is no room left for them the file closes without (as one written before them).
    try {
      guarded_write("the checksums", kStatusReserve,
                    [&] { file.write_string_attribute("checksums", table_checksums(file).dump()); });
    } catch (const H5Error&) {
    }
  }
  step.close();
  eval_step.close();
  eval_loss.close();
  for (Dataset& d : metrics) d.close();
  for (Dataset& d : tensors) d.close();
  if (final_params) final_params->close();
  file.close();  // leaves SWMR-write mode and clears the superblock's "open for writing" flags
}

}  // namespace scape::run_file
