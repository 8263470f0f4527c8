// An independent, deliberately plain implementation of docs/algorithms.md (all workers in
// one loop, top-k by a full stable sort, no kernels, no communicator) checked against the
// optimizers on the noisy quadratic for many switch combinations. It shares only the pinned
// k rule (k_for) with the code under test; residual_decay and residual_clip included. Plus
// hand-derived AdamW / AdamS values.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

#include "core/layout.hpp"
#include "core/schedule.hpp"
#include "kernels/cpu/bf16.hpp"
#include "optimizers/make_optimizer.hpp"
#include "quadratic_run.hpp"
#include "tests/earlier_formulation.hpp"
#include "util/rng.hpp"

using namespace scape;
using scape::testing::mixed_layout;
using scape::testing::run_quadratic;

namespace {

using Vec = std::vector<float>;

double ref_lr(const OptimizerConfig& c, int t, int T) {
  const double min_lr = c.min_lr < 0 ? c.lr / 10 : c.min_lr;
  if (t <= c.warmup_steps) return c.lr * t / c.warmup_steps;
  const double p = double(t - c.warmup_steps) / std::max(1, T - c.warmup_steps);
  return min_lr + 0.5 * (c.lr - min_lr) * (1 + std::cos(std::numbers::pi * p));
}

double ref_density(const OptimizerConfig& c, int t) {
  const double rho = 1 - c.sparsity;
  return c.density_warmup > 0 ? std::pow(rho, std::min(1.0, double(t - 1) / c.density_warmup)) : rho;
}

// Indices of the k largest |x[j]| for j in [lo, hi), ties to the lower index.
std::vector<std::size_t> top_k(const Vec& x, std::size_t lo, std::size_t hi, std::size_t k) {
  std::vector<std::size_t> order(hi - lo);
  std::iota(order.begin(), order.end(), lo);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

float wire(float x, WireType w) { return w == WireType::bf16 ? kernels::round_to_bf16(x) : x; }

// mean in rank order of xs[i][j] after wire rounding, result rounded again.
float ref_mean(const std::vector<float>& xs, WireType w) {
  float acc = wire(xs[0], w);
  for (std::size_t i = 1; i < xs.size(); ++i) acc += wire(xs[i], w);
  return wire(acc / float(xs.size()), w);
}

struct Reference {
  const OptimizerConfig c = scape::testing::earlier_formulation();
  const ParamLayout& layout;
  const int W, T;
  const std::size_t N;
  Vec theta, m, v;
  std::vector<Vec> e;
  std::vector<char> next_mask;  // SCAPE lag 1
  std::vector<char> mask;

  Reference(const OptimizerConfig& cfg, const ParamLayout& l, int workers, int steps)
      : c(cfg), layout(l), W(workers), T(steps), N(l.size()), theta(N, 0.0f), m(N, 0.0f), v(N, 0.0f),
        e(static_cast<std::size_t>(workers), Vec(N, 0.0f)) {}

  bool decayed(std::size_t j) const {
    for (const auto& s : layout.slots()) if (j >= s.offset && j < s.end()) return s.decay;
    return false;
  }

  // The inner rule on one coordinate with synchronized gradient g and new momentum m_new.
  void inner_step(std::size_t j, float g, float m_new, int t, double eta, bool adamw) {
    const float b2 = float(c.beta2), eps = float(c.eps);
    const float c1 = c.bias_correction ? float(1 - std::pow(c.beta1, t)) : 1.0f;
    const float c2 = c.bias_correction ? float(1 - std::pow(c.beta2, t)) : 1.0f;
    if (adamw) {
      v[j] = b2 * v[j] + float(1 - c.beta2) * g * g;
      m[j] = m_new;
      theta[j] -= float(eta) * (m[j] / c1) / (std::sqrt(v[j] / c2) + eps);
    } else {
      const float d = std::sqrt(b2 * (m[j] / c1) * (m[j] / c1) + float(1 - c.beta2) * g * g) + eps;
      m[j] = m_new;
      theta[j] -= float(eta) * (m[j] / c1) / d;
    }
  }

  // residual_clip before step 1: per tensor, in double, ||e|| > c ||g|| scales e by the float
  // factor c ||g|| / ||e|| (+0 when that factor is 0).
  void clip_residual(Vec& ei, const Vec& gi) const {
    if (c.residual_clip == 0) return;
    for (const auto& s : layout.slots()) {
      double ee = 0, gg = 0;
      for (std::size_t j = s.offset; j < s.end(); ++j) {
        ee += double(ei[j]) * ei[j];
        gg += double(gi[j]) * gi[j];
      }
      const double norm = std::sqrt(ee), bound = c.residual_clip * std::sqrt(gg);
      if (!(norm > bound)) continue;
      const float f = float(bound / norm);
      for (std::size_t j = s.offset; j < s.end(); ++j) ei[j] = f == 0 ? 0.0f : ei[j] * f;
    }
  }

  // Step 4 off the mask: gamma a_i (a_i itself at gamma = 1), nothing without a residual.
  float kept(float a) const {
    if (!c.residual || c.residual_decay == 0) return 0.0f;
    return c.residual_decay == 1 ? a : float(c.residual_decay) * a;
  }

  void decay_all(double eta) {
    for (std::size_t j = 0; j < N; ++j) if (decayed(j)) theta[j] *= float(1 - eta * c.weight_decay);
  }

  Vec statistic(std::size_t lo, std::size_t hi, const Vec& a, int use_step, int worker) const {
    Vec s(N, 0.0f);
    const float b1 = float(c.beta1);
    for (std::size_t j = lo; j < hi; ++j) {
      switch (c.scape.mask_statistic) {
        case MaskStatistic::first_moment: s[j] = b1 * m[j] + float(1 - c.beta1) * a[j]; break;
        case MaskStatistic::gradient: s[j] = a[j]; break;
        case MaskStatistic::momentum_only: s[j] = m[j]; break;
        case MaskStatistic::random: {
          std::uint64_t key = rng::derive(rng::derive(c.seed, 0x6d61736b), std::uint64_t(use_step));
          if (c.scape.mask_partition == MaskPartition::local_union) key = rng::derive(key, std::uint64_t(worker));
          s[j] = float(rng::uniform(key, j));
          break;
        }
      }
    }
    return s;
  }

  std::vector<char> compute_mask(const std::vector<Vec>& a, int use_step) const {
    const double rho = ref_density(c, use_step);
    std::vector<char> out(N, 0);
    if (c.scape.mask_partition == MaskPartition::partitioned) {
      const Sharding sh(N, W);
      for (int o = 0; o < W; ++o) {
        const Vec s = statistic(sh.begin(o), sh.end(o), a[std::size_t(o)], use_step, o);
        for (std::size_t j : top_k(s, sh.begin(o), sh.end(o), k_for(rho, sh.size(o)))) out[j] = 1;
      }
    } else {
      for (int i = 0; i < W; ++i) {
        const Vec s = statistic(0, N, a[std::size_t(i)], use_step, i);
        for (std::size_t j : top_k(s, 0, N, k_for(rho, N))) out[j] = 1;
      }
    }
    return out;
  }

  void scape_step(const std::vector<Vec>& g, int t) {
    const double eta = ref_lr(c, t, T);
    const float b1 = float(c.beta1);
    std::vector<Vec> a(static_cast<std::size_t>(W), Vec(N));
    for (int i = 0; i < W; ++i) clip_residual(e[std::size_t(i)], g[std::size_t(i)]);
    for (int i = 0; i < W; ++i) for (std::size_t j = 0; j < N; ++j) a[std::size_t(i)][j] = e[std::size_t(i)][j] + g[std::size_t(i)][j];
    mask = (c.scape.mask_lag == 0 || t == 1) ? compute_mask(a, t) : next_mask;
    if (c.scape.mask_lag == 1 && t < T) next_mask = compute_mask(a, t + 1);
    Vec g_bar(N, 0.0f), b_bar(N, 0.0f);
    for (std::size_t j = 0; j < N; ++j) {
      if (!mask[j]) continue;
      std::vector<float> b(static_cast<std::size_t>(W)), aj(static_cast<std::size_t>(W));
      for (int i = 0; i < W; ++i) {
        const float x = a[std::size_t(i)][j];
        b[std::size_t(i)] = c.sharded ? float(1 - c.beta1) * x : b1 * m[j] + float(1 - c.beta1) * x;
        aj[std::size_t(i)] = x;
      }
      b_bar[j] = ref_mean(b, c.wire_dtype);
      if (c.sharded) b_bar[j] += b1 * m[j];
      g_bar[j] = c.scape.second_moment == SecondMoment::two_collectives ? ref_mean(aj, c.wire_dtype) : (b_bar[j] - b1 * m[j]) / float(1 - c.beta1);
    }
    for (int i = 0; i < W; ++i) {
      for (std::size_t j = 0; j < N; ++j) e[std::size_t(i)][j] = mask[j] ? 0.0f : kept(a[std::size_t(i)][j]);
    }
    const bool adamw = c.inner == InnerRule::adamw;
    if (c.scape.update == UpdateMode::masked) {
      decay_all(eta);
      for (std::size_t j = 0; j < N; ++j) if (mask[j]) inner_step(j, g_bar[j], b_bar[j], t, eta, adamw);
    } else {
      decay_all(eta);
      for (std::size_t j = 0; j < N; ++j) inner_step(j, g_bar[j], b1 * m[j] + float(1 - c.beta1) * g_bar[j], t, eta, adamw);
    }
  }

  void topk_step(const std::vector<Vec>& g, int t) {
    const double eta = ref_lr(c, t, T);
    const std::size_t k = k_for(ref_density(c, t), N);
    Vec sum(N, 0.0f);
    for (int i = 0; i < W; ++i) {
      Vec& ei = e[std::size_t(i)];
      clip_residual(ei, g[std::size_t(i)]);
      for (std::size_t j = 0; j < N; ++j) ei[j] += g[std::size_t(i)][j];
      const auto sent = top_k(ei, 0, N, k);
      for (std::size_t j : sent) sum[j] += wire(ei[j], c.wire_dtype);
      for (float& x : ei) x = kept(x);
      for (std::size_t j : sent) ei[j] = 0;
    }
    decay_all(eta);
    const float b1 = float(c.beta1);
    for (std::size_t j = 0; j < N; ++j) {
      const float gb = sum[j] / float(W);
      inner_step(j, gb, b1 * m[j] + float(1 - c.beta1) * gb, t, eta, c.inner == InnerRule::adamw);
    }
  }

  // Random-k: the shared mask is the top-k of the uniform draw keyed by (seed, "randk", t),
  // the same for every worker; a_i's values on it are averaged, the rest kept.
  void randk_step(const std::vector<Vec>& g, int t) {
    const double eta = ref_lr(c, t, T);
    const std::uint64_t key = rng::derive(rng::derive(c.seed, 0x72616e646b), std::uint64_t(t));
    Vec draw(N);
    for (std::size_t j = 0; j < N; ++j) draw[j] = float(rng::uniform(key, j));
    mask.assign(N, 0);
    for (std::size_t j : top_k(draw, 0, N, k_for(ref_density(c, t), N))) mask[j] = 1;
    Vec g_bar(N, 0.0f);
    for (int i = 0; i < W; ++i) {
      clip_residual(e[std::size_t(i)], g[std::size_t(i)]);
      for (std::size_t j = 0; j < N; ++j) e[std::size_t(i)][j] += g[std::size_t(i)][j];
    }
    for (std::size_t j = 0; j < N; ++j) {
      if (!mask[j]) continue;
      std::vector<float> aj;
      for (int i = 0; i < W; ++i) aj.push_back(e[std::size_t(i)][j]);
      g_bar[j] = ref_mean(aj, c.wire_dtype);
    }
    for (auto& ei : e) for (std::size_t j = 0; j < N; ++j) ei[j] = mask[j] ? 0.0f : kept(ei[j]);
    decay_all(eta);
    const float b1 = float(c.beta1);
    for (std::size_t j = 0; j < N; ++j) {
      inner_step(j, g_bar[j], b1 * m[j] + float(1 - c.beta1) * g_bar[j], t, eta, c.inner == InnerRule::adamw);
    }
  }

  // 1-bit Adam. Its AdamW arithmetic is written as the kernel writes it (AdamFloats: fp32
  // step size lr / c1 and 1 / sqrt(c2), no contraction), so that the sign of a momentum near
  // zero is the same here as in the optimizer: one flipped sign moves a coordinate by a whole
  // scale, far beyond rounding.
  std::vector<Vec> worker_error;
  Vec server_error;

  void adamw_like_kernel(std::size_t j, float g, double beta1_d, double beta2_d, double bc1, double bc2, double eta) {
    const float beta1 = float(beta1_d), beta2 = float(beta2_d);
    const float omb1 = float(1.0 - beta1_d), omb2 = float(1.0 - beta2_d);
    const float step = float(eta / bc1), inv = float(1.0 / std::sqrt(bc2)), eps = float(c.eps);
    const float decay = decayed(j) ? float(1 - eta * c.weight_decay) : 1.0f;
    m[j] = beta1 * m[j] + omb1 * g;
    v[j] = beta2 * v[j] + omb2 * g * g;
    theta[j] = theta[j] * decay - step * m[j] / (std::sqrt(v[j]) * inv + eps);
  }

  // x <- x - C(x) over [lo, hi) in chunks of sign_chunk from lo; returns C(x).
  Vec sign_compress(Vec& x, std::size_t lo, std::size_t hi) const {
    Vec out(N, 0.0f);
    for (std::size_t c0 = lo; c0 < hi; c0 += c.onebit.sign_chunk) {
      const std::size_t c1 = std::min(hi, c0 + c.onebit.sign_chunk);
      double ss = 0;
      for (std::size_t j = c0; j < c1; ++j) ss += double(x[j]) * x[j];
      const float scale = float(std::sqrt(ss / double(c1 - c0)));
      for (std::size_t j = c0; j < c1; ++j) {
        out[j] = x[j] < 0 ? -scale : scale;
        x[j] = x[j] - out[j];
      }
    }
    return out;
  }

  void onebit_step(const std::vector<Vec>& g, int t) {
    const double eta = ref_lr(c, t, T);
    const double bc1 = c.bias_correction ? 1 - std::pow(c.beta1, t) : 1.0;
    if (worker_error.empty()) {
      worker_error.assign(std::size_t(W), Vec(N, 0.0f));
      server_error.assign(N, 0.0f);
    }
    if (t <= c.onebit.freeze_step) {
      const double bc2 = c.bias_correction ? 1 - std::pow(c.beta2, t) : 1.0;
      for (std::size_t j = 0; j < N; ++j) {
        std::vector<float> gj;
        for (int i = 0; i < W; ++i) gj.push_back(g[std::size_t(i)][j]);
        adamw_like_kernel(j, ref_mean(gj, c.wire_dtype), c.beta1, c.beta2, bc1, bc2, eta);
      }
      return;
    }
    const float b1 = float(c.beta1), omb1 = float(1 - c.beta1);
    const Sharding sh(N, W);
    std::vector<Vec> sent(static_cast<std::size_t>(W));
    for (int i = 0; i < W; ++i) {
      Vec& ew = worker_error[std::size_t(i)];
      for (std::size_t j = 0; j < N; ++j) ew[j] = ew[j] + (b1 * m[j] + omb1 * g[std::size_t(i)][j]);
      sent[std::size_t(i)].assign(N, 0.0f);
      for (int o = 0; o < W; ++o) {
        const Vec part = sign_compress(ew, sh.begin(o), sh.end(o));
        for (std::size_t j = sh.begin(o); j < sh.end(o); ++j) sent[std::size_t(i)][j] = part[j];
      }
    }
    Vec m_sync(N, 0.0f);
    for (int o = 0; o < W; ++o) {
      for (std::size_t j = sh.begin(o); j < sh.end(o); ++j) {
        float acc = 0.0f;
        for (int i = 0; i < W; ++i) acc = acc + sent[std::size_t(i)][j];
        server_error[j] = server_error[j] + acc / float(W);
      }
      const Vec part = sign_compress(server_error, sh.begin(o), sh.end(o));
      for (std::size_t j = sh.begin(o); j < sh.end(o); ++j) m_sync[j] = part[j];
    }
    const double bc2 = c.bias_correction ? 1 - std::pow(c.beta2, c.onebit.freeze_step) : 1.0;
    for (std::size_t j = 0; j < N; ++j) adamw_like_kernel(j, m_sync[j], 0.0, 1.0, bc1, bc2, eta);
  }
};

void compare_with_reference(const OptimizerConfig& c, int W, int T) {
  const ParamLayout layout = mixed_layout(2);
  const auto run = run_quadratic(c, layout, W, T, 3, 0.5);
  scape::train::QuadraticSpec spec;
  spec.seed = 3;
  spec.noise = 0.5;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  Reference ref(c, layout, W, T);
  std::vector<Vec> g(static_cast<std::size_t>(W), Vec(layout.size()));
  for (int t = 1; t <= T; ++t) {
    for (int i = 0; i < W; ++i) problem.gradient(ref.theta, t, i, g[std::size_t(i)]);
    if (c.type == OptimizerType::topk_ef) {
      ref.topk_step(g, t);
    } else if (c.type == OptimizerType::randk_ef) {
      ref.randk_step(g, t);
    } else if (c.type == OptimizerType::onebit_adam) {
      ref.onebit_step(g, t);
    } else {
      ref.scape_step(g, t);
    }
    const auto& got = run.steps[0][std::size_t(t - 1)];
    if (c.type == OptimizerType::scape || c.type == OptimizerType::randk_ef) {
      std::size_t mismatched = 0;
      for (std::size_t j = 0; j < layout.size(); ++j) mismatched += testing::bit(got.mask, j) != bool(ref.mask[j]);
      CHECK(mismatched == 0);
    }
    double worst = 0;
    for (std::size_t j = 0; j < layout.size(); ++j) worst = std::max(worst, double(std::fabs(got.params_after[j] - ref.theta[j])));
    // Same formulas, evaluated with different but equivalent fp32 expressions: rounding only.
    CHECK(worst <= 2e-6 * t);
  }
}

OptimizerConfig base() {
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  c.warmup_steps = 3;
  c.sparsity = 0.9;
  return c;
}

}  // namespace

TEST_CASE("SCAPE matches the independent reference for every switch") {
  struct Case { const char* name; OptimizerConfig config; };
  std::vector<Case> cases;
  cases.push_back({"default (sharded, masked, adams, first_moment, partitioned, lag 1)", base()});
  { auto c = base(); c.sharded = false; cases.push_back({"replicated", c}); }
  { auto c = base(); c.inner = InnerRule::adamw; cases.push_back({"inner adamw", c}); }
  { auto c = base(); c.scape.mask_lag = 0; cases.push_back({"lag 0", c}); }
  { auto c = base(); c.scape.update = UpdateMode::dense; cases.push_back({"dense update", c}); }
  { auto c = base(); c.scape.update = UpdateMode::dense; c.sharded = false; c.inner = InnerRule::adamw; cases.push_back({"dense update, replicated adamw", c}); }
  { auto c = base(); c.scape.second_moment = SecondMoment::two_collectives; cases.push_back({"two collectives", c}); }
  { auto c = base(); c.residual = false; cases.push_back({"residual off", c}); }
  { auto c = base(); c.scape.mask_statistic = MaskStatistic::gradient; cases.push_back({"gradient statistic", c}); }
  { auto c = base(); c.scape.mask_statistic = MaskStatistic::momentum_only; cases.push_back({"momentum_only statistic", c}); }
  { auto c = base(); c.scape.mask_statistic = MaskStatistic::random; c.seed = 99; cases.push_back({"random statistic", c}); }
  { auto c = base(); c.scape.mask_partition = MaskPartition::local_union; c.sharded = false; cases.push_back({"local union", c}); }
  { auto c = base(); c.density_warmup = 5; c.sparsity = 0.99; cases.push_back({"density warm-up", c}); }
  { auto c = base(); c.bias_correction = false; cases.push_back({"no bias correction", c}); }
  { auto c = base(); c.wire_dtype = WireType::bf16; c.sharded = false; cases.push_back({"bf16 wire", c}); }
  { auto c = base(); c.residual_decay = 0.6; cases.push_back({"residual decay 0.6", c}); }
  { auto c = base(); c.residual_decay = 0; cases.push_back({"residual decay 0", c}); }
  { auto c = base(); c.residual_clip = 0.5; cases.push_back({"residual clip 0.5", c}); }
  { auto c = base(); c.residual_clip = 1.0; c.residual_decay = 0.8; c.scape.mask_lag = 0; c.sharded = false;
    cases.push_back({"residual clip 1 and decay 0.8, lag 0, replicated", c}); }
  for (const auto& k : cases) {
    for (int w : {1, 3, 4}) {
      CAPTURE(k.name);
      CAPTURE(w);
      compare_with_reference(k.config, w, 10);
    }
  }
}

TEST_CASE("raw-gradient top-k matches the independent reference") {
  for (InnerRule inner : {InnerRule::adams, InnerRule::adamw}) {
    for (WireType wire : {WireType::fp32, WireType::bf16}) {
      auto c = base();
      c.type = OptimizerType::topk_ef;
      c.sharded = false;
      c.inner = inner;
      c.wire_dtype = wire;
      CAPTURE(to_string(inner));
      compare_with_reference(c, 3, 10);
    }
  }
  struct Switches { double decay, clip; };
  for (const Switches sw : {Switches{0.6, 0}, Switches{1, 0.5}, Switches{0.8, 1.0}, Switches{0, 0.5}}) {
    auto c = base();
    c.type = OptimizerType::topk_ef;
    c.sharded = false;
    c.residual_decay = sw.decay;
    c.residual_clip = sw.clip;
    CAPTURE(sw.decay);
    CAPTURE(sw.clip);
    compare_with_reference(c, 3, 10);
  }
}

TEST_CASE("shared-seed random-k matches the independent reference, mask included") {
  struct Case { const char* name; InnerRule inner; WireType wire; double decay, clip; int warmup; };
  for (const Case k : {Case{"adams", InnerRule::adams, WireType::fp32, 1, 0, 0},
                       Case{"adamw", InnerRule::adamw, WireType::fp32, 1, 0, 0},
                       Case{"bf16 wire", InnerRule::adams, WireType::bf16, 1, 0, 0},
                       Case{"decay 0.6, clip 0.5", InnerRule::adams, WireType::fp32, 0.6, 0.5, 0},
                       Case{"density warm-up", InnerRule::adamw, WireType::fp32, 1, 0, 4}}) {
    auto c = base();
    c.type = OptimizerType::randk_ef;
    c.sharded = false;
    c.seed = 17;
    c.inner = k.inner;
    c.wire_dtype = k.wire;
    c.residual_decay = k.decay;
    c.residual_clip = k.clip;
    c.density_warmup = k.warmup;
    CAPTURE(k.name);
    for (int w : {1, 3}) {
      CAPTURE(w);
      compare_with_reference(c, w, 10);
    }
  }
}

TEST_CASE("1-bit Adam matches the independent reference: warm-up, frozen variance, both error feedbacks") {
  struct Case { const char* name; int freeze; std::size_t chunk; WireType wire; bool bias_correction; };
  for (const Case k : {Case{"freeze 3, chunk 100", 3, 100, WireType::fp32, true},
                       Case{"freeze 1, chunk 64, bf16 warm-up", 1, 64, WireType::bf16, true},
                       Case{"freeze 4, chunk 7, no bias correction", 4, 7, WireType::fp32, false},
                       Case{"freeze 2, one chunk per shard", 2, 1 << 20, WireType::fp32, true}}) {
    auto c = base();
    c.type = OptimizerType::onebit_adam;
    c.sharded = false;
    c.onebit.freeze_step = k.freeze;
    c.onebit.sign_chunk = k.chunk;
    c.wire_dtype = k.wire;
    c.bias_correction = k.bias_correction;
    CAPTURE(k.name);
    for (int w : {1, 3, 4}) {
      CAPTURE(w);
      compare_with_reference(c, w, 10);
    }
  }
}

namespace {

// One coordinate, W = 1, constant learning rate (min_lr = lr), decayed tensor.
std::vector<float> dense_trajectory(OptimizerType type, double beta2, bool bias_correction) {
  ParamLayout layout;
  layout.add("w", {70}, true);  // 70 equal coordinates exercise the vector and tail paths
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.type = type;
  c.sharded = false;
  c.lr = 0.1;
  c.min_lr = 0.1;
  c.beta1 = 0.9;
  c.beta2 = beta2;
  c.eps = 1e-8;
  c.weight_decay = 0.01;
  c.bias_correction = bias_correction;
  std::vector<float> out;
  sim::run_ranks(1, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(c, layout, comm, 3);
    std::vector<float> theta(70, 1.0f);
    for (float g : {0.5f, -0.3f, 0.2f}) {
      std::vector<float> grad(70, g);
      opt->step(theta, grad);
      for (float x : theta) CHECK(x == theta[0]);
      out.push_back(theta[0]);
    }
  });
  return out;
}

}  // namespace

TEST_CASE("AdamW: three steps worked by hand (PyTorch semantics)") {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, theta0 = 1, g = 0.5, -0.3, 0.2.
  // t=1: theta = 1 * (1 - 0.1*0.01) = 0.999; m = 0.05; v = 0.001 * 0.25 = 2.5e-4;
  //      m^ = 0.05 / 0.1 = 0.5; v^ = 2.5e-4 / 0.001 = 0.25; theta = 0.999 - 0.1 * 0.5 / 0.5 = 0.899.
  // t=2: theta = 0.899 * 0.999 = 0.898101; m = 0.045 - 0.03 = 0.015; v = 2.4975e-4 + 9e-5 = 3.3975e-4;
  //      m^ = 0.015 / 0.19 = 0.0789474; v^ = 3.3975e-4 / 0.001999 = 0.169960; sqrt = 0.412262;
  //      theta = 0.898101 - 0.1 * 0.0789474 / 0.412262 = 0.8789512.
  // t=3: m = 0.0135 + 0.02 = 0.0335; v = 3.39410e-4 + 4e-5 = 3.79410e-4; c1 = 0.271, c2 = 0.002997;
  //      theta = 0.8789512 * 0.999 - 0.1 * (0.0335/0.271) / sqrt(3.79410e-4/0.002997) = 0.8433295.
  const auto th = dense_trajectory(OptimizerType::adamw, 0.999, true);
  CHECK(th[0] == doctest::Approx(0.899000002).epsilon(2e-7));
  CHECK(th[1] == doctest::Approx(0.8789511989).epsilon(5e-7));
  CHECK(th[2] == doctest::Approx(0.8433294796).epsilon(5e-7));
}

TEST_CASE("AdamS: three steps worked by hand, with and without bias correction") {
  // betas (0.9, 0.95), otherwise as above. d uses the momentum before the step:
  // t=1 (c = 0.1): d = sqrt(0.95 * 0 + 0.05 * 0.25) = 0.1118034; m = 0.05;
  //      theta = 0.999 - 0.1 * (0.05 / 0.1) / 0.1118034 = 0.5517864.
  // t=2 (c = 0.19): d = sqrt(0.95 (0.05/0.19)^2 + 0.05 * 0.09) = 0.2651216; m = 0.015;
  //      theta = 0.5517864 * 0.999 - 0.1 * (0.015 / 0.19) / 0.2651216 = 0.5214569.
  // t=3 (c = 0.271): d = sqrt(0.95 (0.015/0.271)^2 + 0.05 * 0.04) = 0.0700750; m = 0.0335;
  //      theta = 0.5214569 * 0.999 - 0.1 * (0.0335 / 0.271) / 0.0700750 = 0.3445297.
  auto th = dense_trajectory(OptimizerType::adams, 0.95, true);
  CHECK(th[0] == doctest::Approx(0.5517864445).epsilon(5e-7));
  CHECK(th[1] == doctest::Approx(0.5214568658).epsilon(5e-7));
  CHECK(th[2] == doctest::Approx(0.3445297085).epsilon(1e-6));
  // Without bias correction (c = 1): t=1: theta = 0.999 - 0.1 * 0.05 / 0.1118034 = 0.9542786.
  th = dense_trajectory(OptimizerType::adams, 0.95, false);
  CHECK(th[0] == doctest::Approx(0.9542786445).epsilon(2e-7));
  CHECK(th[1] == doctest::Approx(0.9352336873).epsilon(2e-7));
  CHECK(th[2] == doctest::Approx(0.8630983825).epsilon(2e-7));
}
