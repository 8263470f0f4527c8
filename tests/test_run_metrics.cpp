// The metric table (train/metric_table.hpp) against everything that follows it: the run file's
// columns, docs/run-files.md, the reports shipped between processes; and the StateMap
// encoding of checkpoints, whose format is fixed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "optimizers/make_optimizer.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"
#include "test_support.hpp"
#include "tests/earlier_formulation.hpp"
#include "train/checkpoint.hpp"
#include "train/run_metrics.hpp"

#ifndef SCAPE_SOURCE_DIR
#error "SCAPE_SOURCE_DIR must name the source tree (tests/CMakeLists.txt)"
#endif

namespace {

namespace tr = scape::train;
namespace cfg = scape::config;
using scape::StateMap;

std::vector<std::string> doc_lines() {
  std::ifstream in(std::string(SCAPE_SOURCE_DIR) + "/docs/run-files.md");
  REQUIRE(in);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool has_line(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Three workers whose every field differs, for a configuration with every kind of column.
struct Fixture {
  scape::OptimizerConfig optimizer = scape::testing::earlier_formulation();  // the oracles' formulation
  scape::ParamLayout layout;
  std::vector<float> grads[3], acc[3];
  tr::WorkerReport reports[3];

  Fixture() {
    layout.add("a", {40}, true);
    layout.add("b", {24}, false);
    for (int q = 0; q < 3; ++q) {
      const double x = 1.0 + q / 7.0;
      tr::WorkerReport& r = reports[q];
      r.loss = 2.5 * x;
      r.compute_s = 0.01 * x;
      r.optimizer_s = 0.002 * x;
      r.exposed_wait_s = 0.0003 * x;
      r.optimizer_kernel_wall_s = 0.0011 * (3 - q);  // largest on worker 0: a maximum from another worker
      r.metrics.lr = 1e-3;
      r.metrics.target_density = 0.1;
      r.metrics.k_total = 6;
      r.metrics.mask_density = 0.11;
      r.metrics.mask_jaccard = 0.5;
      r.metrics.fill_in = 1.1;
      r.metrics.residual_norm = 3.0 * x;
      r.metrics.residual_max = 0.7 * x;
      r.metrics.residual_to_param = 0.2 * x;
      r.metrics.staleness_mean = 4.0 * x;
      r.metrics.staleness_p99 = 9.0 + q;
      r.metrics.staleness_max = 12.0 - q;
      r.metrics.update_norm = 0.05;
      r.metrics.update_max = 0.01;
      r.metrics.update_sign_flip = 0.3;
      r.metrics.nonfinite_grads = static_cast<std::size_t>(q);
      for (const std::string& p : scape::collective_purposes(optimizer)) {
        r.metrics.comm.push_back({p, scape::CollectiveKind::all_gather, 100, 50.0 * x, 1, 1e-5 * x, p == "mask_all_gather"});
        if (q != 1) r.measured[p] = 2e-4 * x;  // worker 1 measured nothing: its columns stay out of the max
      }
      r.measured["async_all_gather"] = 5e-4 * x;
      r.metrics.tensor_residual_norm = {1.5 * x, 2.5 * x};
      r.metrics.tensor_mask_density = {0.1, 0.2};
      r.metrics.tensor_mask_jaccard = {0.6, 0.7};
      grads[q].assign(layout.size(), static_cast<float>(x));
      acc[q].assign(layout.size(), static_cast<float>(-x));
      r.grads = grads[q];
      r.accumulated = acc[q];
    }
  }
};

std::vector<double> combined_row(const Fixture& f, std::span<const tr::WorkerReport* const> reports,
                                 std::vector<double>* tensor_row = nullptr) {
  tr::StepCombiner combiner(f.optimizer, true, f.layout, tr::metric_columns(f.optimizer, true));
  const std::vector<std::uint64_t> mask(1, 0x3f);
  combiner.combine(reports, mask);
  if (tensor_row != nullptr) tensor_row->assign(combiner.tensor_row().begin(), combiner.tensor_row().end());
  return {combiner.row().begin(), combiner.row().end()};
}

}  // namespace

TEST_CASE("docs/run-files.md has the table's row for every metric, and no row for any other") {
  const std::vector<std::string> lines = doc_lines();
  std::set<std::string> expected;
  for (const tr::RunMetric& m : tr::run_metrics()) expected.insert(tr::doc_row(m));
  for (const tr::TensorMetric& m : tr::tensor_metrics()) expected.insert(tr::doc_row(m));
  for (const std::string& row : expected) {
    INFO("docs/run-files.md lacks this row (the metric table in train/metric_table.cpp writes it):\n" << row);
    CHECK(has_line(lines, row));
  }
  for (const std::string& line : lines) {
    if (line.rfind("| `", 0) != 0) continue;
    INFO("docs/run-files.md documents a metric the table does not have (or has differently):\n" << line);
    CHECK(expected.count(line) == 1);
  }
}

TEST_CASE("every metric has one source of values its combining rule can use, and a unique name") {
  std::set<std::string> names;
  for (const tr::RunMetric& m : tr::run_metrics()) {
    CAPTURE(m.name);
    CHECK(names.insert(m.name).second);
    CHECK(std::string(m.unit) != "");
    CHECK(std::string(m.doc) != "");
    CHECK((m.columns == tr::Columns::one) == (std::string(m.name).back() != '_'));
    const int worker_sources = (m.report_field != nullptr) + (m.metrics_field != nullptr) + (m.computed != nullptr);
    if (m.combine == tr::Combine::rank0) {
      CHECK((m.rank0_field != nullptr));
      CHECK(worker_sources == 0);
    } else {
      CHECK((m.rank0_field == nullptr));
      CHECK(worker_sources == 1);
    }
    // A shipped value computed from the report must be written back by set_computed.
    CHECK((m.set_computed != nullptr) == (m.computed != nullptr && tr::shipped(m.combine)));
  }
  std::set<std::string> tensor_names;
  for (const tr::TensorMetric& m : tr::tensor_metrics()) {
    CAPTURE(m.name);
    CHECK(tensor_names.insert(m.name).second);
    CHECK((m.combine == tr::Combine::mean || m.combine == tr::Combine::worker0));
    CHECK((m.values != nullptr));
  }
}

TEST_CASE("the run file keeps every column analysis/ reads; measured columns only with measured communication") {
  const scape::OptimizerConfig scape_config;  // SCAPE: grad_reduce_scatter, param_all_gather, mask_all_gather
  std::set<std::string> names;
  for (const auto& c : tr::metric_columns(scape_config, false)) names.insert(c.name);
  std::vector<std::string> known = {
      "train_loss",     "lr",            "grad_norm",        "bytes_sent",      "comm_time_model",   "comm_time_exposed",
      "compute_time",   "step_time_model", "target_density", "mask_density",    "mask_jaccard",      "mask_oracle_overlap",
      "mask_energy_capture",
      "fill_in",        "residual_norm", "residual_max",     "residual_to_param", "staleness_mean",  "staleness_p99",
      "staleness_max",  "update_norm",   "update_max",       "update_sign_flip", "nonfinite_grads", "optimizer_time",
      "compute_wall_time", "optimizer_wall_time", "aggregate_time", "record_time"};
  const std::vector<std::string> purposes = scape::collective_purposes(scape_config);
  for (const auto& p : purposes) known.push_back("bytes_sent_" + p);
  for (const std::string& name : known) {
    CAPTURE(name);
    CHECK(names.count(name) == 1);
  }
  // With them, rank 0's step wall time and what the diagnostics sent to it (docs/run-files.md).
  std::vector<std::string> measured = {"comm_time_measured_async_all_gather", "mask_wait_exposed",
                                       "compute_device_time", "step_wall_time", "bytes_sent_diagnostics",
                                       "diagnostics_time", "optimizer_kernel_wall_time"};
  for (const auto& p : purposes) measured.push_back("comm_time_measured_" + p);
  std::set<std::string> with_measured;
  for (const auto& c : tr::metric_columns(scape_config, true)) with_measured.insert(c.name);
  CHECK(with_measured.size() == names.size() + measured.size());
  for (const std::string& name : measured) {
    CAPTURE(name);
    CHECK(names.count(name) == 0);
    CHECK(with_measured.count(name) == 1);
  }
  // The gradient buckets' columns exist only for a measured dense run with overlap_grad_reduce.
  scape::OptimizerConfig dense;
  dense.type = scape::OptimizerType::adams;
  const auto columns_of = [](const scape::OptimizerConfig& c, bool m) {
    std::set<std::string> out;
    for (const auto& col : tr::metric_columns(c, m)) out.insert(col.name);
    return out;
  };
  const auto plain = columns_of(dense, true);
  dense.overlap_grad_reduce = true;
  const auto bucketed = columns_of(dense, true);
  for (const char* name : {"grad_wait_exposed", "comm_time_measured_async_reduce_scatter"}) {
    CAPTURE(std::string(name));
    CHECK(plain.count(name) == 0);
    CHECK(bucketed.count(name) == 1);
    CHECK(columns_of(dense, false).count(name) == 0);
  }
  CHECK(bucketed.size() == plain.size() + 2);
}

TEST_CASE("the combining rules: means and sums in rank order, maxima, worker 0's values, NaN for dense") {
  Fixture f;
  const tr::WorkerReport* all[] = {&f.reports[0], &f.reports[1], &f.reports[2]};
  tr::StepCombiner combiner(f.optimizer, true, f.layout, tr::metric_columns(f.optimizer, true));
  const std::vector<std::uint64_t> mask(1, 0x3f);
  combiner.combine(all, mask);
  CHECK(combiner.value("train_loss") == ((0.0 + f.reports[0].loss) + f.reports[1].loss + f.reports[2].loss) / 3.0);
  CHECK(combiner.value("nonfinite_grads") == 3.0);
  CHECK(combiner.value("staleness_p99") == 11.0);
  CHECK(combiner.value("staleness_max") == 12.0);
  CHECK(combiner.value("update_norm") == 0.05);
  CHECK(combiner.value("comm_time_measured_mask_all_gather") == f.reports[2].measured["mask_all_gather"]);
  CHECK(combiner.value("mask_wait_exposed") == f.reports[2].exposed_wait_s);
  CHECK(combiner.value("optimizer_kernel_wall_time") == f.reports[0].optimizer_kernel_wall_s);
  CHECK(combiner.value("grad_norm") > 0);
  CHECK_THROWS_AS(combiner.value("no_such_metric"), std::logic_error);

  scape::OptimizerConfig dense;
  dense.type = scape::OptimizerType::adams;
  tr::StepCombiner dense_combiner(dense, true, f.layout, tr::metric_columns(dense, false));
  dense_combiner.combine(all, mask);
  for (const char* name : {"target_density", "mask_density", "residual_norm", "residual_max", "staleness_max",
                           "mask_oracle_overlap", "mask_energy_capture"}) {
    CAPTURE(name);
    CHECK(std::isnan(dense_combiner.value(name)));
  }
}

TEST_CASE("reports packed, shipped and unpacked combine to the same row, bit for bit") {
  Fixture f;
  const tr::WorkerReport* direct[] = {&f.reports[0], &f.reports[1], &f.reports[2]};
  std::vector<double> direct_tensors;
  const std::vector<double> expected = combined_row(f, direct, &direct_tensors);

  const tr::ReportPacker packer(f.optimizer, f.layout.slots().size());
  tr::WorkerReport shipped[3];
  const tr::WorkerReport* via_packer[] = {&f.reports[0], &shipped[1], &shipped[2]};
  for (int q = 1; q < 3; ++q) {
    const std::vector<double> values = packer.pack(f.reports[q]);
    CHECK(values.size() == packer.pack(f.reports[0]).size());
    packer.unpack(values, f.reports[0], shipped[q]);
    shipped[q].grads = f.reports[q].grads;
    shipped[q].accumulated = f.reports[q].accumulated;
  }
  std::vector<double> tensors;
  const std::vector<double> row = combined_row(f, via_packer, &tensors);
  const auto columns = tr::metric_columns(f.optimizer, true);
  REQUIRE(row.size() == expected.size());
  for (std::size_t i = 0; i < row.size(); ++i) {
    CAPTURE(columns[i].name);
    CHECK(same_bits(row[i], expected[i]));
  }
  REQUIRE(tensors.size() == direct_tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) CHECK(same_bits(tensors[i], direct_tensors[i]));
}

TEST_CASE("the StateMap encoding: fixed bytes, round trip, truncation refused") {
  StateMap state;
  scape::put_state(state, "m", std::vector<float>{1.0f, -2.0f});
  scape::put_state_value(state, "t", 7);
  const std::string bytes = tr::encode_state_map(state);
  // u64 entries, then per entry in name order: u64 length + name, u64 length + bytes.
  std::string expected;
  auto u64 = [&](std::uint64_t x) { expected.append(reinterpret_cast<const char*>(&x), sizeof x); };
  u64(2);
  u64(1);
  expected += "m";
  u64(8);
  expected.append(reinterpret_cast<const char*>(state["m"].data()), 8);
  u64(1);
  expected += "t";
  u64(4);
  expected.append(reinterpret_cast<const char*>(state["t"].data()), 4);
  CHECK(bytes == expected);
  CHECK(tr::decode_state_map(bytes) == state);
  CHECK(tr::decode_state_map(tr::encode_state_map(StateMap{})).empty());
  CHECK_THROWS_AS(tr::decode_state_map(std::span<const char>(bytes.data(), bytes.size() - 1)), tr::StateFormatError);
  CHECK_THROWS_AS(tr::decode_state_map(bytes + "x"), tr::StateFormatError);
}

TEST_CASE("a checkpoint in the SCAPECK1 format loads when allowed; another config's or a truncated one is refused") {
  scape::testing::TempDir dir;
  const nlohmann::json j = {{"name", "ck"},
                            {"workers", 2},
                            {"steps", 10},
                            {"model", {{"type", "quadratic"}, {"size", 64}}},
                            {"optimizer", {{"type", "adams"}}}};
  const auto config = scape::config::parse_experiment(j, dir.path);
  const std::string id = scape::config::run_id(config.to_json());
  StateMap s0, s1;
  scape::put_state_value(s0, "t", 4);
  scape::put_state(s1, "v", std::vector<float>{0.5f});
  const std::vector<float> params = {1.0f, 2.0f, 3.0f};

  // Written by hand, as the format was before train/checkpoint.cpp existed.
  std::ostringstream file(std::ios::binary);
  auto u64 = [&](std::uint64_t x) { file.write(reinterpret_cast<const char*>(&x), sizeof x); };
  file << "SCAPECK1";
  u64(id.size());
  file << id;
  u64(4);  // step
  u64(2);  // ranks
  for (const StateMap* s : {&s0, &s1}) {
    u64(1);
    const auto& [name, bytes] = *s->begin();
    u64(name.size());
    file << name;
    u64(bytes.size());
    file.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  u64(params.size() * sizeof(float));
  file.write(reinterpret_cast<const char*>(params.data()), static_cast<std::streamsize>(params.size() * sizeof(float)));
  const auto run_file = dir / "run.h5";
  std::ofstream(tr::checkpoint_path(run_file), std::ios::binary) << file.str();

  // It carries no checksum: refused unless asked for (--allow-unchecked-checkpoint).
  CHECK_THROWS_WITH_AS(tr::load_checkpoint(config, run_file, 3),
                       doctest::Contains("a checkpoint of the older SCAPECK1 format, which carries no checksum"),
                       scape::config::ConfigError);
  const tr::Checkpoint c = tr::load_checkpoint(config, run_file, 3, true);
  CHECK(c.step == 4);
  CHECK(c.states == std::vector<StateMap>{s0, s1});
  CHECK(c.params == params);

  // write_checkpoint writes SCAPECK2 since issue 18 (its bytes: test_hardening), holding the same.
  tr::write_checkpoint(tr::checkpoint_path(dir / "again.h5"), config.to_json().dump(), 4, {s0, s1}, params);
  const tr::Checkpoint again = tr::load_checkpoint(config, dir / "again.h5", 3);
  CHECK(again.step == 4);
  CHECK(again.states == c.states);
  CHECK(again.params == c.params);

  CHECK_THROWS_AS(tr::load_checkpoint(config, run_file, 4, true), scape::config::ConfigError);
  std::ofstream(tr::checkpoint_path(run_file), std::ios::binary) << file.str().substr(0, file.str().size() - 5);
  CHECK_THROWS_WITH_AS(tr::load_checkpoint(config, run_file, 3, true),
                       doctest::Contains("corrupt checkpoint (truncated)"), scape::config::ConfigError);
}

// log.gradient_metrics_interval = 3 takes grad_norm and the oracle metrics at steps 1, 4, 7
// (under mask lag 1 the oracle built at step t scores the mask of step t + 1: steps 1, 2, 5, 8),
// with the values of the every-step run there, NaN elsewhere; training itself is unchanged.
TEST_CASE("gradient metrics every k steps: the every-step values at those steps, training unchanged") {
  const nlohmann::json run = {
      {"name", "interval"}, {"workers", 3}, {"steps", 8},
      {"model", {{"type", "gpt"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 16}, {"vocab_size", 32}}},
      {"data", {{"type", "synthetic"}, {"batch_size", 2}, {"tokens", 20000}}},
      {"optimizer",
       {{"type", "scape"}, {"formulation", "frozen_momentum"}, {"mask_scope", "shard"}, {"sparsity", 0.9}, {"lr", 1e-2}}},
      {"eval", {{"interval", 4}, {"batches", 1}}},
      {"log", {{"flush_interval", 4}, {"save_params", true}}}};
  scape::testing::TempDir dir;
  const auto train = [&](int interval) {
    nlohmann::json j = run;
    j["log"]["gradient_metrics_interval"] = interval;
    tr::RunOptions options;
    options.out = dir.path / ("every" + std::to_string(interval) + ".h5");
    options.quiet = true;
    REQUIRE(scape::sim::run_simulated(cfg::parse_experiment(j, "."), options).status == tr::RunStatus::completed);
    return scape::run_file::File::open(options.out, scape::run_file::Access::read);
  };
  auto every = train(1), sparse = train(3);
  const auto column = [](scape::run_file::File& f, const char* name) {
    return f.open_dataset(std::string("/metrics/") + name).read_all<double>();
  };
  CHECK(column(every, "train_loss") == column(sparse, "train_loss"));
  CHECK(every.open_dataset("/final/params").read_all<float>() == sparse.open_dataset("/final/params").read_all<float>());
  const auto expect = [&](const char* name, std::set<int> taken) {
    CAPTURE(name);
    const auto all = column(every, name), some = column(sparse, name);
    REQUIRE(all.size() == 8);
    REQUIRE(some.size() == 8);
    for (int t = 1; t <= 8; ++t) {
      CAPTURE(t);
      CHECK(std::isfinite(all[t - 1]));
      if (taken.count(t)) {
        CHECK(some[t - 1] == all[t - 1]);
      } else {
        CHECK(std::isnan(some[t - 1]));
      }
    }
  };
  expect("grad_norm", {1, 4, 7});
  expect("mask_oracle_overlap", {1, 2, 5, 8});
  expect("mask_energy_capture", {1, 2, 5, 8});
}
