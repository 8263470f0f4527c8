// Schedules (docs/algorithms.md, "Schedules" and "Density and k").
#include "core/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace scape {

double learning_rate(const LrSchedule& s, int t) {
  if (t < 1) throw std::invalid_argument("learning_rate: step t must be >= 1, got " + std::to_string(t));
  const int u = s.warmup_steps;
  if (t <= u) return s.lr * static_cast<double>(t) / static_cast<double>(u);
  const double span = std::max(1, s.total_steps - u);
  const double progress = static_cast<double>(t - u) / span;
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

double density_at(const DensitySchedule& s, int t) {
  const int tau = t - 1;
  if (s.cooldown > 0) {  // the cool-down replaces the warm-up (the artifact's _scheduled_density)
    if (tau < s.cooldown_start) return s.rho;
    const double progress =
        std::min(1.0, static_cast<double>(tau - s.cooldown_start) / static_cast<double>(s.cooldown));
    return std::min(1.0, s.rho * std::pow(1.0 / s.rho, progress));
  }
  if (s.warmup > 0 && tau < s.warmup) {
    return std::min(1.0, s.start * std::pow(s.rho / s.start, static_cast<double>(tau) / static_cast<double>(s.warmup)));
  }
  return s.rho;
}

double density_at(double rho, int density_warmup, int t) {
  if (density_warmup <= 0) return rho;
  const double exponent = std::min(1.0, static_cast<double>(t - 1) / static_cast<double>(density_warmup));
  return std::pow(rho, exponent);
}

std::size_t k_for(double rho, std::size_t n) {
  if (n == 0) return 0;
  const double x = rho * static_cast<double>(n);
  const double nearest = std::round(x);
  double k = std::abs(x - nearest) <= 1e-9 * std::max(1.0, x) ? nearest : std::ceil(x);
  if (rho > 0 && k < 1) k = 1;  // ceil of a positive product is at least 1
  return std::min(n, static_cast<std::size_t>(k));
}

}  // namespace scape
