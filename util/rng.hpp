// Counter-based random numbers: a value is a pure function of (key, counter), so results do
// not depend on thread count or call order. Keys are derived from (seed, purpose, rank, step).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

// mix, derive and uniform also run in CUDA kernels (the random mask statistic on the GPU).
#ifdef __CUDACC__
#define SCAPE_HOST_DEVICE __host__ __device__
#else
#define SCAPE_HOST_DEVICE
#endif

namespace scape::rng {

// splitmix64 finaliser: a bijective 64-bit mix with good avalanche.
SCAPE_HOST_DEVICE constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

SCAPE_HOST_DEVICE constexpr std::uint64_t derive(std::uint64_t key, std::uint64_t part) { return mix(key ^ mix(part)); }

// Uniform in [0, 1) with 53 random bits.
SCAPE_HOST_DEVICE inline double uniform(std::uint64_t key, std::uint64_t counter) {
  return static_cast<double>(mix(key ^ mix(counter)) >> 11) * 0x1.0p-53;
}

// Standard normal by Box-Muller on two counter draws.
inline double normal(std::uint64_t key, std::uint64_t counter) {
  const double u1 = 1.0 - uniform(key, 2 * counter);  // (0, 1]: log is finite
  const double u2 = uniform(key, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace scape::rng
