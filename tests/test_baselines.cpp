// The comparison baselines beyond raw top-k (docs/algorithms.md, "Random-k with a shared
// seed", "1-bit Adam", "PowerSGD" and "DeMo"): properties the invariant and reference tests do
// not already cover -- random-k's shared mask, its uniformity and dense limit; 1-bit Adam's
// momentum conservation through both error feedbacks, its dense limit (freeze_step >= T) and
// lossless limit (sign_chunk = 1); PowerSGD's error feedback, shared rank-r delivery and dense
// limit (rank >= min(rows, cols)); DeMo's momentum conservation, top-k extraction, sign step
// and dense limit (k = chunk).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/schedule.hpp"
#include "optimizers/baselines/powersgd.hpp"
#include "optimizers/make_optimizer.hpp"
#include "quadratic_run.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using scape::testing::bit;
using scape::testing::for_each_dense_twin;
using scape::testing::mixed_layout;
using scape::testing::run_quadratic;
using scape::testing::RunRecord;

namespace {

OptimizerConfig randk_config(double density, std::uint64_t seed = 5) {
  OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::randk_ef);
  c.sparsity = 1.0 - density;
  c.lr = 1e-2;
  c.warmup_steps = 2;
  c.seed = seed;
  return c;
}

std::size_t popcount(const std::vector<std::uint64_t>& words) {
  std::size_t bits = 0;
  for (std::uint64_t w : words) bits += static_cast<std::size_t>(__builtin_popcountll(w));
  return bits;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("random-k: every worker uses the same K coordinates, new ones each step, set by the seed") {
  const ParamLayout layout = mixed_layout(4);
  const std::size_t n = layout.size();
  for (int w : {1, 2, 4, 7}) {
    CAPTURE(w);
    const auto run = run_quadratic(randk_config(0.05), layout, w, 8);
    for (std::size_t t = 0; t < 8; ++t) {
      CHECK(popcount(run.steps[0][t].mask) == k_for(0.05, n));
      for (int i = 1; i < w; ++i) CHECK(run.steps[static_cast<std::size_t>(i)][t].mask == run.steps[0][t].mask);
      // Every replica stays identical: the same g_bar reaches every worker.
      for (int i = 1; i < w; ++i) CHECK(same_bits(run.steps[static_cast<std::size_t>(i)][t].params_after, run.steps[0][t].params_after));
      if (t > 0) CHECK(run.steps[0][t].mask != run.steps[0][t - 1].mask);
      CHECK(run.steps[0][t].metrics.fill_in == 1.0);
    }
    // The mask does not depend on the gradients (another quadratic, same masks) but on the seed.
    const auto other_problem = run_quadratic(randk_config(0.05), layout, w, 8, 99);
    const auto other_seed = run_quadratic(randk_config(0.05, 6), layout, w, 8);
    CHECK(other_problem.steps[0][3].mask == run.steps[0][3].mask);
    CHECK(other_seed.steps[0][3].mask != run.steps[0][3].mask);
  }
}

TEST_CASE("random-k: each coordinate is picked with probability K / N") {
  // 300 steps at density 0.1: each coordinate's count is Binomial(300, ~0.1), mean 30, sd 5.2.
  // The mean over all coordinates is exactly 30 (K per step); a biased draw (say, towards low
  // indices, as a broken tie rule would give) shows in the halves and in the spread.
  ParamLayout layout;
  layout.add("w", {2000}, true);
  const int steps = 300;
  OptimizerConfig c = randk_config(0.1);
  c.lr = 1e-6;
  const auto run = run_quadratic(c, layout, 1, steps);
  std::vector<int> counts(layout.size(), 0);
  for (const auto& s : run.steps[0]) {
    for (std::size_t j = 0; j < layout.size(); ++j) counts[j] += bit(s.mask, j);
  }
  double first_half = 0, sum = 0, sum_sq = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    if (j < counts.size() / 2) first_half += counts[j];
    sum += counts[j];
    sum_sq += double(counts[j]) * counts[j];
  }
  const double mean = sum / counts.size();
  const double var = sum_sq / counts.size() - mean * mean;
  CHECK(mean == doctest::Approx(30.0));
  // Half the picks in each half: the sd of first_half is about sqrt(2000 * 27 / 2 / 2) ~ 82.
  CHECK(std::fabs(first_half - sum / 2) < 400);
  // Binomial variance n p (1 - p) = 27 (without replacement a little less); 3x off means a bug.
  CHECK(var > 27.0 / 2);
  CHECK(var < 27.0 * 1.5);
}

TEST_CASE("random-k at density 1 is dense replicated AdamS (AdamW with inner = adamw), bit for bit") {
  for_each_dense_twin(randk_config(1.0), mixed_layout(2), {1, 2, 4, 7}, 10, [](const RunRecord& a, const RunRecord& b) {
    for (std::size_t t = 0; t < 10; ++t) {
      CHECK(same_bits(a.steps[0][t].params_after, b.steps[0][t].params_after));
      CHECK(a.steps[0][t].metrics.residual_norm == 0.0);
    }
    // The same collective, of the same size: no index travels.
    CHECK(a.ledger_totals.at("grad_all_reduce").payload_bytes == b.ledger_totals.at("grad_all_reduce").payload_bytes);
  });
}

// ---- 1-bit Adam (docs/algorithms.md, "1-bit Adam").

namespace {

OptimizerConfig onebit_config(int freeze_step, std::size_t chunk) {
  OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::onebit_adam);
  c.lr = 1e-2;
  c.onebit.freeze_step = freeze_step;
  c.onebit.sign_chunk = chunk;
  return c;
}

// What one worker saw of a 1-bit Adam run, in double: the sum of its local momenta
// b1 m_{t-1} + (1 - b1) g_t over the compressed steps, the sum of the synchronized momenta
// m_t, and its worker and server errors at the end.
struct OnebitAccount {
  std::vector<double> local_sum, sync_sum;
  std::vector<float> worker_error, server_error;
};

std::vector<OnebitAccount> run_onebit_accounts(const OptimizerConfig& c, const ParamLayout& layout, int workers,
                                               int steps) {
  scape::train::QuadraticSpec spec;
  spec.seed = 11;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  const std::size_t n = layout.size();
  std::vector<OnebitAccount> out(static_cast<std::size_t>(workers));
  sim::run_ranks(workers, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(c, layout, comm, steps);
    OnebitAccount& acc = out[static_cast<std::size_t>(comm.rank())];
    acc.local_sum.assign(n, 0.0);
    acc.sync_sum.assign(n, 0.0);
    std::vector<float> theta(n), g(n);
    problem.initial_params(theta);
    for (int t = 1; t <= steps; ++t) {
      problem.gradient(theta, t, comm.rank(), g);
      StateMap before, after;
      opt->save_state(before);
      opt->step(theta, g);
      opt->save_state(after);
      if (t <= c.onebit.freeze_step) continue;
      std::vector<float> m_prev, m_now;
      get_state(before, "m", m_prev);
      get_state(after, "m", m_now);
      for (std::size_t j = 0; j < n; ++j) {
        acc.local_sum[j] += c.beta1 * m_prev[j] + (1 - c.beta1) * g[j];
        acc.sync_sum[j] += m_now[j];
      }
      if (t == steps) {
        get_state(after, "onebit.worker_error", acc.worker_error);
        get_state(after, "onebit.server_error", acc.server_error);
      }
    }
  });
  return out;
}

}  // namespace

TEST_CASE("1-bit Adam conserves momentum: sum of m_t + mean worker error + server error = sum of mean local momenta") {
  // Worker: e_i' = c_i - C(c_i) with c_i = e_i + local_i; server: e_s' = s - C(s) with
  // s = e_s + mean_i C(c_i) and m_t = C(s). Summed over the compressed steps, with every error
  // starting at zero: sum_t m_t = sum_t mean_i local_i - mean_i e_i(T) - e_s(T).
  const ParamLayout layout = mixed_layout(2);
  const std::size_t n = layout.size();
  for (int w : {1, 2, 4, 7}) {
    for (std::size_t chunk : {std::size_t{64}, std::size_t{300}}) {
      CAPTURE(w);
      CAPTURE(chunk);
      const auto accounts = run_onebit_accounts(onebit_config(2, chunk), layout, w, 10);
      const Sharding sh(n, w);
      double worst = 0, scale = 0, error_size = 0;
      for (int o = 0; o < w; ++o) {
        for (std::size_t j = sh.begin(o); j < sh.end(o); ++j) {
          double local = 0, worker_error = 0;
          for (const auto& a : accounts) {
            local += a.local_sum[j] / w;
            worker_error += static_cast<double>(a.worker_error[j]) / w;
          }
          const double server_error = accounts[static_cast<std::size_t>(o)].server_error[j - sh.begin(o)];
          // m is replicated: every worker holds the same synchronized momentum.
          for (const auto& a : accounts) CHECK(a.sync_sum[j] == accounts[0].sync_sum[j]);
          worst = std::max(worst, std::fabs(accounts[0].sync_sum[j] + worker_error + server_error - local));
          scale = std::max(scale, std::fabs(local));
          error_size = std::max(error_size, std::fabs(worker_error) + std::fabs(server_error));
        }
      }
      // Eight compressed steps of fp32 arithmetic on values of this scale: a few ulps each.
      CHECK(worst <= 8 * 4 * 1.2e-7 * (scale + error_size));
      CHECK(error_size > 0);  // the compression did lose something the errors now hold
    }
  }
}

TEST_CASE("1-bit Adam with freeze_step >= T is dense replicated AdamW, bit for bit") {
  const ParamLayout layout = mixed_layout(2);
  for (int w : {1, 3, 4}) {
    CAPTURE(w);
    OptimizerConfig onebit = onebit_config(8, 2048);
    OptimizerConfig dense = onebit;
    dense.type = OptimizerType::adamw;
    const auto a = run_quadratic(onebit, layout, w, 8);
    const auto b = run_quadratic(dense, layout, w, 8);
    for (std::size_t t = 0; t < 8; ++t) CHECK(same_bits(a.steps[0][t].params_after, b.steps[0][t].params_after));
    CHECK(a.ledger_totals.at("grad_all_reduce").payload_bytes == b.ledger_totals.at("grad_all_reduce").payload_bytes);
  }
}

TEST_CASE("1-bit Adam with sign_chunk 1 loses nothing: both errors stay zero, replicas stay identical") {
  // One scale per coordinate is |x| itself (sqrt of x^2 in double is exact), so C(x) = x.
  const ParamLayout layout = mixed_layout(2);
  for (int w : {1, 2, 7}) {
    CAPTURE(w);
    const auto run = run_quadratic(onebit_config(2, 1), layout, w, 6);
    for (int i = 0; i < w; ++i) {
      const auto& mine = run.steps[static_cast<std::size_t>(i)];
      for (std::size_t t = 0; t < mine.size(); ++t) {
        CHECK(same_bits(mine[t].params_after, run.steps[0][t].params_after));
        for (float e : mine[t].residual_before) CHECK(e == 0.0f);
      }
    }
    const auto accounts = run_onebit_accounts(onebit_config(2, 1), layout, w, 6);
    for (const auto& a : accounts) {
      for (float e : a.worker_error) CHECK(e == 0.0f);
      for (float e : a.server_error) CHECK(e == 0.0f);
    }
  }
}

// ---- PowerSGD and DeMo (docs/algorithms.md, "PowerSGD" and "DeMo").

namespace {

// What one worker saw at each step: its gradient, parameters and optimizer state on both sides.
struct StateStep {
  std::vector<float> grad, theta_before, theta_after;
  StateMap before, after;
};

std::vector<std::vector<StateStep>> run_with_states(const OptimizerConfig& c, const ParamLayout& layout, int workers,
                                                    int steps) {
  scape::train::QuadraticSpec spec;
  spec.seed = 13;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  std::vector<std::vector<StateStep>> out(static_cast<std::size_t>(workers));
  sim::run_ranks(workers, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(c, layout, comm, steps);
    std::vector<float> theta(layout.size());
    problem.initial_params(theta);
    for (int t = 1; t <= steps; ++t) {
      StateStep s;
      s.grad.resize(layout.size());
      problem.gradient(theta, t, comm.rank(), s.grad);
      s.theta_before = theta;
      opt->save_state(s.before);
      opt->step(theta, s.grad);
      opt->save_state(s.after);
      s.theta_after = theta;
      out[static_cast<std::size_t>(comm.rank())].push_back(std::move(s));
    }
  });
  return out;
}

std::vector<float> state_of(const StateMap& state, const std::string& name) {
  std::vector<float> v;
  get_state(state, name, v);
  return v;
}

OptimizerConfig powersgd_config(int rank, InnerRule inner = InnerRule::adams) {
  OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::powersgd);
  c.powersgd.rank = rank;
  c.inner = inner;
  c.lr = 1e-2;
  c.seed = 3;
  return c;
}

// Orthonormal columns (double Gram-Schmidt) of the rows x rank row-major matrix a.
std::vector<double> orthonormal_columns(const float* a, std::size_t rows, std::size_t rank) {
  std::vector<double> q(a, a + rows * rank);
  for (std::size_t c = 0; c < rank; ++c) {
    for (std::size_t d = 0; d < c; ++d) {
      double dot = 0;
      for (std::size_t i = 0; i < rows; ++i) dot += q[i * rank + c] * q[i * rank + d];
      for (std::size_t i = 0; i < rows; ++i) q[i * rank + c] -= dot * q[i * rank + d];
    }
    double norm = 0;
    for (std::size_t i = 0; i < rows; ++i) norm += q[i * rank + c] * q[i * rank + c];
    for (std::size_t i = 0; i < rows; ++i) q[i * rank + c] /= std::sqrt(norm);
  }
  return q;
}

}  // namespace

TEST_CASE("PowerSGD error feedback: e_before + g = e_after + D, D the same rank-r P Q^T on every worker") {
  // D is what every worker delivered; it must lie in the span of the all-reduced Q (its rows are
  // combinations of Q's columns), be identical across workers up to rounding, and the vectors
  // must travel whole (their residual stays zero).
  const ParamLayout layout = mixed_layout(2);
  const PowersgdPlan plan = powersgd_plan(layout, 2);
  REQUIRE(plan.matrices.size() == 2);
  for (int w : {1, 2, 4}) {
    CAPTURE(w);
    const auto run = run_with_states(powersgd_config(2), layout, w, 6);
    double lost = 0;
    for (std::size_t t = 0; t < run[0].size(); ++t) {
      const auto q = state_of(run[0][t].after, "powersgd.q");
      std::vector<std::vector<double>> delivered(static_cast<std::size_t>(w));
      for (int i = 0; i < w; ++i) {
        const auto& s = run[static_cast<std::size_t>(i)][t];
        const auto e0 = state_of(s.before, "powersgd.error");
        const auto e1 = state_of(s.after, "powersgd.error");
        CHECK(state_of(s.after, "powersgd.q") == q);  // the warm start is shared
        auto& d = delivered[static_cast<std::size_t>(i)];
        for (std::size_t j = 0; j < e0.size(); ++j) d.push_back(double(e0[j]) + s.grad[j] - e1[j]);
        for (const auto& v : plan.vectors) {
          for (std::size_t j = v.offset; j < v.offset + v.size; ++j) CHECK(e1[j] == 0.0f);
        }
        for (float e : e1) lost = std::max(lost, double(std::fabs(e)));
      }
      for (const auto& m : plan.matrices) {
        const auto basis = orthonormal_columns(q.data() + m.q_offset, m.cols, m.rank);
        double worst = 0, size = 0, spread = 0;
        for (std::size_t r = 0; r < m.rows; ++r) {
          const double* d = delivered[0].data() + m.offset + r * m.cols;
          // The row minus its projection on span(Q).
          std::vector<double> coef(m.rank, 0.0);
          for (std::size_t c = 0; c < m.rank; ++c) {
            for (std::size_t j = 0; j < m.cols; ++j) coef[c] += d[j] * basis[j * m.rank + c];
          }
          for (std::size_t j = 0; j < m.cols; ++j) {
            double proj = 0;
            for (std::size_t c = 0; c < m.rank; ++c) proj += coef[c] * basis[j * m.rank + c];
            worst = std::max(worst, std::fabs(d[j] - proj));
            size = std::max(size, std::fabs(d[j]));
            for (int i = 1; i < w; ++i) {
              spread = std::max(spread, std::fabs(delivered[static_cast<std::size_t>(i)][m.offset + r * m.cols + j] - d[j]));
            }
          }
        }
        CHECK(size > 0);
        CHECK(worst <= 1e-5 * size);
        CHECK(spread <= 1e-5 * size);
      }
    }
    CHECK(lost > 0);  // rank 2 of a 26 x 31 gradient does lose something the residual keeps
  }
}

TEST_CASE("PowerSGD with rank >= min(rows, cols) is dense replicated AdamS / AdamW up to rounding") {
  const ParamLayout layout = mixed_layout(2);
  for (int w : {1, 3}) {
    for (InnerRule inner : {InnerRule::adams, InnerRule::adamw}) {
      CAPTURE(w);
      CAPTURE(to_string(inner));
      OptimizerConfig full = powersgd_config(64, inner);
      OptimizerConfig dense = full;
      dense.type = inner == InnerRule::adams ? OptimizerType::adams : OptimizerType::adamw;
      const auto a = run_quadratic(full, layout, w, 8);
      const auto b = run_quadratic(dense, layout, w, 8);
      const auto low = run_quadratic(powersgd_config(1, inner), layout, w, 8);
      double gap = 0, low_gap = 0, residual = 0;
      for (std::size_t j = 0; j < layout.size(); ++j) {
        gap = std::max(gap, double(std::fabs(a.steps[0][7].params_after[j] - b.steps[0][7].params_after[j])));
        low_gap = std::max(low_gap, double(std::fabs(low.steps[0][7].params_after[j] - b.steps[0][7].params_after[j])));
        // Each worker keeps M_i - mean M, so the residuals cancel over the workers (the mean
        // gradient is delivered whole); one worker's is not zero for W > 1.
        double mean_residual = 0;
        for (const auto& worker : a.steps) mean_residual += worker[7].residual_before[j] / w;
        residual = std::max(residual, std::fabs(mean_residual));
      }
      // Eight steps of lr 1e-2: a rank-1 run is lr-sized away, the full-rank one at rounding.
      CHECK(gap <= 1e-5);
      CHECK(low_gap > 1e-3);
      CHECK(residual <= 1e-5);
    }
  }
}

namespace {

OptimizerConfig demo_config(std::size_t chunk, std::size_t k) {
  OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::demo);
  c.demo.chunk = chunk;
  c.demo.topk = k;
  c.lr = 1e-2;
  c.weight_decay = 0;
  return c;
}

// The orthonormal DCT-II of x chunk by chunk (the short last chunk by its own length), in double.
std::vector<double> chunk_dct(const std::vector<double>& x, std::size_t chunk) {
  std::vector<double> y(x.size(), 0.0);
  for (std::size_t lo = 0; lo < x.size(); lo += chunk) {
    const std::size_t len = std::min(chunk, x.size() - lo);
    for (std::size_t f = 0; f < len; ++f) {
      const double s = std::sqrt((f == 0 ? 1.0 : 2.0) / double(len));
      for (std::size_t j = 0; j < len; ++j) y[lo + f] += s * std::cos(M_PI * double(2 * j + 1) * f / (2.0 * len)) * x[lo + j];
    }
  }
  return y;
}

}  // namespace

TEST_CASE("DeMo conserves momentum: beta m_before + g = m_after + extracted, extracted the top-k DCT part") {
  // extracted = beta m_before + g - m_after must have, in each chunk's DCT, exactly the k
  // coefficients of largest magnitude of DCT(beta m_before + g) and nothing else (to rounding).
  const ParamLayout layout = mixed_layout(2);  // N = 1634: chunks of 64 leave a tail of 34
  for (std::size_t chunk : {std::size_t{64}, std::size_t{50}}) {
    const std::size_t k = 3;
    CAPTURE(chunk);
    const auto run = run_with_states(demo_config(chunk, k), layout, 2, 4);
    for (const auto& worker : run) {
      for (const auto& s : worker) {
        const auto m0 = state_of(s.before, "m");
        const auto m1 = state_of(s.after, "m");
        std::vector<double> local(m0.size()), extracted(m0.size());
        for (std::size_t j = 0; j < m0.size(); ++j) {
          local[j] = 0.9 * double(m0[j]) + s.grad[j];
          extracted[j] = local[j] - m1[j];
        }
        const auto y_local = chunk_dct(local, chunk);
        const auto y_extracted = chunk_dct(extracted, chunk);
        for (std::size_t lo = 0; lo < local.size(); lo += chunk) {
          const std::size_t len = std::min(chunk, local.size() - lo);
          double scale = 0, kth = 0, rest = 0;
          for (std::size_t f = 0; f < len; ++f) scale = std::max(scale, std::fabs(y_local[lo + f]));
          std::size_t kept = 0;
          for (std::size_t f = 0; f < len; ++f) {
            if (std::fabs(y_extracted[lo + f]) > 1e-4 * scale) {
              ++kept;
              CHECK(y_extracted[lo + f] == doctest::Approx(y_local[lo + f]).epsilon(1e-4));
              kth = kth == 0 ? std::fabs(y_local[lo + f]) : std::min(kth, std::fabs(y_local[lo + f]));
            } else {
              rest = std::max(rest, std::fabs(y_local[lo + f]));
            }
          }
          CHECK(kept == std::min(k, len));
          CHECK(rest <= kth * (1 + 1e-5));  // nothing left behind is larger than what was sent
        }
      }
    }
  }
}

TEST_CASE("DeMo steps by lr sign(IDCT(mean extracted)); with k = chunk that is sign(mean momentum)") {
  const ParamLayout layout = mixed_layout(2);
  for (std::size_t k : {std::size_t{4}, std::size_t{64}}) {
    for (int w : {1, 3}) {
      CAPTURE(k);
      CAPTURE(w);
      const auto run = run_with_states(demo_config(64, k), layout, w, 4);
      const std::size_t n = layout.size();
      std::size_t agree = 0, decided = 0;
      for (std::size_t t = 0; t < 4; ++t) {
        std::vector<double> mean_extracted(n, 0.0);
        for (const auto& worker : run) {
          const auto& s = worker[t];
          const auto m0 = state_of(s.before, "m");
          const auto m1 = state_of(s.after, "m");
          double scale = 0, left = 0;
          for (std::size_t j = 0; j < n; ++j) {
            mean_extracted[j] += (0.9 * double(m0[j]) + s.grad[j] - m1[j]) / w;
            scale = std::max(scale, std::fabs(0.9 * m0[j] + s.grad[j]));
            left = std::max(left, double(std::fabs(m1[j])));
          }
          // k = chunk extracts everything: what stays is the round trip's rounding.
          if (k == 64) CHECK(left <= 1e-6 * scale);
        }
        const auto& s = run[0][t];
        const float lr = static_cast<float>(learning_rate(LrSchedule{1e-2, 1e-3, 0, 4}, static_cast<int>(t) + 1));
        for (std::size_t j = 0; j < n; ++j) {
          // Every worker takes the same step, of exactly +-lr (weight decay is off here).
          for (const auto& worker : run) CHECK(worker[t].theta_after[j] == s.theta_after[j]);
          const bool down = s.theta_after[j] == s.theta_before[j] - lr;
          CHECK((down || s.theta_after[j] == s.theta_before[j] + lr));
          if (std::fabs(mean_extracted[j]) < 1e-4) continue;  // a sign at rounding level is not decided
          ++decided;
          agree += down == (mean_extracted[j] > 0);
        }
      }
      CHECK(decided > n);
      CHECK(agree == decided);
    }
  }
}
