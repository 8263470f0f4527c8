// Calibration (`scape predict --calibrate`): the fits recover known parameters from synthetic
// measurements, run files written with the step model's own times round-trip through the file
// reader and the hardware description to the same parameters and a zero error, the hardware
// description is read back by prediction configs, and bad run files exit 2 naming the file and
// the missing dataset. Hierarchical runs (optimizer.hierarchy = "node"): the intra-node link
// from their node collectives, the port's from their rails', and their prediction by hand.
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

namespace fs = std::filesystem;
namespace cfg = scape::config;
using namespace scape;
using namespace scape::predict;
using namespace scape::presets;
using nlohmann::json;

namespace {

constexpr CollectiveKind kKinds[] = {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                                     CollectiveKind::all_gather};

// The parameters the synthetic measurements are made with, one link per kind.
struct Truth {
  double flops = 2.5e10;
  double optimizer_Bps = 3.1e9;
  NetworkModel link[3] = {{40e-6, 1.7e9}, {25e-6, 2.3e9}, {12e-6, 4.1e9}};
  NetworkModel intra{9e-6, 6.2e9};  // among a node's ranks (hierarchical runs' node collectives)
};

// A deterministic multiplicative noise of at most 0.4%, mean about zero.
double noise(int i) { return 1.0 + 0.004 * std::sin(1.7 * i + 0.3); }

std::vector<CollectiveSample> bench_samples(const Truth& t, bool noisy) {
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

json gpt_run_config(const char* type, int workers, double sparsity) {
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

Calibration truth_calibration(const Truth& t) {
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

void write_column(const scape::run_file::File& f, const std::string& name, const std::vector<double>& v) {
  const hsize_t n = v.size();
  f.create_dataset(name, H5T_IEEE_F64LE, scape::run_file::DatasetShape{{n}, {}, {}, {}}).write<double>({0}, {n}, v);
}

// A run file whose every measured time is the step model's with `t` (the optimizer phase with
// the harness's metric passes at the same throughput), at a CPU share of 1 (compute_time =
// compute_wall_time); `skip` leaves out one metric.
// A slept run's compute holds no core: its thread CPU time is about zero.
fs::path write_measured_run(const fs::path& dir, const std::string& name, const json& config, const Truth& t,
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
int exactly_predicted_rows(const std::string& text) {
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

}  // namespace

TEST_CASE("fit_alpha_beta recovers the latency and bandwidth of every kind within 1% from noisy samples") {
  const Truth t;
  const auto samples = bench_samples(t, true);
  for (const auto kind : kKinds) {
    CAPTURE(to_string(kind));
    std::vector<CollectiveSample> mine;
    for (const auto& s : samples) {
      if (s.kind == kind) mine.push_back(s);
    }
    const LinkFit fit = fit_alpha_beta(mine);
    const auto& truth = t.link[static_cast<int>(kind)];
    CHECK(std::abs(fit.alpha_s / truth.alpha_s - 1) < 0.01);
    CHECK(std::abs(fit.bandwidth_Bps / truth.bandwidth_Bps - 1) < 0.01);
    CHECK(fit.samples == static_cast<int>(mine.size()));
  }
  // Exact samples give the exact parameters.
  std::vector<CollectiveSample> exact;
  for (const auto& s : bench_samples(t, false)) {
    if (s.kind == CollectiveKind::all_gather) exact.push_back(s);
  }
  const LinkFit fit = fit_alpha_beta(exact);
  CHECK(fit.alpha_s == doctest::Approx(12e-6).epsilon(1e-9));
  CHECK(fit.bandwidth_Bps == doctest::Approx(4.1e9).epsilon(1e-9));
}

TEST_CASE("fit_alpha_beta: one distinct point gives alpha 0; no sample or no bytes is an error") {
  const CollectiveSample s{CollectiveKind::all_reduce, 2, 2, 1e6, 1e-3};
  const std::vector<CollectiveSample> same = {s, s};
  const LinkFit fit = fit_alpha_beta(same);
  CHECK(fit.alpha_s == 0.0);
  CHECK(fit.bandwidth_Bps == doctest::Approx(1e9));
  CHECK_THROWS_AS(fit_alpha_beta({}), std::invalid_argument);
  const std::vector<CollectiveSample> no_bytes = {{CollectiveKind::all_reduce, 2, 2, 0, 1e-3}};
  CHECK_THROWS_AS(fit_alpha_beta(no_bytes), std::invalid_argument);
  // Times that fall with the bytes cannot be a link.
  const std::vector<CollectiveSample> falling = {{CollectiveKind::all_reduce, 2, 2, 1e3, 2e-3},
                                                 {CollectiveKind::all_reduce, 2, 2, 1e6, 1e-3}};
  CHECK_THROWS_AS(fit_alpha_beta(falling), std::invalid_argument);
}

TEST_CASE("calibrate: a kind whose times fall with the bytes keeps the combined link and is named in a warning") {
  const Truth t;
  std::vector<CollectiveSample> samples;
  for (const auto& s : bench_samples(t, false)) {
    if (s.kind != CollectiveKind::all_gather) samples.push_back(s);
  }
  // Latency-bound all-gathers on a noisy host: the larger message happened to be faster.
  samples.push_back({CollectiveKind::all_gather, 2, 1, 1024, 60e-6});
  samples.push_back({CollectiveKind::all_gather, 2, 1, 65536, 30e-6});
  const std::vector<RateSample> compute = {{1e12, 1.0}}, optimizer = {{1e9, 0.5}};
  const Calibration c = calibrate(compute, optimizer, samples);
  CHECK_FALSE(c.by_kind[static_cast<std::size_t>(CollectiveKind::all_gather)].has_value());
  const auto& rs = c.by_kind[static_cast<std::size_t>(CollectiveKind::reduce_scatter)];
  REQUIRE(rs.has_value());
  CHECK(rs->bandwidth_Bps == doctest::Approx(t.link[static_cast<int>(CollectiveKind::reduce_scatter)].bandwidth_Bps));
  REQUIRE(c.warnings.size() == 1);
  CHECK(c.warnings[0].find("all_gather") == 0);
  CHECK(c.warnings[0].find("do not grow with the bytes") != std::string::npos);
  CHECK(c.combined.bandwidth_Bps > 0);
  CHECK(hardware_json(c)["network"]["collectives"].contains("all_gather") == false);
}

TEST_CASE("fit_rate recovers a throughput within 1% from noisy samples") {
  std::vector<RateSample> samples;
  for (int i = 0; i < 12; ++i) {
    const double amount = 1e9 * (1 + i);
    samples.push_back(RateSample{amount, amount / 2.5e10 * noise(i)});
  }
  CHECK(std::abs(fit_rate(samples, "compute") / 2.5e10 - 1) < 0.01);
  CHECK_THROWS_AS(fit_rate(std::vector<RateSample>{{1e9, 0}}, "compute"), std::invalid_argument);
}

TEST_CASE("run files with the model's own times round-trip: parameters within 1%, every step error 0") {
  const Truth t;
  scape::testing::TempDir dir;
  std::vector<fs::path> fit;
  for (const int w : {2, 4}) {
    fit.push_back(write_measured_run(dir.path, "dense-" + std::to_string(w), gpt_run_config("adams", w, 0), t));
    fit.push_back(write_measured_run(dir.path, "scape-" + std::to_string(w), gpt_run_config("scape", w, 0.9), t));
  }
  const fs::path held = write_measured_run(dir.path, "scape99-3", gpt_run_config("scape", 3, 0.99), t);
  const fs::path out = dir.path / "hw.json";
  std::ostringstream table;
  calibrate_from_files(fit, {held}, out, table);
  const json hw = json::parse(std::ifstream(out));
  CHECK(hw.at("format") == kHardwareFormat);
  CHECK(hw.at("gpu").at("peak_TFLOPs").get<double>() == doctest::Approx(t.flops / 1e12).epsilon(0.01));
  CHECK(hw.at("gpu").at("mfu").get<double>() == 1.0);
  CHECK(hw.at("gpu").at("memory_bandwidth_TBps").get<double>() == doctest::Approx(t.optimizer_Bps / 1e12).epsilon(0.01));
  // The runs issue reduce-scatters and all-gathers (sharded), so those kinds get their links.
  for (const auto kind : {CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
    const auto& l = hw.at("network").at("collectives").at(to_string(kind));
    const auto& truth = t.link[static_cast<int>(kind)];
    CHECK(l.at("alpha_us").get<double>() == doctest::Approx(truth.alpha_s * 1e6).epsilon(0.01));
    CHECK(l.at("bandwidth_GBps").get<double>() == doctest::Approx(truth.bandwidth_Bps / 1e9).epsilon(0.01));
  }
  const std::string text = table.str();
  CAPTURE(text);
  CHECK(text.find("held out") != std::string::npos);
  CHECK(exactly_predicted_rows(text) == 5);

  // A prediction config reads the description: its figures, with the config's keys on top.
  const json config = {{"hardware", "hw.json"},
                       {"model", {{"preset", "gpt2-124m"}}},
                       {"batch", {{"global_sequences", 8}}},
                       {"gpu", {{"mfu", 0.5}}},
                       {"workers", {1, 2}}};
  std::ofstream(dir.path / "p.json") << config.dump();
  const PredictConfig p = load_predict_config(dir.path / "p.json", {});
  CHECK(p.gpu.peak_TFLOPs == hw.at("gpu").at("peak_TFLOPs").get<double>());
  CHECK(p.gpu.mfu == 0.5);
  CHECK(p.inter.alpha_us == hw.at("network").at("inter").at("alpha_us").get<double>());
  const auto& rs = p.collectives[static_cast<std::size_t>(CollectiveKind::reduce_scatter)];
  REQUIRE(rs.has_value());
  CHECK(rs->bandwidth_GBps == hw.at("network").at("collectives").at("reduce_scatter").at("bandwidth_GBps").get<double>());
  CHECK(p.topology().inter_for(CollectiveKind::reduce_scatter).bandwidth_Bps == doctest::Approx(rs->bandwidth_GBps * 1e9));

  // A link the config names replaces the description's: the preset's figures, not the fitted
  // ones merged under a preset name, and none of the per-kind fits made on the fitted link.
  json named = config;
  named["network"] = {{"inter", {{"preset", "eth_100g"}}}};
  std::ofstream(dir.path / "named.json") << named.dump();
  const PredictConfig q = load_predict_config(dir.path / "named.json", {});
  CHECK(q.inter.alpha_us == 10.0);
  CHECK(q.inter.bandwidth_GBps == 12.5);
  CHECK(q.gpu.peak_TFLOPs == hw.at("gpu").at("peak_TFLOPs").get<double>());
  CHECK_FALSE(q.collectives[static_cast<std::size_t>(CollectiveKind::reduce_scatter)].has_value());
}

TEST_CASE("bad measurement files: ConfigError naming the file and what is missing") {
  const Truth t;
  scape::testing::TempDir dir;
  const auto error_of = [](const fs::path& f) -> std::string {
    try {
      (void)read_run_measurement(f);
    } catch (const cfg::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const fs::path missing = write_measured_run(dir.path, "no-wall", gpt_run_config("adams", 2, 0), t, "compute_wall_time");
  CHECK(error_of(missing).find(missing.string()) != std::string::npos);
  CHECK(error_of(missing).find("missing dataset /metrics/compute_wall_time") != std::string::npos);
  const fs::path no_comm =
      write_measured_run(dir.path, "no-comm", gpt_run_config("adams", 2, 0), t, "comm_time_measured_grad_reduce_scatter");
  CHECK(error_of(no_comm).find("missing dataset /metrics/comm_time_measured_grad_reduce_scatter") != std::string::npos);
  CHECK(error_of(dir.path / "absent.h5").find("absent.h5") != std::string::npos);
  std::ofstream(dir.path / "text.h5") << "not hdf5";
  CHECK(error_of(dir.path / "text.h5").find("text.h5: cannot be read") != std::string::npos);
  // A run whose reduce-scatter ran in buckets beside the backward pass measured no link alone.
  json bucketed = gpt_run_config("adams", 2, 0);
  bucketed["optimizer"]["overlap_grad_reduce"] = true;
  const fs::path overlapped =
      write_measured_run(dir.path, "bucketed", cfg::parse_experiment(bucketed, ".").to_json(), t);
  CHECK(error_of(overlapped).find("bucketed.h5: optimizer.overlap_grad_reduce: its reduce-scatter runs in buckets") !=
        std::string::npos);
}

namespace {
// A bench-comm file of `samples` in the format `scape bench-comm` writes.
fs::path write_bench_comm(const fs::path& file, const std::vector<CollectiveSample>& samples) {
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
}  // namespace

TEST_CASE("--links-from-bench: the links from the bench-comm file alone, compute and the optimizer from the runs") {
  const Truth bench_truth;
  Truth run_truth;  // the runs' own collectives ran over a link 3x slower, with more latency
  for (auto& l : run_truth.link) l = NetworkModel{l.alpha_s * 2, l.bandwidth_Bps / 3};
  scape::testing::TempDir dir;
  const fs::path bench = write_bench_comm(dir.path / "bench.h5", bench_samples(bench_truth, false));
  const std::vector<fs::path> fit = {
      bench, write_measured_run(dir.path, "dense", gpt_run_config("adams", 2, 0), run_truth),
      write_measured_run(dir.path, "scape", gpt_run_config("scape", 2, 0.9), run_truth)};
  const fs::path held = write_measured_run(dir.path, "scape99", gpt_run_config("scape", 2, 0.99), run_truth);
  std::ostringstream table;
  calibrate_from_files(fit, {held}, dir.path / "hw.json", table, dir.path / "runs.csv", true);
  const json hw = json::parse(std::ifstream(dir.path / "hw.json"));
  CHECK(hw.at("gpu").at("peak_TFLOPs").get<double>() == doctest::Approx(run_truth.flops / 1e12).epsilon(0.01));
  CHECK(hw.at("gpu").at("memory_bandwidth_TBps").get<double>() ==
        doctest::Approx(run_truth.optimizer_Bps / 1e12).epsilon(0.01));
  for (const auto kind : kKinds) {  // the bench's links, not the runs'
    const auto& l = hw.at("network").at("collectives").at(to_string(kind));
    const auto& truth = bench_truth.link[static_cast<int>(kind)];
    CHECK(l.at("alpha_us").get<double>() == doctest::Approx(truth.alpha_s * 1e6).epsilon(0.01));
    CHECK(l.at("bandwidth_GBps").get<double>() == doctest::Approx(truth.bandwidth_Bps / 1e9).epsilon(0.01));
  }
  // The CSV: one row a run, each predicted over the bench's faster link: the step a run of the
  // same config measures when its own collectives ran over that link.
  std::ifstream csv(dir.path / "runs.csv");
  std::string header, row;
  std::getline(csv, header);
  CHECK(header == "file,role,workers,optimizer,cpu_share,wall_step_ms,measured_step_ms,predicted_step_ms,error");
  std::vector<std::string> rows;
  while (std::getline(csv, row)) rows.push_back(row);
  REQUIRE(rows.size() == 3);
  const std::string& last = rows.back();
  CAPTURE(last);
  CHECK(last.find("scape99.h5,held_out,2,scape,1,") != std::string::npos);
  const double over_bench_link =
      read_run_measurement(write_measured_run(dir.path, "same", gpt_run_config("scape", 2, 0.99), bench_truth)).step_s();
  std::vector<double> fields;
  for (std::size_t at = last.find(",scape,") + 7; at != std::string::npos + 1; at = last.find(',', at) + 1) {
    fields.push_back(std::stod(last.substr(at)));
  }
  REQUIRE(fields.size() == 5);  // cpu_share, wall, measured, predicted (ms), error
  CHECK(fields[3] == doctest::Approx(over_bench_link * 1e3).epsilon(1e-4));
  CHECK(fields[2] > fields[3]);  // measured over the slower link
  // Without a bench-comm file there is nothing to fit the links to.
  std::ostringstream ignored;
  CHECK_THROWS_WITH_AS(calibrate_from_files({fit[1], fit[2]}, {}, dir.path / "x.json", ignored, {}, true),
                       doctest::Contains("no bench-comm file"), cfg::ConfigError);
}

namespace {
// The netlab's strong-scaling runs (scripts/netlab strong-scaling): a quadratic of n parameters
// whose ranks sleep `seconds` a step for a GPU's forward and backward.
json slept_run_config(const char* type, int workers, double sparsity, double seconds) {
  json j = {{"name", "slept"}, {"seed", 1}, {"steps", 12}, {"workers", workers},
            {"model", {{"type", "quadratic"}, {"size", 200000}}},
            {"optimizer", {{"type", type}, {"sharded", std::string(type) != "scape"}}},
            {"compute", {{"type", "sleep"}, {"seconds", seconds}}}};
  if (std::string(type) == "scape") j["optimizer"]["sparsity"] = sparsity;
  return cfg::parse_experiment(j, ".").to_json();
}
}  // namespace

TEST_CASE("runs whose compute slept: compute given, not fitted; the optimizer and links round-trip exactly") {
  const Truth t;
  scape::testing::TempDir dir;
  const fs::path bench = write_bench_comm(dir.path / "bench.h5", bench_samples(t, false));
  const std::vector<fs::path> fit = {
      bench, write_measured_run(dir.path, "dense-n2", slept_run_config("adams", 2, 0, 0.03), t),
      write_measured_run(dir.path, "scape90-n2", slept_run_config("scape", 2, 0.9, 0.03), t)};
  const std::vector<fs::path> held = {
      write_measured_run(dir.path, "scape99-n2", slept_run_config("scape", 2, 0.99, 0.03), t),
      write_measured_run(dir.path, "scape99-n8", slept_run_config("scape", 8, 0.99, 0.011), t)};
  const RunMeasurement m = read_run_measurement(held[1]);
  CHECK(m.slept_compute_s == 0.011);
  CHECK(m.cpu_share == 1.0);  // the sleep's near-zero CPU time is no oversubscription
  CHECK(m.n_params == 200000);
  std::ostringstream table;
  calibrate_from_files(fit, held, dir.path / "hw.json", table, {}, true);
  const std::string text = table.str();
  CAPTURE(text);
  CHECK(text.find("compute: not fitted (every fitted run's compute slept)") != std::string::npos);
  const json hw = json::parse(std::ifstream(dir.path / "hw.json"));
  CHECK_FALSE(hw.at("gpu").contains("peak_TFLOPs"));
  CHECK(hw.at("gpu").at("memory_bandwidth_TBps").get<double>() == doctest::Approx(t.optimizer_Bps / 1e12).epsilon(0.01));
  CHECK(exactly_predicted_rows(text) == 4);
  // A held-out run that measures its compute cannot be predicted from slept runs alone.
  const fs::path gpt = write_measured_run(dir.path, "gpt", gpt_run_config("adams", 2, 0), t);
  std::ostringstream ignored;
  CHECK_THROWS_WITH_AS(calibrate_from_files(fit, {gpt}, dir.path / "x.json", ignored, {}, true),
                       doctest::Contains("gpt.h5 measures its compute, but every fitted run's compute slept"),
                       cfg::ConfigError);
  // A quadratic whose compute is measured has no FLOPs to fit.
  json measured = slept_run_config("adams", 2, 0, 0.03);
  measured["compute"] = {{"type", "measured"}};
  const fs::path quadratic =
      write_measured_run(dir.path, "quadratic", cfg::parse_experiment(measured, ".").to_json(), t);
  CHECK_THROWS_WITH_AS((void)read_run_measurement(quadratic),
                       doctest::Contains("quadratic.h5: model.type quadratic: calibration fits compute per FLOP"),
                       cfg::ConfigError);
}

TEST_CASE("the optimizer kernels: each rank's own remainder where the run recorded it, else the remainder of the maxima") {
  const Truth t;
  scape::testing::TempDir dir;
  const fs::path file = write_measured_run(dir.path, "scape", gpt_run_config("scape", 2, 0.9), t);
  const RunMeasurement before = read_run_measurement(file);
  // Without the column: the optimizer phase less the blocking collectives and the mask wait.
  CHECK(before.optimizer_kernels_s == doctest::Approx(before.optimizer_s - before.blocking_comm_s - before.mask_wait_s));
  CHECK(before.optimizer_kernels_s > 0);
  {
    // Ranks out of balance: each rank's own kernels, 0.25 ms, are not what the maxima leave.
    scape::run_file::File f = scape::run_file::File::open(file, scape::run_file::Access::read_write);
    write_column(f, "metrics/optimizer_kernel_wall_time", std::vector<double>(12, 2.5e-4));
    f.close();
  }
  const RunMeasurement after = read_run_measurement(file);
  REQUIRE(std::abs(before.optimizer_kernels_s - 2.5e-4) > 1e-6);
  CHECK(after.optimizer_kernels_s == 2.5e-4);
  CHECK(after.optimizer_s == before.optimizer_s);
  CHECK(after.blocking_comm_s == before.blocking_comm_s);
}

// Hierarchical runs (optimizer.hierarchy = "node"): the node collectives fit the intra-node link,
// the rails' collectives the port (their bytes times the G rails that share it), and the step
// model's hierarchy path predicts them.
namespace {
// The netlab's hierarchy runs (docs/NETLAB.md, "Nodes of two ranks"): nodes of two ranks, the
// quadratic of `size` parameters cut into rows, a slept compute.
json node_run_config(const char* type, int nodes, bool hierarchical, int size, double sparsity = 0.99) {
  json j = slept_run_config(type, 2 * nodes, sparsity, 0.05);
  j["model"]["size"] = size;
  j["topology"] = {{"ranks_per_node", 2}};
  if (hierarchical) {
    j["optimizer"]["hierarchy"] = "node";
    j["optimizer"]["rail_split"] = "rows";
  }
  return cfg::parse_experiment(j, ".").to_json();
}
}  // namespace

TEST_CASE("calibrate: the intra-node link is fitted to its own samples alone, and only when given") {
  const Truth t;
  std::vector<CollectiveSample> intra;
  for (const int g : {2, 4}) {
    for (const auto kind : {CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
      for (const double bytes : {8e5, 2.4e6, 8e6}) {
        intra.push_back(CollectiveSample{kind, g, static_cast<double>(ring_latency_steps(kind, g)),
                                         ring_bytes_sent_per_worker(kind, g, bytes),
                                         alpha_beta_time(kind, g, bytes, t.intra)});
      }
    }
  }
  const std::vector<RateSample> compute = {{1e12, 1.0}}, optimizer = {{1e9, 0.5}};
  const auto bench = bench_samples(t, false);
  const Calibration with = calibrate(compute, optimizer, bench, intra);
  REQUIRE(with.intra.has_value());
  CHECK(with.intra->alpha_s == doctest::Approx(9e-6).epsilon(1e-9));
  CHECK(with.intra->bandwidth_Bps == doctest::Approx(6.2e9).epsilon(1e-9));
  CHECK(with.intra->samples == 12);
  const Calibration without = calibrate(compute, optimizer, bench);
  CHECK_FALSE(without.intra.has_value());
  // The inter links do not see the intra samples.
  CHECK(with.combined.alpha_s == without.combined.alpha_s);
  CHECK(with.combined.bandwidth_Bps == without.combined.bandwidth_Bps);
  const json hw = hardware_json(with);
  CHECK(hw.at("network").at("intra").at("alpha_us").get<double>() == doctest::Approx(9.0).epsilon(1e-9));
  CHECK(hw.at("network").at("intra").at("bandwidth_GBps").get<double>() == doctest::Approx(6.2).epsilon(1e-9));
  CHECK(hw.at("network").at("gpus_per_node") == 1);
  CHECK(hw.at("fit").at("intra_samples") == 12);
  CHECK_FALSE(hardware_json(without).at("network").contains("intra"));
  CHECK_FALSE(hardware_json(without).at("fit").contains("intra_samples"));
  // Node collectives whose times fall with the bytes cannot be a link.
  const std::vector<CollectiveSample> falling = {{CollectiveKind::reduce_scatter, 2, 1, 1e3, 2e-3},
                                                 {CollectiveKind::reduce_scatter, 2, 1, 1e6, 1e-3}};
  CHECK_THROWS_WITH_AS(calibrate(compute, optimizer, bench, falling), doctest::Contains("intra-node link: "),
                       std::invalid_argument);
}

TEST_CASE(
    "a hierarchical run from a known calibration: node collectives as rings on intra, the rail's on half a port") {
  Calibration c;
  c.optimizer_Bps = 3.1e9;
  c.combined = LinkFit{40e-6, 1.7e9, 0};
  c.intra = LinkFit{9e-6, 6.2e9, 0};
  const double n = 200000, part = n / 2;  // two rails of rows: half of theta each
  const auto config = cfg::parse_experiment(node_run_config("adams", 2, true, 200000), ".");
  REQUIRE(config.optimizer.sharded);
  StepInputs in = calibrated_inputs(c, config.optimizer, 200000, 0, 1.0);
  CHECK(in.topology.gpus_per_node == 2);
  CHECK(in.topology.nics_per_node == 1);
  ParamLayout theta;
  theta.add("theta", {200000}, true);
  in.layout = theta;
  in.fixed_compute_s = 0.05;
  const StepPrediction p = predict_step(in, 4, 1);
  std::map<std::string, double> time;
  for (const auto& col : p.collectives) time[col.record.purpose] += col.time_s;
  REQUIRE(time.size() == 4);
  // Inside the node, a ring of 2 over the fp32 gradient and parameters: one step, half of 4N.
  const double node_s = 9e-6 + 0.5 * 4 * n / 6.2e9;
  CHECK(time["node_grad_reduce_scatter"] == doctest::Approx(node_s).epsilon(1e-12));
  CHECK(time["node_param_all_gather"] == doctest::Approx(node_s).epsilon(1e-12));
  // Across, the rail's sharded AdamS among the 2 nodes on half the port (the other rail has the
  // other half): one step, half of the part's 4 n/2 bytes, each way of the ring.
  const double rail_s = 40e-6 + 0.5 * 4 * part / (1.7e9 / 2);
  CHECK(time["grad_reduce_scatter"] == doctest::Approx(rail_s).epsilon(1e-12));
  CHECK(time["param_all_gather"] == doctest::Approx(rail_s).epsilon(1e-12));
  // The optimizer steps the rail's part sharded among the 2 nodes.
  OptimizerConfig flat = config.optimizer;
  flat.hierarchy = Hierarchy::flat;
  CHECK(p.optimizer_s == doctest::Approx(optimizer_step_bytes(flat, 100000, 2, 0) / 3.1e9).epsilon(1e-12));
  CHECK(p.step_s == doctest::Approx(0.05 + p.optimizer_s + 2 * node_s + 2 * rail_s).epsilon(1e-12));
  // A flat run of nodes of two ranks stays a flat ring of 4 over the port: as without the nodes.
  const auto flat_config = cfg::parse_experiment(node_run_config("adams", 2, false, 200000), ".");
  CHECK(flat_config.optimizer.ranks_per_node == 2);
  StepInputs flat_in = calibrated_inputs(c, flat_config.optimizer, 200000, 0, 1.0);
  CHECK(flat_in.topology.gpus_per_node == 1);
  flat_in.fixed_compute_s = 0.05;
  const double ring_s = 3 * 40e-6 + 0.75 * 4 * n / 1.7e9;  // W - 1 steps, (W - 1) / W of 4N
  CHECK(predict_step(flat_in, 4, 1).exposed_comm_s == doctest::Approx(2 * ring_s).epsilon(1e-12));
  // Without a fitted intra link a hierarchical run cannot be predicted.
  c.intra.reset();
  CHECK_THROWS_WITH_AS(calibrated_inputs(c, config.optimizer, 200000, 0, 1.0),
                       doctest::Contains("no intra-node link was fitted"), std::invalid_argument);
}

TEST_CASE("hierarchical run files round-trip: the intra link from the node collectives, every step error 0") {
  const Truth t;
  for (const bool links_from_bench : {false, true}) {
    CAPTURE(links_from_bench);
    scape::testing::TempDir dir;
    // Two sizes give the node collectives two distinct points, so their latency is fitted too.
    std::vector<fs::path> fit = {
        write_measured_run(dir.path, "dense-flat-n2", node_run_config("adams", 2, false, 200000), t),
        write_measured_run(dir.path, "dense-flat-n4", node_run_config("adams", 4, false, 200000), t),
        write_measured_run(dir.path, "dense-node-n2", node_run_config("adams", 2, true, 200000), t),
        write_measured_run(dir.path, "dense-node-n4", node_run_config("adams", 4, true, 600000), t),
        write_measured_run(dir.path, "scape90-flat-n2", node_run_config("scape", 2, false, 200000, 0.9), t),
        write_measured_run(dir.path, "scape90-node-n2", node_run_config("scape", 2, true, 200000, 0.9), t)};
    if (links_from_bench) fit.push_back(write_bench_comm(dir.path / "bench.h5", bench_samples(t, false)));
    const std::vector<fs::path> held = {
        write_measured_run(dir.path, "scape99-flat-n4", node_run_config("scape", 4, false, 200000), t),
        write_measured_run(dir.path, "scape99-node-n2", node_run_config("scape", 2, true, 200000), t),
        write_measured_run(dir.path, "scape99-node-n4", node_run_config("scape", 4, true, 200000), t)};
    const RunMeasurement m = read_run_measurement(held[2]);
    CHECK(m.hierarchical());
    CHECK(m.ranks_per_node == 2);
    REQUIRE(m.collectives.size() >= 3);
    CHECK(m.collectives.front().purpose == "node_grad_reduce_scatter");
    CHECK(m.collectives.front().link == LinkClass::intra);
    CHECK(m.collectives.front().ranks == 2);
    CHECK(m.collectives.front().bytes_sent == 0.5 * 4 * 200000);
    CHECK(m.collectives.back().purpose == "node_param_all_gather");
    CHECK(m.collectives[1].ranks == 4);  // the rail's among the 4 nodes
    std::ostringstream table;
    calibrate_from_files(fit, held, dir.path / "hw.json", table, {}, links_from_bench);
    const std::string text = table.str();
    CAPTURE(text);
    CHECK(exactly_predicted_rows(text) == 9);
    CHECK(text.find("intra-node link (the node collectives): alpha 9 us, 6.2 GB/s (6 samples)") != std::string::npos);
    CHECK(text.find("| adams (node) |") != std::string::npos);
    const json hw = json::parse(std::ifstream(dir.path / "hw.json"));
    const auto& intra = hw.at("network").at("intra");
    CHECK(intra.at("alpha_us").get<double>() == doctest::Approx(9.0).epsilon(1e-9));
    CHECK(intra.at("bandwidth_GBps").get<double>() == doctest::Approx(6.2).epsilon(1e-9));
    CHECK(hw.at("fit").at("intra_samples") == 6);
    // The port's links from the flat runs and the rails' (bytes times the 2 rails on one port),
    // or from the bench: the same truth either way.
    const auto& fitted = hw.at("network").at("collectives");
    CHECK(fitted.size() == 3);
    for (const auto kind : kKinds) {
      CAPTURE(to_string(kind));
      if (!fitted.contains(to_string(kind))) continue;
      const auto& l = fitted.at(to_string(kind));
      const auto& truth = t.link[static_cast<int>(kind)];
      CHECK(l.at("alpha_us").get<double>() == doctest::Approx(truth.alpha_s * 1e6).epsilon(1e-9));
      CHECK(l.at("bandwidth_GBps").get<double>() == doctest::Approx(truth.bandwidth_Bps / 1e9).epsilon(1e-9));
    }
  }
}

TEST_CASE("hierarchical runs: no node collective timings or no fitted hierarchical run is a ConfigError naming it") {
  const Truth t;
  scape::testing::TempDir dir;
  const fs::path no_node = write_measured_run(dir.path, "no-node", node_run_config("adams", 2, true, 200000), t,
                                              "comm_time_measured_node_param_all_gather");
  CHECK_THROWS_WITH_AS(
      (void)read_run_measurement(no_node),
      doctest::Contains("no-node.h5: missing dataset /metrics/comm_time_measured_node_param_all_gather "
                        "(optimizer.hierarchy node: its node collectives' times fit the intra-node link)"),
      cfg::ConfigError);
  const std::vector<fs::path> flat = {
      write_measured_run(dir.path, "dense-flat", node_run_config("adams", 2, false, 200000), t),
      write_measured_run(dir.path, "dense-flat-n4", node_run_config("adams", 4, false, 200000), t)};
  const fs::path node = write_measured_run(dir.path, "dense-node", node_run_config("adams", 2, true, 200000), t);
  std::ostringstream ignored;
  CHECK_THROWS_WITH_AS(calibrate_from_files(flat, {node}, dir.path / "x.json", ignored),
                       doctest::Contains("dense-node.h5 runs optimizer.hierarchy node, but no fitted run measured "
                                         "the node collectives"),
                       cfg::ConfigError);
}
