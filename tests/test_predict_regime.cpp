// The predictor's regime: scaling efficiency never exceeds 1 (every shipped config, both
// scalings, overlap on and off, every optimizer), the break-even bandwidths against direct
// predictions at them, the residual-offload pipeline's closed form, and the cost terms of the
// optimizer step (selection and packing at their own throughputs).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "predict/prediction.hpp"
#include "predict/regime.hpp"
#include "predict/step_model.hpp"

namespace fs = std::filesystem;
using namespace scape;
using namespace scape::predict;
using namespace scape::presets;

namespace {

std::vector<fs::path> shipped_configs() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(SCAPE_SOURCE_DIR) / "experiments/configs/predict")) {
    if (e.path().extension() == ".json") out.push_back(e.path());
  }
  REQUIRE(out.size() >= 4);
  return out;
}

void check_bounded(const Prediction& p) {
  for (const auto& row : p.rows) {
    CAPTURE(row.workers);
    CHECK(row.efficiency <= 1.0);
    CHECK(row.baseline_efficiency <= 1.0);
    CHECK(row.efficiency > 0.0);
  }
}

}  // namespace

TEST_CASE("efficiency never exceeds 1: shipped configs, weak and strong, overlap on and off, every optimizer") {
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"overlap.grad_reduce=true", "overlap.param_gather=true"},
      {"overlap.grad_reduce=false", "overlap.param_gather=false"},
      {"optimizer.sparsity=0.9"},
      {"optimizer.sharded=false"},
      {"optimizer.type=\"topk_ef\"", "optimizer.sharded=false"},
      {"optimizer.type=\"adams\""},
      {"optimizer.mask_partition=\"local_union\"", "optimizer.sharded=false", "fill_in=3"},
      {"gpu.mfu=1", "network.inter.bandwidth_GBps=10000"},
  };
  for (const auto& file : shipped_configs()) {
    for (const auto& sets : variants) {
      CAPTURE(file.filename().string());
      CAPTURE(sets.empty() ? std::string("as shipped") : sets.front());
      const PredictConfig c = load_predict_config(file, sets);
      check_bounded(run_prediction(c));
      // Weak scaling at the per-GPU batch of the largest worker count: the case that gave 1.012.
      PredictConfig weak = c;
      weak.batch.scaling = Scaling::weak;
      weak.batch.per_gpu_sequences = std::max<std::int64_t>(1, static_cast<std::int64_t>(
                                                                   c.batch.sequences_per_gpu(c.workers.back())));
      check_bounded(run_prediction(weak));
    }
  }
}

TEST_CASE("efficiency: the reference is one GPU doing the whole W-GPU step") {
  PredictConfig c = load_predict_config(fs::path(SCAPE_SOURCE_DIR) / "experiments/configs/predict/paper-llama-1.8b-gh200.json",
                                        {"overlap.grad_reduce=true", "overlap.param_gather=true"});
  c.batch.scaling = Scaling::weak;
  c.batch.per_gpu_sequences = 8;
  const Prediction p = run_prediction(c);
  const auto& row = p.rows.back();
  REQUIRE(row.workers == 64);
  const StepPrediction one = predict_step(step_inputs(c, c.optimizer), 1, c.batch.global_tokens(64));
  CHECK(row.efficiency == one.step_s / (64 * row.optimizer.step_s));
  CHECK(row.efficiency <= 1.0);
}

TEST_CASE("break-even: the speedup is 1 and the baseline's efficiency 0.5 at the printed bandwidths") {
  for (const std::string name : {"paper-llama-1.8b-gh200.json", "h100-256-eth100g.json"}) {
    for (const std::string overlap : {"true", "false"}) {
      CAPTURE(name);
      CAPTURE(overlap);
      const PredictConfig c = load_predict_config(
          fs::path(SCAPE_SOURCE_DIR) / "experiments/configs/predict" / name,
          {std::string("overlap.grad_reduce=") + overlap, std::string("overlap.param_gather=") + overlap});
      const BreakEven b = break_even(c);
      const int w = c.workers.back();
      REQUIRE(b.workers == w);
      const auto at = [&](double GBps) {
        Prediction p = run_prediction(with_link_bandwidth(c, w, GBps));
        return p.rows.back();
      };
      if (std::isnan(b.speedup_one_GBps)) {
        // No crossing in range: the optimizer wins (or loses) at both ends.
        CHECK(b.speedup_above_one_everywhere == (at(kMinGBps).speedup > 1.0));
        CHECK(b.speedup_above_one_everywhere == (at(kMaxGBps).speedup > 1.0));
      } else {
        CHECK(at(b.speedup_one_GBps * 1.01).speedup < 1.0);
        CHECK(at(b.speedup_one_GBps * 0.99).speedup > 1.0);
      }
      REQUIRE(std::isfinite(b.baseline_half_efficiency_GBps));
      CHECK(at(b.baseline_half_efficiency_GBps * 1.01).baseline_efficiency > 0.5);
      CHECK(at(b.baseline_half_efficiency_GBps * 0.99).baseline_efficiency < 0.5);
      std::ostringstream out;
      print_break_even(out, c, b);
      CHECK(out.str().find("break-even at W = " + std::to_string(w)) != std::string::npos);
    }
  }
}

TEST_CASE("with_link_bandwidth sets the link the workers cross and drops per-kind links") {
  PredictConfig c = load_predict_config(fs::path(SCAPE_SOURCE_DIR) / "experiments/configs/predict/h100-256-eth100g.json", {});
  c.collectives[0] = LinkSpec{"", 1, 1};
  const PredictConfig across = with_link_bandwidth(c, 256, 7.0);
  CHECK(across.inter.bandwidth_GBps == 7.0);
  CHECK(across.intra.bandwidth_GBps == c.intra.bandwidth_GBps);
  CHECK(!across.collectives[0].has_value());
  const PredictConfig inside = with_link_bandwidth(c, 8, 7.0);
  CHECK(inside.intra.bandwidth_GBps == 7.0);
  CHECK(inside.inter.bandwidth_GBps == c.inter.bandwidth_GBps);
}

TEST_CASE("double-buffered offload: three-stage pipeline closed form") {
  // Copies slower than the kernels: (2u + k) / C + (C - 1) u / C - k with u = 4, k = 2, C = 4.
  CHECK(double_buffered_exposed(4.0, 2.0, 4) == doctest::Approx((2 * 4.0 + 2.0) / 4 + 3 * 4.0 / 4 - 2.0));
  // Kernels slower: only the first upload and the last download show, 2 u / C.
  CHECK(double_buffered_exposed(1.0, 8.0, 4) == doctest::Approx(2 * 1.0 / 4));
  // One chunk: nothing overlaps.
  CHECK(double_buffered_exposed(1.0, 8.0, 1) == doctest::Approx(2.0));
  CHECK(double_buffered_exposed(0.0, 8.0, 4) == 0.0);
}

TEST_CASE("optimizer step terms: selection, packing and offload at their own throughputs") {
  StepInputs in;
  in.optimizer.type = OptimizerType::scape;
  in.optimizer.sparsity = 0.99;
  in.optimizer.sharded = true;
  in.n_params = 134'217'728;  // 2^27: eight equal shards of 2^24
  in.flops_per_token = 6e8;
  in.gpu.memory_TBps = 4.0;
  in.topology = Topology{1, 1, NetworkModel{3e-6, 450e9}, NetworkModel{5e-6, 50e9}, {}};
  const StepPrediction base = predict_step(in, 8, 8192);
  const OptimizerBytes b = optimizer_bytes_by_kernel(in.optimizer, in.n_params, 8, 0);
  CHECK(b.select == 20.0 * 16'777'216);  // statistic and two passes over the own shard
  CHECK(base.select_s == doctest::Approx(20.0 * 16'777'216 / 4e12));
  CHECK(base.optimizer_s == doctest::Approx(base.optimizer_bytes / 4e12));
  CHECK(base.offload_s == 0.0);
  in.gpu.select_TBps = 1.0;
  in.gpu.pack_TBps = 0.5;
  const StepPrediction slow = predict_step(in, 8, 8192);
  CHECK(slow.select_s == doctest::Approx(4 * base.select_s));
  CHECK(slow.pack_s == doctest::Approx(8 * base.pack_s));
  CHECK(slow.state_s == base.state_s);
  // Offload: N floats up and down per pass, one pass at lag 1, on a 64 GB/s link.
  in.optimizer.residual_offload = true;
  in.gpu.host_link_GBps = 64;
  const StepPrediction off = predict_step(in, 8, 8192);
  const double n = 134'217'728.0;
  CHECK(off.offload_s == doctest::Approx(2 * 4 * n / 64e9));
  const double kernels = 12.0 * n / 4e12 + slow.select_s + slow.pack_s;
  const double chunks = std::ceil(n / static_cast<double>(in.optimizer.offload_chunk));
  CHECK(off.offload_exposed_s == doctest::Approx(double_buffered_exposed(4 * n / 64e9, kernels, chunks)));
  CHECK(off.optimizer_s == doctest::Approx(slow.optimizer_s + off.offload_exposed_s));
  in.optimizer.scape.mask_lag = 0;  // two passes
  CHECK(predict_step(in, 8, 8192).offload_s == doctest::Approx(4 * 4 * n / 64e9));
}
