// Gradient check of the hand-written GPT backward pass: central finite differences in double on
// every coordinate of every tensor of a tiny model, then the fp32 model against the double one.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/gpt.hpp"
#include "core/rng.hpp"

using scape::model::Gpt;
using scape::model::GptConfig;
using scape::model::GptDouble;

namespace {

// Two blocks (so the residual stream crosses a block boundary), two heads, T < block_size (so the
// unused wpe rows must get exactly zero gradient), a vocab that is not a power of two.
constexpr GptConfig kTiny{.n_layer = 2, .n_head = 2, .n_embd = 8, .block_size = 8, .vocab_size = 13};
constexpr int kB = 2, kT = 6;

struct Case {
  std::vector<double> params;
  std::vector<std::int32_t> inputs, targets;
};

// GPT-2 init plus N(0, 0.3) noise everywhere: biases and LayerNorm shifts become non-zero and the
// attention far from uniform, so every gradient term carries weight.
Case make_case(const GptDouble& model) {
  Case c;
  c.params.resize(model.num_params());
  model.init_params(c.params, 7);
  for (std::size_t i = 0; i < c.params.size(); ++i) c.params[i] += 0.3 * scape::rng::normal(1000, i);
  for (std::uint64_t i = 0; i < kB * kT; ++i) {
    c.inputs.push_back(static_cast<std::int32_t>(scape::rng::derive(3, i) % kTiny.vocab_size));
    c.targets.push_back(static_cast<std::int32_t>(scape::rng::derive(4, i) % kTiny.vocab_size));
  }
  c.targets[3] = c.inputs[3];  // a repeated token exercises the scatter-add into wte
  return c;
}

}  // namespace

TEST_CASE("double backward matches central differences on every coordinate of every tensor") {
  GptDouble model(kTiny);
  Case c = make_case(model);
  std::vector<double> grads(model.num_params());
  model.forward_backward(c.params, c.inputs, c.targets, kB, kT, grads);

  // h = 1e-5: truncation error ~h^2 |f'''| ~ 1e-10 and round-off ~eps |f| / h ~ 1e-10, so a
  // correct gradient agrees to ~1e-9 absolute; an error in any backward term is orders larger.
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
    CHECK(max_grad > 1e-4);  // the check is meaningful only if the tensor gets gradient
  }

  // wpe rows t >= T never see a token: their gradient is exactly zero, not merely small.
  const auto& wpe = model.layout().slot("wpe");
  const std::size_t C = static_cast<std::size_t>(kTiny.n_embd);
  for (std::size_t i = wpe.offset + kT * C; i < wpe.end(); ++i) CHECK(grads[i] == 0.0);
}

TEST_CASE("fp32 model agrees with the double model") {
  GptDouble ref(kTiny);
  Gpt model(kTiny);
  Case c = make_case(ref);
  std::vector<double> gd(ref.num_params());
  const double loss_d = ref.forward_backward(c.params, c.inputs, c.targets, kB, kT, gd);

  std::vector<float> pf(c.params.begin(), c.params.end()), gf(model.num_params());
  const float loss_f = model.forward_backward(pf, c.inputs, c.targets, kB, kT, gf);
  CHECK(loss_f == doctest::Approx(loss_d).epsilon(1e-6));
  CHECK(model.loss(pf, c.inputs, c.targets, kB, kT) == loss_f);

  // fp32 rounding (eps 6e-8) through ~20 dependent layers of arithmetic leaves ~1e-6 relative
  // error per tensor; 1e-4 leaves margin while any wrong formula in the float path is O(1).
  for (const auto& slot : model.layout().slots()) {
    double diff = 0, norm = 0;
    for (std::size_t i = slot.offset; i < slot.end(); ++i) {
      diff += (gf[i] - gd[i]) * (gf[i] - gd[i]);
      norm += gd[i] * gd[i];
    }
    INFO("tensor ", slot.name, ": relative L2 error ", std::sqrt(diff / norm));
    CHECK(std::sqrt(diff / norm) < 1e-4);
  }
}
