// SCAPE's fp8 e5m2 payload (docs/algorithms.md, "FP8 payload"): the rounding on hand-picked
// values, the quantizer's error identity, the conservation law with the rounding error kept in
// the residual, one byte per value in the ledger, and the configurations fp8 rejects.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/optimizer.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/fp8.hpp"
#include "optimizers/make_optimizer.hpp"
#include "sim/emulated_comm.hpp"
#include "train/noisy_quadratic.hpp"

using namespace scape;

TEST_CASE("round_to_e5m2: two mantissa bits, ties to even, subnormals to 2^-16") {
  using kernels::round_to_e5m2;
  CHECK(round_to_e5m2(1.0f) == 1.0f);
  CHECK(round_to_e5m2(1.25f) == 1.25f);
  CHECK(round_to_e5m2(1.125f) == 1.0f);   // halfway between 1 and 1.25: the even mantissa 00
  CHECK(round_to_e5m2(1.375f) == 1.5f);   // halfway between 1.25 and 1.5: the even mantissa 10
  CHECK(round_to_e5m2(1.2f) == 1.25f);
  CHECK(round_to_e5m2(-3.3f) == -3.5f);
  CHECK(round_to_e5m2(57344.0f) == 57344.0f);
  CHECK(round_to_e5m2(0x1p-14f) == 0x1p-14f);          // smallest normal
  CHECK(round_to_e5m2(0x1p-16f) == 0x1p-16f);          // smallest subnormal
  CHECK(round_to_e5m2(3 * 0x1p-17f) == 0x1p-15f);      // 1.5 quanta: to the even 2
  CHECK(round_to_e5m2(0x1p-17f) == 0.0f);              // half a quantum: to the even 0
  CHECK(round_to_e5m2(1.2f * 0x1p-16f) == 0x1p-16f);
  CHECK(std::signbit(round_to_e5m2(-0x1p-18f)));       // the sign survives a flush to zero
}

TEST_CASE("quantize_e5m2: q is e5m2 of v / W 2^-s, and v = W q 2^s + error") {
  const std::vector<float> v = {0.3f, -1.7f, 12.5f, 1e-6f, 0.0f};
  std::vector<float> q(v.size()), error(v.size());
  kernels::quantize_e5m2(v, 3.0f, 2, q, error);
  for (std::size_t i = 0; i < v.size(); ++i) {
    CAPTURE(i);
    CHECK(q[i] == kernels::round_to_e5m2((v[i] / 3.0f) * 0.25f));
    CHECK(error[i] == v[i] - 3.0f * (q[i] * 4.0f));
    CHECK(std::abs(error[i]) <= std::abs(v[i]) * 0.125f + 3.0f * 4.0f * 0x1p-17f);  // half an ulp of 2 bits
  }
  CHECK(q[2] == 1.0f);  // 12.5 / 3 / 4 = 1.0417 rounds to 1
}

TEST_CASE("fp8 payload: one byte a value on the wire, and the scale's all-gather") {
  ParamLayout layout;
  layout.add("w", {40, 30}, true);
  layout.add("norm.w", {30}, false);
  OptimizerConfig c;
  c.sparsity = 0.9;
  c.sharded = false;
  c.wire_dtype = WireType::fp8_e5m2;
  scape::train::QuadraticSpec spec;
  spec.seed = 3;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  std::vector<StepMetrics> metrics;
  sim::run_ranks(3, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(c, layout, comm, 3);
    std::vector<float> theta(layout.size()), g(layout.size());
    problem.initial_params(theta);
    for (int t = 1; t <= 3; ++t) {
      problem.gradient(theta, t, comm.rank(), g);
      const StepMetrics m = opt->step(theta, g);
      if (comm.rank() == 0) metrics.push_back(m);
    }
  });
  for (const StepMetrics& m : metrics) {
    bool reduced = false, scaled = false;
    for (const CommRecord& r : m.comm) {
      if (r.purpose == "grad_all_reduce") {
        CHECK(r.payload_bytes == m.k_total);  // K values of 1 byte
        reduced = true;
      }
      if (r.purpose == "fp8_scale_all_gather") {
        CHECK(r.payload_bytes == 3 * sizeof(float));
        scaled = true;
      }
    }
    CHECK(reduced);
    CHECK(scaled);
  }
}

TEST_CASE("fp8 payload: the configurations it has no meaning for exit naming the key") {
  OptimizerConfig c;
  c.sharded = false;
  c.wire_dtype = WireType::fp8_e5m2;
  CHECK_NOTHROW(c.validate());
  OptimizerConfig dense = c;
  dense.type = OptimizerType::adams;
  CHECK_THROWS_WITH_AS(dense.validate(), doctest::Contains("optimizer.wire_dtype: fp8_e5m2 is SCAPE's payload"),
                       std::invalid_argument);
  OptimizerConfig params = c;
  params.param_dtype = WireType::fp8_e5m2;
  CHECK_THROWS_WITH_AS(params.validate(), doctest::Contains("optimizer.param_dtype"), std::invalid_argument);
  OptimizerConfig sharded = c;
  sharded.sharded = true;
  CHECK_THROWS_WITH_AS(sharded.validate(), doctest::Contains("set optimizer.sharded = false"), std::invalid_argument);
  OptimizerConfig offload = c;
  offload.residual_offload = true;
  CHECK_THROWS_WITH_AS(offload.validate(), doctest::Contains("residual_offload"), std::invalid_argument);
}
