// A shaped link's idle and busy regimes (predict/link_load.hpp, docs/PREDICTING.md "A link's
// load"): the measured curves reproduce their own inputs and interpolate between them; the
// calibration keeps them beside lines fitted to the busy calls alone and scales them to another
// rate; the step model prices the step's first collective across nodes on the idle curve and
// the others on the busy one; the curves round-trip through a hardware description, and a bad
// one or a bad bench-comm file is an error naming the key or the file.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "predict/calibration.hpp"
#include "predict/link_load.hpp"
#include "predict/link_load_fit.hpp"
#include "predict/measured_runs.hpp"
#include "predict/predict_config.hpp"
#include "predict/step_model.hpp"
#include "run_file/bench_comm_file.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace scape;
using namespace scape::predict;
using nlohmann::json;

namespace {

constexpr auto RS = CollectiveKind::reduce_scatter;
constexpr auto AG = CollectiveKind::all_gather;

// A link of 12.5 MB/s that a busy call gets half of beyond 64 KiB, 2 ranks.
double idle_time(double sent) { return 1e-4 + sent / 12.5e6; }
double busy_time(double sent) { return 1e-4 + std::min(sent, 65536.0) / 12.5e6 + std::max(0.0, sent - 65536) / 6.25e6; }

std::vector<CollectiveSample> two_regime_samples() {
  std::vector<CollectiveSample> out;
  for (const auto load : {LinkLoad::busy, LinkLoad::idle}) {
    for (const auto kind : {RS, AG}) {
      for (double payload = 16384; payload <= 16777216; payload *= 4) {
        const double sent = ring_bytes_sent_per_worker(kind, 2, payload);
        out.push_back(
            CollectiveSample{kind, 2, 1.0, sent, load == LinkLoad::idle ? idle_time(sent) : busy_time(sent), load});
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("curve_time: the measured points exactly, linear between them, flat below, the last slope above") {
  const MeasuredCurve c{{1000, 3000, 7000}, {0.01, 0.02, 0.06}};
  CHECK(curve_time(c, 1000) == 0.01);
  CHECK(curve_time(c, 3000) == 0.02);
  CHECK(curve_time(c, 7000) == 0.06);
  CHECK(curve_time(c, 2000) == doctest::Approx(0.015));
  CHECK(curve_time(c, 5000) == doctest::Approx(0.04));
  CHECK(curve_time(c, 10) == 0.01);                                             // latency-bound below the smallest size
  CHECK(curve_time(c, 9000) == doctest::Approx(0.08));                          // 0.06 + 2000 x 1e-5
  CHECK(curve_time(MeasuredCurve{{100}, {0.5}}, 300) == doctest::Approx(1.5));  // one point: proportional above it
  CHECK_THROWS_AS(curve_time(MeasuredCurve{}, 1), std::invalid_argument);
}

TEST_CASE("measured_curves: each regime's and kind's samples, ascending, the mean of a size measured twice") {
  auto samples = two_regime_samples();
  // all_gather of 64-bit words beside the floats: the same kind and size, another time.
  samples.push_back(CollectiveSample{AG, 2, 1.0, 8192, 2 * busy_time(8192), LinkLoad::busy});
  const LoadCurves c = measured_curves(samples);
  CHECK(c.workers == 2);
  CHECK(c.rate_scale == 1);
  REQUIRE(c.at(LinkLoad::idle, RS));
  REQUIRE(c.at(LinkLoad::busy, AG));
  CHECK_FALSE(c.at(LinkLoad::idle, CollectiveKind::all_reduce));
  const MeasuredCurve& idle_rs = *c.at(LinkLoad::idle, RS);
  REQUIRE(idle_rs.bytes_sent.size() == 6);
  for (std::size_t i = 0; i < idle_rs.bytes_sent.size(); ++i) {  // the curve reproduces its inputs
    CHECK(idle_rs.bytes_sent[i] == 8192.0 * std::pow(4.0, static_cast<double>(i)));
    CHECK(idle_rs.time_s[i] == idle_time(idle_rs.bytes_sent[i]));
    CHECK(curve_time(idle_rs, idle_rs.bytes_sent[i]) == idle_rs.time_s[i]);
  }
  CHECK(c.at(LinkLoad::busy, AG)->time_s.front() == doctest::Approx(1.5 * busy_time(8192)));
  // One regime alone, or rows of two benches on different rank counts, cannot make the curves.
  std::vector<CollectiveSample> busy_only;
  for (const auto& s : samples) {
    if (s.load == LinkLoad::busy) busy_only.push_back(s);
  }
  CHECK_THROWS_WITH_AS(measured_curves(busy_only), doctest::Contains("idle and busy"), std::invalid_argument);
  samples.push_back(CollectiveSample{AG, 4, 3.0, 8192, 0.1, LinkLoad::idle});
  CHECK_THROWS_WITH_AS(measured_curves(samples), doctest::Contains("2 and 4 ranks"), std::invalid_argument);
}

TEST_CASE("calibrate with idle calls: lines fitted to the busy calls alone, the curves kept, scaled to another rate") {
  const auto samples = two_regime_samples();
  std::vector<CollectiveSample> busy;
  for (const auto& s : samples) {
    if (s.load == LinkLoad::busy) busy.push_back(s);
  }
  const std::vector<RateSample> optimizer = {{1e9, 0.5}};
  const Calibration c = calibrate({}, optimizer, samples);
  REQUIRE(c.inter_curves);
  CHECK(c.idle_samples == static_cast<int>(samples.size() - busy.size()));
  const LinkFit line = fit_alpha_beta(busy);
  CHECK(c.combined.alpha_s == line.alpha_s);
  CHECK(c.combined.bandwidth_Bps == line.bandwidth_Bps);
  CHECK_FALSE(calibrate({}, optimizer, busy).inter_curves);  // no idle call: the lines alone, as before

  const Calibration slower = with_link_rate_scale(c, 0.6);
  CHECK(slower.link_rate_scale == 0.6);
  CHECK(slower.combined.bandwidth_Bps == doctest::Approx(0.6 * c.combined.bandwidth_Bps));
  CHECK(slower.combined.alpha_s == c.combined.alpha_s);
  CHECK(slower.inter_curves->rate_scale == 0.6);
  // At 0.6 of the rate, b bytes take what b / 0.6 took on the bench's link.
  const double payload = 2e6;
  const double sent = ring_bytes_sent_per_worker(AG, 2, payload);
  CHECK(*loaded_time(*slower.inter_curves, AG, 2, payload, LinkLoad::busy, 1.0) ==
        doctest::Approx(busy_time(sent / 0.6)));
  CHECK(*loaded_time(*c.inter_curves, AG, 2, payload, LinkLoad::idle, 1.0) == doctest::Approx(idle_time(sent)));
  CHECK_FALSE(loaded_time(*c.inter_curves, AG, 4, payload, LinkLoad::idle, 1.0));  // the bench ran on 2 ranks
  CHECK_THROWS_AS(with_link_rate_scale(c, 0), std::invalid_argument);
  const json hw = hardware_json(slower);
  CHECK(hw.at("fit").at("link_rate_scale") == 0.6);
  CHECK(hw.at("fit").at("idle_samples") == c.idle_samples);
  CHECK(hw.at("network").at("inter_curves").at("rate_scale") == 0.6);
}

TEST_CASE("the step model: the step's first collective across nodes on the idle curve, the next on the busy one") {
  const auto samples = two_regime_samples();
  const Calibration c = calibrate({}, std::vector<RateSample>{{1e9, 0.5}}, samples);
  OptimizerConfig dense;
  dense.type = OptimizerType::adams;
  dense.sharded = true;  // a reduce-scatter of the gradient, then an all-gather of the parameters
  StepInputs in = calibrated_inputs(c, dense, 3'000'000, 0, 1.0);
  in.fixed_compute_s = 0.05;
  const StepPrediction p = predict_step(in, 2, 1);
  REQUIRE(p.collectives.size() == 2);
  CHECK(p.collectives[0].record.kind == RS);
  CHECK(p.collectives[1].record.kind == AG);
  const double sent = ring_bytes_sent_per_worker(RS, 2, 12e6);
  CHECK(p.collectives[0].time_s == doctest::Approx(idle_time(sent)));
  CHECK(p.collectives[1].time_s == doctest::Approx(busy_time(sent)));
  CHECK(p.exposed_comm_s == doctest::Approx(idle_time(sent) + busy_time(sent)));
  // Without the curves both are on the busy calls' line.
  Calibration lines = c;
  lines.inter_curves.reset();
  StepInputs plain = calibrated_inputs(lines, dense, 3'000'000, 0, 1.0);
  plain.fixed_compute_s = 0.05;
  const StepPrediction q = predict_step(plain, 2, 1);
  CHECK(q.collectives[0].time_s == doctest::Approx(alpha_beta_time(RS, 2, 12e6, lines.by_kind[1]->model())));
}

TEST_CASE("network.inter_curves: round-trips through a prediction config; a bad curve names its key") {
  const Calibration c = calibrate({}, std::vector<RateSample>{{1e9, 0.5}}, two_regime_samples());
  const json curves = hardware_json(c).at("network").at("inter_curves");
  CHECK(inter_curves_json(parse_inter_curves(curves, "network.inter_curves")) == curves);
  json config = {{"model", {{"preset", "gpt2-124m"}}},
                 {"workers", {2}},
                 {"batch", {{"global_sequences", 8}, {"seq_len", 1024}}},
                 {"network", {{"gpus_per_node", 1}, {"inter_curves", curves}}}};
  const PredictConfig p = parse_predict_config(config);
  REQUIRE(p.inter_curves);
  CHECK(p.to_json().at("network").at("inter_curves") == curves);
  CHECK(p.topology().inter_curves->at(LinkLoad::idle, RS)->time_s == c.inter_curves->at(LinkLoad::idle, RS)->time_s);
  const auto error_of = [&](const json& bad_curves) {
    json bad = config;
    bad["network"]["inter_curves"] = bad_curves;
    try {
      parse_predict_config(bad);
    } catch (const config::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  json unsorted = curves;
  unsorted["idle"]["reduce_scatter"]["bytes_sent"][1] = 1;
  CHECK(error_of(unsorted).find("network.inter_curves.idle.reduce_scatter.bytes_sent: not ascending") !=
        std::string::npos);
  json typo = curves;
  typo["idle"]["all_gathr"] = typo["idle"]["all_gather"];
  CHECK(error_of(typo).find("network.inter_curves.idle: unknown collective kind all_gathr") != std::string::npos);
  json uneven = curves;
  uneven["busy"]["all_gather"]["time_s"].erase(0);
  CHECK(error_of(uneven).find("network.inter_curves.busy.all_gather: bytes_sent and time_s differ") !=
        std::string::npos);
  CHECK(error_of(json{{"workers", 1}}).find("network.inter_curves.workers") != std::string::npos);
}

TEST_CASE("bench-comm files: /regime read back (absent: busy); an unknown regime names the file and the row") {
  scape::testing::TempDir dir;
  std::vector<run_file::BenchCommRow> rows = {{"all_gather", "all_gather", "busy", 2, 4096, 1, 2048, 1e-3, 1, 1},
                                              {"all_gather", "all_gather", "idle", 2, 4096, 1, 2048, 5e-4, 1, 1}};
  run_file::write_bench_comm_file(dir.path / "b.h5", "mpi", rows);
  const auto samples = read_bench_comm(dir.path / "b.h5");
  REQUIRE(samples.size() == 2);
  CHECK(samples[0].load == LinkLoad::busy);
  CHECK(samples[1].load == LinkLoad::idle);
  rows[1].regime = "sleepy";
  run_file::write_bench_comm_file(dir.path / "bad.h5", "mpi", rows);
  CHECK_THROWS_WITH_AS(read_bench_comm(dir.path / "bad.h5"),
                       doctest::Contains("bad.h5: /regime[1]: unknown regime sleepy"), config::ConfigError);
}
