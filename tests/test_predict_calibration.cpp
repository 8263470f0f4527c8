// Calibration (`scape predict --calibrate`): the fits recover known parameters from synthetic
// measurements, run files written with the step model's own times round-trip through the file
// reader and the hardware description to the same parameters and a zero error, the hardware
// description is read back by prediction configs, and bad run files exit 2 naming the file and
// the missing dataset. Hierarchical runs: tests/test_predict_calibration_hierarchy.cpp (the
// synthetic measurements of both: calibration_fixtures.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "calibration_fixtures.hpp"

using namespace scape::testing::calibration;

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

TEST_CASE("--links-from-bench with bench-comm files alone: the links, no compute or optimizer figure") {
  const Truth t;
  scape::testing::TempDir dir;
  const fs::path bench = write_bench_comm(dir.path / "bench.h5", bench_samples(t, false));
  std::ostringstream table;
  calibrate_from_files({bench}, {}, dir.path / "hw.json", table, {}, true);
  const std::string text = table.str();
  CAPTURE(text);
  CHECK(text.find("compute and optimizer step: not fitted (no run: the links alone)") != std::string::npos);
  CHECK(text.find("| run |") == std::string::npos);  // no run to compare
  const json hw = json::parse(std::ifstream(dir.path / "hw.json"));
  CHECK(hw.at("gpu").empty());
  CHECK(hw.at("fit").at("optimizer_samples").get<int>() == 0);
  for (const auto kind : kKinds) {  // the same links a calibration with runs fits to this file
    const auto& l = hw.at("network").at("collectives").at(to_string(kind));
    const auto& truth = t.link[static_cast<int>(kind)];
    CHECK(l.at("alpha_us").get<double>() == doctest::Approx(truth.alpha_s * 1e6).epsilon(0.01));
    CHECK(l.at("bandwidth_GBps").get<double>() == doctest::Approx(truth.bandwidth_Bps / 1e9).epsilon(0.01));
  }
  // Without --links-from-bench a bench-comm file alone still needs a run beside it.
  std::ostringstream ignored;
  CHECK_THROWS_WITH_AS(calibrate_from_files({bench}, {}, dir.path / "x.json", ignored, {}, false),
                       doctest::Contains("no run file among the inputs"), cfg::ConfigError);
}

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
