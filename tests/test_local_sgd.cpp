// DiLoCo, Streaming DiLoCo and SparseLoCo (docs/algorithms.md, "DiLoCo" and "SparseLoCo"): the
// schedule and fragments, DiLoCo at W = 1 with outer_lr 1 and no momentum as its inner optimizer
// bit for bit, SparseLoCo's quantizer and message against hand-computed cases, one outer step of
// each against its formula, the metrics, and a resumed run against an uninterrupted one.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "config/config.hpp"
#include "optimizers/baselines/outer_loop.hpp"
#include "optimizers/baselines/sparseloco_codec.hpp"
#include "optimizers/make_optimizer.hpp"
#include "run_file/hdf5.hpp"
#include "sim/emulated_comm.hpp"
#include "sim/sim_run.hpp"
#include "tests/test_support.hpp"

using namespace scape;

namespace {

ParamLayout layout_of(std::initializer_list<std::size_t> sizes) {
  ParamLayout layout;
  const char* names[] = {"t0", "t1", "t2", "t3", "t4"};
  std::size_t i = 0;
  for (const std::size_t s : sizes) layout.add(names[i++], {s}, true);
  return layout;
}

// A gradient trace that does not depend on the parameters, different per worker and step.
float trace_gradient(int t, int worker, std::size_t j) {
  const double x = 0.37 * static_cast<double>(j) + 1.3 * t + 2.1 * worker;
  return static_cast<float>(0.5 * std::sin(x) + 0.1 * std::cos(0.11 * static_cast<double>(j) * t));
}

// Parameters in [1, 2]: an AdamW step of lr 1e-3 moves none of them by a factor near 2.
std::vector<float> initial_params(std::size_t n) {
  std::vector<float> theta(n);
  for (std::size_t j = 0; j < n; ++j) theta[j] = static_cast<float>(1.5 + 0.5 * std::sin(0.7 * static_cast<double>(j)));
  return theta;
}

struct Trace {
  std::vector<std::vector<std::vector<float>>> params;  // [worker][step] after the step
  std::vector<std::vector<StepMetrics>> metrics;        // [worker][step]
  std::vector<std::vector<StateMap>> states;            // [worker][step] after the step (with_states)
};

// Steps first_step..steps of W workers on the trace, from initial_params or what `resume` sets
// (it may load the optimizer's state and the parameters).
Trace run_trace(const OptimizerConfig& c, const ParamLayout& layout, int workers, int steps, bool with_states = false,
                int first_step = 1, const std::function<void(int, Optimizer&, std::vector<float>&)>& resume = {}) {
  Trace out;
  const auto w_count = static_cast<std::size_t>(workers);
  out.params.resize(w_count);
  out.metrics.resize(w_count);
  out.states.resize(w_count);
  sim::run_ranks(workers, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(c, layout, comm, steps);
    std::vector<float> theta = initial_params(layout.size()), g(layout.size());
    const auto w = static_cast<std::size_t>(comm.rank());
    if (resume) resume(comm.rank(), *opt, theta);
    for (int t = first_step; t <= steps; ++t) {
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = trace_gradient(t, comm.rank(), j);
      out.metrics[w].push_back(opt->step(theta, g));
      out.params[w].push_back(theta);
      if (with_states) {
        StateMap state;
        opt->save_state(state);
        out.states[w].push_back(std::move(state));
      }
    }
    opt->finish();
  });
  return out;
}

std::vector<float> state_floats(const StateMap& state, const std::string& name) {
  std::vector<float> v;
  get_state(state, name, v);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

OptimizerConfig outer_config(OptimizerType type, InnerRule inner) {
  OptimizerConfig c;
  c.type = type;
  c.inner = inner;
  c.sharded = false;
  c.lr = 1e-3;
  c.outer.inner_steps = 4;
  return c;
}

}  // namespace

TEST_CASE("fragments: tensor boundaries nearest f N / F, else an even split; the schedule syncs one every H / F") {
  // Tensors 10, 30, 20, 40 (edges 0, 10, 40, 60, 100): F = 2 cuts at 40 (nearest 50, tie with 60
  // goes low), F = 4 at 10 (25: 10 and 40 are 15 away, the lower wins), 40 (50) and 60 (75: 60 is
  // nearer than 100).
  const ParamLayout layout = layout_of({10, 30, 20, 40});
  CHECK(fragment_boundaries(layout, 1) == std::vector<std::size_t>{0, 100});
  CHECK(fragment_boundaries(layout, 2) == std::vector<std::size_t>{0, 40, 100});
  CHECK(fragment_boundaries(layout, 4) == std::vector<std::size_t>{0, 10, 40, 60, 100});
  // Five fragments of four tensors cannot be whole tensors: floor(f N / F).
  CHECK(fragment_boundaries(layout, 5) == std::vector<std::size_t>{0, 20, 40, 60, 80, 100});
  // One tensor of 7: 0, 2, 4, 7 for F = 3.
  CHECK(fragment_boundaries(layout_of({7}), 3) == std::vector<std::size_t>{0, 2, 4, 7});
  CHECK_THROWS_WITH_AS(fragment_boundaries(layout_of({3}), 4), doctest::Contains("optimizer.streaming_fragments: 4"),
                       std::invalid_argument);
  // H = 8, F = 4: a fragment every 2 steps, 0, 1, 2, 3, 0, ...; F = 1: the whole buffer every 8.
  std::vector<int> synced;
  for (int t = 1; t <= 10; ++t) synced.push_back(fragment_synced_at(t, 8, 4));
  CHECK(synced == std::vector<int>{-1, 0, -1, 1, -1, 2, -1, 3, -1, 0});
  CHECK(fragment_synced_at(8, 8, 1) == 0);
  CHECK(fragment_synced_at(7, 8, 1) == -1);
  CHECK(fragment_synced_at(16, 8, 1) == 0);
  // H = 10, F = 4 (4 does not divide 10): offsets floor(10/4) = 2, 5, 7, 10 of every period.
  synced.clear();
  for (int t = 1; t <= 20; ++t) synced.push_back(fragment_synced_at(t, 10, 4));
  CHECK(synced == std::vector<int>{-1, 0, -1, -1, 1, -1, 2, -1, -1, 3, -1, 0, -1, -1, 1, -1, 2, -1, -1, 3});
  // F = H: a fragment at every step.
  for (int t = 1; t <= 6; ++t) CHECK(fragment_synced_at(t, 3, 3) == (t - 1) % 3);
}

TEST_CASE("DiLoCo at W = 1 with outer_lr 1 and outer_momentum 0 is its inner optimizer, bit for bit") {
  // theta_g - (theta_g - theta_i) is theta_i exactly when theta_i / theta_g lies in [1/2, 2]
  // (Sterbenz): the parameters here stay in [0.9, 2.1] (checked), so every outer step hands back
  // the inner optimizer's parameters unchanged, and so does the delayed one.
  const ParamLayout layout = layout_of({40, 25, 64});
  const int steps = 24;
  for (const InnerRule inner : {InnerRule::adamw, InnerRule::adams}) {
    OptimizerConfig dense = outer_config(inner == InnerRule::adamw ? OptimizerType::adamw : OptimizerType::adams, inner);
    const Trace reference = run_trace(dense, layout, 1, steps);
    for (const auto& p : reference.params[0]) {
      for (const float x : p) REQUIRE((x > 0.9f && x < 2.1f));
    }
    struct Variant {
      const char* name;
      void (*apply)(OptimizerConfig&);
    };
    const Variant variants[] = {
        {"H 4", [](OptimizerConfig&) {}},
        {"H 1", [](OptimizerConfig& c) { c.outer.inner_steps = 1; }},
        {"H 4, F 2", [](OptimizerConfig& c) { c.diloco.streaming_fragments = 2; }},
        {"H 4, F 4, overlap_outer", [](OptimizerConfig& c) {
           c.diloco.streaming_fragments = 4;
           c.outer.overlap_outer = true;
         }},
        {"H 3, overlap_outer", [](OptimizerConfig& c) {
           c.outer.inner_steps = 3;
           c.outer.overlap_outer = true;
         }},
    };
    for (const auto& v : variants) {
      CAPTURE(std::string(to_string(inner)));
      CAPTURE(v.name);
      OptimizerConfig c = outer_config(OptimizerType::diloco, inner);
      c.outer.outer_lr = 1.0;
      c.diloco.outer_momentum = 0.0;
      v.apply(c);
      const Trace diloco = run_trace(c, layout, 1, steps);
      for (int t = 0; t < steps; ++t) {
        CAPTURE(t + 1);
        CHECK(same_bits(diloco.params[0][static_cast<std::size_t>(t)], reference.params[0][static_cast<std::size_t>(t)]));
      }
    }
    // The outer step does act: at outer_lr 0.7 the parameters leave the inner optimizer's at step 4.
    OptimizerConfig damped = outer_config(OptimizerType::diloco, inner);
    damped.diloco.outer_momentum = 0.0;
    const Trace d = run_trace(damped, layout, 1, steps);
    CHECK(same_bits(d.params[0][2], reference.params[0][2]));
    CHECK_FALSE(same_bits(d.params[0][3], reference.params[0][3]));
  }
}

TEST_CASE("SparseLoCo's quantizer: Templar's 6-sigma bins and bin means, by hand") {
  // [1, 2, 3, 10], 2 bits: shift 4, c = [-3, -2, -1, 6], sigma = sqrt(50 / 3), scale = 6 sigma / 4
  // = 6.1237; c / scale + 2 = [1.51, 1.67, 1.84, 2.98] -> codes 2, 2, 2, 3; bin 2 holds the mean
  // of -3, -2, -1 = -2, bin 3 holds 6: delivered 2, 2, 2, 10.
  const std::vector<float> v = {1, 2, 3, 10};
  const QuantizedValues two = quantize_statistical(v, 2);
  CHECK(two.shift == 4.0f);
  CHECK(two.codes == std::vector<std::uint8_t>{2, 2, 2, 3});
  CHECK(two.codebook == std::vector<float>{0, 0, -2, 6});
  CHECK(std::vector<float>{two.value(0), two.value(1), two.value(2), two.value(3)} == std::vector<float>{2, 2, 2, 10});
  // 8 bits: scale = 6 sigma / 256 = 0.09568; c / scale + 128 = [96.6, 107.1, 117.5, 190.7]: one
  // value a bin, each delivered exactly.
  const QuantizedValues eight = quantize_statistical(v, 8);
  CHECK(eight.codes == std::vector<std::uint8_t>{97, 107, 118, 191});
  for (std::size_t i = 0; i < v.size(); ++i) CHECK(eight.value(i) == v[i]);
  // An outlier past the range is clamped to the top bin: [0 x 7, 100] has shift 12.5, sigma =
  // sqrt(8750 / 7) = 35.36, scale 53.03; 87.5 / 53.03 + 2 = 3.65 rounds to 4, clamped to 3.
  std::vector<float> outlier(8, 0.0f);
  outlier[7] = 100.0f;
  const QuantizedValues clamped = quantize_statistical(outlier, 2);
  CHECK(clamped.codes == std::vector<std::uint8_t>{2, 2, 2, 2, 2, 2, 2, 3});
  CHECK(clamped.codebook[2] == -12.5f);
  CHECK(clamped.codebook[3] == 87.5f);
  CHECK(clamped.value(0) == 0.0f);
  CHECK(clamped.value(7) == 100.0f);
  // One value: no spread, scale 1, the middle bin, delivered exactly.
  const QuantizedValues one = quantize_statistical(std::vector<float>{-5.25f}, 2);
  CHECK(one.codes == std::vector<std::uint8_t>{2});
  CHECK(one.value(0) == -5.25f);
}

TEST_CASE("fixed-width packing: indices within a chunk round-trip at 12, 3 and 0 bits") {
  const std::vector<std::uint32_t> twelve = {4095, 0, 1234, 4000, 7, 2048};
  std::vector<std::uint64_t> words(kernels::words_for(twelve.size() * 12));
  pack_fixed_width(twelve, 12, words);
  CHECK((words[0] & 0xFFF) == 4095);
  CHECK(((words[0] >> 12) & 0xFFF) == 0);
  CHECK(((words[0] >> 24) & 0xFFF) == 1234);
  std::vector<std::uint32_t> back(twelve.size());
  unpack_fixed_width(words, 12, back);
  CHECK(back == twelve);
  // 3 bits: value 21 straddles the first two words (bits 63..65).
  std::vector<std::uint32_t> small(30);
  for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<std::uint32_t>((i * 5) % 8);
  std::vector<std::uint64_t> w3(kernels::words_for(small.size() * 3));
  pack_fixed_width(small, 3, w3);
  std::vector<std::uint32_t> b3(small.size());
  unpack_fixed_width(w3, 3, b3);
  CHECK(b3 == small);
  std::vector<std::uint32_t> none(4, 0), b0(4, 9);
  std::vector<std::uint64_t> w0;
  pack_fixed_width(none, 0, w0);
  unpack_fixed_width(w0, 0, b0);
  CHECK(b0 == none);
}

TEST_CASE("DiLoCo's outer step: the rank-order mean of Delta_i, torch's Nesterov SGD, and the metrics") {
  // overlap_outer leaves theta_i in place at the outer step, so the step's parameters are the
  // theta_i its pseudo-gradients came from; theta_global and the momentum come from the state.
  const ParamLayout layout = layout_of({40, 25});
  OptimizerConfig c = outer_config(OptimizerType::diloco, InnerRule::adamw);
  c.outer.inner_steps = 2;
  c.outer.overlap_outer = true;
  c.diloco.outer_momentum = 0.9;
  const int workers = 3;
  const Trace run = run_trace(c, layout, workers, 5, true);
  const std::size_t n = layout.size();
  for (const int sync : {2, 4}) {
    CAPTURE(sync);
    const auto before = static_cast<std::size_t>(sync - 2), at = static_cast<std::size_t>(sync - 1);
    const std::vector<float> global = state_floats(run.states[0][before], "outer.global");
    std::vector<float> buf = state_floats(run.states[0][before], "diloco.momentum");
    std::vector<std::vector<float>> delta(workers, std::vector<float>(n));
    std::vector<float> mean(n, 0.0f);
    for (std::size_t i = 0; i < workers; ++i) {
      for (std::size_t j = 0; j < n; ++j) delta[i][j] = global[j] - run.params[i][at][j];
    }
    for (std::size_t j = 0; j < n; ++j) mean[j] = ((delta[0][j] + delta[1][j]) + delta[2][j]) / 3.0f;
    std::vector<float> expected(n);
    for (std::size_t j = 0; j < n; ++j) {
      buf[j] = buf[j] * 0.9f + mean[j];
      expected[j] = global[j] + (buf[j] * 0.9f + mean[j]) * -0.7f;
    }
    for (std::size_t i = 0; i < workers; ++i) {
      CHECK(same_bits(state_floats(run.states[i][at], "outer.global"), expected));
      CHECK(same_bits(state_floats(run.states[i][at], "diloco.momentum"), buf));
      double norm = 0, drift = 0;
      for (std::size_t j = 0; j < n; ++j) {
        norm += double(delta[i][j]) * delta[i][j];
        const float d = mean[j] - delta[i][j];
        drift += double(d) * d;
      }
      CHECK(run.metrics[i][at].pseudo_grad_norm == doctest::Approx(std::sqrt(norm)).epsilon(1e-12));
      CHECK(run.metrics[i][at].param_drift == doctest::Approx(std::sqrt(drift)).epsilon(1e-12));
      CHECK(run.metrics[i][at].param_drift > 0);
      // No outer step at the steps between: NaN.
      CHECK(std::isnan(run.metrics[i][at - 1].pseudo_grad_norm));
      CHECK(std::isnan(run.metrics[i][at - 1].param_drift));
    }
  }
}

TEST_CASE("SparseLoCo's outer step: e <- beta e + Delta, the top 1 of every chunk of 3 sent, the rest kept") {
  // Tensors of 6 and 5: chunks [0, 3) [3, 6) | [6, 9) [9, 11), one entry each (sparsity 2/3).
  const ParamLayout layout = layout_of({6, 5});
  const std::size_t n = layout.size();
  for (const int bits : {0, 2}) {
    for (const MaskEncoding encoding : {MaskEncoding::bitmap, MaskEncoding::elias_fano}) {
      CAPTURE(bits);
      CAPTURE(std::string(to_string(encoding)));
      OptimizerConfig c = outer_config(OptimizerType::sparseloco, InnerRule::adams);
      c.outer.inner_steps = 2;
      c.outer.overlap_outer = true;
      c.outer.outer_lr = 0.8;
      c.sparsity = 2.0 / 3.0;
      c.sparseloco.chunk = 3;
      c.sparseloco.quant_bits = bits;
      c.sparseloco.ef_decay = 0.5;
      c.mask_encoding = encoding;
      const int workers = 2;
      const Trace run = run_trace(c, layout, workers, 5, true);
      for (const int sync : {2, 4}) {
        CAPTURE(sync);
        const auto before = static_cast<std::size_t>(sync - 2), at = static_cast<std::size_t>(sync - 1);
        const std::vector<float> global = state_floats(run.states[0][before], "outer.global");
        std::vector<float> mean(n, 0.0f);
        for (std::size_t i = 0; i < workers; ++i) {
          std::vector<float> e = state_floats(run.states[i][before], "sparseloco.error");
          for (std::size_t j = 0; j < n; ++j) e[j] = e[j] * 0.5f + (global[j] - run.params[i][at][j]);
          // The largest |e| of each chunk, the lower index on a tie.
          std::vector<std::size_t> picks;
          for (const auto& [lo, hi] : {std::pair{0, 3}, std::pair{3, 6}, std::pair{6, 9}, std::pair{9, 11}}) {
            std::size_t best = static_cast<std::size_t>(lo);
            for (auto j = static_cast<std::size_t>(lo); j < static_cast<std::size_t>(hi); ++j) {
              if (std::fabs(e[j]) > std::fabs(e[best])) best = j;
            }
            picks.push_back(best);
          }
          std::vector<float> sent = {e[picks[0]], e[picks[1]], e[picks[2]], e[picks[3]]};
          if (bits > 0) {  // one codebook per tensor
            for (const std::size_t first : {std::size_t{0}, std::size_t{2}}) {
              const QuantizedValues q = quantize_statistical(std::vector<float>{sent[first], sent[first + 1]}, bits);
              sent[first] = q.value(0);
              sent[first + 1] = q.value(1);
            }
          }
          for (std::size_t p = 0; p < 4; ++p) {
            e[picks[p]] = e[picks[p]] + -sent[p];
            mean[picks[p]] += sent[p];
          }
          CHECK(same_bits(state_floats(run.states[i][at], "sparseloco.error"), e));
          if (bits == 0) {
            for (const std::size_t p : picks) CHECK(e[p] == 0.0f);
          }
        }
        std::vector<float> expected(n);
        for (std::size_t j = 0; j < n; ++j) expected[j] = global[j] + (mean[j] / 2.0f) * -0.8f;
        for (std::size_t i = 0; i < workers; ++i) {
          CHECK(same_bits(state_floats(run.states[i][at], "outer.global"), expected));
          CHECK(std::isnan(run.metrics[i][at].param_drift));
          CHECK(run.metrics[i][at].pseudo_grad_norm > 0);
        }
      }
    }
  }
}

TEST_CASE("a run resumed from a checkpoint taken while an outer step is on the wire continues bit for bit") {
  const ParamLayout layout = layout_of({40, 25});
  for (const OptimizerType type : {OptimizerType::diloco, OptimizerType::sparseloco}) {
    CAPTURE(std::string(to_string(type)));
    OptimizerConfig c = outer_config(type, InnerRule::adamw);
    c.outer.inner_steps = 3;
    c.outer.overlap_outer = true;
    c.sparsity = 0.8;
    c.sparseloco.chunk = 16;
    c.diloco.outer_wire = WireType::fp8_e5m2;
    const Trace whole = run_trace(c, layout, 2, 9, true);
    // Step 6 started an outer step that step 7 applies: resume from there.
    const Trace resumed = run_trace(c, layout, 2, 9, false, 7, [&](int rank, Optimizer& opt, std::vector<float>& theta) {
      const auto w = static_cast<std::size_t>(rank);
      opt.load_state(whole.states[w][5]);
      theta = whole.params[w][5];
    });
    for (std::size_t w = 0; w < 2; ++w) {
      for (std::size_t t = 0; t < 3; ++t) CHECK(same_bits(resumed.params[w][t], whole.params[w][t + 6]));
    }
    // The last step is an outer step delivered at once: the workers end on theta_global; the one
    // before it had each on its own parameters.
    CHECK(same_bits(whole.params[0][8], whole.params[1][8]));
    CHECK_FALSE(same_bits(whole.params[0][7], whole.params[1][7]));
  }
}

TEST_CASE("DiLoCo's fp8 outer wire delivers the mean to e5m2's precision, 1 byte a value") {
  const ParamLayout layout = layout_of({300});
  OptimizerConfig exact = outer_config(OptimizerType::diloco, InnerRule::adamw);
  exact.outer.inner_steps = 2;
  exact.outer.overlap_outer = true;  // theta_i stays in place at step 2: Delta_i = theta_0 - theta_i
  exact.diloco.outer_momentum = 0.0;
  OptimizerConfig fp8 = exact;
  fp8.diloco.outer_wire = WireType::fp8_e5m2;
  const Trace a = run_trace(exact, layout, 3, 3, true), b = run_trace(fp8, layout, 3, 3, true);
  const std::vector<float> ga = state_floats(a.states[0][1], "outer.global");
  const std::vector<float> gb = state_floats(b.states[0][1], "outer.global");
  const std::vector<float> theta0 = initial_params(300);
  // e5m2 keeps 2 mantissa bits: each Delta_i is off by at most 1/8 of the largest (its scale
  // puts that one in [2^14, 2^15), far from the subnormals), so the step by 0.7/8 of it.
  double worst = 0, largest = 0;
  for (std::size_t j = 0; j < 300; ++j) {
    worst = std::max(worst, std::fabs(double(gb[j]) - ga[j]));
    for (std::size_t i = 0; i < 3; ++i) largest = std::max(largest, std::fabs(double(theta0[j]) - b.params[i][1][j]));
  }
  CHECK(worst > 0);
  CHECK(worst <= 0.7 * largest / 8 * 1.001 + 1e-6);
  const auto& records = b.metrics[0][1].comm;
  REQUIRE(records.size() == 2);
  CHECK(records[0].purpose == "outer_scale_all_gather");
  CHECK(records[0].payload_bytes == 3 * 4);
  CHECK(records[1].purpose == "outer_all_reduce");
  CHECK(records[1].payload_bytes == 300);
  CHECK(records[1].overlapped);
  CHECK(b.metrics[0][0].comm.empty());
}

TEST_CASE("modelled time: the outer step is charged at its step, and overlap_outer hides it behind compute") {
  // W = 4 on a 1 GB/s link with 10 us a message step: the all-reduce of N = 65 fp32 values at the
  // outer step, 2 (W - 1) = 6 latency steps and 2 (W - 1) / W N 4 bytes.
  const ParamLayout layout = layout_of({40, 25});
  const NetworkModel net{1e-5, 1e9};
  const double sync_s = 6 * 1e-5 + 1.5 * 65 * 4 / 1e9;
  for (const bool overlap : {false, true}) {
    CAPTURE(overlap);
    OptimizerConfig c = outer_config(OptimizerType::diloco, InnerRule::adamw);
    c.outer.inner_steps = 2;
    c.outer.overlap_outer = overlap;
    std::vector<std::vector<CommRecord>> records(4);
    sim::run_ranks(4, net, [&](Communicator& comm) {
      auto opt = make_optimizer(c, layout, comm, 5);
      std::vector<float> theta = initial_params(layout.size()), g(layout.size(), 0.1f);
      for (int t = 1; t <= 5; ++t) {
        const auto m = opt->step(theta, g);
        if (comm.rank() == 0 && t <= 4) records[static_cast<std::size_t>(t - 1)] = m.comm;
      }
    });
    CHECK(records[0].empty());
    REQUIRE(records[1].size() == 1);
    CHECK(records[1][0].modelled_time_s == doctest::Approx(sync_s));
    // Between outer steps only the compute; at one, the sync on top, or what compute does not hide.
    for (const double compute : {1e-5, 1e-3}) {
      CHECK(modelled_step_time(records[0], compute) == doctest::Approx(compute));
      const double expected = overlap ? compute + std::max(0.0, sync_s - compute) : compute + sync_s;
      CHECK(modelled_step_time(records[1], compute) == doctest::Approx(expected));
    }
  }
}

TEST_CASE("scape run: a run killed between outer steps resumes from its checkpoint with each worker's own parameters") {
  // Between outer steps every worker holds parameters of its own, which a checkpoint of rank 0's
  // alone would lose; the failure at step 8 leaves the checkpoint of step 6, where H = 4 puts the
  // workers 2 steps past their last outer step (and overlap_outer 1 step into the delay at 5).
  scape::testing::TempDir dir;
  for (const char* type : {"diloco", "sparseloco"}) {
    CAPTURE(type);
    const nlohmann::json j = {
        {"name", "resume"}, {"seed", 2}, {"workers", 3}, {"steps", 12},
        {"model", {{"type", "quadratic"}, {"size", 500}}},
        {"optimizer", {{"type", type}, {"lr", 0.01}, {"inner_steps", 4}, {"overlap_outer", true}, {"chunk", 64},
                       {"sparsity", 0.9}}},
        {"log", {{"save_params", true}}}};
    const auto config = config::parse_experiment(j, dir.path);
    train::RunOptions whole;
    whole.quiet = true;
    whole.out = dir.path / (std::string(type) + "-whole.h5");
    REQUIRE(sim::run_simulated(config, whole).status == train::RunStatus::completed);
    train::RunOptions killed = whole;
    killed.out = dir.path / (std::string(type) + "-killed.h5");
    killed.checkpoint_every = 3;
    killed.before_step = [](int rank, int step) {
      if (rank == 1 && step == 8) throw std::runtime_error("injected failure");
    };
    REQUIRE(sim::run_simulated(config, killed).status == train::RunStatus::failed);
    train::RunOptions resumed = killed;
    resumed.before_step = {};
    resumed.resume = true;
    REQUIRE(sim::run_simulated(config, resumed).status == train::RunStatus::completed);
    const auto params = [](const std::filesystem::path& f) {
      return run_file::File::open(f, run_file::Access::read).open_dataset("/final/params").read_all<float>();
    };
    CHECK(same_bits(params(resumed.out), params(whole.out)));
  }
}
