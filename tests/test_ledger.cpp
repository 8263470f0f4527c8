// Invariant 7: the byte ledger of every optimizer equals the closed forms of
// docs/algorithms.md ("Communication volume"), and the alpha-beta model its formula.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/ledger.hpp"
#include "core/schedule.hpp"
#include "kernels/kernel_types.hpp"
#include "optimizers/volume.hpp"
#include "quadratic_run.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using scape::testing::mixed_layout;
using scape::testing::run_quadratic;

namespace {

constexpr int kSteps = 5;

// purpose -> payload bytes of every call of that purpose in one step
using StepPayloads = std::map<std::string, std::vector<std::uint64_t>>;

StepPayloads payloads(const StepMetrics& m) {
  StepPayloads out;
  for (const auto& r : m.comm) out[r.purpose].push_back(r.payload_bytes);
  return out;
}

// The default mask: per shard 8 ceil(EF / 64) bytes, EF = k L + k + floor((|S_w| - 1) / 2^L)
// bits with L = floor(log2(|S_w| / k_w)) (0 for k_w = 0).
std::uint64_t elias_fano_mask_bytes(std::size_t n, int w, double rho) {
  const Sharding sharding(n, w);
  std::uint64_t bytes = 0;
  for (int o = 0; o < w; ++o) {
    const std::size_t size = sharding.size(o);
    const std::size_t k_w = k_for(rho, size);
    const unsigned low = kernels::ef_low_bits(size, k_w);
    const std::size_t bits = k_w == 0 ? 0 : k_w * low + k_w + (size - 1) / (std::size_t{1} << low);
    bytes += 8 * ((bits + 63) / 64);
  }
  return bytes;
}

void check_sent(const StepMetrics& m, int w) {
  for (const auto& r : m.comm) {
    const double n = static_cast<double>(r.payload_bytes);
    const double factor = r.kind == CollectiveKind::all_reduce ? 2.0 : 1.0;
    CHECK(r.bytes_sent_per_worker == doctest::Approx(factor * (w - 1) * n / w).epsilon(1e-12));
    CHECK(r.latency_steps == static_cast<int>(factor) * (w - 1));
  }
}

std::size_t k_partitioned(double rho, std::size_t n, int w) {
  const Sharding sh(n, w);
  std::size_t k = 0;
  for (int o = 0; o < w; ++o) k += k_for(rho, sh.size(o));
  return k;
}

}  // namespace

TEST_CASE("closed forms: alpha-beta time") {
  NetworkModel net{5e-6, 25e9};
  // all-reduce of 1 MB on 4 workers: 2*3 alpha + 2*(3/4)*1e6 / 25e9
  CHECK(alpha_beta_time(CollectiveKind::all_reduce, 4, 1e6, net) == doctest::Approx(6 * 5e-6 + 1.5e6 / 25e9));
  CHECK(alpha_beta_time(CollectiveKind::reduce_scatter, 8, 8e6, net) == doctest::Approx(7 * 5e-6 + 7e6 / 25e9));
  CHECK(alpha_beta_time(CollectiveKind::all_gather, 1, 8e6, net) == 0.0);
  ByteLedger ledger(4, net);
  ledger.record(CollectiveKind::all_gather, "x", 4000, true);
  ledger.record(CollectiveKind::all_reduce, "y", 4000, false);
  const auto recs = ledger.drain();
  REQUIRE(recs.size() == 2);
  const auto s = summarize(recs);
  CHECK(s.overlapped_time_s == doctest::Approx(3 * 5e-6 + 3000 / 25e9));
  CHECK(s.exposed_time_s == doctest::Approx(6 * 5e-6 + 6000 / 25e9));
  CHECK(s.bytes_sent_per_worker == doctest::Approx(3000 + 6000));
  CHECK(ledger.drain().empty());
  CHECK(ledger.totals().at("x").calls == 1);
}

TEST_CASE("closed forms: dense optimizers") {
  const ParamLayout layout = mixed_layout(2);
  const std::uint64_t n = layout.size();
  for (int w : {1, 2, 4, 7}) {
    for (WireType wire : {WireType::fp32, WireType::bf16}) {
      CAPTURE(w);
      OptimizerConfig c = scape::testing::earlier_formulation();
      c.type = OptimizerType::adams;
      c.wire_dtype = wire;
      c.sharded = false;
      auto run = run_quadratic(c, layout, w, kSteps);
      for (const auto& s : run.steps[0]) {
        CHECK(payloads(s.metrics) == StepPayloads{{"grad_all_reduce", {n * wire_bytes(wire)}}});
        check_sent(s.metrics, w);
      }
      c.sharded = true;
      c.param_dtype = WireType::bf16;
      run = run_quadratic(c, layout, w, kSteps);
      for (const auto& s : run.steps[0]) {
        CHECK(payloads(s.metrics) ==
              StepPayloads{{"grad_reduce_scatter", {n * wire_bytes(wire)}}, {"param_all_gather", {n * 2}}});
        check_sent(s.metrics, w);
      }
    }
  }
}

TEST_CASE("closed forms: SCAPE in every mode") {
  const ParamLayout layout = mixed_layout(4);
  const std::uint64_t n = layout.size();
  const std::uint64_t mask_bytes = 8 * ((n + 63) / 64);
  for (int w : {1, 2, 4, 7}) {
    for (double rho : {1.0, 0.1, 0.01}) {
      CAPTURE(w);
      CAPTURE(rho);
      const std::uint64_t k = k_partitioned(rho, n, w);
      OptimizerConfig c = scape::testing::earlier_formulation();
      c.type = OptimizerType::scape;
      c.sparsity = 1.0 - rho;

      // Sharded, masked update, lag 1: the first step also gathers M_1 at lag 0; the last
      // step starts no gather because no step uses its mask. The paper's bitmap, then the
      // default Elias-Fano mask.
      for (const MaskEncoding e : {MaskEncoding::bitmap, MaskEncoding::elias_fano}) {
        CAPTURE(to_string(e));
        c.mask_encoding = e;
        const std::uint64_t gathered = e == MaskEncoding::bitmap ? mask_bytes : elias_fano_mask_bytes(n, w, rho);
        const auto run = run_quadratic(c, layout, w, kSteps);
        for (int t = 1; t <= kSteps; ++t) {
          const auto& m = run.steps[0][static_cast<std::size_t>(t - 1)].metrics;
          StepPayloads expected{{"grad_reduce_scatter", {k * 4}}, {"param_all_gather", {k * 4}}};
          if (t == 1) expected["mask_all_gather"] = {gathered, gathered};
          else if (t < kSteps) expected["mask_all_gather"] = {gathered};
          CHECK(payloads(m) == expected);
          check_sent(m, w);
          for (const auto& r : m.comm) {
            // Only the lagged gathers of the next mask overlap compute.
            const bool lagged = r.purpose == "mask_all_gather" && &r == &m.comm.back() && t < kSteps;
            CHECK(r.overlapped == lagged);
          }
        }
      }
      c.mask_encoding = MaskEncoding::bitmap;  // the cases below use the paper's bitmap

      // Replicated, bf16 wire.
      c.sharded = false;
      c.wire_dtype = WireType::bf16;
      c.scape.mask_lag = 0;
      auto run = run_quadratic(c, layout, w, kSteps);
      for (const auto& s : run.steps[0]) {
        CHECK(payloads(s.metrics) == StepPayloads{{"mask_all_gather", {mask_bytes}}, {"grad_all_reduce", {k * 2}}});
        check_sent(s.metrics, w);
      }

      // Sharded, lag 0: update = dense makes the parameter all-gather dense; two_collectives
      // doubles the gradient payload.
      struct ShardedCase {
        UpdateMode update;
        SecondMoment second_moment;
        StepPayloads expected;
      };
      const ShardedCase sharded_cases[] = {
          {UpdateMode::dense, SecondMoment::single_buffer,
           {{"mask_all_gather", {mask_bytes}}, {"grad_reduce_scatter", {k * 4}}, {"param_all_gather", {n * 4}}}},
          {UpdateMode::masked, SecondMoment::two_collectives,
           {{"mask_all_gather", {mask_bytes}},
            {"grad_reduce_scatter", {k * 4}},
            {"accum_reduce_scatter", {k * 4}},
            {"param_all_gather", {k * 4}}}},
      };
      for (const ShardedCase& sc : sharded_cases) {
        CAPTURE(to_string(sc.update));
        CAPTURE(to_string(sc.second_moment));
        c = scape::testing::earlier_formulation();
        c.sparsity = 1.0 - rho;
        c.mask_encoding = MaskEncoding::bitmap;
        c.scape.update = sc.update;
        c.scape.second_moment = sc.second_moment;
        c.scape.mask_lag = 0;
        run = run_quadratic(c, layout, w, kSteps);
        for (const auto& s : run.steps[0]) CHECK(payloads(s.metrics) == sc.expected);
      }

      // local_union: W K 4 bytes of indices (bitmap encoding) or W Elias-Fano lists of K among
      // N (the default), then |M| values all-reduced.
      c = scape::testing::earlier_formulation();
      c.sparsity = 1.0 - rho;
      c.sharded = false;
      c.scape.mask_partition = MaskPartition::local_union;
      c.scape.mask_lag = 0;
      const std::uint64_t kg = k_for(rho, n);
      const unsigned low = kernels::ef_low_bits(n, kg);
      const std::uint64_t ef_list_bytes = 8 * ((kg * low + kg + (n - 1) / (std::uint64_t{1} << low) + 63) / 64);
      for (const MaskEncoding e : {MaskEncoding::bitmap, MaskEncoding::elias_fano}) {
        c.mask_encoding = e;
        run = run_quadratic(c, layout, w, kSteps);
        const std::uint64_t list_bytes = e == MaskEncoding::bitmap ? kg * 4 : ef_list_bytes;
        for (const auto& s : run.steps[0]) {
          CHECK(payloads(s.metrics) == StepPayloads{{"index_all_gather", {w * list_bytes}},
                                                    {"grad_all_reduce", {s.metrics.mask_size * 4}}});
          check_sent(s.metrics, w);
        }
      }
    }
  }
}

TEST_CASE("closed forms: raw-gradient top-k sends W K (4 + p_wire), or W (EF(N, K) + K p_wire) coded") {
  const ParamLayout layout = mixed_layout(2);
  const std::uint64_t n = layout.size();
  const std::uint64_t k = k_for(0.1, n);
  const unsigned low = kernels::ef_low_bits(n, k);
  const std::uint64_t code_bytes = 8 * ((k * low + k + (n - 1) / (std::uint64_t{1} << low) + 63) / 64);
  for (int w : {1, 2, 4, 7}) {
    for (WireType wire : {WireType::fp32, WireType::bf16}) {
      for (const MaskEncoding e : {MaskEncoding::bitmap, MaskEncoding::elias_fano}) {
        OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::topk_ef);
        c.sparsity = 0.9;
        c.wire_dtype = wire;
        c.mask_encoding = e;
        const auto run = run_quadratic(c, layout, w, kSteps);
        const std::uint64_t message =
            e == MaskEncoding::bitmap ? k * (4 + wire_bytes(wire)) : code_bytes + k * wire_bytes(wire);
        for (const auto& s : run.steps[0]) {
          CHECK(payloads(s.metrics) == StepPayloads{{"topk_all_gather", {w * message}}});
          check_sent(s.metrics, w);
          CHECK(s.metrics.fill_in >= 1.0);
          CHECK(s.metrics.fill_in <= w);
        }
      }
    }
  }
}

TEST_CASE("closed forms: shared-seed random-k all-reduces K p_wire, no index") {
  const ParamLayout layout = mixed_layout(2);
  const std::uint64_t n = layout.size();
  const std::uint64_t k = k_for(0.1, n);
  for (int w : {1, 2, 4, 7}) {
    for (WireType wire : {WireType::fp32, WireType::bf16}) {
      OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::randk_ef);
      c.sparsity = 0.9;
      c.wire_dtype = wire;
      const auto run = run_quadratic(c, layout, w, kSteps);
      for (const auto& s : run.steps[0]) {
        CHECK(payloads(s.metrics) == StepPayloads{{"grad_all_reduce", {k * wire_bytes(wire)}}});
        check_sent(s.metrics, w);
        CHECK(s.metrics.fill_in == 1.0);
      }
    }
  }
}

TEST_CASE("closed forms: 1-bit Adam all-reduces N p_wire until freeze_step, then exchanges and gathers P") {
  const ParamLayout layout = mixed_layout(2);
  const std::uint64_t n = layout.size();
  for (int w : {1, 2, 4, 7}) {
    for (std::size_t chunk : {std::size_t{64}, std::size_t{100}}) {
      CAPTURE(w);
      CAPTURE(chunk);
      OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::onebit_adam);
      c.onebit.freeze_step = 3;
      c.onebit.sign_chunk = chunk;
      c.wire_dtype = WireType::bf16;
      // P: the sign words of N (shard boundaries are multiples of 64) and one scale per chunk of each shard.
      const Sharding sh(n, w);
      std::uint64_t p = 8 * ((n + 63) / 64);
      for (int o = 0; o < w; ++o) p += 4 * ((sh.size(o) + chunk - 1) / chunk);
      const auto run = run_quadratic(c, layout, w, kSteps);
      for (std::size_t t = 0; t < run.steps[0].size(); ++t) {
        const auto& m = run.steps[0][t].metrics;
        if (t < 3) {
          CHECK(payloads(m) == StepPayloads{{"grad_all_reduce", {n * 2}}});
        } else {
          CHECK(payloads(m) == StepPayloads{{"momentum_all_to_all", {p}}, {"momentum_all_gather", {p}}});
        }
        check_sent(m, w);
      }
    }
  }
}

TEST_CASE("closed forms: PowerSGD all-reduces sum r'(n + m) factor entries in two collectives, vectors dense") {
  // mixed_layout(2): w1 26 x 31, b1 31, w2 14 x 50, ln 97; r' = min(r, rows, cols).
  const ParamLayout layout = mixed_layout(2);
  for (int w : {1, 2, 4}) {
    for (int r : {1, 4, 20}) {
      CAPTURE(w);
      CAPTURE(r);
      OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::powersgd);
      c.powersgd.rank = r;
      const std::uint64_t r2 = std::min(r, 14);
      const std::uint64_t p = 4 * (std::uint64_t(r) * 26 + r2 * 14), q = 4 * (std::uint64_t(r) * 31 + r2 * 50);
      const auto run = run_quadratic(c, layout, w, 3);
      for (const auto& s : run.steps[0]) {
        CHECK(payloads(s.metrics) == StepPayloads{{"lowrank_p_all_reduce", {p}},
                                                  {"lowrank_q_all_reduce", {q}},
                                                  {"grad_all_reduce", {4 * (31 + 97)}}});
        check_sent(s.metrics, w);
      }
      // The layout-aware volume model gives the same records.
      const auto predicted = step_collectives(c, layout, w, 2, 3, NetworkModel{});
      REQUIRE(predicted.size() == 3);
      CHECK(predicted[0].payload_bytes == p);
      CHECK(predicted[1].payload_bytes == q);
      CHECK(predicted[2].payload_bytes == 4 * (31 + 97));
    }
  }
}

TEST_CASE("closed forms: DeMo all-gathers W (Elias-Fano of K positions among N + K p_wire), K = chunks x k") {
  const ParamLayout layout = mixed_layout(2);
  const std::uint64_t n = layout.size();  // 1634 = 25 chunks of 64 and a tail of 34
  REQUIRE(n == 1634);
  for (int w : {1, 3}) {
    for (WireType wire : {WireType::fp32, WireType::bf16}) {
      for (std::uint64_t k : {std::uint64_t{4}, std::uint64_t{64}}) {
        CAPTURE(w);
        CAPTURE(k);
        OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::demo);
        c.demo.chunk = 64;
        c.demo.topk = k;
        c.wire_dtype = wire;
        const std::uint64_t entries = 25 * k + std::min<std::uint64_t>(k, 34);
        const unsigned low = kernels::ef_low_bits(n, entries);
        const std::uint64_t code = 8 * ((entries * low + entries + (n - 1) / (std::uint64_t{1} << low) + 63) / 64);
        const std::uint64_t message = code + entries * wire_bytes(wire);
        const auto run = run_quadratic(c, layout, w, 3);
        for (const auto& s : run.steps[0]) {
          CHECK(payloads(s.metrics) == StepPayloads{{"demo_all_gather", {w * message}}});
          check_sent(s.metrics, w);
        }
        CHECK(step_collectives(c, n, w, 1, 3, NetworkModel{})[0].payload_bytes == w * message);
      }
    }
  }
}

TEST_CASE("density warm-up: k follows rho^min(1,(t-1)/tau)") {
  const ParamLayout layout = mixed_layout(4);
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.sparsity = 0.99;
  c.density_warmup = 4;
  c.scape.mask_lag = 0;
  const auto run = run_quadratic(c, layout, 2, 7);
  for (int t = 1; t <= 7; ++t) {
    const double rho_t = std::pow(0.01, std::min(1.0, (t - 1) / 4.0));
    const auto& m = run.steps[0][static_cast<std::size_t>(t - 1)].metrics;
    CHECK(m.target_density == doctest::Approx(rho_t));
    CHECK(m.k_total == k_partitioned(rho_t, layout.size(), 2));
  }
  CHECK(run.steps[0][0].metrics.mask_density == 1.0);
}

TEST_CASE("backward buckets: the pipeline's exposed time and the modelled step, by hand") {
  const auto record = [](std::uint64_t bytes, double seconds, bool in_backward, bool overlapped) {
    CommRecord r;
    r.payload_bytes = bytes;
    r.modelled_time_s = seconds;
    r.in_backward = in_backward;
    r.overlapped = overlapped;
    return r;
  };
  // Buckets of 1 and 3 bytes behind a 2 s backward pass: ready at 0.5 s and 2 s. The first runs
  // 0.5..1.0, the second 2.0..2.1: 0.1 s exposed.
  const std::vector<CommRecord> small = {record(1, 0.5, true, false), record(3, 0.1, true, false)};
  CHECK(backward_buckets_exposed(small, 2.0) == doctest::Approx(0.1));
  // 3 and 1 bytes of 2 s and 0.2 s behind 1 s: ready at 0.75 and 1; the link is busy until 2.75,
  // the second ends at 2.95: 1.95 s exposed.
  const std::vector<CommRecord> slow = {record(3, 2.0, true, false), record(1, 0.2, true, false)};
  CHECK(backward_buckets_exposed(slow, 1.0) == doctest::Approx(1.95));
  // Other records are not buckets; no buckets, nothing exposed.
  CHECK(backward_buckets_exposed({record(8, 5.0, false, false), record(8, 5.0, false, true)}, 1.0) == 0.0);

  // The step: compute 3 s (backward 2 s), the small buckets (0.6 s, 0.1 s exposed, so 0.5 s of
  // link time inside the compute), a blocking all-gather of 0.3 s and a lagged all-gather of
  // 2.8 s that has 3 - 0.5 = 2.5 s of free link to hide in: 3 + 0.3 + 0.1 + 0.3.
  std::vector<CommRecord> step = small;
  step.push_back(record(64, 0.3, false, false));
  step.push_back(record(64, 2.8, false, true));
  CHECK(modelled_step_time(step, 3.0) == doctest::Approx(3.7));
  const CommSummary s = summarize(step);
  CHECK(s.backward_bucket_time_s == doctest::Approx(0.6));
  CHECK(s.exposed_time_s == doctest::Approx(0.3));
  CHECK(s.overlapped_time_s == doctest::Approx(2.8));
  CHECK(s.modelled_time_s == doctest::Approx(3.7));
  // Without buckets the step is compute + exposed + max(0, overlapped - compute), as before.
  CHECK(modelled_step_time({record(64, 0.3, false, false), record(64, 4.0, false, true)}, 3.0) ==
        doctest::Approx(3.0 + 0.3 + 1.0));
}

TEST_CASE("closed forms: DiLoCo all-reduces each fragment at outer_wire once every H steps, dense's bytes / H on average") {
  // mixed_layout(2): tensors of 806, 31, 700 and 97 (edges 0, 806, 837, 1537, 1634). F = 2 cuts at
  // the edge nearest 817 (806); F = 4 has no four whole-tensor fragments there (408.5 and 817 both
  // snap to 806), so it splits the elements: 408, 817, 1225. F = 3 (not dividing H = 4) cuts at the
  // edges nearest 544.7 and 1089.3 (806, 837) and syncs at steps 1, 2 and 4 of each period.
  const ParamLayout layout = mixed_layout(2);
  const std::uint64_t n = layout.size();
  const std::map<int, std::vector<std::uint64_t>> fragments = {
      {1, {n}}, {2, {806, 828}}, {3, {806, 31, 797}}, {4, {408, 409, 408, 409}}};
  const int steps = 8, h = 4;
  for (int w : {2, 3}) {
    for (const auto& [f, sizes] : fragments) {
      for (WireType wire : {WireType::fp32, WireType::bf16, WireType::fp8_e5m2}) {
        for (bool overlap : {false, true}) {
          CAPTURE(w);
          CAPTURE(f);
          CAPTURE(to_string(wire));
          CAPTURE(overlap);
          OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::diloco);
          c.outer.inner_steps = h;
          c.outer.overlap_outer = overlap;
          c.diloco.streaming_fragments = f;
          c.diloco.outer_wire = wire;
          const auto run = run_quadratic(c, layout, w, steps);
          double sent = 0;
          for (int t = 1; t <= steps; ++t) {
            CAPTURE(t);
            const auto& m = run.steps[0][static_cast<std::size_t>(t - 1)].metrics;
            const auto predicted = step_collectives(c, layout, w, t, steps, NetworkModel{});
            REQUIRE(predicted.size() == m.comm.size());
            for (std::size_t r = 0; r < m.comm.size(); ++r) {
              CHECK(predicted[r].payload_bytes == m.comm[r].payload_bytes);
              CHECK(predicted[r].overlapped == m.comm[r].overlapped);
              CHECK(m.comm[r].overlapped == (overlap && t < steps));  // the last step delivers at once
            }
            check_sent(m, w);
            sent += summarize(m.comm).bytes_sent_per_worker;
            int synced = -1;  // fragment k at the steps t with t mod H = floor((k + 1) H / F) mod H
            for (int k = 0; k < f; ++k) {
              if ((k + 1) * h / f % h == t % h) synced = k;
            }
            if (synced < 0) {
              CHECK(m.comm.empty());
              continue;
            }
            const std::uint64_t values = sizes[static_cast<std::size_t>(synced)];
            StepPayloads expected{{"outer_all_reduce", {values * wire_bytes(wire)}}};
            if (wire == WireType::fp8_e5m2) expected["outer_scale_all_gather"] = {4u * static_cast<unsigned>(w)};
            CHECK(payloads(m) == expected);
          }
          // Per step on average: the dense all-reduce of N values at the wire's width, divided by H
          // (fp8 adds its scale gather, 4 W bytes at every one of the F syncs of H steps).
          const double dense = 2.0 * (w - 1) / w * static_cast<double>(n * wire_bytes(wire));
          const double scales = wire == WireType::fp8_e5m2 ? f * (w - 1) / double(w) * 4.0 * w : 0.0;
          CHECK(sent / steps == doctest::Approx((dense + scales) / h).epsilon(1e-12));
        }
      }
    }
  }
}

TEST_CASE("closed forms: SparseLoCo all-gathers W messages every H steps, k indices and values a chunk") {
  // mixed_layout(2), chunk 64, sparsity 0.9: k = ceil(0.1 * 64) = 7 a chunk, min(7, length) of a
  // short one: 806 = 12 x 64 + 38 -> 91, 31 -> 7, 700 = 10 x 64 + 60 -> 77, 97 = 64 + 33 -> 14;
  // K = 189 entries in 4 tensors.
  const ParamLayout layout = mixed_layout(2);
  const std::uint64_t n = layout.size(), k = 189, tensors = 4;
  // Indices: within the chunk at bit_width(63) = 6 bits (bitmap), or Elias-Fano among N:
  // L = floor(log2(1634 / 189)) = 3, K L + K + (N - 1) >> L = 960 bits, 15 words.
  const std::map<MaskEncoding, std::uint64_t> index_bytes = {{MaskEncoding::bitmap, 8 * ((k * 6 + 63) / 64)},
                                                             {MaskEncoding::elias_fano, 120}};
  REQUIRE(index_bytes.at(MaskEncoding::bitmap) == 144);
  REQUIRE(kernels::ef_words(n, k) * 8 == 120);
  const int steps = 9, h = 3;
  for (int w : {1, 3}) {
    for (const auto& [encoding, indices] : index_bytes) {
      for (int bits : {0, 2, 8}) {
        for (WireType wire : {WireType::fp32, WireType::bf16}) {
          if (bits > 0 && wire == WireType::bf16) continue;  // the wire width is for unquantized values
          CAPTURE(w);
          CAPTURE(to_string(encoding));
          CAPTURE(bits);
          CAPTURE(to_string(wire));
          OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::sparseloco);
          c.outer.inner_steps = h;
          c.sparsity = 0.9;
          c.sparseloco.chunk = 64;
          c.sparseloco.quant_bits = bits;
          c.mask_encoding = encoding;
          c.wire_dtype = wire;
          // Values: a codebook per tensor (shift and 2^q bin means, fp32) and q-bit codes, or K at
          // the wire width.
          const std::uint64_t values =
              bits > 0 ? tensors * ((1u << bits) + 1) * 4 + 8 * ((k * bits + 63) / 64) : k * wire_bytes(wire);
          const std::uint64_t message = indices + values;
          if (encoding == MaskEncoding::bitmap && bits == 2) CHECK(message == 144 + 80 + 48);
          const auto run = run_quadratic(c, layout, w, steps);
          double sent = 0;
          for (int t = 1; t <= steps; ++t) {
            const auto& m = run.steps[0][static_cast<std::size_t>(t - 1)].metrics;
            CHECK(payloads(m) == (t % h == 0 ? StepPayloads{{"sparseloco_all_gather", {w * message}}} : StepPayloads{}));
            const auto predicted = step_collectives(c, layout, w, t, steps, NetworkModel{});
            REQUIRE(predicted.size() == m.comm.size());
            if (!predicted.empty()) CHECK(predicted[0].payload_bytes == w * message);
            check_sent(m, w);
            sent += summarize(m.comm).bytes_sent_per_worker;
          }
          CHECK(sent / steps == doctest::Approx((w - 1) * static_cast<double>(message) / h).epsilon(1e-12));
        }
      }
    }
  }
}
