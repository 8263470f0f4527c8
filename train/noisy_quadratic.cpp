// Noisy quadratic gradient source (docs/algorithms.md, "Synthetic gradients").
#include "train/noisy_quadratic.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "util/rng.hpp"

namespace scape::train {
namespace {

constexpr std::uint64_t kCurvature = 1;
constexpr std::uint64_t kOptimum = 2;
constexpr std::uint64_t kNoise = 3;

using Index = std::int64_t;

}  // namespace

NoisyQuadratic::NoisyQuadratic(std::size_t n, const QuadraticSpec& spec) : spec_(spec), h_(n), optimum_(n) {
  if (!(spec.curvature_min > 0)) throw std::invalid_argument("NoisyQuadratic: curvature_min must be > 0");
  if (!(spec.curvature_tail > 0)) throw std::invalid_argument("NoisyQuadratic: curvature_tail must be > 0");
  if (!(spec.curvature_max >= spec.curvature_min)) {
    throw std::invalid_argument("NoisyQuadratic: curvature_max must be >= curvature_min");
  }
  if (!(spec.noise >= 0)) throw std::invalid_argument("NoisyQuadratic: noise must be >= 0");
  const std::uint64_t hk = rng::derive(spec.seed, kCurvature);
  const std::uint64_t ok = rng::derive(spec.seed, kOptimum);
  for (std::size_t j = 0; j < n; ++j) {
    const double u = rng::uniform(hk, j);
    const double pareto = spec.curvature_min * std::pow(1.0 - u, -1.0 / spec.curvature_tail);
    h_[j] = static_cast<float>(std::min(spec.curvature_max, pareto));
    optimum_[j] = static_cast<float>(rng::normal(ok, j));
  }
}

void NoisyQuadratic::initial_params(std::span<float> theta) const {
  if (theta.size() != h_.size()) throw std::invalid_argument("NoisyQuadratic::initial_params: size mismatch");
  std::fill(theta.begin(), theta.end(), 0.0f);
}

void NoisyQuadratic::gradient(std::span<const float> theta, int step, int worker, std::span<float> g) const {
  if (theta.size() != h_.size() || g.size() != h_.size()) {
    throw std::invalid_argument("NoisyQuadratic::gradient: theta and g must have " + std::to_string(h_.size()) +
                                " elements");
  }
  const std::uint64_t key = rng::derive(rng::derive(rng::derive(spec_.seed, kNoise), static_cast<std::uint64_t>(step)),
                                        static_cast<std::uint64_t>(worker));
  const float sigma = static_cast<float>(spec_.noise);
  const Index n = static_cast<Index>(h_.size());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (Index jj = 0; jj < n; ++jj) {
    const std::size_t j = static_cast<std::size_t>(jj);
    const float z = static_cast<float>(rng::normal(key, j));
    g[j] = h_[j] * (theta[j] - optimum_[j]) + sigma * std::sqrt(h_[j]) * z;
  }
}

double NoisyQuadratic::loss(std::span<const float> theta) const {
  double s = 0;
  for (std::size_t j = 0; j < h_.size(); ++j) {
    const double d = static_cast<double>(theta[j]) - optimum_[j];
    s += 0.5 * h_[j] * d * d;
  }
  return s;
}

}  // namespace scape::train
