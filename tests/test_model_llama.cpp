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

#include "model/llama.hpp"
#include "model_gradcheck.hpp"
#include "util/rng.hpp"

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

// A repeated token exercises the scatter-add into wte.
scape::testing::GradCase llama_case(const LlamaDouble& model) {
  auto c = scape::testing::make_grad_case(model, kB, kT);
  c.inputs[3] = c.inputs[1];
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
  const auto layout = transformer_layout(transformer_shape(kTiny));
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
  auto c = llama_case(model);
  scape::testing::check_central_differences(model, c);
}

namespace {

// The float model of `cfg` against the double model (fp32 GEMMs) on one case.
void compare_to_double(const LlamaConfig& cfg, double loss_eps, double grad_tol) {
  LlamaDouble ref(kTiny);
  Llama model(cfg);
  scape::testing::compare_float_to_double(ref, model, llama_case(ref), loss_eps, grad_tol);
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
  const auto c = llama_case(ref);
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
