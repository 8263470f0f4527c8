// scape repair: makes a killed run's file open plainly (h5py.File(p, "r"), h5dump) and says so
// in its status. Why this exists: an SWMR writer keeps the superblock's "open for writing"
// flags set for its whole life, and HDF5 1.10 refuses every ordinary open while they are set;
// a killed writer never clears them. Opening with the library's clear-status-flags property
// (what `h5clear -s` does) and closing cleanly rewrites the superblock without them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "run_file/step_rows.hpp"
#include "run_file/table_checksums.hpp"

namespace scape::run_file {
namespace {

// Rows of a step table with step <= limit.
hsize_t kept_rows(const Dataset& steps, long limit) {
  return rows_up_to(read_steps(steps), limit, steps);
}

// The fewest rows any table of `group` (but `keep`) holds, capped at `rows`.
hsize_t rows_in_every_table(const File& file, const std::string& group, hsize_t rows, const std::string& keep) {
  if (!file.has_link(group)) return rows;
  for (const std::string& name : file.child_names(group)) {
    if (name == keep) continue;
    const std::vector<hsize_t> dims = file.open_dataset(group + "/" + name).dims();
    if (dims.empty()) throw_invalid_file(file.file_path(), in_quotes(group + "/" + name) + " has no rows");
    rows = std::min(rows, dims[0]);
  }
  return rows;
}

// Cuts every table of `group` (but `keep`) back to `rows` rows and reads it whole, which checks
// that every chunk the flushed steps need is on disk.
void trim_group(const File& file, const std::string& group, hsize_t rows, const std::string& keep,
                std::vector<std::string>& trimmed) {
  if (!file.has_link(group)) return;
  for (const std::string& name : file.child_names(group)) {
    if (name == keep) continue;
    const Dataset d = file.open_dataset(group + "/" + name);
    std::vector<hsize_t> dims = d.dims();
    std::error_code ec;
    const auto file_bytes = std::filesystem::file_size(file.file_path(), ec);
    dims[0] = std::min(dims[0], rows);
    double values = 1;  // in double: a corrupt extent's product may not fit 64 bits
    for (hsize_t x : dims) values *= static_cast<double>(x);
    if (!ec && values > static_cast<double>(file_bytes) / sizeof(double))
      throw_invalid_file(file.file_path(), in_quotes(d.name()) + " claims more values than the file holds");
    if (d.dims()[0] > rows) {
      d.set_extent(dims);
      trimmed.push_back(d.name());
    }
    (void)d.read_all<double>();
  }
}

}  // namespace

bool opens_plainly(const std::filesystem::path& path) {
  const auto lock = lock_hdf5();
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  H5Eclear2(H5E_DEFAULT);
  if (id < 0) return false;
  H5Fclose(id);
  return true;
}

namespace {

// The repair itself, on `copy` (a copy of the run file `summary` describes).
void repair_copy(const std::filesystem::path& copy, const RunFileSummary& summary, RepairReport& report) {
  File file = File::open(copy, Access::recover);
  // Rows past steps_completed belong to a flush the kill interrupted: they are dropped, as
  // --resume drops them.
  const Dataset step_table = file.open_dataset("metrics/step");
  const hsize_t claimed = kept_rows(step_table, summary.steps_completed);
  // A file closed with checksums must still hold the values it was closed with.
  verify_table_checksums(file);
  // A writer older than the flush ordering of recorder_state.cpp could be killed with a table shorter
  // than steps_completed claims: the steps every table holds are kept, and the rest is reported.
  const hsize_t rows =
      rows_in_every_table(file, "tensors", rows_in_every_table(file, "metrics", claimed, "step"), "names");
  if (rows < claimed) {
    report.steps_completed = rows == 0 ? 0 : static_cast<long>(read_steps(step_table)[rows - 1]);
    file.write_int_attribute("steps_completed", report.steps_completed);
  }
  trim_group(file, "metrics", rows, "", report.trimmed);
  trim_group(file, "tensors", rows, "names", report.trimmed);
  if (file.has_link("eval/step")) {
    const hsize_t evals = kept_rows(file.open_dataset("eval/step"), report.steps_completed);
    trim_group(file, "eval", rows_in_every_table(file, "eval", evals, "step"), "", report.trimmed);
  }
  report.status_after = summary.status;
  if (summary.status == "running") {
    report.status_after = "killed";
    file.write_string_attribute("status", "killed");
    std::string error = "the run stopped after step " + std::to_string(summary.steps_completed) +
                        " without closing its file (killed or crashed); repaired by scape repair";
    if (report.steps_completed < summary.steps_completed)
      error += "; its tables held the steps up to " + std::to_string(report.steps_completed) + " only";
    file.write_string_attribute("error", error);
  }
  file.write_string_attribute("checksums", table_checksums(file).dump());
  file.flush();
  file.close();
}

// Writes `path`'s data to the disk (fsync), so that the rename after it never publishes a file
// whose bytes are still only in the cache.
void sync_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    throw std::system_error(error, std::generic_category(), path.string() + ": cannot sync the repaired copy");
  }
  ::close(fd);
}

}  // namespace

// The repair works on a copy beside the file, which replaces it (rename) only once it is
// repaired, read back whole and opens plainly: a repair that fails anywhere leaves the file as it
// was, byte for byte. A file with nothing to repair is left as it is.
RepairReport repair_run_file(const std::filesystem::path& path) {
  const auto lock = lock_hdf5();
  RepairReport report;
  const RunFileSummary summary = read_run_summary(path);  // also refuses files that are not run files
  report.was_open_for_writing = !opens_plainly(path);
  report.status_before = summary.status;
  report.steps_completed = report.steps_completed_before = summary.steps_completed;
  std::filesystem::path copy = path;
  copy += ".repair.tmp";
  std::filesystem::copy_file(path, copy, std::filesystem::copy_options::overwrite_existing);
  try {
    try {
      repair_copy(copy, summary, report);
      if (!opens_plainly(copy)) throw_invalid_file(copy.string(), "still marked open for writing after the repair");
      (void)read_run_summary(copy);
    } catch (const H5Error& e) {
      // The messages name the copy; the user knows the file.
      std::string message = e.what();
      for (std::size_t at; (at = message.find(copy.string())) != std::string::npos;)
        message.replace(at, copy.string().size(), path.string());
      throw H5Error(message);
    }
    const bool changed = report.was_open_for_writing || !report.trimmed.empty() ||
                         report.status_after != report.status_before ||
                         report.steps_completed != report.steps_completed_before;
    if (changed) {
      sync_file(copy);
      std::filesystem::rename(copy, path);
    } else {
      std::filesystem::remove(copy);
    }
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(copy, ec);
    throw;
  }
  return report;
}

}  // namespace scape::run_file
