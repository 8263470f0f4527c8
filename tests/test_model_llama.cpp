// The Llama model (model/llama.hpp): config validation naming the field, the layout and its
// weight-decay flags, central finite differences in double on every coordinate of every tensor
// (grouped-query attention, RoPE and SwiGLU included), fp32 against double, the loss at
// initialization, and overfitting one batch.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "model/llama.hpp"

using namespace scape::model;

namespace {

// Two blocks, 4 query heads sharing 2 key/value heads (head dim 4), an explicit small SwiGLU
// width, T < block_size, a vocab that is not a power of two.
const LlamaConfig kTiny{.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 16, .block_size = 6, .vocab_size = 11,
                        .ffn_hidden = 12, .rope_base = 50.0};
constexpr int kB = 2, kT = 5;

std::string message(const LlamaConfig& cfg) {
  try {
    cfg.validate();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}

struct Case {
  std::vector<double> params;
  std::vector<std::int32_t> inputs, targets;
};

// Init plus N(0, 0.3) noise everywhere, so norm gains differ from 1 and attention is far from
// uniform: every gradient term carries weight.
Case make_case(const LlamaDouble& model) {
  Case c;
  c.params.resize(model.num_params());
  model.init_params(c.params, 7);
  for (std::size_t i = 0; i < c.params.size(); ++i) c.params[i] += 0.3 * scape::rng::normal(1000, i);
  for (std::uint64_t i = 0; i < kB * kT; ++i) {
    c.inputs.push_back(static_cast<std::int32_t>(scape::rng::derive(3, i) % kTiny.vocab_size));
    c.targets.push_back(static_cast<std::int32_t>(scape::rng::derive(4, i) % kTiny.vocab_size));
  }
  c.inputs[3] = c.inputs[1];  // a repeated token exercises the scatter-add into wte
  return c;
}

}  // namespace

TEST_CASE("config validation names the field: width, odd head dimension, n_kv_head") {
  CHECK(message(kTiny) == "no exception");
  LlamaConfig c = kTiny;
  c.n_embd = 18;
  CHECK(message(c).find("LlamaConfig.n_embd = 18: must be a multiple of n_head") == 0);
  c = kTiny;
  c.n_embd = 12;  // head dim 3
  CHECK(message(c).find("LlamaConfig.n_embd = 12: the head dimension") == 0);
  c = kTiny;
  c.n_kv_head = 3;
  CHECK(message(c).find("LlamaConfig.n_kv_head = 3: must divide n_head") == 0);
  c = kTiny;
  c.n_layer = 0;
  CHECK(message(c).find("LlamaConfig.n_layer") == 0);
  CHECK_THROWS_AS(LlamaDouble{c}, std::invalid_argument);
}

TEST_CASE("layout: tensors, sizes, the default SwiGLU width and the weight-decay rule") {
  CHECK(default_ffn_hidden(64) == 192);   // ceil(512 / 3) = 171 -> 192
  CHECK(default_ffn_hidden(96) == 256);   // 256 exactly
  CHECK(default_ffn_hidden(768) == 2048);
  LlamaConfig d = kTiny;
  d.ffn_hidden = 0;
  CHECK(d.hidden() == 64);
  const auto layout = llama_layout(kTiny);
  const std::size_t C = 16, V = 11, F = 12, S = (4 + 2 * 2) * 4, L = 2;
  CHECK(layout.size() == V * C + L * (C + S * C + C * C + C + 2 * F * C + C * F) + C + V * C);
  CHECK(layout.slot("h.1.attn.qkv.w").shape == std::vector<std::size_t>{S, C});
  CHECK(layout.slot("h.0.mlp.gate_up.w").shape == std::vector<std::size_t>{2 * F, C});
  for (const auto& slot : layout.slots()) {
    INFO(slot.name);
    CHECK(slot.decay == (slot.shape.size() == 2 && slot.name != "wte"));
  }
}

TEST_CASE("double backward matches central differences on every coordinate of every tensor") {
  LlamaDouble model(kTiny);
  Case c = make_case(model);
  std::vector<double> grads(model.num_params());
  model.forward_backward(c.params, c.inputs, c.targets, kB, kT, grads);
  const double h = 1e-5;
  for (const auto& slot : model.layout().slots()) {
    double max_err = 0, max_grad = 0;
    for (std::size_t i = slot.offset; i < slot.end(); ++i) {
      const double saved = c.params[i];
      c.params[i] = saved + h;
      const double up = model.loss(c.params, c.inputs, c.targets, kB, kT);
      c.params[i] = saved - h;
      const double down = model.loss(c.params, c.inputs, c.targets, kB, kT);
      c.params[i] = saved;
      const double numeric = (up - down) / (2 * h);
      max_err = std::max(max_err, std::abs(numeric - grads[i]));
      max_grad = std::max(max_grad, std::abs(numeric));
    }
    INFO("tensor ", slot.name, ": max |analytic - numeric| = ", max_err, ", max |grad| = ", max_grad);
    CHECK(max_err < 1e-8);
    CHECK(max_grad > 1e-4);
  }
}

namespace {

// The float model of `cfg` against the double model (fp32 GEMMs) on one case: the loss within
// loss_eps relative and every gradient tensor within grad_tol relative L2 error.
void compare_to_double(const LlamaConfig& cfg, double loss_eps, double grad_tol) {
  LlamaDouble ref(kTiny);
  Llama model(cfg);
  Case c = make_case(ref);
  std::vector<double> gd(ref.num_params());
  const double loss_d = ref.forward_backward(c.params, c.inputs, c.targets, kB, kT, gd);
  std::vector<float> pf(c.params.begin(), c.params.end()), gf(model.num_params());
  const float loss_f = model.forward_backward(pf, c.inputs, c.targets, kB, kT, gf);
  CHECK(loss_f == doctest::Approx(loss_d).epsilon(loss_eps));
  CHECK(model.loss(pf, c.inputs, c.targets, kB, kT) == loss_f);
  for (const auto& slot : model.layout().slots()) {
    double diff = 0, norm = 0;
    for (std::size_t i = slot.offset; i < slot.end(); ++i) {
      diff += (gf[i] - gd[i]) * (gf[i] - gd[i]);
      norm += gd[i] * gd[i];
    }
    INFO("tensor ", slot.name, ": relative L2 error ", std::sqrt(diff / norm));
    CHECK(std::sqrt(diff / norm) < grad_tol);
  }
}

}  // namespace

TEST_CASE("fp32 model agrees with the double model") { compare_to_double(kTiny, 1e-6, 1e-4); }

// bf16 GEMM operands carry 8 significant bits (relative rounding 2^-9): the loss stays within
// 0.5% and each gradient within 5%, and an fp32 model would not be this far off (1e-6, 1e-4).
TEST_CASE("bf16 model: within bf16 rounding of the double model, and not fp32") {
  LlamaConfig bf16 = kTiny;
  bf16.precision = Precision::bf16;
  compare_to_double(bf16, 5e-3, 0.05);
  LlamaDouble ref(kTiny);
  Llama fp32(kTiny), half(bf16);
  Case c = make_case(ref);
  std::vector<float> pf(c.params.begin(), c.params.end());
  CHECK(half.loss(pf, c.inputs, c.targets, kB, kT) != fp32.loss(pf, c.inputs, c.targets, kB, kT));
}

TEST_CASE("loss at initialisation is near ln(vocab_size); one fixed batch is overfit below 0.1") {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const LlamaConfig cfg{.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 64};
  Llama model(cfg);
  const int B = 4, T = 16;
  std::vector<float> p(model.num_params()), g(p.size()), m(p.size()), v(p.size());
  model.init_params(p, 1);
  std::vector<std::int32_t> in(B * T), tg(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    in[i] = static_cast<std::int32_t>(scape::rng::derive(11, i) % 64);
    tg[i] = static_cast<std::int32_t>(scape::rng::derive(12, i) % 64);
  }
  const float first = model.forward_backward(p, in, tg, B, T, g);
  float last = first;
  int steps = 0;
  // Adam without weight decay (memorisation, not generalisation).
  for (int t = 1; t <= 400 && last >= 0.1f; ++t, ++steps) {
    const float c1 = 1.0f - std::pow(0.9f, float(t)), c2 = 1.0f - std::pow(0.95f, float(t));
    for (std::size_t i = 0; i < p.size(); ++i) {
      m[i] = 0.9f * m[i] + 0.1f * g[i];
      v[i] = 0.95f * v[i] + 0.05f * g[i] * g[i];
      p[i] -= 1e-2f * (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8f);
    }
    last = model.forward_backward(p, in, tg, B, T, g);
  }
  omp_set_num_threads(saved);
  MESSAGE("llama overfit: loss ", first, " -> ", last, " in ", steps, " steps");
  CHECK(first == doctest::Approx(std::log(64.0)).epsilon(0.02));
  CHECK(last < 0.1f);
}
