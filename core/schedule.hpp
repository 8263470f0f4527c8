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

// SCAPE's and top-k's density schedule (docs/algorithms.md, "Density schedule").
struct DensitySchedule {
  double rho = 1.0;         // the target density 1 - sparsity
  double start = 1.0;       // s: the density at step 1 of a warm-up
  int warmup = 0;           // T_w steps of geometric decay from s to rho (0 = none)
  int cooldown = 0;         // C steps of geometric rise back to 1 (0 = none)
  int cooldown_start = 0;   // the 0-based step tau at which the cool-down starts
};

// rho_t for step t (1-based), tau = t - 1: s (rho/s)^(tau/T_w) while tau < T_w, then rho. With a
// cool-down (C > 0), which replaces the warm-up as in the artifact: rho before cooldown_start,
// then rho (1/rho)^min(1, (tau - cooldown_start)/C).
double density_at(const DensitySchedule& s, int t);
// The warm-up from 1 alone: rho^min(1, (t-1)/tau) with tau = density_warmup > 0, else rho.
double density_at(double rho, int density_warmup, int t);

// k = ceil(rho * n), 0 for n = 0. The product is rounded to the nearest integer first when it
// lies within 1e-9 (relative) of one, so that 1 - 0.99 = 0.010000000000000009 gives k = 64 on
// 6400 elements, not 65.
std::size_t k_for(double rho, std::size_t n);

}  // namespace scape
