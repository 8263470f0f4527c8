// A RunRecorder's state (its tables, buffered rows and guarded writes), shared by recorder.cpp and recorder_state.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"

namespace scape::run_file {

inline constexpr long kNoStep = -1;  // steps are non-negative
// Reserved beyond the new chunks before each flush: a global-heap collection for the rewritten
// string attributes and object-header updates, plus per growing dataset its chunk index's new
// blocks. Measured with HDF5 1.10.8: at most 15 KB over 36 datasets (their first chunks).
inline constexpr std::uint64_t kMetadataReserve = 16 * 1024;
inline constexpr std::uint64_t kIndexReservePerDataset = 1024;
// Kept free by every flush for the status and error attributes (a 4 KiB global-heap collection
// when they are rewritten): whatever stops the run, its status can still be recorded.
inline constexpr std::uint64_t kStatusReserve = 8 * 1024;

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

  void create_objects();
  // Opens the datasets of an existing file and checks them against the spec.
  void open_objects();
  // Drops every row with step > steps_completed (also rows of a flush a kill interrupted).
  void truncate_after(long steps_completed);
  void create_final_params();
  // Bytes a flush of the pending rows may add to the file: every chunk it starts, whole, and
  // room for the metadata that indexes them and for the rewritten attributes.
  std::uint64_t bytes_to_flush() const;
  std::string pending_what() const;
  // Stops the writer for good: later flushes throw the first failure without touching the file.
  [[noreturn]] void stop(const std::string& what, const std::string& reason);

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
  void flush();
  void write_status(std::string_view status, std::string_view error);
  void write_pending();
  // The chunk rows of the growing tables, for bytes_to_flush (created or reopened files alike).
  void read_chunk_rows();
  void close();
};

}  // namespace scape::run_file
