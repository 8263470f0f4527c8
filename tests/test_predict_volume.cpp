// The predictor's bytes are the simulator's bytes: step_collectives (optimizers/volume.cpp) against
// the ledger records of real simulator runs over the noisy quadratic, collective for
// collective and step for step (step 1 and the last step under lag 1 included), for every
// optimizer family and switch that changes the collectives, at W in {1, 2, 4, 7}.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "optimizers/volume.hpp"
#include "predict/model_layout.hpp"
#include "predict/step_model.hpp"
#include "presets/model_presets.hpp"
#include "quadratic_run.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using scape::testing::mixed_layout;
using scape::testing::run_quadratic;

namespace {

constexpr int kSteps = 4;

struct Case {
  const char* name;
  OptimizerConfig config = scape::testing::earlier_formulation();
};

OptimizerConfig make(OptimizerType type, bool sharded) {
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.type = type;
  c.sharded = sharded;
  c.lr = 0.01;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"adams replicated", make(OptimizerType::adams, false)});
  out.push_back({"adamw sharded", make(OptimizerType::adamw, true)});
  auto bf16 = make(OptimizerType::adams, true);
  bf16.wire_dtype = WireType::bf16;
  out.push_back({"adams sharded bf16 grads", bf16});
  out.push_back({"scape sharded", make(OptimizerType::scape, true)});
  out.push_back({"scape replicated", make(OptimizerType::scape, false)});
  auto dense_update = make(OptimizerType::scape, true);
  dense_update.scape.update = UpdateMode::dense;
  out.push_back({"scape dense update", dense_update});
  auto two = make(OptimizerType::scape, true);
  two.scape.second_moment = SecondMoment::two_collectives;
  out.push_back({"scape two_collectives sharded", two});
  auto two_rep = make(OptimizerType::scape, false);
  two_rep.scape.second_moment = SecondMoment::two_collectives;
  out.push_back({"scape two_collectives replicated", two_rep});
  auto lag0 = make(OptimizerType::scape, true);
  lag0.scape.mask_lag = 0;
  out.push_back({"scape lag 0", lag0});
  auto warm = make(OptimizerType::scape, true);
  warm.density_warmup = 2;
  warm.param_dtype = WireType::bf16;
  out.push_back({"scape density warm-up, bf16 params", warm});
  auto local = make(OptimizerType::scape, false);
  local.scape.mask_partition = MaskPartition::local_union;
  out.push_back({"scape local_union", local});
  auto local_warm = local;
  local_warm.density_warmup = 2;
  out.push_back({"scape local_union density warm-up", local_warm});
  // The paper formulation's per-tensor owners (the layout overload), its fp8 payload and clip_grad.
  for (const bool sharded : {true, false}) {
    auto paper = make(OptimizerType::scape, sharded);
    paper.scape.formulation = Formulation::paper;
    paper.scape.mask_scope = MaskScope::tensor;
    paper.scape.dense_tensors = {"b1", "ln"};
    paper.adams_form = AdamsForm::automatic;
    out.push_back({sharded ? "scape paper, per tensor, sharded" : "scape paper, per tensor, replicated", paper});
  }
  auto fp8 = make(OptimizerType::scape, false);
  fp8.scape.formulation = Formulation::paper;
  fp8.wire_dtype = WireType::fp8_e5m2;
  out.push_back({"scape paper fp8, replicated", fp8});
  auto clip = make(OptimizerType::scape, true);
  clip.clip_grad = 1e-3;
  out.push_back({"scape clip_grad sharded", clip});
  auto dense_clip = make(OptimizerType::adams, true);
  dense_clip.clip_grad = 1e-3;
  out.push_back({"adams clip_grad sharded", dense_clip});
  auto topk = make(OptimizerType::topk_ef, false);
  topk.wire_dtype = WireType::bf16;
  out.push_back({"topk_ef", topk});
  auto randk = make(OptimizerType::randk_ef, false);
  randk.density_warmup = 2;
  out.push_back({"randk_ef density warm-up", randk});
  auto onebit = make(OptimizerType::onebit_adam, false);
  onebit.onebit.freeze_step = 2;
  onebit.onebit.sign_chunk = 100;
  out.push_back({"onebit_adam freeze 2", onebit});
  auto powersgd = make(OptimizerType::powersgd, false);
  powersgd.powersgd.rank = 3;
  out.push_back({"powersgd rank 3", powersgd});
  auto demo = make(OptimizerType::demo, false);
  demo.demo.chunk = 50;
  demo.demo.topk = 5;
  out.push_back({"demo chunk 50 top 5", demo});
  return out;
}

void check_same(const CommRecord& predicted, const CommRecord& simulated) {
  CHECK(predicted.purpose == simulated.purpose);
  CHECK(predicted.kind == simulated.kind);
  CHECK(predicted.payload_bytes == simulated.payload_bytes);
  CHECK(predicted.bytes_sent_per_worker == simulated.bytes_sent_per_worker);
  CHECK(predicted.latency_steps == simulated.latency_steps);
  CHECK(predicted.overlapped == simulated.overlapped);
  CHECK(predicted.modelled_time_s == simulated.modelled_time_s);
}

}  // namespace

TEST_CASE("step_collectives reports the simulator's bytes per collective, step for step") {
  const ParamLayout layout = mixed_layout();
  for (const auto& c : cases()) {
    for (const double sparsity : {0.9, 0.99}) {
      for (const int w : {1, 2, 4, 7}) {
        OptimizerConfig config = c.config;
        config.sparsity = sparsity;
        CAPTURE(c.name);
        CAPTURE(sparsity);
        CAPTURE(w);
        const auto run = run_quadratic(config, layout, w, kSteps);
        std::map<std::string, CommTotals> totals;
        for (int t = 1; t <= kSteps; ++t) {
          CAPTURE(t);
          for (int rank = 0; rank < w; ++rank) {
            const StepMetrics& m = run.steps[static_cast<std::size_t>(rank)][static_cast<std::size_t>(t - 1)].metrics;
            // local_union's |M_t| depends on the data: the simulator's value goes in.
            const bool local = config.type == OptimizerType::scape &&
                               config.scape.mask_partition == MaskPartition::local_union;
            // PowerSGD's bytes and SCAPE's per-tensor k need the tensor shapes: the layout overload.
            const bool per_tensor = config.type == OptimizerType::scape && config.scape.mask_scope == MaskScope::tensor;
            const auto predicted =
                config.type == OptimizerType::powersgd || per_tensor
                    ? step_collectives(config, layout, w, t, kSteps, NetworkModel{})
                    : step_collectives(config, layout.size(), w, t, kSteps, NetworkModel{},
                                       local ? std::optional<std::size_t>(m.mask_size) : std::nullopt);
            REQUIRE(predicted.size() == m.comm.size());
            for (std::size_t i = 0; i < predicted.size(); ++i) check_same(predicted[i], m.comm[i]);
            if (rank != 0) continue;
            for (const auto& r : predicted) {
              auto& tot = totals[r.purpose];
              tot.calls += 1;
              tot.payload_bytes += r.payload_bytes;
              tot.bytes_sent_per_worker += r.bytes_sent_per_worker;
            }
          }
        }
        REQUIRE(totals.size() == run.ledger_totals.size());
        for (const auto& [purpose, tot] : run.ledger_totals) {
          CAPTURE(purpose);
          REQUIRE(totals.count(purpose) == 1);
          CHECK(totals[purpose].calls == tot.calls);
          CHECK(totals[purpose].payload_bytes == tot.payload_bytes);
          CHECK(totals[purpose].bytes_sent_per_worker == tot.bytes_sent_per_worker);
        }
      }
    }
  }
}

TEST_CASE("step_collectives: lag 1 gathers two masks at step 1 and none at the last step") {
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.sparsity = 0.99;
  c.mask_encoding = MaskEncoding::bitmap;
  const auto first = step_collectives(c, 10000, 4, 1, 3, NetworkModel{});
  const auto middle = step_collectives(c, 10000, 4, 2, 3, NetworkModel{});
  const auto last = step_collectives(c, 10000, 4, 3, 3, NetworkModel{});
  auto masks = [](const std::vector<CommRecord>& rs) {
    int n = 0;
    for (const auto& r : rs) n += r.purpose == "mask_all_gather";
    return n;
  };
  CHECK(masks(first) == 2);
  CHECK_FALSE(first.front().overlapped);
  CHECK(first.back().overlapped);
  CHECK(masks(middle) == 1);
  CHECK(masks(last) == 0);
  // 8 ceil(N/64) bytes: 157 words for N = 10000.
  CHECK(middle.back().payload_bytes == 8 * 157);
  // Elias-Fano: shards of 2560 (k_w = 26, L = 6: 156 + 26 + 39 = 221 bits) and 2320 (k_w = 24,
  // L = 6: 144 + 24 + 36 = 204 bits), 4 words each.
  c.mask_encoding = MaskEncoding::elias_fano;
  CHECK(step_collectives(c, 10000, 4, 2, 3, NetworkModel{}).back().payload_bytes == 8 * 16);
  // delta and auto exchange sizes first (8 W bytes); at step 2 under lag 1 the next mask is
  // coded against one of the same density: with every position kept, k_w kept bits and no new
  // position (1 + 1 words per shard); with none kept, delta's largest size (1 + 1 + 4 words).
  for (const MaskEncoding e : {MaskEncoding::delta, MaskEncoding::auto_select}) {
    c.mask_encoding = e;
    const auto kept_all = step_collectives(c, 10000, 4, 2, 3, NetworkModel{}, std::nullopt, 1.0);
    REQUIRE(kept_all.size() == 4);
    CHECK(kept_all[2].purpose == "mask_size_all_gather");
    CHECK(kept_all[2].payload_bytes == 8 * 4);
    CHECK(kept_all[3].payload_bytes == 8 * 4 * 2);
    const auto kept_none = step_collectives(c, 10000, 4, 2, 3, NetworkModel{});
    CHECK(kept_none[3].payload_bytes == 8 * 4 * (e == MaskEncoding::delta ? 6 : 5));
  }
  CHECK_THROWS_AS(step_collectives(c, 10000, 4, 2, 3, NetworkModel{}, std::nullopt, 1.5), std::invalid_argument);
}

TEST_CASE("step_collectives rejects what the optimizer would reject") {
  OptimizerConfig c = scape::testing::earlier_formulation();
  CHECK_THROWS_AS(step_collectives(c, 0, 4, 1, 3, NetworkModel{}), std::invalid_argument);
  CHECK_THROWS_AS(step_collectives(c, 1000, 0, 1, 3, NetworkModel{}), std::invalid_argument);
  CHECK_THROWS_AS(step_collectives(c, 1000, 4, 4, 3, NetworkModel{}), std::invalid_argument);
  c.sparsity = 1.5;
  CHECK_THROWS_AS(step_collectives(c, 1000, 4, 1, 3, NetworkModel{}), std::invalid_argument);
  OptimizerConfig local = scape::testing::earlier_formulation();
  local.sharded = false;
  local.scape.mask_partition = MaskPartition::local_union;
  local.sparsity = 0.9;  // K = 100 of 1000 on 4 workers: |M| in [100, 400]
  CHECK_NOTHROW(step_collectives(local, 1000, 4, 2, 3, NetworkModel{}, 400));
  CHECK_THROWS_AS(step_collectives(local, 1000, 4, 2, 3, NetworkModel{}, 401), std::invalid_argument);
  CHECK_THROWS_AS(step_collectives(local, 1000, 4, 2, 3, NetworkModel{}, 99), std::invalid_argument);
  // PowerSGD's factors depend on the tensor shapes, which N alone does not give.
  OptimizerConfig powersgd = scape::testing::earlier_replicated(OptimizerType::powersgd);
  CHECK_THROWS_WITH_AS(step_collectives(powersgd, 1000, 4, 1, 3, NetworkModel{}), doctest::Contains("tensor shapes"),
                       std::invalid_argument);
}

TEST_CASE("predict_step costs exactly the ledger's collectives") {
  predict::StepInputs in;
  in.optimizer.sparsity = 0.9;
  in.n_params = 123457;
  in.flops_per_token = 1e6;
  in.topology.inter = NetworkModel{5e-6, 50e9};
  const int t = predict::steady_state_step(in.optimizer);
  const auto expected = step_collectives(in.optimizer, in.n_params, 7, t, t + 1, in.topology.inter);
  const auto s = predict::predict_step(in, 7, 1000);
  REQUIRE(s.collectives.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) check_same(s.collectives[i].record, expected[i]);
}

namespace {

// K by hand: over each owner's range (all of N replicated, the shard sharded), every tensor
// piece keeps max(1, floor(rho n)) = max(1, n / 100) at rho = 0.01, or all n when its name holds
// "norm" or "bias".
std::size_t hand_k(const ParamLayout& layout, int workers, bool sharded) {
  const Sharding shards(layout.size(), sharded ? workers : 1);
  std::size_t k = 0;
  for (int w = 0; w < shards.workers(); ++w) {
    for (const auto& slot : layout.slots()) {
      const std::size_t b = std::max(slot.offset, shards.begin(w)), e = std::min(slot.end(), shards.end(w));
      if (b >= e) continue;
      const bool dense = slot.name.find("norm") != std::string::npos || slot.name.find("bias") != std::string::npos;
      k += dense ? e - b : std::max<std::size_t>(1, (e - b) / 100);
    }
  }
  return k;
}

}  // namespace

TEST_CASE("predict_step counts SCAPE's K over the model's tensors: per-tensor floors, norms and biases whole") {
  const scape::presets::ModelSpec spec = scape::presets::find_model_preset("gpt2-124m", "").spec;
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    predict::StepInputs in;
    in.optimizer.type = OptimizerType::scape;  // the paper formulation, mask_scope tensor, norm and bias dense
    in.optimizer.sparsity = 0.99;
    in.optimizer.sharded = sharded;
    in.layout = predict::tensor_layout(spec);
    in.n_params = in.layout.size();
    in.flops_per_token = 1e6;
    const int workers = 8;
    const std::size_t k = hand_k(in.layout, workers, sharded);
    // The one-tensor approximation differs: the 0.12M norm and bias elements are not on its mask.
    CHECK(k > mask_k(in.optimizer, in.n_params, workers, 0.01) + 100000);
    CHECK(mask_k(in.optimizer, in.layout, workers, 0.01) == k);
    const auto s = predict::predict_step(in, workers, 1000);
    const char* payload = sharded ? "grad_reduce_scatter" : "grad_all_reduce";
    int found = 0;
    for (const auto& c : s.collectives) {
      if (c.record.purpose != payload) continue;
      ++found;
      CHECK(c.record.payload_bytes == 4 * k);  // fp32 values
    }
    CHECK(found == 1);
  }
}
