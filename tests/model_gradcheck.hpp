// The gradient-check harness of every model family (model/transformer.hpp): a perturbed case,
// central finite differences in double on every coordinate of every tensor, and the float model
// against the double one. A family's test file gives its tiny shape and calls these.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/transformer.hpp"
#include "util/rng.hpp"

namespace scape::testing {

struct GradCase {
  std::vector<double> params;
  std::vector<std::int32_t> inputs, targets;
  int B = 0, T = 0;
};

// Init plus N(0, 0.3) noise everywhere: biases, norm shifts and gains move off 0 and 1 and the
// attention far from uniform, so every gradient term carries weight. Tokens are drawn from
// streams 3 (inputs) and 4 (targets); callers repeat one to exercise the scatter-add into wte.
inline GradCase make_grad_case(const model::BasicTransformer<double>& model, int B, int T) {
  GradCase c;
  c.B = B;
  c.T = T;
  c.params.resize(model.num_params());
  model.init_params(c.params, 7);
  for (std::size_t i = 0; i < c.params.size(); ++i) c.params[i] += 0.3 * rng::normal(1000, i);
  const auto vocab = static_cast<std::uint64_t>(model.shape().vocab_size);
  for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(B * T); ++i) {
    c.inputs.push_back(static_cast<std::int32_t>(rng::derive(3, i) % vocab));
    c.targets.push_back(static_cast<std::int32_t>(rng::derive(4, i) % vocab));
  }
  return c;
}

// Central differences at h = 1e-5 against the analytic gradient, per tensor: truncation error
// ~h^2 |f'''| ~ 1e-10 and round-off ~eps |f| / h ~ 1e-10, so a correct gradient agrees to ~1e-9
// absolute; an error in any backward term is orders larger. Every tensor must get gradient
// (max |grad| > 1e-4), or the check would say nothing. Returns the analytic gradient.
inline std::vector<double> check_central_differences(model::BasicTransformer<double>& model, GradCase& c) {
  std::vector<double> grads(model.num_params());
  model.forward_backward(c.params, c.inputs, c.targets, c.B, c.T, grads);
  const double h = 1e-5;
  for (const auto& slot : model.layout().slots()) {
    double max_err = 0, max_grad = 0;
    for (std::size_t i = slot.offset; i < slot.end(); ++i) {
      const double saved = c.params[i];
      c.params[i] = saved + h;
      const double up = model.loss(c.params, c.inputs, c.targets, c.B, c.T);
      c.params[i] = saved - h;
      const double down = model.loss(c.params, c.inputs, c.targets, c.B, c.T);
      c.params[i] = saved;
      const double numeric = (up - down) / (2 * h);
      max_err = std::max(max_err, std::abs(numeric - grads[i]));
      max_grad = std::max(max_grad, std::abs(numeric));
    }
    INFO("tensor ", slot.name, ": max |analytic - numeric| = ", max_err, ", max |grad| = ", max_grad);
    CHECK(max_err < 1e-8);
    CHECK(max_grad > 1e-4);
  }
  return grads;
}

// The float model on the double case: the loss within loss_eps relative, loss() within 1e-6 of
// forward_backward's, and every gradient tensor within grad_tol relative L2 error of the double
// model's (fp32 rounding through ~20 dependent layers leaves ~1e-6 per tensor).
inline void compare_float_to_double(model::BasicTransformer<double>& ref, model::BasicTransformer<float>& model,
                                    const GradCase& c, double loss_eps, double grad_tol) {
  std::vector<double> gd(ref.num_params());
  const double loss_d = ref.forward_backward(c.params, c.inputs, c.targets, c.B, c.T, gd);
  std::vector<float> pf(c.params.begin(), c.params.end()), gf(model.num_params());
  const float loss_f = model.forward_backward(pf, c.inputs, c.targets, c.B, c.T, gf);
  CHECK(loss_f == doctest::Approx(loss_d).epsilon(loss_eps));
  // loss() takes cross_entropy's evaluation path, whose exp is not stored before the sum
  // (kernels/cpu/model_ops.hpp): it may differ from the training path in the last bit.
  CHECK(model.loss(pf, c.inputs, c.targets, c.B, c.T) == doctest::Approx(loss_f).epsilon(1e-6));
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

}  // namespace scape::testing
