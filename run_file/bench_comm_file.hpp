// The file `scape bench-comm` writes and `scape predict --calibrate` reads: one row per
// collective and payload size, its columns as HDF5 datasets, marked by the "format" attribute
// (docs/PREDICTING.md, "Calibration"). The writer and the reader share these names.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace scape::run_file {

// The "format" attribute of a bench-comm file.
inline constexpr const char* kBenchCommFormat = "scape-bench-comm-1";

// One timed collective; `kind` is the collective's name (all_reduce, reduce_scatter, all_gather,
// all_to_all) as the ledger writes it; `regime` "busy" for calls timed back to back, "idle" for
// calls each timed after an idle gap (bench-comm --idle-gap-ms). Files without /regime are busy.
struct BenchCommRow {
  std::string collective;
  std::string kind;
  std::string regime = "busy";
  double workers = 0, payload_bytes = 0, latency_steps = 0, bytes_sent_per_worker = 0, time_s = 0, algbw_GBps = 0,
         busbw_GBps = 0;
};

// Creates `out` (failing if it cannot) with the rows, the format and the backend's name.
void write_bench_comm_file(const std::filesystem::path& out, const std::string& backend,
                           const std::vector<BenchCommRow>& rows);

}  // namespace scape::run_file
