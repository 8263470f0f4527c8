// Test helper for the calibration tests (tests/test_predict_calibration.cpp,
// test_predict_calibration_hierarchy.cpp): synthetic measurements made with known link,
// compute and optimizer parameters, written as the run files and bench-comm files that
// `scape predict --calibrate` reads.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "config/compute_model.hpp"
#include "config/config.hpp"
#include "config/model_shapes.hpp"
#include "optimizers/volume.hpp"
#include "predict/calibration.hpp"
#include "predict/measured_runs.hpp"
#include "predict/predict_config.hpp"
#include "run_file/bench_comm_file.hpp"
#include "run_file/hdf5.hpp"
#include "test_support.hpp"
#include "train/gradient_source.hpp"

namespace scape::testing::calibration {

namespace fs = std::filesystem;
namespace cfg = scape::config;
using namespace scape;
using namespace scape::predict;
using namespace scape::presets;
using nlohmann::json;

inline constexpr CollectiveKind kKinds[] = {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                                            CollectiveKind::all_gather};

// The parameters the synthetic measurements are made with, one link per kind.
struct Truth {
  double flops = 2.5e10;
  double optimizer_Bps = 3.1e9;
  NetworkModel link[3] = {{40e-6, 1.7e9}, {25e-6, 2.3e9}, {12e-6, 4.1e9}};
  NetworkModel intra{9e-6, 6.2e9};  // among a node's ranks (hierarchical runs' node collectives)
};

// A deterministic multiplicative noise of at most 0.4%, mean about zero.
inline double noise(int i) { return 1.0 + 0.004 * std::sin(1.7 * i + 0.3); }

inline std::vector<CollectiveSample> bench_samples(const Truth& t, bool noisy) {
  std::vector<CollectiveSample> out;
  int i = 0;
  for (const auto kind : kKinds) {
    for (const int w : {2, 3, 4, 8}) {
      for (double bytes = 1024; bytes <= 64e6; bytes *= 4) {
        CollectiveSample s{kind, w, static_cast<double>(ring_latency_steps(kind, w)),
                           ring_bytes_sent_per_worker(kind, w, bytes), 0};
        s.time_s = alpha_beta_time(kind, w, bytes, t.link[static_cast<int>(kind)]) * (noisy ? noise(i++) : 1.0);
        out.push_back(s);
      }
    }
  }
  return out;
}

inline json gpt_run_config(const char* type, int workers, double sparsity) {
  json j = json::parse(R"({
    "name": "synthetic-measured", "seed": 1, "steps": 12,
    "model": {"type": "gpt", "n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 32, "vocab_size": 64},
    "data": {"type": "synthetic", "batch_size": 2, "tokens": 20000},
    "network": {"preset": "loopback"}
  })");
  j["workers"] = workers;
  j["optimizer"] = {{"type", type}, {"sharded", true}};
  if (std::string(type) == "scape") j["optimizer"]["sparsity"] = sparsity;
  return cfg::parse_experiment(j, ".").to_json();
}

inline Calibration truth_calibration(const Truth& t) {
  Calibration c;
  c.achieved_flops = t.flops;
  c.optimizer_Bps = t.optimizer_Bps;
  c.combined = LinkFit{t.link[0].alpha_s, t.link[0].bandwidth_Bps, 0};
  for (const auto kind : kKinds) {
    const auto& l = t.link[static_cast<int>(kind)];
    c.by_kind[static_cast<std::size_t>(kind)] = LinkFit{l.alpha_s, l.bandwidth_Bps, 0};
  }
  c.intra = LinkFit{t.intra.alpha_s, t.intra.bandwidth_Bps, 0};
  return c;
}

inline void write_column(const scape::run_file::File& f, const std::string& name, const std::vector<double>& v) {
  const hsize_t n = v.size();
  f.create_dataset(name, H5T_IEEE_F64LE, scape::run_file::DatasetShape{{n}, {}, {}, {}}).write<double>({0}, {n}, v);
}

// A run file whose every measured time is the step model's with `t` (the optimizer phase with
// the harness's metric passes at the same throughput), at a CPU share of 1 (compute_time =
// compute_wall_time); `skip` leaves out one metric.
// A slept run's compute holds no core: its thread CPU time is about zero.
inline fs::path write_measured_run(const fs::path& dir, const std::string& name, const json& config, const Truth& t,
                                   const std::string& skip = "") {
  const auto c = cfg::parse_experiment(config, ".");
  const bool slept = c.compute.type == "sleep";
  StepInputs in;
  double tokens = 1;
  if (c.model.type == "gpt") {
    const ModelSpec spec = scape::config::predictor_model_spec(c.model);
    const double fpt = training_flops_per_token(spec, c.model.block_size, AttentionFlops::causal);
    in = calibrated_inputs(truth_calibration(t), c.optimizer, parameter_count(spec), fpt, 1.0);
    in.layout = scape::config::language_model_spec(c.model).layout();  // SCAPE's per-tensor k, as the reader counts
    tokens = static_cast<double>(c.data.batch_size) * c.model.block_size;
  } else {
    in = calibrated_inputs(truth_calibration(t), c.optimizer, static_cast<std::uint64_t>(c.model.size), 0, 1.0);
    ParamLayout theta;  // the quadratic's one tensor, as the reader lays it out
    theta.add("theta", {static_cast<std::size_t>(c.model.size)}, true);
    in.layout = theta;
  }
  if (slept) in.fixed_compute_s = c.compute.seconds;
  const StepPrediction p = predict_step(in, c.workers, tokens);
  const std::size_t steps = static_cast<std::size_t>(c.steps);
  std::vector<std::pair<std::string, double>> columns = {
      {"compute_wall_time", p.compute_s()},
      {"compute_time", slept ? 1e-6 : p.compute_s()},
      {"optimizer_wall_time",
       p.optimizer_s + p.exposed_comm_s +
           harness_metric_bytes(
               c.optimizer, in.n_params,
               method_share(c.optimizer, in.layout, in.n_params, c.workers, c.topology.ranks_per_node).n) /
               t.optimizer_Bps},
      {"mask_wait_exposed", 0.0}};
  for (const auto& col : p.collectives) {
    const std::string key = col.record.overlapped ? "async_all_gather" : col.record.purpose;
    bool found = false;
    for (auto& [n, v] : columns) {
      if (n == "comm_time_measured_" + key) v += col.time_s, found = true;
    }
    if (!found) columns.emplace_back("comm_time_measured_" + key, col.time_s);
  }
  const fs::path file = dir / (name + ".h5");
  scape::run_file::File f = scape::run_file::File::create(file);
  f.write_string_attribute("config", config.dump());
  std::vector<double> step(steps);
  for (std::size_t i = 0; i < steps; ++i) step[i] = static_cast<double>(i + 1);
  write_column(f, "metrics/step", step);
  for (const auto& [n, v] : columns) {
    if (n != skip) write_column(f, "metrics/" + n, std::vector<double>(steps, v));
  }
  f.close();
  return file;
}

// The run rows of a calibration table, each checked to be predicted exactly: no error other
// than +0.0% or -0.0%, fitted or held out.
inline int exactly_predicted_rows(const std::string& text) {
  std::istringstream lines(text);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find(".h5 | fitted") == std::string::npos && line.find(".h5 | held out") == std::string::npos) continue;
    ++rows;
    CAPTURE(line);
    CHECK((line.find("| +0.0% |") != std::string::npos || line.find("| -0.0% |") != std::string::npos));
  }
  return rows;
}

// A bench-comm file of `samples` in the format `scape bench-comm` writes.
inline fs::path write_bench_comm(const fs::path& file, const std::vector<CollectiveSample>& samples) {
  scape::run_file::File f = scape::run_file::File::create(file);
  f.write_string_attribute("format", scape::run_file::kBenchCommFormat);
  f.write_string_attribute("backend", "synthetic");
  std::vector<std::string> kinds;
  std::vector<double> workers, steps, sent, time;
  for (const auto& s : samples) {
    kinds.push_back(to_string(s.kind));
    workers.push_back(s.workers);
    steps.push_back(s.latency_steps);
    sent.push_back(s.bytes_sent);
    time.push_back(s.time_s);
  }
  f.create_string_dataset("collective", kinds);
  f.create_string_dataset("kind", kinds);
  write_column(f, "workers", workers);
  write_column(f, "latency_steps", steps);
  write_column(f, "bytes_sent_per_worker", sent);
  write_column(f, "time_s", time);
  f.close();
  return file;
}

// The netlab's strong-scaling runs (scripts/netlab strong-scaling): a quadratic of n parameters
// whose ranks sleep `seconds` a step for a GPU's forward and backward.
inline json slept_run_config(const char* type, int workers, double sparsity, double seconds) {
  json j = {{"name", "slept"},
            {"seed", 1},
            {"steps", 12},
            {"workers", workers},
            {"model", {{"type", "quadratic"}, {"size", 200000}}},
            {"optimizer", {{"type", type}, {"sharded", std::string(type) != "scape"}}},
            {"compute", {{"type", "sleep"}, {"seconds", seconds}}}};
  if (std::string(type) == "scape") j["optimizer"]["sparsity"] = sparsity;
  return cfg::parse_experiment(j, ".").to_json();
}

}  // namespace scape::testing::calibration
