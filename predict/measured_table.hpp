// Published measurements as data (docs/PREDICTING.md, "Measured tables"): step-time tables
// (model,method,gpus,step_ms) and peak-memory tables (model,method,peak_MB) in CSV, read with
// an error naming the file, the row and the column for every bad cell.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace scape::predict {

// The artifact's timing setups and the rows of its tables, in the tables' order.
inline constexpr std::string_view kTableModels[] = {"llama-500m", "llama-1.3b", "llama-1.8b"};
inline constexpr std::string_view kStepMethods[] = {"adams",
                                                    "adams_do",
                                                    "scape_0.1",
                                                    "scape_0.1_do",
                                                    "scape_0.1_do_offload",
                                                    "scape_0.01",
                                                    "scape_0.01_do",
                                                    "scape_0.01_do_offload"};
inline constexpr std::string_view kMemoryMethods[] = {"adams",         "adams_do", "scape",
                                                      "scape_offload", "scape_do", "scape_do_offload"};

struct MeasuredRow {
  std::string model, method;
  int gpus = 0;      // 0 for a memory row
  double value = 0;  // step_ms, or peak_MB
  int line = 0;      // in the file, counting the header as line 1
};

struct MeasuredTable {
  std::filesystem::path file;
  bool memory = false;  // peak_MB rows (else step_ms rows)
  std::vector<MeasuredRow> rows;
};

// Throws config::ConfigError naming the file (and the row and column) for a missing or
// unreadable file, a header that is neither format, a missing, negative, zero, non-numeric or
// non-finite cell, an unknown model or method, a non-integer or non-positive gpus, and a row
// that repeats an earlier (model, method, gpus).
MeasuredTable read_measured_table(const std::filesystem::path& file);

}  // namespace scape::predict
