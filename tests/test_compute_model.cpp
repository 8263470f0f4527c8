// The FLOP-based compute of the modelled step time (compute.type = "flops"): hand values of the
// FLOPs and seconds, agreement with `scape predict`'s compute to the last bit, the checks of the
// compute section, and a simulated run whose step_time_model adds that compute to the
// communication.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "config/compute_model.hpp"
#include "config/config.hpp"
#include "config/model_shapes.hpp"
#include "model/gpt.hpp"
#include "predict/step_model.hpp"
#include "presets/gpu_presets.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"
#include "test_support.hpp"

namespace cfg = scape::config;
using nlohmann::json;

namespace {

// The quickstart's shape: 2 layers, width 64, 4 heads, 64-token blocks and vocabulary, 4
// sequences per worker.
json quickstart_like(const json& compute) {
  return {{"workers", 4},
          {"steps", 3},
          {"model", {{"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"block_size", 64}, {"vocab_size", 64}}},
          {"data", {{"batch_size", 4}, {"tokens", 20000}}},
          {"optimizer", {{"type", "scape"}, {"sparsity", 0.9}}},
          {"eval", {{"interval", 3}, {"batches", 1}}},
          {"log", {{"oracle", false}}},
          {"compute", compute}};
}

cfg::ExperimentConfig parse(const json& j) { return cfg::parse_experiment(j, "."); }

std::string error_of(const json& j) {
  try {
    parse(j);
  } catch (const cfg::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the run's gpt shape has the parameters the model lays out") {
  for (const auto& [layers, heads, width, block, vocab] :
       std::vector<std::tuple<int, int, int, int, int>>{{2, 4, 64, 64, 64}, {3, 2, 48, 32, 256}}) {
    const auto c = parse({{"model",
                           {{"n_layer", layers}, {"n_head", heads}, {"n_embd", width}, {"block_size", block},
                            {"vocab_size", vocab}}}});
    scape::model::GptConfig g{layers, heads, width, block, vocab};
    CHECK(scape::presets::parameter_count(scape::config::predictor_model_spec(c.model)) ==
          scape::model::transformer_layout(scape::model::transformer_shape(g)).size());
  }
}

TEST_CASE("the run's llama shape has the parameters the model lays out (grouped queries, default and given width)") {
  for (const auto& [layers, heads, kv_heads, width, ffn] :
       std::vector<std::tuple<int, int, int, int, int>>{{2, 4, 0, 64, 0}, {3, 4, 2, 48, 96}}) {
    const auto c = parse({{"model",
                           {{"type", "llama"}, {"n_layer", layers}, {"n_head", heads}, {"n_kv_head", kv_heads},
                            {"n_embd", width}, {"block_size", 32}, {"vocab_size", 64}, {"ffn_hidden", ffn}}}});
    const auto spec = scape::config::predictor_model_spec(c.model);
    CHECK(spec.family == scape::presets::Family::llama);
    CHECK_FALSE(spec.tied_embeddings);
    CHECK(scape::presets::parameter_count(spec) == scape::config::language_model_spec(c.model).layout().size());
  }
}

TEST_CASE("flops: FLOPs per token and seconds per step against hand values") {
  const auto c = parse(quickstart_like({{"type", "flops"}, {"device", "gh200"}, {"mfu", 0.4}}));
  // N = V d + T d + L (12 d^2 + 13 d) + 2 d = 4096 + 4096 + 2 * 50048 + 128 = 108288; the
  // position table (T d = 4096) is only looked up: N_matmul = 104192. Causal attention adds
  // 6 L T d = 6 * 2 * 64 * 64 = 49152. 6 * 104192 + 49152 = 674304 FLOPs per token.
  CHECK(scape::presets::training_flops_per_token(scape::config::predictor_model_spec(c.model), 64,
                                                 scape::presets::AttentionFlops::causal) == 674304.0);
  // 4 sequences of 64 tokens on a GH200 (989 TFLOP/s dense bf16) at MFU 0.4.
  CHECK(scape::config::modelled_compute_seconds(c) == doctest::Approx(674304.0 * 256 / (989e12 * 0.4)).epsilon(1e-12));
  const auto a100 = parse(quickstart_like({{"type", "flops"}, {"device", "a100"}, {"mfu", 0.5}}));
  CHECK(scape::config::modelled_compute_seconds(a100) ==
        doctest::Approx(674304.0 * 256 / (312e12 * 0.5)).epsilon(1e-12));
  CHECK(std::isnan(scape::config::modelled_compute_seconds(parse(quickstart_like({{"type", "measured"}})))));
}

TEST_CASE("flops: the same seconds as scape predict's compute for that shape, batch and GPU") {
  for (const char* device : {"a100", "h100", "h200", "gh200"}) {
    CAPTURE(device);
    const auto c = parse(quickstart_like({{"type", "flops"}, {"device", device}, {"mfu", 0.3}}));
    scape::predict::StepInputs in;
    in.n_params = scape::presets::parameter_count(scape::config::predictor_model_spec(c.model));
    in.flops_per_token = scape::presets::training_flops_per_token(scape::config::predictor_model_spec(c.model), 64,
                                                                  scape::presets::AttentionFlops::causal);
    const auto& preset = scape::presets::find_gpu_preset(device, "gpu.preset");
    in.gpu.peak_TFLOPs = preset.peak_bf16_TFLOPs;
    in.gpu.memory_TBps = preset.memory_TBps;
    in.gpu.mfu = 0.3;
    CHECK(scape::predict::predict_step(in, 1, 4.0 * 64).compute_s() == scape::config::modelled_compute_seconds(c));
  }
}

TEST_CASE("the compute section: defaults, choices and ranges, named in the error") {
  const json resolved = parse(json::object()).to_json();
  CHECK(resolved["compute"] == json{{"type", "measured"}});
  CHECK(parse(quickstart_like({{"type", "flops"}})).to_json()["compute"] ==
        json{{"type", "flops"}, {"device", "h100"}, {"mfu", scape::presets::kDefaultMfu}});
  CHECK(parse(quickstart_like({{"type", "flops"}, {"mfu", 1}})).compute.mfu == 1.0);
  CHECK(error_of(quickstart_like({{"type", "flops"}, {"device", "tpu"}})).find("compute.device") != std::string::npos);
  CHECK(error_of(quickstart_like({{"type", "flops"}, {"mfu", 0}})).find("compute.mfu") != std::string::npos);
  CHECK(error_of(quickstart_like({{"type", "flops"}, {"mfu", 1.5}})).find("compute.mfu") != std::string::npos);
  CHECK(error_of(quickstart_like({{"type", "gpu"}})).find("compute.type") != std::string::npos);
  CHECK(error_of(quickstart_like({{"device", "h100"}})).find("compute.device") != std::string::npos);
  CHECK(error_of({{"model", {{"type", "quadratic"}}}, {"compute", {{"type", "flops"}}}}).find("compute.type") !=
        std::string::npos);
}

TEST_CASE("a simulated run: compute_time_model is the FLOP time (flops) or compute_time (measured)") {
  scape::testing::TempDir dir;
  for (const char* type : {"flops", "measured"}) {
    CAPTURE(type);
    json compute = {{"type", type}};
    if (std::string(type) == "flops") compute["device"] = "gh200";
    const auto c = parse(quickstart_like(compute));
    scape::train::RunOptions options;
    options.out = dir / (std::string(type) + ".h5");
    options.quiet = true;
    REQUIRE(scape::sim::run_simulated(c, options).status == scape::train::RunStatus::completed);
    const auto f = scape::run_file::File::open(options.out, scape::run_file::Access::read);
    const auto column = [&](const char* name) {
      return f.open_dataset(std::string("/metrics/") + name).read_all<double>();
    };
    const auto model = column("compute_time_model"), measured = column("compute_time"),
               step = column("step_time_model"), comm = column("comm_time_model"),
               exposed = column("comm_time_exposed");
    REQUIRE(model.size() == 3);
    for (std::size_t t = 0; t < model.size(); ++t) {
      CAPTURE(t);
      CHECK(model[t] == (std::string(type) == "flops" ? scape::config::modelled_compute_seconds(c) : measured[t]));
      // The lagged mask all-gather (the overlapped part) hides behind the compute up to its length.
      const double overlapped = comm[t] - exposed[t];
      CHECK(step[t] == doctest::Approx(model[t] + exposed[t] + std::max(0.0, overlapped - model[t])).epsilon(1e-12));
    }
  }
}

TEST_CASE("compute.type sleep: each rank's step takes at least compute.seconds, and the model takes those seconds") {
  const json sleep = {{"type", "sleep"}, {"seconds", 0.05}};
  const auto c = parse(quickstart_like(sleep));
  CHECK(c.to_json()["compute"] == sleep);  // device and mfu do not apply: not recorded
  CHECK(scape::config::modelled_compute_seconds(c) == 0.05);
  CHECK(scape::config::describe_step_time_model(c).find("0.05 s a step slept") != std::string::npos);
  CHECK(error_of(quickstart_like({{"type", "sleep"}})).find("compute.seconds") != std::string::npos);
  CHECK(error_of(quickstart_like({{"type", "sleep"}, {"seconds", 0}})).find("compute.seconds") != std::string::npos);
  CHECK(error_of(quickstart_like({{"type", "flops"}, {"seconds", 1}})).find("compute.seconds") != std::string::npos);

  scape::testing::TempDir dir;
  scape::train::RunOptions options;
  options.out = dir / "sleep.h5";
  options.quiet = true;
  REQUIRE(scape::sim::run_simulated(c, options).status == scape::train::RunStatus::completed);
  const auto f = scape::run_file::File::open(options.out, scape::run_file::Access::read);
  const auto wall = f.open_dataset("/metrics/compute_wall_time").read_all<double>();
  const auto model = f.open_dataset("/metrics/compute_time_model").read_all<double>();
  REQUIRE(wall.size() == 3);
  for (std::size_t t = 0; t < wall.size(); ++t) {
    CAPTURE(t);
    CHECK(wall[t] >= 0.05);  // the 50 ms a step stands for, the gradient's own time inside them
    CHECK(model[t] == 0.05);
  }
}
