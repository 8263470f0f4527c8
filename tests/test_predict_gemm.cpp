// The per-GEMM compute model (docs/PREDICTING.md, "Per-GEMM compute"): the GEMMs add up to the
// training FLOPs, the curve fit recovers the parameters it was generated from, the step-table fit
// under the GEMM model recovers a generated table and reproduces the measured ones, the held-out
// model both ways, the shipped calibrations and the GH200 preset agree, and a prediction config
// with gpu.compute_model "gemm" computes as the table rows do.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "config/json_section.hpp"
#include "predict/gemm_model.hpp"
#include "predict/measured_table.hpp"
#include "predict/predict_config.hpp"
#include "predict/prediction.hpp"
#include "predict/table_model.hpp"
#include "predict/table_report.hpp"

namespace fs = std::filesystem;
using namespace scape::predict;
using namespace scape::presets;

namespace {

const fs::path kRoot = SCAPE_SOURCE_DIR;

Calibration shipped(const std::string& name) {
  std::ifstream in(kRoot / "experiments/hardware" / name);
  return calibration_from_hardware(nlohmann::json::parse(in), name);
}

MeasuredTable measured(const std::string& model) {
  return read_measured_table(kRoot / "experiments/measured" / (model + "-step-times.csv"));
}

double speedup_at_64(const Calibration& c, const std::string& model, const std::string& method) {
  const double dense = predict_table_row(c, MeasuredRow{model, "adams", 64, 0, 0}).step_s;
  return dense / predict_table_row(c, MeasuredRow{model, method, 64, 0, 0}).step_s;
}

}  // namespace

TEST_CASE("the GEMMs add up to the training FLOPs but for the norm weights") {
  for (const char* name : {"llama-500m", "llama-1.8b", "gpt2-124m", "llama2-7b"}) {
    CAPTURE(name);
    const ModelSpec m = find_model_preset(name, "").spec;
    const int seq = 2048, micro = 4;
    const ComputeWork w = compute_work(m, seq, micro);
    double flops = 0;
    for (const Gemm& g : w.gemms) flops += g.flops();
    const double expected = training_flops_per_token(m, seq, AttentionFlops::causal) * seq * micro;
    CHECK(w.tokens == seq * micro);
    CHECK(flops / expected == doctest::Approx(1).epsilon(2e-3));
    CHECK(flops < expected);  // the norms' (and gpt2's biases') parameters are no GEMM's
  }
}

TEST_CASE("a GEMM's intensity and efficiency: hand values") {
  const Gemm square{"square", 4096, 4096, 4096, 1};
  CHECK(square.intensity() == doctest::Approx(4096.0 / 3));
  const Gemm head{"scores", 2048, 2048, 128, 1};
  CHECK(head.intensity() == doctest::Approx(2048.0 * 2048 * 128 / (2048 * 128 * 2 + 2048.0 * 2048)));
  const GemmCurve curve{1000, 200, 0.8, 5};
  CHECK(gemm_efficiency(curve, Gemm{"at ridge", 600, 600, 600, 1}) == doctest::Approx(0.4));
  // 1000 GEMM FLOPs-worth at 1 TFLOP/s... in seconds: F (1 + r / x) / P, and bytes / B.
  ComputeWork w;
  w.gemms.push_back(Gemm{"at ridge", 600, 600, 600, 2});
  w.elementwise_bytes = 5e12;
  const ComputeSeconds s = compute_seconds(w, curve);
  CHECK(s.gemm_at_full_efficiency == doctest::Approx(2.0 * 2 * 600 * 600 * 600 * 2 / 1e15));
  CHECK(s.elementwise == doctest::Approx(1.0));
  CHECK(s.total(curve) == doctest::Approx(s.gemm_at_full_efficiency / 0.8 + 1.0));
  CHECK_THROWS_AS(compute_seconds(w, GemmCurve{}), std::invalid_argument);
}

TEST_CASE("fit_gemm_curve recovers the curve its samples were generated from") {
  const GemmCurve truth{989, 150, 0.72, 4.9};
  std::vector<GemmSample> samples;
  for (const double n : {64.0, 128.0, 256.0, 1024.0, 4096.0, 8192.0}) {
    Gemm g{"g", 8192, n, 2048, 3};
    samples.push_back(GemmSample{g, g.flops() / (truth.peak_TFLOPs * 1e12 * gemm_efficiency(truth, g))});
  }
  const GemmCurve fit = fit_gemm_curve(samples, truth.peak_TFLOPs, truth.memory_TBps);
  CHECK(fit.max_efficiency == doctest::Approx(truth.max_efficiency).epsilon(1e-9));
  CHECK(fit.ridge_flop_per_byte == doctest::Approx(truth.ridge_flop_per_byte).epsilon(1e-9));
  // One shape cannot tell the efficiency from the ridge.
  const std::vector<GemmSample> one(3, samples.front());
  CHECK_THROWS_AS(fit_gemm_curve(one, 989, 4.9), std::invalid_argument);
}

TEST_CASE("a table generated under the GEMM model is recovered by its fit within 1%") {
  Calibration truth;
  truth.gemm = gh200_curve_shape();
  truth.gemm.max_efficiency = 0.7;
  truth.achieved_flops = 1;  // unused by the rows once there is a curve
  truth.optimizer_Bps = 90e9;
  truth.combined = LinkFit{500e-6, 6e9, 0};
  MeasuredTable table;
  table.file = "synthetic.csv";
  for (const auto method : kStepMethods) {
    for (const int gpus : {4, 8, 16, 32, 64}) {
      MeasuredRow r{"llama-1.8b", std::string(method), gpus, 0, 0};
      r.value = predict_table_row(truth, r).step_s * 1e3;
      table.rows.push_back(r);
    }
  }
  const Calibration fit = fit_step_table(table, {}, TableCompute::gemm);
  CHECK(fit.gemm.max_efficiency == doctest::Approx(0.7).epsilon(0.01));
  CHECK(fit.gemm.ridge_flop_per_byte == truth.gemm.ridge_flop_per_byte);  // given, not fitted
  CHECK(fit.optimizer_Bps == doctest::Approx(truth.optimizer_Bps).epsilon(0.01));
  CHECK(fit.combined.alpha_s == doctest::Approx(truth.combined.alpha_s).epsilon(0.01));
  CHECK(fit.combined.bandwidth_Bps == doctest::Approx(truth.combined.bandwidth_Bps).epsilon(0.01));
  CHECK(check_table(table, fit).worst_abs_error < 0.01);
}

TEST_CASE("the shipped calibrations are the fits to their tables, and the GH200 preset holds the 500M one") {
  for (const auto& [file, model] : {std::pair{"tacc-vista-measured.json", "llama-500m"},
                                    std::pair{"tacc-vista-measured-1.8b.json", "llama-1.8b"}}) {
    CAPTURE(file);
    const Calibration c = shipped(file);
    REQUIRE(c.gemm.fitted());
    const Calibration refit = fit_step_table(measured(model), {}, TableCompute::gemm);
    CHECK(refit.gemm.max_efficiency == doctest::Approx(c.gemm.max_efficiency).epsilon(1e-12));
    CHECK(refit.combined.bandwidth_Bps == doctest::Approx(c.combined.bandwidth_Bps).epsilon(1e-12));
    // The fitted model reproduces its own rows (docs/PREDICTING.md: 3.5% / 21.1% and 4.0% / 13.8%).
    const TableCheck own = check_table(measured(model), c);
    CHECK(own.mean_abs_error < 0.045);
    CHECK(own.worst_abs_error < 0.22);
  }
  const GemmCurve preset = find_gpu_preset("gh200", "").gemm;
  const GemmCurve vista = shipped("tacc-vista-measured.json").gemm;
  CHECK(preset.max_efficiency == doctest::Approx(vista.max_efficiency).epsilon(1e-12));
  CHECK(preset.ridge_flop_per_byte == doctest::Approx(vista.ridge_flop_per_byte).epsilon(1e-12));
  CHECK(preset.peak_TFLOPs == vista.peak_TFLOPs);
  CHECK(preset.memory_TBps == vista.memory_TBps);
  CHECK_FALSE(find_gpu_preset("h100", "").gemm.fitted());
}

TEST_CASE("leave one model out, both ways: the GEMM model against one FLOP rate") {
  // Fitted on one model's table, predicting the other's (docs/PREDICTING.md, "Per-GEMM compute").
  const Calibration on_500m = shipped("tacc-vista-measured.json");
  const Calibration on_1_8b = shipped("tacc-vista-measured-1.8b.json");
  const TableCheck held_1_8b = check_table(measured("llama-1.8b"), on_500m);
  const TableCheck held_500m = check_table(measured("llama-500m"), on_1_8b);
  MESSAGE("1.8B held out: mean ", held_1_8b.mean_abs_error, ", worst ", held_1_8b.worst_abs_error);
  MESSAGE("500M held out: mean ", held_500m.mean_abs_error, ", worst ", held_500m.worst_abs_error);
  CHECK(held_1_8b.mean_abs_error < 0.05);   // 4.8%; 15.6% with one FLOP rate
  CHECK(held_1_8b.worst_abs_error < 0.24);  // 23.4%, SCAPE d = 0.01 with DO at 64 GPUs
  CHECK(held_500m.mean_abs_error < 0.04);   // 3.7%; 15.0% with one FLOP rate
  CHECK(held_500m.worst_abs_error < 0.26);  // 25.4%, SCAPE d = 0.1 with DO and offload at 64 GPUs
  // Both fits find the same curve: the one parameter carries from one model to the other.
  CHECK(on_1_8b.gemm.max_efficiency == doctest::Approx(on_500m.gemm.max_efficiency).epsilon(0.005));
  // One FLOP rate fitted to 500M misses 1.8B's compute-bound cells by 12-20%; the curve does not.
  const Calibration flops_500m = fit_step_table(measured("llama-500m"), {}, TableCompute::flops);
  CHECK(check_table(measured("llama-1.8b"), flops_500m).mean_abs_error > 0.15);
  for (const auto& r : held_1_8b.rows) {
    if (r.row.gpus <= 8) CHECK(std::abs(r.error) < 0.07);
  }
  // The 64-GPU speedup of SCAPE d = 0.01 with DO and both offloads over dense AdamS, measured
  // 4987.2 / 1279.9 = 3.90: predicted 3.33 (within 15%), 3.13 with one FLOP rate.
  const double measured_speedup = 4987.157 / 1279.877;
  const double predicted = speedup_at_64(on_500m, "llama-1.8b", "scape_0.01_do_offload");
  MESSAGE("64-GPU speedup predicted ", predicted, " against ", measured_speedup);
  CHECK(std::abs(predicted / measured_speedup - 1) < 0.15);
}

TEST_CASE("a predicted table from the stored calibrations is the same byte for byte on every run") {
  const auto render = [](const std::string& file, const std::string& model) {
    std::ostringstream out;
    const MeasuredTable t = measured(model);
    print_table_check(out, t, check_table(t, shipped(file)), {});
    return out.str();
  };
  for (const auto& [file, model] : {std::pair{"tacc-vista-measured.json", "llama-1.8b"},
                                    std::pair{"tacc-vista-measured-1.8b.json", "llama-500m"}}) {
    const std::string first = render(file, model);
    CHECK(first.find("mean |error|") != std::string::npos);
    CHECK(render(file, model) == first);
  }
}

TEST_CASE("a bad gemm_curve names the file and the field") {
  std::ifstream in(kRoot / "experiments/hardware/tacc-vista-measured.json");
  const nlohmann::json good = nlohmann::json::parse(in);
  const auto error = [](const nlohmann::json& j) {
    try {
      calibration_from_hardware(j, "hw.json");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json j = good;
  j["gemm_curve"].erase("ridge_flop_per_byte");
  CHECK(error(j) == "hw.json: gemm_curve.ridge_flop_per_byte must be a number");
  j = good;
  j["gemm_curve"]["max_efficiency"] = 1.5;
  CHECK(error(j) == "hw.json: gemm_curve.max_efficiency must be <= 1");
  j = good;
  j["gemm_curve"]["memory_TBps"] = -4.9;
  CHECK(error(j) == "hw.json: gemm_curve.memory_TBps must be > 0");
  j = good;
  j["gemm_curve"] = 3;
  CHECK(error(j) == "hw.json: gemm_curve must be an object");
  CHECK(error(good) == "no error");
}

namespace {

const fs::path kVista18 = kRoot / "experiments/configs/predict/vista-llama-1.8b.json";

// The shipped Llama-1.8B config on Vista with `edit` applied before the hardware is merged.
PredictConfig vista_1_8b(const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(kVista18);
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  merge_hardware(j, kVista18.parent_path());
  return parse_predict_config(j);
}

}  // namespace

TEST_CASE("gpu.compute_model gemm: a prediction config computes as the measured table's rows do") {
  const PredictConfig c = load_predict_config(kVista18, {});
  REQUIRE(c.gemm_curve.fitted());
  CHECK(c.gemm_curve.max_efficiency == find_gpu_preset("gh200", "").gemm.max_efficiency);
  CHECK(c.to_json().at("gpu").at("compute_model") == "gemm");
  CHECK(c.to_json().at("batch").at("micro_sequences") == 8);
  const Prediction p = run_prediction(c);
  const Calibration vista = shipped("tacc-vista-measured.json");
  for (const auto& row : p.rows) {
    CAPTURE(row.workers);
    const StepPrediction table = predict_table_row(vista, MeasuredRow{"llama-1.8b", "adams_do", row.workers, 0, 0});
    CHECK(row.baseline.compute_s() == doctest::Approx(table.compute_s()).epsilon(1e-12));
  }
  // The same config at MFU: the 500M table's average rate, 1.8B's compute 21% slower.
  const PredictConfig mfu = vista_1_8b([](nlohmann::json& j) {
    j["gpu"]["compute_model"] = "mfu";
    j["batch"].erase("micro_sequences");
  });
  CHECK_FALSE(mfu.gemm_curve.fitted());
  const double ratio = run_prediction(mfu).rows.front().baseline.compute_s() / p.rows.front().baseline.compute_s();
  CHECK(ratio == doctest::Approx(557.0 / 460.1).epsilon(0.01));
}

TEST_CASE("gpu.compute_model gemm: what it needs, each missing one an error naming its field") {
  const auto error = [](const std::function<void(nlohmann::json&)>& edit) {
    try {
      vista_1_8b(edit);
    } catch (const scape::config::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  using J = nlohmann::json;
  CHECK(error([](J& j) {
          j["gpu"]["preset"] = "h100";
        }).find("gpu.compute_model: gemm needs a gpu.preset with a fitted GEMM curve") != std::string::npos);
  CHECK(error([](J& j) {
          j["batch"].erase("micro_sequences");
        }).find("batch.micro_sequences: required with gpu.compute_model") != std::string::npos);
  CHECK(error([](J& j) {
          j["batch"]["micro_sequences"] = 32;
        }).find("batch.micro_sequences: 32 exceeds the 16 sequences of one GPU at 64") != std::string::npos);
  CHECK(error([](J& j) {
          j["gpu"]["compute_model"] = "mfu";
        }).find("batch.micro_sequences: only valid with gpu.compute_model") != std::string::npos);
  CHECK(error([](J& j) {
          j["model"]["attention_flops"] = "full";
        }).find("model.attention_flops: gpu.compute_model \"gemm\"") != std::string::npos);
  CHECK(error([](J& j) { j["gpu"]["compute_model"] = "roofline"; }).find("gpu.compute_model") != std::string::npos);
  CHECK(error([](J&) {}) == "no error");
}
