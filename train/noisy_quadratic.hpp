// Synthetic gradient source for tests and fast studies: a noisy quadratic
//   f(theta) = 1/2 sum_j h_j (theta_j - theta*_j)^2
// with heavy-tailed (Pareto) per-coordinate curvature h_j and per-worker Gaussian noise
//   g_i = h (theta - theta*) + sigma sqrt(h) z_i(seed, step, worker).
// Every value is a pure function of (seed, step, worker, coordinate), so W workers in any
// order or thread count see the same gradients.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace scape::train {

struct QuadraticSpec {
  std::uint64_t seed = 0;
  double curvature_min = 0.01;   // h_min of the Pareto law
  double curvature_tail = 1.0;   // Pareto shape alpha: smaller is heavier-tailed
  double curvature_max = 100.0;  // cap so that a fixed learning rate stays stable
  double noise = 0.1;            // sigma
};

class NoisyQuadratic {
 public:
  NoisyQuadratic(std::size_t n, const QuadraticSpec& spec);

  std::size_t size() const { return h_.size(); }
  std::span<const float> curvature() const { return h_; }
  std::span<const float> optimum() const { return optimum_; }
  // theta_0 = 0 (the optimum is drawn around it).
  void initial_params(std::span<float> theta) const;
  void gradient(std::span<const float> theta, int step, int worker, std::span<float> g) const;
  double loss(std::span<const float> theta) const;

 private:
  QuadraticSpec spec_;
  std::vector<float> h_;
  std::vector<float> optimum_;
};

}  // namespace scape::train
