// Calibration of hierarchical runs (optimizer.hierarchy = "node"): the intra-node link from
// their node collectives, the port's from their rails', their prediction by hand, and the errors
// when a node's timings are missing. The flat runs: tests/test_predict_calibration.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "calibration_fixtures.hpp"

using namespace scape::testing::calibration;

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
