// What the runs of a folder mean on a cluster (`scape predict CONFIG --from-runs DIR`): each
// completed run of the config's optimizer type gives its sparsity to the prediction, and the
// table sets the quality and bytes measured here beside the step time and speedup predicted
// there, with the config's overlap and with bucketed overlap switched the other way.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "predict/prediction.hpp"

namespace scape::predict {

// A completed run file of the folder, as the table uses it.
struct MeasuredRun {
  std::filesystem::path file;
  nlohmann::json config;  // the resolved config the run recorded
  double final_val_loss = 0;  // NaN without validation
  double bytes_per_step = 0;  // mean bytes sent per worker per step
};

// Every completed run file directly in `dir`, sorted by name. Throws ConfigError when the
// folder does not exist.
std::vector<MeasuredRun> read_completed_runs(const std::filesystem::path& dir);

// One line of the table: a sparse run, the dense run of the same problem (nullptr when the
// folder has none) and the prediction at the config's largest worker count.
struct AtScaleRow {
  const MeasuredRun* run = nullptr;
  const MeasuredRun* dense = nullptr;
  bool overlap = true;  // the config's overlap; false: grad_reduce and param_gather off
  Prediction prediction;
  const PredictionRow& at_scale() const { return prediction.rows.back(); }
};

// Throws ConfigError when no run in `runs` has the config's optimizer type. Each run gives a row
// with the config's overlap and, unless `config_overlap_only`, one with the overlap switched.
std::vector<AtScaleRow> predict_from_runs(const std::filesystem::path& config_file,
                                          const std::vector<std::string>& sets, const std::vector<MeasuredRun>& runs,
                                          bool config_overlap_only = false);
void print_at_scale(std::ostream& out, const std::vector<AtScaleRow>& rows);

}  // namespace scape::predict
