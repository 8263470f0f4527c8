// `scape predict` end to end: every shipped prediction config runs and writes its HDF5 and
// CSV files; bad input exits with status 2 and a message naming the field; the parser's
// defaults and --set overrides; the optimizer's memory per GPU, flat and under hierarchy node.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/config.hpp"
#include "core/schedule.hpp"
#include "optimizers/rail_partition.hpp"
#include "optimizers/volume.hpp"
#include "predict/model_layout.hpp"
#include "predict/predict_config.hpp"
#include "predict/prediction.hpp"
#include "predict/step_model.hpp"
#include "run_file/bench_comm_file.hpp"
#include "run_file/hdf5.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
namespace cfg = scape::config;
using namespace scape::predict;
using namespace scape::presets;
using nlohmann::json;

namespace {

using scape::testing::TempDir;

scape::testing::CommandResult run_scape(const std::string& args) {
  return scape::testing::run_command(std::string(SCAPE_BINARY) + " " + args);
}

json small_config() {
  return json::parse(R"({
    "name": "small",
    "model": {"preset": "gpt2-124m"},
    "batch": {"scaling": "weak", "seq_len": 1024, "per_gpu_sequences": 8},
    "gpu": {"preset": "a100", "mfu": 0.5},
    "network": {"gpus_per_node": 4, "inter": {"preset": "eth_100g"}},
    "optimizer": {"type": "scape", "sparsity": 0.9, "wire_dtype": "bf16"},
    "workers": [1, 4, 8, 16]
  })");
}

fs::path write_config(const TempDir& dir, const json& j, const std::string& name = "predict.json") {
  const fs::path p = dir.path / name;
  std::ofstream(p) << j.dump(2);
  return p;
}

// Runs `scape predict` on `j` and expects exit status 2 with `field` in the message.
void expect_invalid(const json& j, const std::string& field, const std::string& extra_args = "") {
  TempDir dir;
  const auto cfg = write_config(dir, j);
  const auto r = run_scape("predict " + cfg.string() + " --out " + (dir.path / "p.h5").string() + " " + extra_args);
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(field) != std::string::npos);
  CHECK_FALSE(fs::exists(dir.path / "p.h5"));
}

}  // namespace

TEST_CASE("every shipped prediction config runs and writes HDF5 and CSV") {
  const fs::path configs = fs::path(SCAPE_SOURCE_DIR) / "experiments/configs/predict";
  REQUIRE(fs::is_directory(configs));
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(configs)) {
    if (entry.path().extension() != ".json") continue;
    ++seen;
    CAPTURE(entry.path());
    TempDir dir;
    const auto h5 = dir.path / "p.h5", csv = dir.path / "p.csv";
    const auto r = run_scape("predict " + entry.path().string() + " --out " + h5.string() + " --csv " + csv.string());
    CAPTURE(r.output);
    REQUIRE(r.code == 0);
    CHECK(r.output.find("| W | config |") != std::string::npos);
    const auto config = load_predict_config(entry.path(), {});
    auto f = scape::run_file::File::open(h5, scape::run_file::Access::read);
    CHECK(f.read_string_attribute("format") == "scape-prediction-1");
    CHECK(f.open_dataset("workers").read_all<std::int64_t>().size() == config.workers.size());
    CHECK(f.open_dataset("optimizer/speedup").read_all<double>().size() == config.workers.size());
    std::ifstream in(csv);
    std::string header;
    std::getline(in, header);
    CHECK(header.rfind("workers,config,type,", 0) == 0);
    int lines = 0;
    for (std::string line; std::getline(in, line);) ++lines;
    CHECK(lines == 2 * static_cast<int>(config.workers.size()));
  }
  CHECK(seen >= 4);
}

TEST_CASE("the prediction file holds the ledger's bytes and the table's times") {
  TempDir dir;
  const auto cfg = write_config(dir, small_config());
  const auto h5 = dir.path / "p.h5";
  REQUIRE(run_scape("predict " + cfg.string() + " --out " + h5.string()).code == 0);
  auto f = scape::run_file::File::open(h5, scape::run_file::Access::read);
  CHECK(f.open_dataset("model/n_params").read_all<std::int64_t>() == std::vector<std::int64_t>{124439808});
  // Dense AdamS baseline, sharded, bf16 gradients, fp32 parameters.
  const auto rs = f.open_dataset("baseline/collectives/grad_reduce_scatter/payload_bytes").read_all<double>();
  const auto ag = f.open_dataset("baseline/collectives/param_all_gather/payload_bytes").read_all<double>();
  CHECK(rs.front() == 124439808.0 * 2);
  CHECK(ag.front() == 124439808.0 * 4);
  const auto sent = f.open_dataset("baseline/collectives/grad_reduce_scatter/bytes_sent_per_worker").read_all<double>();
  CHECK(sent[0] == 0.0);
  CHECK(sent[2] == doctest::Approx(7.0 / 8 * 124439808.0 * 2));
  const auto step = f.open_dataset("optimizer/step_s").read_all<double>();
  const auto tokens = f.open_dataset("optimizer/tokens_per_s").read_all<double>();
  const auto global = f.open_dataset("global_tokens").read_all<double>();
  CHECK(tokens[3] == doctest::Approx(global[3] / step[3]));
  CHECK(global[3] == 16.0 * 8 * 1024);
  CHECK(f.open_dataset("optimizer/efficiency").read_all<double>()[0] == 1.0);
}

TEST_CASE("bad input exits 2 naming the field") {
  auto j = small_config();
  j["model"]["preset"] = "gpt-9";
  expect_invalid(j, "model.preset");
  j = small_config();
  j["gpu"]["mfu"] = 0;
  expect_invalid(j, "gpu.mfu");
  j["gpu"]["mfu"] = 1.5;
  expect_invalid(j, "gpu.mfu");
  j = small_config();
  expect_invalid(j, "gpu.mfu", "--set gpu.mfu=-0.1");
  j["workers"] = json::array({4, 0});
  expect_invalid(j, "workers[1]");
  j["workers"] = json::array();
  expect_invalid(j, "workers");
  j = small_config();
  j["batch"] = {{"scaling", "weak"}, {"global_sequences", 100}, {"reference_workers", 16}};
  expect_invalid(j, "batch.global_sequences");
  j = small_config();
  j["batch"] = {{"scaling", "strong"}, {"global_sequences", 100}};
  expect_invalid(j, "batch.global_sequences");
  j = small_config();
  j["gpu"]["preset"] = "tpu";
  expect_invalid(j, "gpu.preset");
  j = small_config();
  j["network"]["inter"]["preset"] = "carrier_pigeon";
  expect_invalid(j, "network.inter.preset");
  j = small_config();
  j["workers"] = json::array({4, 6});
  expect_invalid(j, "workers[1]");
  j = small_config();
  j["optimizer"]["sparsty"] = 0.9;
  expect_invalid(j, "did you mean 'sparsity'");
  j = small_config();
  j["baseline"] = {{"type", "adams"}, {"sharded", "yes"}};
  expect_invalid(j, "baseline.sharded");
  j = small_config();
  j["model"] = {{"family", "llama"}, {"n_layer", 2}, {"n_embd", 64}, {"n_head", 4}};
  expect_invalid(j, "model.vocab_size");
  j = small_config();
  j["optimizer"] = {{"type", "powersgd"}, {"sharded", false}};  // its bytes need the tensor shapes
  expect_invalid(j, "optimizer.type: powersgd cannot be predicted");
  expect_invalid(small_config(), "--config-overlap-only goes with --from-runs", "--config-overlap-only");
}

TEST_CASE("parser: defaults, explicit models and the derived baseline") {
  auto c = parse_predict_config(small_config());
  CHECK(c.batch.per_gpu_sequences == 8);
  CHECK(c.batch.tokens_per_gpu(16) == 8.0 * 1024);
  CHECK(c.gpu.peak_TFLOPs == 312.0);
  CHECK(c.gpu.mfu == 0.5);
  CHECK(c.nics_per_node == 4);
  CHECK(c.inter.bandwidth_GBps == 12.5);
  CHECK(c.intra.preset == "nvlink_h100");
  CHECK(c.baseline.type == scape::OptimizerType::adams);
  CHECK(c.baseline.sharded);
  CHECK(c.baseline.wire_dtype == scape::WireType::bf16);
  CHECK(c.overlap.grad_reduce);
  CHECK_FALSE(c.overlap.sparse_reduce);
  // SCAPE's fp8 payload (replicated): one byte a value and the scale's all-gather; the derived
  // dense baseline sends fp32.
  {
    auto fp8 = small_config();
    fp8["optimizer"]["sharded"] = false;
    fp8["optimizer"]["wire_dtype"] = "fp8_e5m2";
    const auto p = parse_predict_config(fp8);
    CHECK(p.baseline.wire_dtype == scape::WireType::fp32);
    const scape::predict::Prediction r = scape::predict::run_prediction(p);
    const auto& row = r.rows.back();
    const double rho =
        scape::density_at(p.optimizer.density_schedule(), scape::predict::steady_state_step(p.optimizer));
    const auto k = scape::mask_k(p.optimizer, scape::predict::tensor_layout(p.model), row.workers, rho);
    int seen = 0;
    for (const auto& col : row.optimizer.collectives) {
      if (col.record.purpose == "grad_all_reduce") {
        CHECK(col.record.payload_bytes == k);
        ++seen;
      }
      if (col.record.purpose == "fp8_scale_all_gather") {
        CHECK(col.record.payload_bytes == 4u * static_cast<unsigned>(row.workers));
        ++seen;
      }
    }
    CHECK(seen == 2);
  }
  // Weak scaling from a global batch at the largest worker count.
  auto j = small_config();
  j["batch"] = {{"scaling", "weak"}, {"global_sequences", 128}};
  CHECK(parse_predict_config(j).batch.per_gpu_sequences == 8);
  // Explicit Llama dimensions derive the SwiGLU width and untied embeddings.
  j["model"] = {{"family", "llama"}, {"n_layer", 32}, {"n_embd", 4096}, {"n_head", 32}, {"vocab_size", 32000}};
  c = parse_predict_config(j);
  CHECK(c.model.ffn_hidden == 11008);
  CHECK_FALSE(c.model.tied_embeddings);
  CHECK(parameter_count(c.model) == 6738415616);
  // A preset with one field overridden.
  j["model"] = {{"preset", "gpt2-124m"}, {"vocab_size", 50304}};
  CHECK(parameter_count(parse_predict_config(j).model) == 124439808 + 47 * 768);
  // The resolved config parses back to the same prediction inputs.
  const auto again = parse_predict_config(parse_predict_config(small_config()).to_json());
  CHECK(again.to_json() == parse_predict_config(small_config()).to_json());
  CHECK_THROWS_AS(parse_predict_config(json::parse(R"({"workers": [1]})")), cfg::ConfigError);
}

TEST_CASE("predict --calibrate: bad run files exit 2 naming the file and the missing dataset") {
  TempDir dir;
  const auto absent = run_scape("predict --calibrate " + (dir.path / "absent.h5").string());
  CHECK(absent.code == 2);
  CHECK(absent.output.find("absent.h5") != std::string::npos);
  // A simulated run has no measured collective times.
  const json run = {{"name", "sim"},
                    {"workers", 2},
                    {"steps", 6},
                    {"model", {{"type", "gpt"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 8},
                               {"vocab_size", 16}}},
                    {"data", {{"type", "synthetic"}, {"batch_size", 2}, {"tokens", 4000}}},
                    {"optimizer", {{"type", "adams"}}},
                    {"eval", {{"interval", 100}, {"batches", 1}}}};
  const fs::path cfg = write_config(dir, run, "run.json");
  const fs::path h5 = dir.path / "sim.h5";
  REQUIRE(run_scape("run " + cfg.string() + " --out " + h5.string() + " --quiet").code == 0);
  const auto sim = run_scape("predict --calibrate " + h5.string() + " --out " + (dir.path / "hw.json").string());
  CAPTURE(sim.output);
  CHECK(sim.code == 2);
  CHECK(sim.output.find(h5.string() + ": missing dataset /metrics/comm_time_measured_grad_reduce_scatter") !=
        std::string::npos);
  CHECK(!fs::exists(dir.path / "hw.json"));
}

TEST_CASE("--validate: a bad table exits 2 naming the file, row and column; the shipped table prints its errors") {
  TempDir dir;
  const fs::path bad = dir.path / "bad.csv";
  std::ofstream(bad) << "model,method,gpus,step_ms\nllama-500m,adams,4,-1\n";
  auto r = run_scape("predict --validate " + bad.string());
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(bad.string() + ": row 2, column step_ms: -1 must be > 0") != std::string::npos);
  const fs::path csv = dir.path / "out.csv";
  r = run_scape("predict --validate " + std::string(SCAPE_SOURCE_DIR) + "/experiments/measured/llama-500m-step-times.csv --csv " +
                csv.string());
  CHECK(r.code == 0);
  CHECK(r.output.find("| llama-500m | scape_0.01 | 64 | 908.2 |") != std::string::npos);
  CHECK(r.output.find("mean |error|") != std::string::npos);
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  CHECK(header == "model,method,gpus,measured_ms,predicted_ms,error");
  CHECK(run_scape("predict --validate " + bad.string() + " --out x.h5").code == 2);
}

TEST_CASE("--validate with the stored calibrations: the same bytes on every run; a bad one exits 2 naming it") {
  TempDir dir;
  const std::string root = SCAPE_SOURCE_DIR;
  const std::string table = root + "/experiments/measured/llama-1.8b-step-times.csv";
  const std::string hw = root + "/experiments/hardware/tacc-vista-measured.json";
  const fs::path csv1 = dir.path / "a.csv", csv2 = dir.path / "b.csv";
  const auto first = run_scape("predict --validate " + table + " --hardware " + hw + " --csv " + csv1.string());
  const auto second = run_scape("predict --validate " + table + " --hardware " + hw + " --csv " + csv2.string());
  REQUIRE(first.code == 0);
  CHECK(second.code == 0);
  CHECK(first.output == second.output);
  CHECK(scape::testing::read_file(csv1) == scape::testing::read_file(csv2));
  CHECK(first.output.find("| llama-1.8b | scape_0.01_do_offload | 64 | 1279.9 |") != std::string::npos);

  json bad = json::parse(std::ifstream(hw));
  bad["gemm_curve"]["max_efficiency"] = "high";
  const fs::path bad_file = dir.path / "bad-hw.json";
  std::ofstream(bad_file) << bad.dump(2);
  auto r = run_scape("predict --validate " + table + " --hardware " + bad_file.string());
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(bad_file.string() + ": gemm_curve.max_efficiency must be a number") != std::string::npos);
  std::ofstream(bad_file) << "{ not json";
  r = run_scape("predict --validate " + table + " --hardware " + bad_file.string());
  CHECK(r.code == 2);
  CHECK(r.output.find(bad_file.string()) != std::string::npos);
}

TEST_CASE(
    "--calibrate-table: the same hardware description on every run; a ridge that needs more than the peak exits 2") {
  TempDir dir;
  const std::string table = std::string(SCAPE_SOURCE_DIR) + "/experiments/measured/llama-500m-step-times.csv";
  const fs::path a = dir.path / "a.json", b = dir.path / "b.json";
  REQUIRE(run_scape("predict --calibrate-table " + table + " --out " + a.string()).code == 0);
  REQUIRE(run_scape("predict --calibrate-table " + table + " --out " + b.string()).code == 0);
  CHECK(scape::testing::read_file(a) == scape::testing::read_file(b));
  CHECK(json::parse(std::ifstream(a)).contains("gemm_curve"));
  const auto flops = run_scape("predict --calibrate-table " + table + " --compute-model flops --out " + b.string());
  CHECK(flops.code == 0);
  CHECK_FALSE(json::parse(std::ifstream(b)).contains("gemm_curve"));
  const auto r = run_scape("predict --calibrate-table " + table + " --gemm-ridge 800 --out " + b.string());
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("llama-500m-step-times.csv: the GEMM curve's fitted max_efficiency is") != std::string::npos);
  // Without --calibrate-table they would do nothing: refused.
  const auto stray = run_scape("predict --validate " + table + " --gemm-ridge 150");
  CHECK(stray.code == 2);
  CHECK(stray.output.find("--compute-model and --gemm-ridge go with --calibrate-table") != std::string::npos);
}

// The optimizer's memory per GPU in all three outputs (the last two CSV columns): SCAPE 90% of
// the default formulation, sharded, on GPT-2 124M at W = 8 on nodes of 4. Its state is m and the
// owner's carried momentum over the owned shard and the residual over what the rank steps: all
// of N among 8 flat, the largest rail's part among the 2 nodes under hierarchy node.
TEST_CASE("the prediction's optimizer state per GPU, flat and node, in the table, HDF5 and CSV") {
  const scape::ParamLayout layout = tensor_layout(parse_predict_config(small_config()).model);
  const auto parts = scape::split_into_rails(layout, 4, scape::RailSplit::tensors);
  const std::size_t n = layout.size(), part = parts[scape::largest_rail(parts)].size();
  for (const bool node : {false, true}) {
    CAPTURE(node);
    TempDir dir;
    json j = small_config();
    j["workers"] = {8};
    if (node) j["optimizer"]["hierarchy"] = "node";
    const auto h5 = dir.path / "p.h5", csv = dir.path / "p.csv";
    const auto r =
        run_scape("predict " + write_config(dir, j).string() + " --out " + h5.string() + " --csv " + csv.string());
    REQUIRE(r.code == 0);
    CHECK(r.output.find("| opt. state GiB | opt. memory GiB |") != std::string::npos);
    const std::size_t own = node ? scape::Sharding(part, 2).size(0) : scape::Sharding(n, 8).size(0);
    const double state = 4.0 * (2 * own + (node ? part : n));
    auto f = scape::run_file::File::open(h5, scape::run_file::Access::read);
    CHECK(f.open_dataset("optimizer/optimizer_state_bytes").read_all<double>() == std::vector<double>{state});
    const double memory = f.open_dataset("optimizer/optimizer_memory_bytes").read_all<double>().front();
    CHECK(memory > state);
    std::ifstream in(csv);
    std::string header, line;
    std::getline(in, header);
    CHECK(header.ends_with(",efficiency,optimizer_state_bytes,optimizer_memory_bytes"));
    std::getline(in, line);  // the optimizer's row
    CHECK(line.substr(line.rfind(',', line.rfind(',') - 1) + 1) ==
          std::to_string(static_cast<std::uint64_t>(state)) + "," + std::to_string(static_cast<std::uint64_t>(memory)));
  }
}

TEST_CASE("a held-out link rate from the stored netlab files: the same bytes on every run; bad input exits 2") {
  // scripts/netlab bench --held-out-rate 60mbit, 2026-12-06 (docs/NETLAB.md): compute and the
  // optimizer from the 10 Gbit/s runs, the links from the 100 Mbit/s bench-comm file (back to
  // back and after an idle gap) scaled to 60 Mbit/s, the 60 Mbit/s runs held out.
  TempDir dir;
  const std::string d = std::string(SCAPE_SOURCE_DIR) + "/experiments/measured/netlab/held-out-rate-2026-12-06/";
  const std::string bench = d + "mpi-100mbit-bench-comm.h5";
  const std::string fit = d + "mpi-10000mbit-adams.h5 " + d + "mpi-10000mbit-scape-90.h5 ";
  const std::string held = " --held-out " + d + "mpi-60mbit-adams.h5 " + d + "mpi-60mbit-scape-99.h5";
  const auto calibrate = [&](const std::string& name, const std::string& links) {
    return run_scape("predict --calibrate " + fit + links + " --links-from-bench --link-rate-scale 0.6" + held +
                     " --out " + (dir.path / (name + ".json")).string() + " --csv " +
                     (dir.path / (name + ".csv")).string());
  };
  const auto first = calibrate("a", bench);
  const auto second = calibrate("b", bench);
  CAPTURE(first.output);
  REQUIRE(first.code == 0);
  CHECK(second.code == 0);
  // The same text but for the file name it says it wrote.
  std::string renamed = first.output;
  renamed.replace(renamed.find("a.json"), 6, "b.json");
  CHECK(renamed == second.output);
  CHECK(scape::testing::read_file(dir.path / "a.csv") == scape::testing::read_file(dir.path / "b.csv"));
  CHECK(scape::testing::read_file(dir.path / "a.json") == scape::testing::read_file(dir.path / "b.json"));
  const json hw = json::parse(std::ifstream(dir.path / "a.json"));
  CHECK(hw.at("network").at("inter_curves").at("rate_scale") == 0.6);
  CHECK(hw.at("fit").at("link_rate_scale") == 0.6);
  // The measured result this reproduces: dense AdamS and SCAPE 99% at the held-out rate within 20%.
  std::ifstream csv(dir.path / "a.csv");
  std::string line;
  int held_out = 0;
  while (std::getline(csv, line)) {
    if (line.find(",held_out,") == std::string::npos) continue;
    ++held_out;
    CAPTURE(line);
    CHECK(std::abs(std::stod(line.substr(line.rfind(',') + 1))) < 0.20);
  }
  CHECK(held_out == 2);

  // A bench-comm file whose /regime names no regime, a file that is no HDF5, a scale of 0.
  const fs::path bad = dir.path / "bad-bench.h5";
  scape::run_file::write_bench_comm_file(bad, "mpi",
                                         {{"all_gather", "all_gather", "sleepy", 2, 4096, 1, 2048, 1e-3, 1, 1}});
  auto r = calibrate("c", bad.string());
  CHECK(r.code == 2);
  CHECK(r.output.find(bad.string() + ": /regime[0]: unknown regime sleepy") != std::string::npos);
  std::ofstream(dir.path / "junk.h5") << "not hdf5";
  r = calibrate("d", (dir.path / "junk.h5").string());
  CHECK(r.code == 2);
  CHECK(r.output.find((dir.path / "junk.h5").string() + ": cannot be read") != std::string::npos);
  r = run_scape("predict --calibrate " + fit + bench + " --links-from-bench --link-rate-scale 0");
  CHECK(r.code == 2);
  CHECK(r.output.find("--link-rate-scale") != std::string::npos);
}
