// Learning-rate schedule, density schedule and the per-shard k rule
// (docs/algorithms.md, "Schedules" and "Density and k").
#pragma once

#include <cstddef>

namespace scape {

struct LrSchedule {
  double lr = 6e-4;
  double min_lr = 6e-5;   // documented default: lr / 10
  int warmup_steps = 0;   // u
  int total_steps = 1;    // T
};

// Linear warm-up eta_t = lr t / u for t <= u, then cosine from lr to min_lr over T - u steps.
// t is 1-based.
double learning_rate(const LrSchedule& s, int t);

// rho_t = rho^min(1, (t-1)/tau) with tau = density_warmup > 0, else rho.
double density_at(double rho, int density_warmup, int t);

// k = ceil(rho * n), 0 for n = 0. The product is rounded to the nearest integer first when it
// lies within 1e-9 (relative) of one, so that 1 - 0.99 = 0.010000000000000009 gives k = 64 on
// 6400 elements, not 65.
std::size_t k_for(double rho, std::size_t n);

}  // namespace scape
